"""Machine facts and the markdown rendering of a benchmark run.

``machine_facts()`` records what the numbers depend on (CPU, cores, library versions, BLAS and
ONNX Runtime threads, the OpenBLAS environment variables, which it reads and never changes).
``render_markdown(results)`` turns the JSON document into tables; it reads only that document.
"""

from __future__ import annotations

import ctypes
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np

# Environment variables that change BLAS or ONNX Runtime speed: recorded as found, never set.
ENV_KEYS = (
    "OPENBLAS_CORETYPE",
    "OPENBLAS_L2_SIZE",
    "OPENBLAS_NUM_THREADS",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _blas() -> dict:
    """numpy's BLAS: name, version, build configuration and (OpenBLAS) its thread count and core."""
    info: dict = {}
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        info = {k: blas.get(k) for k in ("name", "version", "openblas configuration") if blas.get(k)}
    except (KeyError, TypeError):
        pass
    try:  # the loaded OpenBLAS library, found through this process's memory map
        with open("/proc/self/maps") as f:
            libs = sorted({ln.split()[-1] for ln in f if "openblas" in ln.lower() and ".so" in ln})
    except OSError:
        libs = []
    for path in libs:
        lib = ctypes.CDLL(path)
        for prefix, suffix in (("scipy_", "64_"), ("", "64_"), ("", "")):
            get_threads = getattr(lib, f"{prefix}openblas_get_num_threads{suffix}", None)
            if get_threads is None:
                continue
            info["threads"] = int(get_threads())
            corename = getattr(lib, f"{prefix}openblas_get_corename{suffix}", None)
            if corename is not None:
                corename.restype = ctypes.c_char_p
                info["core"] = corename().decode()
            return info
    return info


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def machine_facts() -> dict:
    """What the wall times depend on, JSON-ready."""
    import onnx
    import onnxruntime as ort

    import mcpc

    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "usable_cores": usable,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": ort.__version__,
        "onnxruntime_threads": "default (intra-op pool sized by ONNX Runtime, one per core)",
        "mcpc": mcpc.__version__,
        "git_commit": _git_commit(),
        "blas": _blas(),
        "env": {k: os.environ.get(k) for k in ENV_KEYS},
        "executable": Path(sys.executable).name,
    }


def _ms(s: float) -> str:
    return f"{s * 1e3:.1f}" if s >= 1e-3 else f"{s * 1e3:.3f}"


def _bytes(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _row(cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _table(header, rows) -> list[str]:
    aligns = ["---" if i < 4 else "---:" for i in range(len(header))]
    return [_row(header), _row(aligns), *(_row(r) for r in rows)]


def render_markdown(doc: dict) -> str:
    """A markdown report of ``doc`` (the benchmark JSON): facts, simulated roofline, toolchain speed."""
    facts, res = doc["facts"], doc["results"]
    blas = facts.get("blas", {})
    env = ", ".join(f"{k}={v}" for k, v in facts["env"].items() if v is not None) or "none set"
    lines = [
        "# mcpc benchmark",
        "",
        f"Command: `{doc['command']}`  ",
        f"Date: {doc['date']} · total wall time {doc['wall_s']:.0f} s · repeats {doc['repeats']} "
        "(median; one warm-up pass excluded)",
        "",
        f"Machine: {facts['cpu_model']}, {facts['usable_cores']} usable cores "
        f"({facts['cpu_count']} online) · Python {facts['python']} · numpy {facts['numpy']} "
        f"(BLAS {blas.get('name', '?')} {blas.get('version', '')}, {blas.get('threads', '?')} threads, "
        f"core {blas.get('core', '?')}) · onnxruntime {facts['onnxruntime']} · onnx {facts['onnx']} · "
        f"mcpc {facts['mcpc']} ({facts.get('git_commit') or 'no git'})  ",
        f"Environment: {env}  ",
        "Load average (1/5/15 min) before / after the run: "
        + " / ".join(" ".join(f"{x:.2f}" for x in doc["load_average"][k]) for k in ("before", "after")),
        "",
        "## Simulated performance and accuracy",
        "",
        "MAC % and DRAM % are the achieved rates as a fraction of the target's peaks (the roofline);",
        "`bound` is the profile's verdict (`latency` = more than twice the larger roof).  Error is",
        "max|y − r| / max|r| against ONNX Runtime (graph optimizations off).",
        "",
    ]
    header = ["case", "size", "target", "build", "cycles", "latency µs", "MAC %", "DRAM %", "bound"]
    header += ["DRAM bytes", "peak SRAM", "top node (share)", "norm max err", "cosine"]
    rows = []
    for r in res:
        s, a = r["sim"], r["accuracy"]
        top = s["top_nodes"][0] if s["top_nodes"] else None
        rows.append(
            [r["case"], r["size"], r["target"], r["build"], f"{s['cycles']:,}", f"{s['latency_us']:.1f}"]
            + [f"{s['mac_pct_of_peak']:.1f}", f"{s['dram_pct_of_peak']:.1f}", s["bound"]]
            + [_bytes(s["dram_bytes"]), _bytes(s["peak_sram_bytes"])]
            + [f"{top['op_type']} {top['name']} ({top['share']:.0%})" if top else "-"]
            + [f"{a['norm_max_err']:.2e}", f"{a['cosine']:.6f}"]
        )
    lines += _table(header, rows)
    lines += [
        "",
        "## Toolchain speed",
        "",
        "Wall times in ms (median).  `sim/ORT` = simulator run time / ONNX Runtime CPU inference time",
        "of the same model on the same inputs: how much slower simulating it is than running it here.",
        "",
    ]
    header = ["case", "size", "target", "build", "import", "passes", "backend", "sim load", "sim run"]
    header += ["sim instr/s", "ORT", "sim/ORT"]
    rows = []
    for r in res:
        t = r["toolchain"]
        rows.append(
            [r["case"], r["size"], r["target"], r["build"]]
            + [_ms(t[k]) for k in ("import_s", "passes_s", "backend_s", "sim_load_s", "sim_run_s")]
            + [f"{t['sim_instructions_per_s']:,.0f}", _ms(r["ort"]["median_s"]), f"{r['sim_over_ort']:.1f}×"]
        )
    lines += _table(header, rows)
    if doc.get("sim_speed"):
        lines += [
            "",
            "## Simulator speed against ONNX Runtime",
            "",
            "Best of the repeats, warm and in-process (program load and the first run, which prepares",
            "the program's machine, excluded; ONNX Runtime with 2 intra-op threads, session creation",
            "excluded), same model and inputs.  `sim/ORT`: functional simulation; `timing/ORT`:",
            "timing-only simulation (same cycles, no values).  Error: the functional outputs against",
            "ONNX Runtime (max over outputs of max|y − r| / max|r|).",
            "",
            *sim_speed_table(doc["sim_speed"]),
        ]
    if doc.get("quant"):
        q = doc["quant"]
        lines += [
            "",
            f"## Weight quantization speed ({q['model']})",
            "",
            f"All {q['layers']} MatMul weights ({q['weights']:,} parameters), int4, groups of 32 along K;",
            "wall time of the algorithm alone over every weight (best of `runs`, one warm-up excluded",
            "when a run is under 2 s; `CPU ms`: the process's CPU time in that run, all threads),",
            "against ONNX Runtime's `MatMulNBitsQuantizer.process()` on the",
            f"same model (same symmetry).  AWQ and GPTQ read input statistics of {q['calibration_tokens']:,}",
            f"calibration tokens, gathered once in {q['calibration_s']:.1f} s (not in their rows).",
            "`output err` = calibration output error trace(ΔWᵀHΔW) summed over the layers, relative",
            "to RTN with the same scales: what AWQ and GPTQ minimise.  `cosine`: mean per-sequence",
            f"cosine of output `{q['eval_output']}` against the f32 model on {q['eval_samples']} held-out",
            "sequences (random token ids, not English), run by ONNX Runtime.",
            "",
            *quant_table(q),
        ]
        if q.get("compile_passes"):
            lines += [
                "",
                "The same work inside the compiler: the quantization passes' own time in `mcpc.compile` of",
                "MiniLM-L3 (batch 1, 48 tokens) with `qat_w4a16.yaml` (symmetric) and each algorithm (the",
                "compile reports per-pass times; one warm-up compile excluded, fastest of `runs`), against",
                "ONNX Runtime's symmetric `MatMulNBitsQuantizer` above.  AWQ and GPTQ include gathering",
                "their statistics from the 289 committed calibration sentences.",
                "",
                *compile_pass_table(q["compile_passes"]),
            ]
    return "\n".join(lines) + "\n"


def compile_pass_table(rows: list[dict]) -> list[str]:
    """The quantization passes' compile-time table as markdown lines."""
    header = ["algorithm", "calibrated", "runs", "quantize-weights ms", "all quant passes ms", "vs ORT"]
    body = [
        [r["algorithm"], "yes" if r["calibrated"] else "no", r["runs"], _ms(r["quantize_weights_s"])]
        + [_ms(r["seconds"]), f"{r['over_ort']:.2f}×"]
        for r in rows
    ]
    return _table(header, body)


def quant_table(q: dict) -> list[str]:
    """The weight quantization speed table as markdown lines."""
    header = ["algorithm", "spec", "runs", "time ms", "CPU ms", "vs ORT", "bits/weight", "output err"]
    header += ["cosine"]
    rows = [
        [r["algorithm"], r["spec"], r["runs"], _ms(r["seconds"]), _ms(r["cpu_seconds"])]
        + (["peer", "-", "-"] if r["peer"] else [f"{r['over_ort']:.2f}×", f"{r['bits_per_weight']:.3f}"])
        + ([] if r["peer"] else [f"{r['output_error_vs_rtn']:.3f}"])
        + [f"{r['cosine']:.5f}"]
        for r in q["rows"]
    ]
    return _table(header, rows)


def sim_speed_table(speed: list[dict]) -> list[str]:
    """The simulator-vs-ONNX Runtime table as markdown lines."""
    header = ["case", "size", "target", "build", "instructions", "first run", "sim", "timing-only"]
    header += ["ORT", "sim/ORT", "timing/ORT", "norm max err"]
    rows = [
        [r["case"], r["size"], r["target"], r["build"], f"{r['instructions']:,}"]
        + [_ms(r[k]) for k in ("sim_first_run_s", "sim_s", "timing_only_s", "ort_s")]
        + [f"{r['sim_over_ort']:.2f}×", f"{r['timing_only_over_ort']:.3f}×", f"{r['norm_max_err']:.1e}"]
        for r in speed
    ]
    return _table(header, rows)
