"""Sweep MiniLM-L3 (the ``models`` extra) over every shipped QAT config x the three targets: with 1
and 2 local workers, on a local Ray instance (``make extras``), and with 2 workers interrupted halfway
then resumed; check that every run gave the same rows, and write the report of the sweep.

    .venv/bin/python bench/sweep_minilm.py [--out out/sweep] [--seq 48] [--batch 1] [--calib-samples 16]
                                           [--stages j1,j2,ray,resume,report]

The configs that quantize get the committed calibration token ids (``tests/data/minilm_calib.npz``:
289 English sentences padded to 48 tokens, so the sequence length is 48), the first
``--calib-samples`` of them (16: with all 289 one GPTQ build took 468 s on the loaded development
machine, with 16 about 50 s); accuracy is measured on the first held-out sentence of
``tests/data/minilm_eval.npz``.  The configs with a ``kv_cache:``
section give a row with the compiler's reason (KV-cache settings apply to a decoder build; MiniLM
has no KV cache).  Writes OUT/minilm_inputs.npz, OUT/minilm_calib.npz, OUT/minilm_j1.jsonl,
OUT/minilm_j2.jsonl, OUT/minilm_ray.jsonl, OUT/minilm_resumed.jsonl and OUT/minilm_sweep.html,
and prints the wall and CPU times, the load average around each run (the machine's other work
slows them all), and the report's size.  ``--stages`` runs a subset (the ``report`` stage compares
the files the others wrote): e.g. ``ray`` and ``resume`` in two processes at once.  The
interruption kills the sweep's whole process group (SIGKILL, as a cancelled CI job is) once half
the rows are written.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "real_models"))

from real_model import MINILM, dim_bindings  # noqa: E402

from mcpc.sweep import resolve_configs  # noqa: E402

CALIB = ROOT / "tests" / "data" / "minilm_calib.npz"
EVAL = ROOT / "tests" / "data" / "minilm_eval.npz"
WALL = ("compile_s", "sim_s")


def _lines(path: Path) -> int:
    return sum(1 for line in path.read_bytes().splitlines(keepends=True) if line.endswith(b"\n"))


def _comparable(path: Path) -> dict[str, str]:
    """key -> the row without its wall times, as canonical JSON."""
    out = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        for k in WALL:
            (row.get("metrics") or {}).pop(k, None)
        out[row["key"]] = json.dumps(row, sort_keys=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "sweep")
    ap.add_argument("--seq", type=int, default=48, help="48: the length of the committed calibration ids")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--calib-samples", type=int, default=16, help="calibration sentences (of 289)")
    ap.add_argument("--stages", default="j1,j2,ray,resume,report", help="comma-separated subset")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model_path = MINILM.path()
    model = onnx.load(str(model_path), load_external_data=False)
    ev = np.load(EVAL)
    if ev["input_ids"].shape[1] != args.seq:
        sys.exit(f"--seq {args.seq}: the calibration and evaluation ids are {ev['input_ids'].shape[1]} long")
    # written once: a build's key digests these files, and an .npz holds its write time
    inputs = args.out / "minilm_inputs.npz"
    if not inputs.exists():
        np.savez(inputs, **{k: np.repeat(ev[k][:1], args.batch, axis=0) for k in ev.files})
    calib = args.out / "minilm_calib.npz"
    if not calib.exists():
        cal = np.load(CALIB)
        np.savez(calib, **{k: cal[k][: args.calib_samples] for k in cal.files})
    dims = [a for k, v in dim_bindings(model, args.batch, args.seq).items() for a in ("--dim", f"{k}={v}")]
    mcpc = str(Path(sys.executable).parent / "mcpc")
    base = [mcpc, "sweep", str(model_path), *dims, "--inputs", str(inputs), "--calib", str(calib)]

    def timed(label: str, out: Path, extra: list[str]) -> None:
        load = os.getloadavg()[0]
        cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run([*base, *extra, "-o", str(out)], check=True)
        wall = time.perf_counter() - t0
        cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
        print(
            f"{label}: {wall:.1f} s wall, {cpu:.1f} s CPU of child processes (load average {load:.1f} "
            f"before, {os.getloadavg()[0]:.1f} after)",
            flush=True,
        )

    stages = set(args.stages.split(","))
    runs = {"j1": ("-j 1", ["-j", "1"]), "j2": ("-j 2", ["-j", "2"])}
    runs["ray"] = ("ray local, 2 CPUs", ["--ray-address", "local", "-j", "2"])
    files = {stage: args.out / f"minilm_{stage}.jsonl" for stage in (*runs, "resumed")}
    for stage, (label, extra) in runs.items():
        if stage in stages:
            files[stage].unlink(missing_ok=True)
            timed(label, files[stage], extra)
    total = 3 * len(resolve_configs(None))

    if "resume" in stages:  # killed once half the rows are written, then the same command again
        out = files["resumed"]
        out.unlink(missing_ok=True)
        cmd = [*base, "-j", "2", "-o", str(out)]
        proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        while proc.poll() is None and (not out.exists() or _lines(out) < total // 2):
            time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        print(f"killed with {_lines(out)} of {total} rows written", flush=True)
        timed("resumed, -j 2", out, ["-j", "2"])

    if "report" not in stages:
        return
    want = _comparable(files["j1"])
    for label, path in files.items():
        got = _comparable(path)
        same = got == want
        print(f"{label}: {len(got)} rows, {'identical to' if same else 'DIFFERENT from'} -j 1's")
        if not same:
            sys.exit(1)
    report = args.out / "minilm_sweep.html"
    subprocess.run([mcpc, "report", str(files["j2"]), "-o", str(report)], check=True)
    print(f"report: {report} ({report.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
