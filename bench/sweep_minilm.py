"""Sweep MiniLM-L3 (the ``models`` extra) over every shipped QAT config x the three targets with 1 and
2 local workers, time both, and write the report of the sweep.

    .venv/bin/python bench/sweep_minilm.py [--out out/sweep] [--seq 128] [--batch 1]

Writes OUT/minilm_inputs.npz (realistic padded token ids, tests/real_models/real_model.py),
OUT/minilm_j1.jsonl, OUT/minilm_j2.jsonl and OUT/minilm_sweep.html, and prints the wall and CPU times,
the load average around each run (the machine's other work slows both), and the report's size.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "real_models"))

from real_model import MINILM, dim_bindings, realistic_inputs  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "sweep")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model_path = MINILM.path()
    model = onnx.load(str(model_path), load_external_data=False)
    inputs = args.out / "minilm_inputs.npz"
    np.savez(inputs, **realistic_inputs(model, args.batch, args.seq))
    dims = [a for k, v in dim_bindings(model, args.batch, args.seq).items() for a in ("--dim", f"{k}={v}")]
    mcpc = str(Path(sys.executable).parent / "mcpc")
    for jobs in (1, 2):
        out = args.out / f"minilm_j{jobs}.jsonl"
        out.unlink(missing_ok=True)
        load = os.getloadavg()[0]
        cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        cmd = [
            mcpc,
            "sweep",
            str(model_path),
            *dims,
            "--inputs",
            str(inputs),
            "-j",
            str(jobs),
            "-o",
            str(out),
        ]
        subprocess.run(cmd, check=True)
        wall = time.perf_counter() - t0
        cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
        print(
            f"-j {jobs}: {wall:.1f} s wall, {cpu:.1f} s CPU (load average {load:.1f} before, "
            f"{os.getloadavg()[0]:.1f} after)"
        )
    report = args.out / "minilm_sweep.html"
    subprocess.run([mcpc, "report", str(args.out / "minilm_j2.jsonl"), "-o", str(report)], check=True)
    print(f"report: {report} ({report.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
