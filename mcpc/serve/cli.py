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
    from mcpc.serve.cost import GRID_VERSION, AnalyticCost, CostGrid, ExactCost, file_digest, load_cost_file

    if source.suffix.lower() in _COST_SUFFIXES:
        cost, shape = load_cost_file(source)
        if exact:
            raise UsageError(f"--exact simulates each step of a program; {source} is a cost file")
        if cost_grid is None or not isinstance(cost, AnalyticCost):
            mode = "analytic" if isinstance(cost, AnalyticCost) else "cost_grid"
            error = getattr(cost, "error", None)
            return cost, shape, {"mode": mode, "file": source.name, "interpolation_error": error}
        measure, clock, digest = cost.measure, cost.clock_hz, file_digest(source)
        bandwidth = cost.dram_bytes_per_s
    else:
        from mcpc.serve.program import default_grid_path, measurer, served_shape
        from mcpc.sim.api import load_program

        loaded = load_program(source)
        shape = served_shape(loaded, str(source))
        clock = loaded.target.clock_mhz * 1e6
        bandwidth = loaded.target.dram.bandwidth_gbps * 1e9
        digest = file_digest(source)
        if exact:
            cost = ExactCost(measurer(loaded, str(source)), clock, bandwidth)
            return cost, shape, {"mode": "exact", "file": source.name}
        cost_grid = cost_grid or default_grid_path(source)
        measure = None  # only when the cache misses: measuring needs the host driver
    if cost_grid.exists() and _grid_version(cost_grid) not in range(1, GRID_VERSION):  # older: measured again
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
            dram_bytes_per_s=bandwidth,
        )
    grid.save(cost_grid)
    return grid, shape, _grid_info(grid, cost_grid, cached=False)


def _grid_version(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("version")
    except (OSError, ValueError, AttributeError):
        return None  # not a grid we wrote: load_cost_file names what is wrong with it


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
    bw = result.get("bandwidth") or {}
    if bw.get("mean_utilisation") is not None:
        lines.append(
            f"DRAM bandwidth utilisation: mean {bw['mean_utilisation']:.1%} per step, time-weighted "
            f"{bw['time_weighted_utilisation']:.1%}, peak {bw['peak_utilisation']:.1%} of "
            f"{bw['dram_bytes_per_s'] / 1e9:.0f} GB/s"
        )
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
    if "replicas" in result:
        _render_replicas(result, console)


def _render_replicas(result: dict, console) -> None:
    from rich.table import Table

    fleet = result["fleet"]
    table = Table(title=f"{fleet['replicas']} replicas, router {fleet['router']}")
    for col in ("replica", "requests", "tokens/s", "TTFT p99 (ms)", "E2E p99 (ms)", "busy", "KV peak"):
        table.add_column(col, justify="right")
    for r in result["replicas"]:
        if not r["requests"]:
            table.add_row(str(r["replica"]), "0", *["-"] * 5)
            continue
        table.add_row(
            str(r["replica"]), str(r["requests"]), f"{r['throughput_tokens_per_s']:.1f}",
            f"{r['ttft_ms']['p99']:.2f}", f"{r['e2e_ms']['p99']:.2f}", f"{r['npu']['busy_fraction']:.1%}",
            f"{r['kv']['peak_utilisation']:.1%}",
        )  # fmt: skip
    console.print(table)


def run_summary(sim, spec, workload_path: Path, shape, info: dict) -> dict:
    """The JSON summary of a finished run: ``summarize``'s metrics plus where its costs came from
    (``cost``), the workload file and seed, and the served shape."""
    from mcpc.serve import summarize

    result = summarize(sim, spec.slo)
    result["cost"] = info
    result["workload"] = {"file": workload_path.name, "seed": spec.seed}
    result["shape"] = {
        k: getattr(shape, k) for k in ("max_batch", "max_seq", "prefill_chunk", "kv_blocks", "block")
    }
    return result


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
@click.option(
    "--replicas", type=click.IntRange(min=1), default=1, show_default=True,
    help="NPUs behind a router, each with its own program, KV pool and policy.",
)  # fmt: skip
@click.option(
    "--router", type=click.Choice(["round_robin", "least_tokens", "prefix_affinity"]),
    default="least_tokens", show_default=True, help="How requests are spread over --replicas.",
)  # fmt: skip
def serve_command(
    source, workload_path, policy_path, json_path, trace_path, cost_grid, exact, grid_points, replicas, router
):
    """Simulate serving a workload on SOURCE: a decoder program (.mcpb, mcp-compile --max-seq) or a
    cost file (kind: analytic or cost_grid)."""
    from mcpc.fileio import write_atomic
    from mcpc.serve import Simulator, chrome_trace, load_policy, load_workload

    spec, requests = load_workload(workload_path)
    cost, shape, info = _costs(source, cost_grid, exact, grid_points)
    if replicas > 1:
        from mcpc.serve.fleet import Fleet

        load_policy(policy_path, shape)  # a bad policy file fails before any replica is built
        sim = Fleet(requests, cost, shape, lambda: load_policy(policy_path, shape), replicas, router)
    else:
        sim = Simulator(requests, cost, shape, load_policy(policy_path, shape))
    with _progress("serving") as tick:
        sim.run(progress=tick)
    result = run_summary(sim, spec, workload_path, shape, info)
    from mcpc.serve.metrics import per_request, timeline

    result["per_request"], result["timeline"] = per_request(sim), timeline(sim)
    if json_path:
        write_atomic(json_path, json.dumps(result, indent=1) + "\n")
    if trace_path:
        write_atomic(trace_path, json.dumps(chrome_trace(sim, source.name), separators=(",", ":")))
    _render(result, _stdout_console())


@click.command("tune-batching", cls=GuardedCommand)
@click.argument("source", type=click.Path(path_type=Path, dir_okay=False, exists=True))
@click.option(
    "--workload", "workload_path", required=True, type=click.Path(path_type=Path, dir_okay=False),
    help="Workload YAML the settings are measured on.",
)  # fmt: skip
@click.option("--slo-p99-ms", "slo", required=True, type=click.FloatRange(min=0, min_open=True),
              help="The P99 (ms) of --metric every bucket and the whole workload must meet.")  # fmt: skip
@click.option(
    "--metric", type=click.Choice(["e2e", "ttft", "tpot"]), default="e2e", show_default=True,
    help="Which latency's P99 the SLO bounds: end to end, time to first token, or time per output token.",
)  # fmt: skip
@click.option(
    "--search", type=click.Choice(["table", "continuous"]), default="table", show_default=True,
    help="table: the sequence-length table's batch per bucket; continuous: max_seqs and token_budget.",
)  # fmt: skip
@click.option(
    "--policy", "policy_path", type=click.Path(path_type=Path, dir_okay=False),
    help="A seqlen_table policy whose bucket bounds and max_queue_delay_ms to keep (default: the seed's).",
)  # fmt: skip
@click.option("-o", "--output", "out_path", type=click.Path(path_type=Path, dir_okay=False),
              help="Write the best setting as a policy YAML for sim serve --policy.")  # fmt: skip
@click.option("--json", "json_path", type=click.Path(path_type=Path, dir_okay=False),
              help="Write every trial and the best as JSON.")  # fmt: skip
@click.option("--cost-grid", "cost_grid", type=click.Path(path_type=Path, dir_okay=False),
              help="Cost grid file (as sim serve).")  # fmt: skip
@click.option("--grid-points", type=click.IntRange(min=2), default=9, show_default=True)
def tune_batching_command(
    source, workload_path, slo, metric, search, policy_path, out_path, json_path, cost_grid, grid_points
):
    """Search batching parameters of SOURCE (a decoder program or cost file, as sim serve) so that
    the P99 of --metric meets --slo-p99-ms at the highest throughput; exit 1 when nothing does."""
    from mcpc.errors import CheckFailed
    from mcpc.fileio import write_atomic
    from mcpc.serve import load_workload
    from mcpc.serve.policies import SeqLenTableSpec
    from mcpc.serve.tune import Tuner, policy_yaml

    spec, requests = load_workload(workload_path)
    cost, shape, info = _costs(source, cost_grid, False, grid_points)
    bounds, delay = None, 100.0
    if policy_path is not None:
        from mcpc.serve.policies import load_policy

        base = load_policy(policy_path, shape).spec
        if not isinstance(base, SeqLenTableSpec):
            raise UsageError(
                f"{policy_path}: --policy gives the buckets to tune: expected policy: seqlen_table"
            )
        bounds, delay = [b.max_prompt for b in base.buckets], base.max_queue_delay_ms
    with _progress("tuning") as tick:
        tuner = Tuner(requests, cost, shape, slo, metric, bounds, delay, progress=tick)
        best = tuner.search_table() if search == "table" else tuner.search_continuous()

    def trial_json(t):
        return {"policy": t.spec.model_dump(exclude_none=True), "throughput_tokens_per_s": t.throughput,
                "p99_ms": t.p99, "bucket_p99_ms": t.bucket_p99, "bucket_requests": t.bucket_requests,
                "feasible": t.feasible}  # fmt: skip

    result = {"metric": metric, "slo_p99_ms": slo, "search": search, "bounds": tuner.bounds,
              "best": trial_json(best), "trials": [trial_json(t) for t in tuner.trials.values()],
              "cost": info, "workload": {"file": workload_path.name, "seed": spec.seed}}  # fmt: skip
    if json_path:
        write_atomic(json_path, json.dumps(result, indent=1) + "\n")
    _render_tune(result, tuner, _stdout_console())
    if not best.feasible:
        raise CheckFailed(
            f"no setting of {len(tuner.trials)} tried meets P99 {metric} <= {slo:g} ms on {workload_path}: "
            f"the best reaches {best.worst:.4g} ms ({best.spec.model_dump(exclude_none=True)}); relax the "
            "SLO, lower the load, or serve on more replicas"
        )
    if out_path:
        header = [
            f"tune-batching {source.name} --workload {workload_path.name} --slo-p99-ms {slo:g} "
            f"--metric {metric} --search {search}",
            f"P99 {metric} {best.p99:.4g} ms over all requests, {best.throughput:.1f} tokens/s "
            f"({len(tuner.trials)} settings simulated)",
        ]
        write_atomic(out_path, policy_yaml(best, tuner, header))


def _render_tune(result: dict, tuner, console) -> None:
    from rich.table import Table

    best = result["best"]
    table = Table(title=f"tune-batching: P99 {result['metric']} <= {result['slo_p99_ms']:g} ms, "
                        f"best of {len(result['trials'])} settings")  # fmt: skip
    for col in ("bucket (prompt tokens)", "batch", "requests", "P99 (ms)"):
        table.add_column(col, justify="right")
    lo = 0
    buckets = best["policy"].get("buckets")
    for i, bound in enumerate(result["bounds"]):
        rng = f"{lo + 1}-{bound}" if bound is not None else f"> {lo}"
        batch = str(buckets[i]["batch"]) if buckets else "-"
        p = best["bucket_p99_ms"][i]
        table.add_row(rng, batch, str(best["bucket_requests"][i]), "-" if p is None else f"{p:.2f}")
        lo = bound or lo
    console.print(table)
    pol = {k: v for k, v in best["policy"].items() if k != "buckets"}
    console.print(
        f"best {pol}: {best['throughput_tokens_per_s']:.1f} tokens/s, P99 {result['metric']} "
        f"{best['p99_ms']:.2f} ms over all requests, {'meets' if best['feasible'] else 'MISSES'} the SLO"
    )
