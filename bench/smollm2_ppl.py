"""SmolLM2-135M perplexity through the served path, one row per build and KV setting.

    python bench/smollm2_ppl.py [--onnx smollm2-decode.onnx] [--tokens TOKENS.npy] [--window 256]
                                [--max-seq 320] [--target mcp2026-a100] [--rows fp32,fp16,...]
                                [--work DIR] [--reuse] [--ort] [--json OUT.json] [--markdown OUT.md]

Each row is one ``mcp-compile --max-seq 320`` build of the SmolLM2 decode export
(tests/llm/export_smollm2.py, ``make llm-models``) and one ``mcpc sim eval-ppl --tokens ... --window
256 --json`` of it (4 windows of 256 tokens, prefill 16, then one decode step per token, every step
reading K/V from the cache in simulated NPU memory): fp32, fp16, W4A16 (``-c qat_w4a16``), W4A16 +
INT8 KV (``-c qat_w4a16_kv8``) and W4A16 + INT8 KV + 70 % sparsity under each policy
(``--kv-sparsity 0.7 --kv-policy P`` on top of ``qat_w4a16_kv8``).  Both commands run as
subprocesses and are timed (wall seconds, and the CPU seconds of the process, which a machine
shared with other jobs does not inflate as much, and the load average), with numpy's BLAS on one
thread (``BLAS_ENV``: the same bits, and no threads spinning against other work).

Columns: perplexity; its change against ONNX Runtime fp32 on the same windows (the recorded
reference of tests/llm/test_reference_data.py for the default tokens, or ``--ort`` to recompute it
with tests/llm/ort_greedy.py); its change against the same build without the KV setting (INT8 KV
against W4A16, a sparsity policy against W4A16 + INT8 KV); peak ``kv_bytes`` (stored bytes for a
compressed cache, whole 64-token blocks otherwise) and how many times smaller it is than that
base's; cycles per decode token on the target; eval and build wall time.  SmolLM2's weights come
from a Q4_1 GGUF (embedding Q8_0): the "fp32" and "fp16" builds carry those 4-bit-rounded weights.

``--work DIR`` (default out/smollm2_ppl) keeps each row's .mcpb, eval JSON and timings; with
``--reuse`` a row whose files are there (from the same commands) is not run again, so the table
can be assembled from rows measured one at a time.  ``--rows`` selects rows by key.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TOKENS = ROOT / "tests" / "data" / "apache-2.0.smollm2.4x256.npy"
WEIGHTS_NOTE = (
    "SmolLM2-135M-Instruct comes as a GGUF file with Q4_1 weights (embedding Q8_0): the fp32 and fp16 "
    "builds carry those 4-bit-rounded weights, so W4A16 re-quantizes weights that were 4-bit already."
)
# key, label, mcp-compile flags, the row it is compared to for "vs same build without it"
ROWS = [
    ("fp32", "fp32", ["-c", "fp32"], None),
    ("fp16", "fp16 (Q4_1 weights)", ["-c", "fp16"], None),
    ("w4a16", "W4A16", ["-c", "qat_w4a16"], None),
    ("w4a16_kv8", "W4A16 + INT8 KV", ["-c", "qat_w4a16_kv8"], "w4a16"),
    *[
        (f"kv8_sp70_{p}", f"W4A16 + INT8 KV + 70 % {p}",
         ["-c", "qat_w4a16_kv8", "--kv-sparsity", "0.7", "--kv-policy", p], "w4a16_kv8")
        for p in ("topk_magnitude", "topk_entropy", "heavy_hitter")
    ],
]  # fmt: skip


def default_onnx() -> Path:
    """smollm2-decode.onnx in the export's cache ($MCPC_SMOLLM2_DIR, else $XDG_CACHE_HOME/mcpc/smollm2)."""
    if os.environ.get("MCPC_SMOLLM2_DIR"):
        return Path(os.environ["MCPC_SMOLLM2_DIR"]) / "smollm2-decode.onnx"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "mcpc" / "smollm2" / "smollm2-decode.onnx"


# BLAS on one thread: numpy's OpenBLAS threads spin against other work on a shared machine (a 1 x 576 x
# 1536 product took 63 ms on two threads at a load average of 11, 0.6 ms on one); its float32 products
# split rows and columns across threads, never k, so one thread gives the same bits.
BLAS_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


def _timed(cmd: list[str], log: Path) -> dict:
    """Run ``cmd`` (stdout and stderr to ``log``); its wall and CPU seconds and the machine's
    1-minute load average when it started and ended (other jobs slow a row).  Exits with the
    command's status and the end of its log when it fails."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = os.getloadavg()[0]
    t = time.perf_counter()
    with log.open("w") as f:
        env = {**os.environ, **BLAS_ENV}
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, check=False, env=env).returncode
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if rc:
        tail = log.read_text(errors="replace").strip().splitlines()[-5:]
        sys.exit(f"smollm2_ppl: `{' '.join(cmd)}` failed (exit {rc}):\n" + "\n".join(tail))
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    loads = [round(load, 1), round(os.getloadavg()[0], 1)]  # 1-minute load average at start and end
    return {"command": cmd, "env": BLAS_ENV, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
            "load_avg": loads}  # fmt: skip


def run_row(key: str, flags: list[str], args: argparse.Namespace) -> dict:
    """Build and evaluate one row (or reuse its recorded files); the row's record."""
    work: Path = args.work
    prog, record_path = work / f"{key}.mcpb", work / f"{key}.json"
    build_cmd = [str(BIN / "mcp-compile"), str(args.onnx), *flags, "--max-seq", str(args.max_seq),
                 "--target", args.target, "-o", str(prog)]  # fmt: skip
    eval_json = work / f"{key}.eval.json"
    eval_cmd = [str(BIN / "mcpc"), "sim", "eval-ppl", str(prog), "--tokens", str(args.tokens),
                "--window", str(args.window), "--json", str(eval_json)]  # fmt: skip
    if args.reuse and record_path.exists():
        record = json.loads(record_path.read_text())
        if (
            record.get("build", {}).get("command") == build_cmd
            and record.get("eval", {}).get("command") == eval_cmd
            and record["eval"].get("env") == BLAS_ENV
        ):
            print(f"{key}: reused {record_path}", file=sys.stderr)
            return record
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip() or None  # fmt: skip
    print(f"{key}: building ...", file=sys.stderr, flush=True)
    build = _timed(build_cmd, work / f"{key}.build.log")
    print(f"{key}: built in {build['wall_s']} s; evaluating ...", file=sys.stderr, flush=True)
    ev = _timed(eval_cmd, work / f"{key}.eval.log")
    report = json.loads(eval_json.read_text())
    record = {
        "key": key, "commit": commit, "build": build, "eval": ev, "perplexity": report["perplexity"],
        "kv_bytes": report["kv_bytes"], "cycles_per_token": report["cycles_per_token"],
        "latency_us_per_token": report.get("latency_us_per_token"),
        "roofline_us_per_token": report.get("roofline_us_per_token"), "predictions": report["predictions"],
        "weight_bytes": report.get("weight_bytes"), "kv_store": report.get("kv_store"),
    }  # fmt: skip
    record_path.write_text(json.dumps(record, indent=1))
    print(f"{key}: ppl {record['perplexity']:.4f}, eval {ev['wall_s']} s", file=sys.stderr, flush=True)
    return record


def _recorded_ppl() -> float:
    """SMOLLM2_PPL of tests/llm/test_reference_data.py (read, not imported: it is a pytest module)."""
    import ast

    tree = ast.parse((ROOT / "tests" / "llm" / "test_reference_data.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "SMOLLM2_PPL" for t in node.targets):
            return float(ast.literal_eval(node.value))
    raise SystemExit("smollm2_ppl: no SMOLLM2_PPL in tests/llm/test_reference_data.py (use --ort)")


def ort_reference(args: argparse.Namespace) -> tuple[float, str]:
    """ONNX Runtime fp32's perplexity on the same windows, and where it comes from."""
    sys.path.insert(0, str(ROOT / "tests" / "llm"))
    if not args.ort and args.tokens.resolve() == TOKENS.resolve() and args.window == 256:
        return _recorded_ppl(), "recorded (tests/llm/test_reference_data.py)"
    import numpy as np
    from ort_greedy import ort_nll, perplexity

    return perplexity(
        ort_nll(args.onnx, np.load(args.tokens), args.window)
    ), "measured (tests/llm/ort_greedy.py)"


def checks(rows: dict[str, dict], ort: float) -> list[str]:
    """The acceptance figures the table is held to, each with its verdict (rows present only)."""
    out = []
    if "fp16" in rows:
        d = (rows["fp16"]["perplexity"] / ort - 1) * 100
        out.append(f"fp16 within 1 % of ONNX Runtime fp32: {d:+.2f} % ({'yes' if abs(d) <= 1 else 'NO'})")
    if "w4a16" in rows and "w4a16_kv8" in rows:
        a, b = rows["w4a16"], rows["w4a16_kv8"]
        d = (b["perplexity"] / a["perplexity"] - 1) * 100
        x = a["kv_bytes"] / b["kv_bytes"]
        out.append(f"INT8 KV costs <= 1 % perplexity against W4A16: {d:+.2f} % ({'yes' if d <= 1 else 'NO'})")
        out.append(f"INT8 KV makes kv_bytes >= 1.85x smaller: {x:.3f}x ({'yes' if x >= 1.85 else 'NO'})")
    for key, label, _, _ in ROWS:
        if key in rows:
            ev = rows[key]["eval"]
            load = "–".join(f"{x:g}" for x in ev.get("load_avg", [])) or "?"
            ok = "yes" if ev["wall_s"] <= 600 else "NO"
            out.append(f"{label}: the evaluation in <= 600 s of wall time: {ev['wall_s']:.0f} s "
                       f"at a load average of {load} ({ok})")  # fmt: skip
    return out


def markdown(result: dict) -> str:
    rows = {r["key"]: r for r in result["rows"]}
    ort = result["ort_fp32"]
    out = [
        f"SmolLM2-135M-Instruct ({Path(result['onnx']).name}), {result['windows']} windows x "
        f"{result['window']} "
        f"tokens, prefill 16, `--max-seq {result['max_seq']}`, {result['target']}; ONNX Runtime fp32 "
        f"perplexity {ort:.4f} ({result['ort_source']}). {WEIGHTS_NOTE}",
        "",
        "| build | perplexity | vs ORT fp32 | vs same build without the KV setting | kv_bytes "
        "| cycles / decode token | eval wall (CPU) | load avg | build wall (CPU) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key, label, _, base_key in ROWS:
        r = rows.get(key)
        if r is None:
            continue
        base = rows.get(base_key) if base_key else None
        rel = ""
        if base is not None:
            rel = (f"{(r['perplexity'] / base['perplexity'] - 1) * 100:+.2f} %, "
                   f"kv_bytes {base['kv_bytes'] / r['kv_bytes']:.3f}x smaller")  # fmt: skip
        ev, bd = r["eval"], r["build"]
        out.append(
            f"| {label} | {r['perplexity']:.4f} | {(r['perplexity'] / ort - 1) * 100:+.2f} % | {rel} "
            f"| {r['kv_bytes']:,} | {r['cycles_per_token']:,.0f} "
            f"| {ev['wall_s']:.0f} s ({ev['cpu_s']:.0f} s) "
            f"| {'–'.join(f'{x:g}' for x in ev.get('load_avg', [])) or '?'} "
            f"| {bd['wall_s']:.0f} s ({bd['cpu_s']:.0f} s) |"
        )
    missing = [label for key, label, _, _ in ROWS if key not in rows]
    if missing:
        out += ["", "Not measured: " + ", ".join(missing) + "."]
    verdicts = checks(rows, ort)
    if verdicts:
        out += [""] + [f"- {v}" for v in verdicts]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--onnx", type=Path, default=None, help="default: the SmolLM2 decode export's cache")
    p.add_argument("--tokens", type=Path, default=TOKENS)
    p.add_argument("--window", type=int, default=256)
    p.add_argument("--max-seq", type=int, default=320)
    p.add_argument("--target", default="mcp2026-a100")
    p.add_argument("--rows", default=",".join(k for k, *_ in ROWS), help="row keys, comma-separated")
    p.add_argument("--work", type=Path, default=ROOT / "out" / "smollm2_ppl")
    p.add_argument("--reuse", action="store_true", help="keep the rows already measured in --work")
    p.add_argument("--ort", action="store_true", help="recompute ONNX Runtime fp32's perplexity")
    p.add_argument("--json", type=Path, default=ROOT / "bench" / "smollm2_ppl.json")
    p.add_argument("--markdown", type=Path, default=ROOT / "bench" / "smollm2_ppl.md")
    args = p.parse_args(argv)
    args.onnx = args.onnx or default_onnx()
    if not args.onnx.exists():
        print(
            f"smollm2_ppl: {args.onnx} not found: run `make llm-models` (the SmolLM2 export)", file=sys.stderr
        )
        return 2
    flags = {key: f for key, _, f, _ in ROWS}
    wanted = [k.strip() for k in args.rows.split(",") if k.strip()]
    unknown = [k for k in wanted if k not in flags]
    if unknown:
        print(f"smollm2_ppl: unknown row(s) {', '.join(unknown)} (rows: {', '.join(flags)})", file=sys.stderr)
        return 2
    args.work.mkdir(parents=True, exist_ok=True)
    import numpy as np

    n = np.load(args.tokens).size // args.window
    ort, source = ort_reference(args)
    result = {"onnx": str(args.onnx.name), "tokens": args.tokens.name, "window": args.window, "windows": n,
              "max_seq": args.max_seq, "target": args.target, "ort_fp32": ort, "ort_source": source,
              "weights": WEIGHTS_NOTE, "rows": []}  # fmt: skip
    for key in wanted:
        result["rows"].append(run_row(key, flags[key], args))
        for r in result["rows"]:  # no machine paths in the written table
            for part in ("build", "eval"):
                r[part]["command"] = [Path(c).name if os.sep in c else c for c in r[part]["command"]]
        args.json.write_text(json.dumps(result, indent=1))
        args.markdown.write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
