"""``mcpc sim serve``: simulate serving a workload on the NPU, print the metrics, write JSON and a
Chrome trace.  Registered on the ``sim`` group by ``mcpc.cli``; errors go through the guard
(exit 3 for a bad workload, policy or cost file, 2 for a program that is not a decoder build)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from mcpc.cli_guard import GuardedCommand, _stderr_console, _stdout_console
from mcpc.errors import UsageError

_COST_SUFFIXES = (".yaml", ".yml", ".json")


def _progress(label: str):
    """A rich progress bar on a terminal (a no-op callback elsewhere); use as a context manager."""
    from contextlib import nullcontext

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = _stderr_console()
    if not console.is_terminal:
        return nullcontext(lambda done, total: None)

    class _Bar:
        def __enter__(self):
            self.p = Progress(
                TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                console=console, transient=True,
            )  # fmt: skip
            self.p.__enter__()
            self.task = self.p.add_task(label, total=None)
            return lambda done, total: self.p.update(self.task, completed=done, total=total)

        def __exit__(self, *exc):
            return self.p.__exit__(*exc)

    return _Bar()


def _costs(source: Path, cost_grid: Path | None, exact: bool, points: int):
    """(step cost, served shape, cost description for the JSON) for a program or a cost file."""
    from mcpc.serve.cost import AnalyticCost, CostGrid, ExactCost, file_digest, load_cost_file

    if source.suffix.lower() in _COST_SUFFIXES:
        cost, shape = load_cost_file(source)
        if exact:
            raise UsageError(f"--exact simulates each step of a program; {source} is a cost file")
        if cost_grid is None or not isinstance(cost, AnalyticCost):
            mode = "analytic" if isinstance(cost, AnalyticCost) else "cost_grid"
            error = getattr(cost, "error", None)
            return cost, shape, {"mode": mode, "file": source.name, "interpolation_error": error}
        measure, clock, digest = cost.measure, cost.clock_hz, file_digest(source)
    else:
        from mcpc.serve.program import default_grid_path, measurer, served_shape
        from mcpc.sim.api import load_program

        loaded = load_program(source)
        shape = served_shape(loaded, str(source))
        clock = loaded.target.clock_mhz * 1e6
        digest = file_digest(source)
        if exact:
            cost = ExactCost(measurer(loaded, str(source)), clock)
            return cost, shape, {"mode": "exact", "file": source.name}
        cost_grid = cost_grid or default_grid_path(source)
        measure = None  # only when the cache misses: measuring needs the host driver
    if cost_grid.exists():
        grid, _ = load_cost_file(cost_grid)
        if isinstance(grid, CostGrid) and grid.source.get("sha256") == digest:
            return grid, shape, _grid_info(grid, cost_grid, cached=True)
    if measure is None:
        measure = measurer(loaded, str(source))
    with _progress("measuring the cost grid") as tick:
        grid = CostGrid.measure(
            measure,
            shape,
            clock,
            points=points,
            source={"file": source.name, "sha256": digest},
            progress=tick,
        )
    grid.save(cost_grid)
    return grid, shape, _grid_info(grid, cost_grid, cached=False)


def _grid_info(grid, path: Path, cached: bool) -> dict:
    return {"mode": "grid", "file": path.name, "cached": cached, "interpolation_error": grid.error}


def _render(result: dict, console) -> None:
    from rich.table import Table

    table = Table(title=f"serving: {result['requests']} requests, policy {result['policy']}")
    table.add_column("metric")
    for col in ("mean", "p50", "p90", "p99"):
        table.add_column(col, justify="right")
    for key, label in (
        ("ttft_ms", "TTFT (ms)"),
        ("tpot_ms", "TPOT (ms)"),
        ("itl_ms", "ITL (ms)"),
        ("e2e_ms", "E2E (ms)"),
        ("queue_ms", "queue (ms)"),
    ):
        s = result[key]
        table.add_row(label, *("-" if s[c] is None else f"{s[c]:.2f}" for c in ("mean", "p50", "p90", "p99")))
    console.print(table)
    kv, npu = result["kv"], result["npu"]
    lines = [
        f"throughput {result['throughput_tokens_per_s']:.1f} tokens/s, "
        f"{result['throughput_requests_per_s']:.2f} requests/s over {result['duration_s']:.2f} s",
        f"NPU busy {npu['busy_fraction']:.1%}, {npu['iterations']} iterations, mean decode batch "
        f"{npu['mean_decode_batch']:.2f}",
        f"KV: peak {kv['peak_blocks']}/{kv['blocks']} blocks ({kv['peak_utilisation']:.1%}, "
        f"{kv['peak_bytes']} bytes), mean {kv['mean_utilisation']:.1%}, prefix hit rate "
        f"{kv['prefix_hit_rate']:.1%}, {kv['preemptions']} preemptions, {kv['evictions']} evictions",
    ]
    if "goodput" in result:
        g = result["goodput"]
        lines.append(f"goodput {g['requests_per_s']:.2f} requests/s ({g['fraction']:.1%} meet {g['slo']})")
    err = (result.get("cost") or {}).get("interpolation_error")
    if err:
        lines.append(
            f"cost grid interpolation error: decode max {err['decode_max_rel']:.2%} "
            f"(mean {err['decode_mean_rel']:.2%}), prefill max {err['prefill_max_rel']:.2%} "
            f"(mean {err['prefill_mean_rel']:.2%}) at {err['checked_points']} cell centres"
        )
    for line in lines:
        console.print(line)


@click.command("serve", cls=GuardedCommand)
@click.argument("source", type=click.Path(path_type=Path, dir_okay=False, exists=True))
@click.option(
    "--workload", "workload_path", required=True, type=click.Path(path_type=Path, dir_okay=False),
    help="Workload YAML (arrivals, lengths, prefix groups, seed, SLOs).",
)  # fmt: skip
@click.option(
    "--policy", "policy_path", type=click.Path(path_type=Path, dir_okay=False),
    help="Policy YAML (default: continuous batching with its defaults).",
)  # fmt: skip
@click.option(
    "--json", "json_path", type=click.Path(path_type=Path, dir_okay=False), help="Write the metrics JSON."
)
@click.option(
    "--trace", "trace_path", type=click.Path(path_type=Path, dir_okay=False),
    help="Write a Chrome/Perfetto trace of the iterations.",
)  # fmt: skip
@click.option(
    "--cost-grid", "cost_grid", type=click.Path(path_type=Path, dir_okay=False),
    help="Cost grid file: read when it matches SOURCE, else measured and written (default for a "
    "program: NAME.costgrid.json beside it).",
)  # fmt: skip
@click.option("--exact", is_flag=True, help="Simulate every step on the program instead of the cost grid.")
@click.option(
    "--grid-points", type=click.IntRange(min=2), default=9, show_default=True,
    help="Grid points per length axis when the grid is measured.",
)  # fmt: skip
def serve_command(source, workload_path, policy_path, json_path, trace_path, cost_grid, exact, grid_points):
    """Simulate serving a workload on SOURCE: a decoder program (.mcpb, mcp-compile --max-seq) or a
    cost file (kind: analytic or cost_grid)."""
    from mcpc.fileio import write_atomic
    from mcpc.serve import Simulator, chrome_trace, load_policy, load_workload, summarize

    spec, requests = load_workload(workload_path)
    cost, shape, info = _costs(source, cost_grid, exact, grid_points)
    policy = load_policy(policy_path, shape)
    sim = Simulator(requests, cost, shape, policy)
    with _progress("serving") as tick:
        sim.run(progress=tick)
    result = summarize(sim, spec.slo)
    result["cost"] = info
    result["workload"] = {"file": workload_path.name, "seed": spec.seed}
    result["shape"] = {
        k: getattr(shape, k) for k in ("max_batch", "max_seq", "prefill_chunk", "kv_blocks", "block")
    }
    from mcpc.serve.metrics import per_request, timeline

    result["per_request"], result["timeline"] = per_request(sim), timeline(sim)
    if json_path:
        write_atomic(json_path, json.dumps(result, indent=1) + "\n")
    if trace_path:
        write_atomic(trace_path, json.dumps(chrome_trace(sim, source.name), separators=(",", ":")))
    _render(result, _stdout_console())
