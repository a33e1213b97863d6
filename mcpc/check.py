"""``mcpc check``: run ONNX Runtime on the model and the simulator on the program, compare outputs.

Per output it reports the normalized max error max|y − r| / max|r|, the max abs error and the
cosine similarity; the output passes when every element meets |y − r| ≤ atol + rtol·|r|
(numpy.isclose semantics) and, when ``min_cosine`` is set, its cosine reaches it.  The report's
``numeric`` section is the simulator's (``mcpc.sim.numeric``): a run that produced a NaN or an
overflow fails the check with exit 7 whatever the tolerances.  Default
tolerances come from the build's precision recorded in the ``.mcpb`` META section.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from mcpc.errors import InputError


@dataclass(frozen=True)
class OutputComparison:
    """How one simulated output compares with the ONNX Runtime reference."""

    name: str
    shape: tuple[int, ...]
    norm_max_err: float
    max_abs_err: float
    cosine: float
    violations: int
    passed: bool


def compare(
    name: str, y: np.ndarray, r: np.ndarray, rtol: float, atol: float, min_cosine: float | None = None
) -> OutputComparison:
    """Compare simulated ``y`` with reference ``r`` (both converted to float64)."""
    if y.shape != r.shape:
        raise InputError(f"output '{name}': simulator shape {y.shape} differs from ONNX Runtime {r.shape}")
    y64 = np.asarray(y, dtype=np.float64)
    r64 = np.asarray(r, dtype=np.float64)
    diff = np.abs(y64 - r64)
    max_abs = float(diff.max()) if diff.size else 0.0
    scale = float(np.abs(r64).max()) if r64.size else 0.0
    norm = max_abs / scale if scale > 0 else max_abs
    ny, nr = float(np.linalg.norm(y64)), float(np.linalg.norm(r64))
    if ny == 0.0 and nr == 0.0:
        cosine = 1.0
    elif ny == 0.0 or nr == 0.0:
        cosine = 0.0
    else:
        cosine = float(np.dot(y64.ravel(), r64.ravel()) / (ny * nr))
    bad = ~(diff <= atol + rtol * np.abs(r64))
    bad |= np.isnan(y64) != np.isnan(r64)
    violations = int(bad.sum())
    passed = violations == 0 and (min_cosine is None or cosine >= min_cosine)
    return OutputComparison(name, tuple(y.shape), norm, max_abs, cosine, violations, passed)


def run_onnxruntime(model_path: str | Path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Reference outputs from ONNX Runtime (CPU, all graph optimizations off for fidelity)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    try:
        sess = ort.InferenceSession(str(model_path), opts, providers=["CPUExecutionProvider"])
    except Exception as e:  # ORT raises its own exception types for any bad model
        raise InputError(f"{model_path}: ONNX Runtime cannot load the model: {e}") from None
    names = [i.name for i in sess.get_inputs()]
    missing = [n for n in names if n not in inputs]
    if missing:
        raise InputError(f"inputs are missing {', '.join(missing)} (the model needs {', '.join(names)})")
    try:
        outs = sess.run(None, {n: inputs[n] for n in names})
    except Exception as e:  # e.g. a token id outside the vocabulary, a wrong input dtype
        raise InputError(f"{model_path}: ONNX Runtime refused these inputs: {e}") from None
    return {o.name: v for o, v in zip(sess.get_outputs(), outs, strict=True)}


def check(
    model_path: str | Path,
    program_path: str | Path,
    inputs: dict[str, np.ndarray],
    rtol: float | None = None,
    atol: float | None = None,
    min_cosine: float | None = None,
    entry: str = "main",
) -> dict:
    """Run both sides and compare every program output; returns a JSON-ready report."""
    from mcpc.sim.api import load_program, run_program

    program = load_program(program_path)
    tol = program.meta.get("default_tolerances") or program.meta.get("tolerances") or {}
    rtol = float(tol.get("rtol", 1e-4)) if rtol is None else rtol
    atol = float(tol.get("atol", 1e-5)) if atol is None else atol
    ref = run_onnxruntime(model_path, inputs)
    sim = run_program(program, inputs, entry=entry)
    results = []
    for name, y in sim.outputs.items():
        if name not in ref:
            raise InputError(f"program output '{name}' is not an output of {model_path}")
        results.append(compare(name, y, ref[name], rtol, atol, min_cosine))
    return {
        "model": str(model_path),
        "program": str(program_path),
        "precision": program.meta.get("precision"),
        "rtol": rtol,
        "atol": atol,
        "min_cosine": min_cosine,
        "passed": all(r.passed for r in results),
        "outputs": [asdict(r) for r in results],
        "numeric": sim.profile.get("numeric"),
        "cycles": sim.profile.get("cycles"),
        "latency_us": sim.profile.get("latency_us"),
    }
