"""Measure the shipped MiniLM export through the user's commands and print a Markdown table.

    .venv/bin/python tests/real_models/measure_minilm.py [--batch 1] [--seq 128] [--targets ...]

For each target and build (fp32, fp16) it runs, as separate processes, ``mcp-compile`` (wall time),
``mcpc sim run --profile-json`` (wall time, simulated cycles and latency) and ``mcpc check --json``
(per output: normalized max error and cosine against ONNX Runtime), on the realistic padded inputs
of ``real_model.realistic_inputs``.  This is the command behind the figures in
docs/real_models.md.  Exits 1 when any check fails.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from real_model import MINILM, dim_bindings, realistic_inputs

BIN = Path(sys.executable).parent
TARGETS = ("mcp2026-a100", "mcp2026-a10", "mcp2026-edge")


def _timed(*args: str) -> float:
    start = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--targets", nargs="+", default=list(TARGETS))
    args = ap.parse_args()
    try:
        path = MINILM.path()
    except LookupError as e:
        raise SystemExit(str(e)) from None
    model = onnx.load(str(path), load_external_data=False)
    dims = [a for k, v in dim_bindings(model, args.batch, args.seq).items() for a in ("--dim", f"{k}={v}")]
    watched = [o.name for o in model.graph.output if o.type.tensor_type.elem_type == onnx.TensorProto.FLOAT]
    print(f"MiniLM ({path.name}), batch {args.batch}, sequence {args.seq}\n")
    print(
        "| target | build | compile s | sim s | cycles | latency µs | "
        + " | ".join(f"`{n}` norm max err / cosine" for n in watched)
        + " | check |"
    )
    print("|---" * (7 + len(watched)) + "|")
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        feeds = Path(tmp) / "inputs.npz"
        np.savez(feeds, **realistic_inputs(model, args.batch, args.seq))
        for target in args.targets:
            for config in ("fp32", "fp16"):
                prog, prof, rep = (
                    Path(tmp) / f"{target}-{config}{s}" for s in (".mcpb", ".prof.json", ".json")
                )
                t_compile = _timed(
                    str(BIN / "mcp-compile"), "--target", target, "--qat-config", config, *dims,
                    "-o", str(prog), str(path),
                )  # fmt: skip
                t_sim = _timed(
                    str(BIN / "mcpc"),
                    "sim",
                    "run",
                    str(prog),
                    "--inputs",
                    str(feeds),
                    "--profile-json",
                    str(prof),
                )
                _timed(
                    str(BIN / "mcpc"),
                    "check",
                    str(path),
                    str(prog),
                    "--inputs",
                    str(feeds),
                    "--json",
                    str(rep),
                )
                p, r = json.loads(prof.read_text()), json.loads(rep.read_text())
                outs = {o["name"]: o for o in r["outputs"]}
                cells = [f"{outs[n]['norm_max_err']:.2e} / {outs[n]['cosine']:.7f}" for n in watched]
                ok &= bool(r["passed"])
                print(
                    f"| {target} | {config} | {t_compile:.1f} | {t_sim:.1f} | {p['cycles']:,} | "
                    f"{p['latency_us']:,.1f} | "
                    + " | ".join(cells)
                    + f" | {'pass' if r['passed'] else 'FAIL'} |",
                    flush=True,
                )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
