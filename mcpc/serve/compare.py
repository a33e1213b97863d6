"""``mcpc compare BASE.mcpb OPT.mcpb --workload W.yaml``: the seed's headline table (latency, peak NPU
memory, throughput, and the change from BASE to OPT) measured by serving one workload on two decoder
builds of the same model, each under its own batching policy (``docs/serving.md``, "Comparing two
builds").

Every figure comes from the serving simulator (``mcpc.serve``) on the two programs: latencies and
throughput from the run, the memory from each program's memory map (weights = the constant pool,
activations = the DRAM the entries' inputs, outputs and scratch occupy) and the KV manager's peak
use during the run (blocks referenced by live sequences, at the bytes one block takes in the
build's KV storage: an INT8 cache's quantized values, scales and zero points).  The seed's own
end-to-end claim is shown beside it, labelled as a claim, never used in a computation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mcpc.errors import UsageError

# The seed's end-to-end claim (chapter 1 step 4 of its digest): 1000 concurrent requests, batch 16,
# seq 256, an optimised MCP 2026 build against plain PyTorch.  Printed as claims, never computed with.
SEED_CLAIMS = {
    "latency": {"base_ms": 114.3, "opt_ms": 42.5, "change": "-62.8 %"},
    "memory": {"base_gb": 18.7, "opt_gb": 9.2, "change": "-50.8 %"},
    "throughput": {"base_tokens_per_s": 142, "opt_tokens_per_s": 441, "change": "3.1x"},
}

# What must agree for two programs to be builds of one model (META["decoder"]).
SAME_MODEL = ("vocab", "layers", "q_heads", "kv_heads", "head_dim")

ACTIVATION_KINDS = ("input", "output", "scratch")


@dataclass
class Side:
    """One served build: its label, file, loaded program and decoder META."""

    label: str
    path: Path
    loaded: object
    meta: object


def load_side(label: str, path: Path) -> Side:
    from mcpc.sim.api import load_program
    from mcpc.sim.decoder import DecoderMeta

    loaded = load_program(path)
    return Side(label, path, loaded, DecoderMeta.from_program(loaded))


def check_same_model(base: Side, opt: Side) -> None:
    """Both programs must be decoder builds of one model: a mismatch is a usage error naming the
    field and both values."""
    diff = [
        f"{k} {getattr(base.meta, k)} vs {getattr(opt.meta, k)}"
        for k in SAME_MODEL
        if getattr(base.meta, k) != getattr(opt.meta, k)
    ]
    if diff:
        raise UsageError(
            f"{base.path.name} and {opt.path.name} are not builds of the same model ({', '.join(diff)} "
            "in their META decoder sections): compare two builds of one exported decoder (e.g. fp16 "
            "and W4A16 of the same ONNX file)"
        )


def _union_bytes(ranges: list[tuple[int, int]]) -> int:
    total, end = 0, None
    for lo, hi in sorted(ranges):
        if end is None or lo >= end:
            total += hi - lo
            end = hi
        elif hi > end:
            total += hi - end
            end = hi
    return total


def memory_breakdown(loaded, kv_peak_bytes: int) -> dict:
    """Peak NPU memory of a served build: ``weights_bytes`` (the memory map's ``const`` regions),
    ``activation_bytes`` (the DRAM its ``input``/``output``/``scratch`` regions occupy, overlaps
    counted once), ``kv_peak_bytes`` (the KV manager's peak during the run) and their sum
    ``total_bytes``; ``kv_pool_bytes`` is the cache the program reserves (its ``persistent`` globals,
    in the cache's compute dtype) and ``dram_planned_bytes`` the whole planned DRAM, for reference."""
    regions = (loaded.memory_map or {}).get("regions") or []
    weights = sum(int(r.get("bytes", 0)) for r in regions if r.get("kind") == "const")
    acts = _union_bytes(
        [
            (int(r["dram"]), int(r["dram"]) + int(r.get("bytes", 0)))
            for r in regions
            if r.get("kind") in ACTIVATION_KINDS and int(r.get("bytes", 0)) > 0
        ]
    )
    pool = sum(int(r.get("bytes", 0)) for r in regions if r.get("kind") == "persistent")
    return {
        "weights_bytes": int(weights),
        "kv_peak_bytes": int(kv_peak_bytes),
        "activation_bytes": int(acts),
        "total_bytes": int(weights + kv_peak_bytes + acts),
        "kv_pool_bytes": int(pool),
        "dram_planned_bytes": int((loaded.memory_map or {}).get("dram_size", 0)),
    }


def serve_side(side: Side, workload_path: Path, policy_path, exact: bool, points: int, progress) -> dict:
    """Serve the workload on one build: the ``sim serve`` result JSON plus ``memory`` and ``program``."""
    from mcpc.serve import Simulator, load_policy, load_workload
    from mcpc.serve.cli import _costs, run_summary

    spec, requests = load_workload(workload_path)
    cost, shape, info = _costs(side.path, None, exact, points)
    policy = load_policy(policy_path, shape)
    sim = Simulator(requests, cost, shape, policy)
    with progress(f"serving on {side.path.name}") as tick:
        sim.run(progress=tick)
    result = run_summary(sim, spec, workload_path, shape, info)
    result["program"] = {
        "file": side.path.name,
        "target": side.loaded.target.name,
        "precision": (side.loaded.program.meta or {}).get("precision"),
        "kv_quant": (side.meta.kv_quant or {}).get("quant"),
        "kv_dtype": side.meta.kv_dtype,
        "kv_block_bytes": shape.kv_bytes_per_token * shape.block,
        "policy_file": None if policy_path is None else Path(policy_path).name,
    }
    result["memory"] = memory_breakdown(side.loaded, result["kv"]["peak_bytes"])
    return result


LATENCY_KEYS = ("ttft_ms", "tpot_ms", "e2e_ms")


def _rel(base: float | None, opt: float | None) -> float | None:
    if base is None or opt is None or base == 0:
        return None
    return opt / base - 1.0


def _ratio(base: float, opt: float) -> float | None:
    return None if base == 0 else opt / base


def changes(base: dict, opt: dict) -> dict:
    """OPT against BASE: relative changes (opt / base − 1) of every latency statistic and memory
    figure, and throughput ratios (opt / base)."""
    out: dict = {}
    for key in LATENCY_KEYS:
        for stat in ("mean", "p50", "p90", "p99"):
            out[f"{key}_{stat}"] = _rel(base[key][stat], opt[key][stat])
    for key in ("weights_bytes", "kv_peak_bytes", "activation_bytes", "total_bytes"):
        out[f"memory_{key}"] = _rel(base["memory"][key], opt["memory"][key])
    for key in ("throughput_tokens_per_s", "throughput_requests_per_s"):
        out[f"{key}_ratio"] = _ratio(base[key], opt[key])
    return out


def compare(base: Side, opt: Side, workload_path: Path, policies: tuple, exact: bool, points: int, progress):
    """The comparison JSON: ``base``, ``opt`` (each a ``serve_side`` result), ``change`` and the
    seed's claims (labelled as such)."""
    check_same_model(base, opt)
    b = serve_side(base, workload_path, policies[0], exact, points, progress)
    o = serve_side(opt, workload_path, policies[1], exact, points, progress)
    return {
        "workload": b["workload"],
        "requests": b["requests"],
        "base": b,
        "opt": o,
        "change": changes(b, o),
        "seed_claims": {"note": "the seed's own figures (vs plain PyTorch), not measured here"} | SEED_CLAIMS,
    }


# -- rendering -----------------------------------------------------------------------------------


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:+.1f} %"


def _times(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _mb(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}" if n < 100 * scale else f"{n / scale:.0f} {unit}"
    return f"{n} B"


def _ms(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.3f}" if abs(x) < 10 else f"{x:.1f}"


def _side_title(r: dict) -> str:
    p = r["program"]
    kv = f", KV {p['kv_quant']}" if p["kv_quant"] else f", KV {p['kv_dtype']}"
    return f"{p['file']} ({p['precision']}{kv}) + {r['policy']}"


def rows(result: dict) -> list[tuple[str, str, str, str, str]]:
    """(metric, base, opt, change, seed claim) rows of the headline table."""
    b, o, ch = result["base"], result["opt"], result["change"]
    claims = result["seed_claims"]
    out = []
    for key, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2e_ms", "E2E latency")):
        for stat in ("mean", "p99"):
            claim = ""
            if key == "e2e_ms" and stat == "mean":
                c = claims["latency"]
                claim = f"{c['base_ms']} -> {c['opt_ms']} ms ({c['change']})"
            vals = _ms(b[key][stat]), _ms(o[key][stat]), _pct(ch[f"{key}_{stat}"])
            out.append((f"{label} {stat} (ms)", *vals, claim))
    for key, label in (
        ("weights_bytes", "weights"),
        ("kv_peak_bytes", "KV cache (peak in use)"),
        ("activation_bytes", "activations"),
        ("total_bytes", "peak NPU memory"),
    ):
        claim = ""
        if key == "total_bytes":
            c = claims["memory"]
            claim = f"{c['base_gb']} -> {c['opt_gb']} GB ({c['change']})"
        out.append((label, _mb(b["memory"][key]), _mb(o["memory"][key]), _pct(ch[f"memory_{key}"]), claim))
    c = claims["throughput"]
    out.append(
        (
            "throughput (tokens/s)",
            f"{b['throughput_tokens_per_s']:.1f}",
            f"{o['throughput_tokens_per_s']:.1f}",
            _times(ch["throughput_tokens_per_s_ratio"]),
            f"{c['base_tokens_per_s']} -> {c['opt_tokens_per_s']} TPS ({c['change']})",
        )
    )
    out.append(
        (
            "throughput (requests/s)",
            f"{b['throughput_requests_per_s']:.2f}",
            f"{o['throughput_requests_per_s']:.2f}",
            _times(ch["throughput_requests_per_s_ratio"]),
            "",
        )
    )
    return out


def render(result: dict, console) -> None:
    from rich.table import Table

    b, o = result["base"], result["opt"]
    table = Table(title=f"compare: {result['requests']} requests of {result['workload']['file']}")
    table.add_column("metric")
    console.print(f"BASE: {_side_title(b)}")
    console.print(f"OPT:  {_side_title(o)}")
    table.add_column("BASE", justify="right")
    table.add_column("OPT", justify="right")
    table.add_column("change", justify="right")
    table.add_column("seed's claim (not measured)", justify="right")
    for row in rows(result):
        table.add_row(*row)
    console.print(table)
    for name, r in (("BASE", b), ("OPT", o)):
        m, kv, cost = r["memory"], r["kv"], r["cost"]
        err = cost.get("interpolation_error")
        src = cost["mode"] + (
            f" (interpolation error: decode max {err['decode_max_rel']:.2%}, prefill max "
            f"{err['prefill_max_rel']:.2%})"
            if err
            else ""
        )
        console.print(
            f"{name}: KV peak {kv['peak_blocks']}/{kv['blocks']} blocks of {r['program']['kv_block_bytes']} "
            f"bytes; the program reserves {_mb(m['kv_pool_bytes'])} of cache globals; NPU busy "
            f"{r['npu']['busy_fraction']:.1%}, mean decode batch {r['npu']['mean_decode_batch']:.2f}; "
            f"costs: {src}"
        )


# -- the command ---------------------------------------------------------------------------------


def _command():
    import click

    from mcpc.cli_guard import GuardedCommand

    path = click.Path(path_type=Path, dir_okay=False)

    @click.command("compare", cls=GuardedCommand)
    @click.argument("base", type=click.Path(path_type=Path, dir_okay=False, exists=True))
    @click.argument("opt", type=click.Path(path_type=Path, dir_okay=False, exists=True))
    @click.option("--workload", "workload_path", required=True, type=path, help="Workload YAML for both.")
    @click.option("--policy-base", type=path, help="Policy YAML for BASE (default: continuous batching).")
    @click.option("--policy-opt", type=path, help="Policy YAML for OPT (default: continuous batching).")
    @click.option("--json", "json_path", type=path, help="Write the comparison JSON.")
    @click.option("--exact", is_flag=True, help="Simulate every step on the programs instead of cost grids.")
    @click.option(
        "--grid-points", type=click.IntRange(min=2), default=9, show_default=True,
        help="Grid points per length axis when a cost grid is measured (cached beside each program).",
    )  # fmt: skip
    def compare_command(base, opt, workload_path, policy_base, policy_opt, json_path, exact, grid_points):
        """Serve one workload on two decoder builds of a model (BASE, OPT: mcp-compile --max-seq) and
        print the headline table: latency, peak NPU memory (weights + KV + activations) and throughput,
        with the change from BASE to OPT. Every figure is measured on the simulator."""
        import json

        from mcpc.cli_guard import _stdout_console
        from mcpc.fileio import write_atomic
        from mcpc.serve.cli import _progress

        if base.resolve() == opt.resolve() and policy_base == policy_opt:
            raise UsageError(f"BASE and OPT are the same program ({base}) under the same policy")
        b, o = load_side("base", base), load_side("opt", opt)
        result = compare(b, o, workload_path, (policy_base, policy_opt), exact, grid_points, _progress)
        if json_path:
            write_atomic(json_path, json.dumps(result, indent=1) + "\n")
        render(result, _stdout_console())

    return compare_command


compare_command = _command()
