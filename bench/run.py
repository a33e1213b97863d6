"""mcpc benchmark: toolchain speed against ONNX Runtime and simulated performance against the roofline.

    python bench/run.py [--quick] [--repeats N] [--targets T,...] [--builds fp32,fp16]
                        [--cases NAME,...] [--no-sim-speed] [--no-quant] [-o bench/results.json]
                        [--markdown bench/results.md]

For the bundled example models (two sizes each) and the roofline probes (square matmul at array
multiples, one-row matmul, large elementwise add), on every shipped target and build, one run
measures the toolchain wall times (import, passes, backend, simulator load and run; median of
``--repeats`` after a warm-up), ONNX Runtime's CPU inference time on the same model and inputs,
the simulated cycles and roofline fractions, and the accuracy against ONNX Runtime.  It writes a
JSON document and a markdown report (both atomically) with the machine facts and the command.
Then, on MiniLM-L3 (batch 1 and 8, sequence 128) and a decoder step of SmolLM2-135M's shape
(context 256), for every build, it measures the simulator's functional and timing-only run
times against ONNX Runtime's (2 threads, best of ``--repeats``) and prints that table.  Last, on
MiniLM-L3, it times our weight quantization algorithms (RTN, MSE, AWQ, GPTQ) over every MatMul
weight against ONNX Runtime's ``MatMulNBitsQuantizer`` (``bench_quant.py``) and prints that table,
and adds the quantization accuracy table of ``make quant-eval`` (docs/quant-eval.md; not with
``--quick``, ``--cases`` or ``--no-quant``).

Exit codes: 0 done, 2 usage error, and the ``mcpc.errors`` code of any toolchain error.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the bench_* modules beside this script

from bench_cases import SIM_SPEED_TARGET, model_cases, probe_cases, sim_speed_cases  # noqa: E402
from bench_measure import measure_case, measure_sim_speed  # noqa: E402
from bench_quant import measure_quant  # noqa: E402
from bench_report import (  # noqa: E402
    compile_pass_table,
    machine_facts,
    quant_table,
    render_markdown,
    sim_speed_table,
)

from mcpc.arch.target import list_targets, load_target  # noqa: E402
from mcpc.driver import load_qat_config, write_atomic  # noqa: E402
from mcpc.errors import McpcError, UsageError  # noqa: E402

HERE = Path(__file__).resolve().parent
BUILDS = ("fp32", "fp16")
SCHEMA = 4  # 2: sim_speed, 3: quant, 4: quant_accuracy


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/run.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes only (under a minute on 2 cores)")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats per case (median; default 5)")
    p.add_argument("--targets", type=_csv, default=None, help="comma-separated targets (default: shipped)")
    p.add_argument("--builds", type=_csv, default=list(BUILDS), help="comma-separated QAT configs")
    p.add_argument("--cases", type=_csv, default=None, help="only these cases (e.g. mlp,square_matmul,quant)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--no-sim-speed", action="store_true", help="skip the simulator-vs-ONNX Runtime speed table"
    )
    p.add_argument("--no-quant", action="store_true", help="skip the quantization speed and accuracy tables")
    p.add_argument("-o", "--output", type=Path, default=HERE / "results.json", help="JSON results path")
    p.add_argument("--markdown", type=Path, default=None, help="markdown path (default: OUTPUT with .md)")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error(f"--repeats must be at least 1, got {args.repeats}")
    for path in (args.output, args.markdown):
        if path is not None and not path.parent.is_dir():
            p.error(f"{path}: directory {str(path.parent)!r} does not exist")
    return args


def plan(args: argparse.Namespace) -> list[tuple]:
    """(case, target name, build) triples in run order; McpcError for an unknown target or build."""
    targets = [load_target(t) for t in args.targets] if args.targets else list_targets()
    builds = [load_qat_config(b) for b in args.builds]
    runs = []
    for target in targets:
        for build in builds:
            # probes in the build's activation dtype when ONNX has it natively, else f32
            act = build.precision.activations if build.precision.activations in ("f16", "f32") else "f32"
            cases = model_cases(args.quick) + probe_cases(target, act, args.quick)
            runs += [(c, target.name, build.name) for c in cases if not args.cases or c.name in args.cases]
    return runs


def plan_sim_speed(args: argparse.Namespace) -> list[tuple]:
    """(case, target name, build) triples of the simulator speed table (``SIM_SPEED_TARGET``)."""
    if args.no_sim_speed:
        return []
    builds = [load_qat_config(b).name for b in args.builds]
    cases = [c for c in sim_speed_cases(args.quick) if not args.cases or c.name in args.cases]
    return [(c, SIM_SPEED_TARGET, b) for c in cases for b in builds]


def measure_quant_accuracy(args: argparse.Namespace, log=sys.stderr) -> dict | None:
    """The quantization accuracy report of ``make quant-eval`` (tests/quant/minilm_eval.py: MiniLM,
    every shipped quantization config against ONNX Runtime fp32 and its 4-bit quantizer), or None
    for a ``--quick``, ``--cases`` or ``--no-quant`` run; ``{"skipped": why}`` without MiniLM."""
    if args.no_quant or args.quick or args.cases:
        return None
    sys.path.insert(0, str(HERE.parent / "tests" / "quant"))
    import minilm_eval

    try:
        minilm_eval.MINILM.path()
    except LookupError as exc:
        print(f"[quant] skipped: {exc}", file=log, flush=True)
        return {"skipped": str(exc)}
    t = time.perf_counter()
    report = minilm_eval.run()
    print(f"[quant] MiniLM accuracy, {len(report['rows'])} rows ({time.perf_counter() - t:.1f} s)", file=log)
    return report


def run(args: argparse.Namespace, command: str, log=sys.stderr) -> dict:
    """Measure every planned case and return the JSON document (not yet written)."""
    runs, speed_runs = plan(args), plan_sim_speed(args)
    want_quant = not args.no_quant and (not args.cases or "quant" in args.cases)
    if not runs and not speed_runs and not want_quant:
        raise UsageError(f"no case matches --cases {','.join(args.cases or [])}")
    # Other processes on the machine inflate wall times: the load average says how busy it was.
    load_before = os.getloadavg()
    start = time.perf_counter()
    results = []
    with tempfile.TemporaryDirectory(prefix="mcpc-bench-") as tmp:
        for i, (case, target, build) in enumerate(runs, 1):
            t = time.perf_counter()
            r = measure_case(case, target, build, Path(tmp), args.repeats, args.seed)
            results.append(r)
            s = r["sim"]
            print(
                f"[{i}/{len(runs)}] {case.name} {case.size} {target} {build}: {s['cycles']:,} cycles, "
                f"{s['roof_pct']:.1f} % of roof ({s['bound']}), sim/ORT {r['sim_over_ort']:.1f}x, "
                f"err {r['accuracy']['norm_max_err']:.1e} ({time.perf_counter() - t:.1f} s)",
                file=log,
                flush=True,
            )
        speed = []
        for i, (case, target, build) in enumerate(speed_runs, 1):
            t = time.perf_counter()
            r = measure_sim_speed(case, target, build, Path(tmp), args.repeats, args.seed)
            speed.append(r)
            print(
                f"[speed {i}/{len(speed_runs)}] {case.name} {case.size} {build}: sim/ORT "
                f"{r['sim_over_ort']:.2f}x, timing-only/ORT {r['timing_only_over_ort']:.3f}x "
                f"({time.perf_counter() - t:.1f} s)",
                file=log,
                flush=True,
            )
        quant = None
        if want_quant:
            t = time.perf_counter()
            quant = measure_quant(
                repeats=min(args.repeats, 3), n_seq=32 if args.quick else 256, seed=args.seed
            )
            print(
                f"[quant] MiniLM-L3 weight quantization ({time.perf_counter() - t:.1f} s)",
                file=log,
                flush=True,
            )
        quant_accuracy = measure_quant_accuracy(args, log)
    return {
        "schema": SCHEMA,
        "command": command,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "wall_s": time.perf_counter() - start,
        "load_average": {"before": list(load_before), "after": list(os.getloadavg())},
        "repeats": args.repeats,
        "quick": args.quick,
        "facts": machine_facts(),
        "results": results,
        "sim_speed": speed,
        "quant": quant,
        "quant_accuracy": quant_accuracy,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    command = shlex.join(["python", "bench/run.py", *argv])
    try:
        doc = run(args, command)
    except McpcError as exc:
        print(f"bench/run.py: error: {exc.message}", file=sys.stderr)
        return exc.exit_code
    markdown = args.markdown or args.output.with_suffix(".md")
    write_atomic(args.output, json.dumps(doc, indent=1, sort_keys=True) + "\n")
    text = render_markdown(doc)
    accuracy = doc["quant_accuracy"]
    if accuracy and "rows" in accuracy:
        from mcpc.quant_eval import render as render_quant

        text += "\n## Quantization accuracy (make quant-eval)\n\n" + render_quant(accuracy) + "\n"
        if accuracy.get("missing"):
            text += f"\nnot shipped (not measured): {', '.join(accuracy['missing'])}\n"
    write_atomic(markdown, text)
    if doc["sim_speed"]:
        print("\n".join(sim_speed_table(doc["sim_speed"])))
    if doc["quant"]:
        print("\n".join(quant_table(doc["quant"])))
        if doc["quant"].get("compile_passes"):
            print("\n".join(compile_pass_table(doc["quant"]["compile_passes"])))
    print(f"wrote {args.output} and {markdown} ({doc['wall_s']:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
