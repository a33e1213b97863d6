"""The serving tables of SmolLM2-135M on mcp2026-a100 (docs/serving.md, "SmolLM2 on mcp2026-a100").

    python bench/serve_headline.py [--out out/serve-headline] [--markdown bench/serve_headline.md]
                                   [--workload examples/serve/headline.yaml] [--no-consistency]

From the cached decode export of ``make llm-models`` (``smollm2-decode.onnx``, in ``$MCPC_SMOLLM2_DIR``
or ``~/.cache/mcpc/smollm2``; never re-exported here) it builds two decoder programs with
``mcp-compile --max-seq 1024 --max-batch 16`` (the KV pool left at its default, 16 x 16 blocks: every
sequence of a full batch can reach max_seq): fp16 (``fp16.yaml``) and W4A16 + INT8 KV
(``qat_w4a16_kv8.yaml``).  A build is reused when the program is newer than the export (delete
``--out`` to rebuild).  Then, each a ``mcpc`` command timed by wall clock:

1. ``mcpc sim serve`` of the fp16 build under static batching and under continuous batching (the
   first run measures the build's cost grid, cached beside the program);
2. ``mcpc compare`` fp16 + static against W4A16 + INT8 KV + continuous: the headline table (the
   W4A16 build's cost grid measured on its first run, 5 points per axis);
3. the consistency check: one request (a 100-token prompt, 8 output tokens) at batch 1 through
   ``sim serve --exact`` and through the cost grid against ``mcpc sim generate`` on the fp16 build.

It writes every JSON under ``--out`` and the tables as markdown (``--markdown``).  Without the export
it prints the one-line reason and exits 0 (``make bench`` runs it only when the export exists).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
MAX_SEQ, MAX_BATCH = 1024, 16
BUILDS = {"fp16": "fp16", "w4a16_kv8": "qat_w4a16_kv8"}
POLICIES = ROOT / "examples" / "serve"
STATIC, CONTINUOUS = POLICIES / "static16.yaml", POLICIES / "headline_continuous.yaml"


def export_path() -> Path:
    """The cached decode export (tests/llm/export_smollm2.py's cache_dir)."""
    if os.environ.get("MCPC_SMOLLM2_DIR"):
        base = Path(os.environ["MCPC_SMOLLM2_DIR"])
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mcpc" / "smollm2"
    return base / "smollm2-decode.onnx"


def sh(*args) -> float:
    """Run one toolchain command (stdout passed through); its wall time in seconds."""
    cmd = [str(a) for a in args]
    print("$", " ".join(Path(cmd[0]).name if i == 0 else c for i, c in enumerate(cmd)), flush=True)
    t = time.perf_counter()
    res = subprocess.run(cmd, cwd=ROOT)
    if res.returncode:
        sys.exit(res.returncode)
    return time.perf_counter() - t


def build(onnx: Path, out: Path, name: str, config: str) -> tuple[Path, float | None]:
    prog = out / f"smollm2-{name}.mcpb"
    if prog.exists() and prog.stat().st_mtime > onnx.stat().st_mtime:
        return prog, None
    secs = sh(BIN / "mcp-compile", onnx, "-c", config, "--max-seq", MAX_SEQ, "--max-batch", MAX_BATCH,
              "-o", prog)  # fmt: skip
    return prog, secs


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def _f(x: float, digits: int = 1) -> str:
    return f"{x:,.{digits}f}"


def serve_table(runs: dict) -> list[str]:
    lines = [
        "| policy | tokens/s | requests/s | TTFT mean / P99 (ms) | TPOT mean / P99 (ms) "
        "| E2E mean / P99 (ms) | mean decode batch | NPU busy | peak KV blocks | wall time |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, (r, secs) in runs.items():
        lines.append(
            f"| {name} | {_f(r['throughput_tokens_per_s'])} | {r['throughput_requests_per_s']:.2f} "
            f"| {_f(r['ttft_ms']['mean'])} / {_f(r['ttft_ms']['p99'])} "
            f"| {r['tpot_ms']['mean']:.3f} / {r['tpot_ms']['p99']:.3f} "
            f"| {_f(r['e2e_ms']['mean'])} / {_f(r['e2e_ms']['p99'])} "
            f"| {r['npu']['mean_decode_batch']:.2f} | {r['npu']['busy_fraction']:.1%} "
            f"| {r['kv']['peak_blocks']}/{r['kv']['blocks']} | {secs:.0f} s |"
        )
    return lines


def compare_table(result: dict) -> list[str]:
    sys.path.insert(0, str(ROOT))
    from mcpc.serve.compare import rows

    lines = ["| metric | BASE | OPT | change | seed's claim (not measured) |", "|---|---|---|---|---|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows(result)]
    return lines


def grid_error(r: dict) -> str:
    e = (r.get("cost") or {}).get("interpolation_error") or {}
    if not e:
        return "-"
    return (
        f"decode max {e['decode_max_rel']:.2%} (mean {e['decode_mean_rel']:.2%}), prefill max "
        f"{e['prefill_max_rel']:.2%} (mean {e['prefill_mean_rel']:.2%}) at {e['checked_points']} cell centres"
    )


def consistency(prog: Path, out: Path) -> tuple[list[str], dict]:
    import numpy as np

    prompt = (np.arange(100) * 37 + 11) % 49152
    np.save(out / "one.npy", prompt)
    (out / "one.jsonl").write_text(
        json.dumps({"arrival_s": 0.0, "prompt_tokens": prompt.tolist(), "output_len": 8}) + "\n"
    )
    (out / "one.yaml").write_text("arrival: {process: trace, path: one.jsonl}\n")
    t_gen = sh(BIN / "mcpc", "sim", "generate", prog, "--prompt-ids", out / "one.npy", "--max-new-tokens", 8,
               "--json", out / "one-generate.json")  # fmt: skip
    t_exact = sh(BIN / "mcpc", "sim", "serve", prog, "--workload", out / "one.yaml", "--exact",
                 "--json", out / "one-exact.json")  # fmt: skip
    t_grid = sh(BIN / "mcpc", "sim", "serve", prog, "--workload", out / "one.yaml",
                "--json", out / "one-grid.json")  # fmt: skip
    gen, exact, grid = (load(out / f"one-{k}.json") for k in ("generate", "exact", "grid"))
    rel = lambda a, b: abs(a - b) / b  # noqa: E731
    mean = lambda r, t: {"ttft_ms": r["ttft_ms"]["mean"], "tpot_ms": r["tpot_ms"]["mean"], "wall_s": t}  # noqa: E731
    facts = {
        "generate": {"ttft_ms": gen["ttft_ms"], "tpot_ms": gen["tpot_ms"], "wall_s": t_gen},
        "exact": mean(exact, t_exact),
        "grid": mean(grid, t_grid),
        "grid_error": (grid.get("cost") or {}).get("interpolation_error"),
    }
    lines = [
        "| source | TTFT (ms) | TPOT (ms) | vs generate (TTFT / TPOT) | wall time |",
        "|---|---|---|---|---|",
        f"| `mcpc sim generate` | {gen['ttft_ms']:.5f} | {gen['tpot_ms']:.5f} | - | {t_gen:.0f} s |",
    ]
    for name, r in (("`sim serve --exact`", facts["exact"]), ("`sim serve` (cost grid)", facts["grid"])):
        lines.append(
            f"| {name} | {r['ttft_ms']:.5f} | {r['tpot_ms']:.5f} | {rel(r['ttft_ms'], gen['ttft_ms']):.3%} / "
            f"{rel(r['tpot_ms'], gen['tpot_ms']):.3%} | {r['wall_s']:.0f} s |"
        )
    return lines, facts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "serve-headline")
    ap.add_argument("--markdown", type=Path, default=ROOT / "bench" / "serve_headline.md")
    ap.add_argument("--workload", type=Path, default=POLICIES / "headline.yaml")
    ap.add_argument("--no-consistency", action="store_true", help="skip the one-request check")
    args = ap.parse_args(argv)

    onnx = export_path()
    if not onnx.exists():
        print(f"serve_headline: skipped, no SmolLM2 decode export at {onnx} (make llm-models)")
        return 0
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    progs, build_s = {}, {}
    for name, config in BUILDS.items():
        progs[name], build_s[name] = build(onnx, out, name, config)

    fp16 = progs["fp16"]
    runs = {}
    for label, policy in (("static (batch 16)", STATIC), ("continuous", CONTINUOUS)):
        js = out / f"fp16-{policy.stem}.json"
        secs = sh(BIN / "mcpc", "sim", "serve", fp16, "--workload", args.workload, "--policy", policy,
                  "--json", js)  # fmt: skip
        runs[label] = (load(js), secs)

    js = out / "compare.json"
    t_cmp = sh(BIN / "mcpc", "compare", fp16, progs["w4a16_kv8"], "--workload", args.workload,
               "--policy-base", STATIC, "--policy-opt", CONTINUOUS, "--grid-points", 5,
               "--json", js)  # fmt: skip
    cmp = load(js)

    md = [
        "# SmolLM2-135M served on mcp2026-a100 (bench/serve_headline.py)",
        "",
        f"Builds: `mcp-compile smollm2-decode.onnx --max-seq {MAX_SEQ} --max-batch {MAX_BATCH}` with "
        "`-c fp16` and `-c qat_w4a16_kv8`; build wall times: "
        + ", ".join(f"{k} {'cached' if v is None else f'{v:.0f} s'}" for k, v in build_s.items())
        + f". Workload `{args.workload.name}`.",
        "",
        "## Continuous vs static batching (fp16 build)",
        "",
        *serve_table(runs),
        "",
        f"Cost grid of the fp16 build: {grid_error(runs['continuous'][0])}.",
        "",
        "## mcpc compare: fp16 + static vs W4A16 + INT8 KV + continuous",
        "",
        *compare_table(cmp),
        "",
        f"Wall time {t_cmp:.0f} s. W4A16 + INT8 KV cost grid: {grid_error(cmp['opt'])}.",
    ]
    if not args.no_consistency:
        lines, facts = consistency(fp16, out)
        (out / "consistency.json").write_text(json.dumps(facts, indent=1) + "\n")
        md += ["", "## One request at batch 1: sim serve against sim generate (fp16 build)", "", *lines]
    args.markdown.write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
