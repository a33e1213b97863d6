"""``mcpc check``: run ONNX Runtime on the model and the simulator on the program, compare outputs.

Every output is scored relative to its own scale, so one tolerance fits logits of O(10) and hidden
states of O(0.1) alike:

* normalized max error ``max|y − r| / max|r|`` (``max|y − r|`` when the reference is all zero),
  passing when ≤ ``max_norm_err``;
* cosine similarity of ``y`` and ``r`` flattened, passing when ≥ ``min_cosine``;
* top-1 agreement for logits-like outputs (the last axis is the vocabulary: its size equals the
  rows of an embedding table that a Gather indexes with an integer model input, or the output's
  name contains ``logits``; size > 1): the fraction of positions where ``argmax`` over the last
  axis agrees, passing when ≥ ``min_top1``;
* optionally (when ``rtol`` or ``atol`` is set) the element-wise ``|y − r| ≤ atol + rtol·|r|``
  (numpy.isclose semantics) with no violation.

A non-finite simulated value where the reference is finite (or the other way round) always fails.
The report's ``numeric`` section is the simulator's (``mcpc.sim.numeric``): a run that produced a
NaN or an overflow fails the check with exit 7 whatever the tolerances.  Tolerances come from the
build (the QAT config's ``check:`` section, recorded in the ``.mcpb`` META ``tolerances``), each
overridable on the command line.

``mask`` (``--mask INPUT``) scores only the positions whose mask is 1: the mask is a [batch, seq]
0/1 input (the usual ``attention_mask``).  An output whose axes 0 and 1 have the mask's shape
([batch, seq, ...]: hidden states, logits) is scored at the elements whose (batch, seq) index has
mask 1, over every trailing axis; otherwise a rank-4 output whose axes 0 and 2 have the mask's
shape ([batch, heads, seq, head_dim]: K/V caches) is masked along those axes; any other output is
scored whole, and the report says which axes each output was masked on.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from mcpc.errors import InputError, UsageError


@dataclass(frozen=True)
class Tolerances:
    """The pass criteria of one check; None = that criterion is not applied."""

    max_norm_err: float | None = None
    min_cosine: float | None = None
    min_top1: float | None = None
    rtol: float | None = None
    atol: float | None = None

    @classmethod
    def from_mapping(cls, data: dict[str, Any] | None) -> Tolerances:
        known = {f.name for f in fields(cls)}
        return cls(**{k: float(v) for k, v in (data or {}).items() if k in known and v is not None})

    def override(self, **values: float | None) -> Tolerances:
        """These tolerances with every non-None value of ``values`` replacing its field."""
        current = asdict(self)
        current.update({k: float(v) for k, v in values.items() if v is not None})
        return Tolerances(**current)

    @classmethod
    def of_program(cls, meta: dict[str, Any]) -> Tolerances:
        """The tolerances a build recorded in its META (FALLBACK for a file that recorded none)."""
        recorded = meta.get("default_tolerances") or meta.get("tolerances")
        return cls.from_mapping(recorded) if recorded else FALLBACK

    def compare(
        self, name: str, y: np.ndarray, r: np.ndarray, *, top1: bool = False, mask: np.ndarray | None = None
    ) -> OutputComparison:
        """``compare`` with these criteria."""
        return compare(
            name, y, r, self.rtol, self.atol, self.min_cosine,
            max_norm_err=self.max_norm_err, min_top1=self.min_top1, top1=top1, mask=mask,
        )  # fmt: skip

    @property
    def elementwise(self) -> bool:
        return self.rtol is not None or self.atol is not None

    def describe(self) -> str:
        parts = []
        if self.max_norm_err is not None:
            parts.append(f"norm max err ≤ {self.max_norm_err:g}")
        if self.min_cosine is not None:
            parts.append(f"cosine ≥ {self.min_cosine:g}")
        if self.min_top1 is not None:
            parts.append(f"top-1 ≥ {100 * self.min_top1:g}% (logits)")
        if self.elementwise:
            parts.append(f"|y − r| ≤ {self.atol or 0:g} + {self.rtol or 0:g}·|r|")
        return ", ".join(parts) or "finite outputs only"


# Tolerances of a build whose .mcpb records none (files from before tolerances were recorded).
FALLBACK = Tolerances(max_norm_err=1e-4, min_cosine=0.99999, min_top1=0.99)


@dataclass(frozen=True)
class OutputComparison:
    """How one simulated output compares with the ONNX Runtime reference."""

    name: str
    shape: tuple[int, ...]
    norm_max_err: float
    max_abs_err: float
    cosine: float
    violations: int  # elements outside atol + rtol·|r| (0 when that criterion is off)
    passed: bool
    scored: int = 0  # elements compared (fewer than the output's size under a mask)
    masked_axes: tuple[int, ...] | None = None  # output axes the mask was applied on
    top1: float | None = None  # argmax agreement over scored positions (logits-like outputs)
    nonfinite: int = 0  # elements finite on one side and not on the other
    reasons: list[str] = field(default_factory=list)  # why it failed, one phrase per criterion


def mask_axes(mask_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The output axes a [batch, seq] mask applies to: (0, 1) when they have the mask's shape,
    else (0, 2) for a rank-4 [batch, heads, seq, head_dim] output, else None (scored whole)."""
    if len(out_shape) >= 2 and tuple(out_shape[:2]) == tuple(mask_shape):
        return (0, 1)
    if len(out_shape) == 4 and (out_shape[0], out_shape[2]) == tuple(mask_shape):
        return (0, 2)
    return None


def _selection(mask: np.ndarray, axes: tuple[int, ...], shape: tuple[int, ...]) -> np.ndarray:
    """Boolean array of ``shape``: True where the mask is 1 along ``axes``."""
    view = [1] * len(shape)
    for a, n in zip(axes, mask.shape, strict=True):
        view[a] = n
    return np.broadcast_to(mask.astype(bool).reshape(view), shape)


def compare(
    name: str,
    y: np.ndarray,
    r: np.ndarray,
    rtol: float | None = None,
    atol: float | None = None,
    min_cosine: float | None = None,
    *,
    max_norm_err: float | None = None,
    min_top1: float | None = None,
    top1: bool = False,
    mask: np.ndarray | None = None,
) -> OutputComparison:
    """Compare simulated ``y`` with reference ``r`` (both converted to float64).

    ``top1``: the output is logits-like (argmax agreement over the last axis is measured);
    ``mask``: a [batch, seq] 0/1 array restricting the scored elements (see the module doc)."""
    if y.shape != r.shape:
        raise InputError(f"output '{name}': simulator shape {y.shape} differs from ONNX Runtime {r.shape}")
    y64 = np.asarray(y, dtype=np.float64)
    r64 = np.asarray(r, dtype=np.float64)
    axes = mask_axes(mask.shape, y.shape) if mask is not None else None
    sel = _selection(mask, axes, y.shape) if axes is not None else None
    ys, rs = (y64[sel], r64[sel]) if sel is not None else (y64.ravel(), r64.ravel())
    same = (ys == rs) | (np.isnan(ys) & np.isnan(rs))  # equal infinities and both-NaN agree
    nonfinite = int((~same & ~(np.isfinite(ys) & np.isfinite(rs))).sum())
    with np.errstate(invalid="ignore"):  # inf - inf where both are infinite: agreed above
        diff = np.where(same, 0.0, np.abs(ys - rs))
    max_abs = float(diff.max()) if diff.size else 0.0
    finite_r = np.abs(rs[np.isfinite(rs)])
    scale = float(finite_r.max()) if finite_r.size else 0.0
    norm = max_abs / scale if scale > 0 else max_abs
    finite = np.isfinite(ys) & np.isfinite(rs)  # cosine over the elements finite on both sides
    fy, fr = ys[finite], rs[finite]
    ny, nr = float(np.linalg.norm(fy)), float(np.linalg.norm(fr))
    if ny == 0.0 and nr == 0.0:
        cosine = 1.0
    elif ny == 0.0 or nr == 0.0:
        cosine = 0.0
    else:
        cosine = float(np.dot(fy, fr) / (ny * nr))
    violations = 0
    if rtol is not None or atol is not None:
        violations = int((~(diff <= (atol or 0.0) + (rtol or 0.0) * np.abs(rs))).sum())
    agreement = None
    if top1 and y.ndim >= 1 and y.shape[-1] > 1 and y.size:
        hits = np.argmax(y64, axis=-1) == np.argmax(r64, axis=-1)
        if sel is not None and y.ndim - 1 not in axes:
            hits = hits[sel[..., 0]]
        agreement = float(hits.mean()) if hits.size else 1.0
    reasons = []
    if nonfinite:
        reasons.append(f"{nonfinite} non-finite values where the other side is finite")
    if max_norm_err is not None and not norm <= max_norm_err:
        reasons.append(f"norm max err {norm:.3g} > {max_norm_err:g}")
    if min_cosine is not None and not cosine >= min_cosine:
        reasons.append(f"cosine {cosine:.6f} < {min_cosine:g}")
    if min_top1 is not None and agreement is not None and not agreement >= min_top1:
        reasons.append(f"top-1 agreement {100 * agreement:.2f}% < {100 * min_top1:g}%")
    if violations:
        reasons.append(f"{violations} elements outside atol {atol or 0:g} + rtol {rtol or 0:g}·|r|")
    return OutputComparison(
        name, tuple(y.shape), norm, max_abs, cosine, violations, not reasons,
        int(ys.size), axes, agreement, nonfinite, reasons,
    )  # fmt: skip


def vocabulary_sizes(model_path: str | Path) -> set[int]:
    """Rows of every initializer that a Gather indexes with an integer graph input (the embedding
    tables of token ids): the last-axis sizes that mark an output as logits."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    ints = {
        i.name
        for i in model.graph.input
        if i.type.tensor_type.elem_type
        in (onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.UINT16, onnx.TensorProto.INT16)
    }
    inits = {t.name: t for t in model.graph.initializer}
    sizes = set()
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) == 2 and node.input[1] in ints:
            table = inits.get(node.input[0])
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            if table is not None and len(table.dims) == 2:
                sizes.add(int(table.dims[axis]))
    return sizes


def is_logits(name: str, shape: tuple[int, ...], vocab: set[int]) -> bool:
    """An output whose last axis is a vocabulary: its size is one of ``vocab`` or the name says
    logits; size > 1 either way (argmax over one class means nothing)."""
    if not shape or shape[-1] <= 1:
        return False
    return shape[-1] in vocab or "logits" in name.lower()


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


def _mask_array(inputs: dict[str, np.ndarray], name: str) -> np.ndarray:
    if name not in inputs:
        raise UsageError(f"--mask {name}: no such input (the inputs are {', '.join(sorted(inputs))})")
    m = np.asarray(inputs[name])
    if m.ndim != 2:
        raise UsageError(f"--mask {name}: the mask must be [batch, seq], this input is {m.shape}")
    if not np.isin(m, (0, 1)).all():
        raise UsageError(f"--mask {name}: the mask must hold only 0 and 1")
    if not m.any():
        raise UsageError(f"--mask {name}: the mask is 0 everywhere, no position would be scored")
    return m


def check(
    model_path: str | Path,
    program_path: str | Path,
    inputs: dict[str, np.ndarray],
    rtol: float | None = None,
    atol: float | None = None,
    min_cosine: float | None = None,
    entry: str = "main",
    *,
    max_norm_err: float | None = None,
    min_top1: float | None = None,
    mask: str | None = None,
    ignore_outputs: tuple[str, ...] | list[str] = (),
) -> dict:
    """Run both sides and compare every program output; returns a JSON-ready report.

    Tolerances are the build's (META ``tolerances``) with each argument that is not None replacing
    its criterion.  ``mask`` names the [batch, seq] input that selects the scored positions;
    ``ignore_outputs`` are program outputs left out (each must exist)."""
    from mcpc.sim.api import load_program, run_program

    program = load_program(program_path)
    tol = Tolerances.of_program(program.meta).override(
        max_norm_err=max_norm_err, min_cosine=min_cosine, min_top1=min_top1, rtol=rtol, atol=atol
    )
    mask_arr = _mask_array(inputs, mask) if mask is not None else None
    io = (program.program.io or {}).get(entry, {}).get("outputs", [])
    names = [b["name"] for b in io]
    unknown = [n for n in ignore_outputs if names and n not in names]
    if unknown:
        raise UsageError(
            f"--ignore-outputs: {', '.join(unknown)} not an output of {program_path} "
            f"(its outputs are {', '.join(names)})"
        )
    if names and set(names) <= set(ignore_outputs):
        raise UsageError(f"--ignore-outputs leaves no output of {program_path} to check")
    ref = run_onnxruntime(model_path, inputs)
    sim = run_program(program, inputs, entry=entry)
    vocab = vocabulary_sizes(model_path)
    results = []
    for name, y in sim.outputs.items():
        if name in ignore_outputs:
            continue
        if name not in ref:
            raise InputError(f"program output '{name}' is not an output of {model_path}")
        results.append(tol.compare(name, y, ref[name], top1=is_logits(name, y.shape, vocab), mask=mask_arr))
    return {
        "model": str(model_path),
        "program": str(program_path),
        "precision": program.meta.get("precision"),
        "tolerances": {k: v for k, v in asdict(tol).items() if v is not None},
        "rtol": tol.rtol,
        "atol": tol.atol,
        "min_cosine": tol.min_cosine,
        "mask": mask,
        "ignored": [n for n in sim.outputs if n in ignore_outputs],
        "passed": all(r.passed for r in results),
        "outputs": [asdict(r) for r in results],
        "numeric": sim.profile.get("numeric"),
        "cycles": sim.profile.get("cycles"),
        "latency_us": sim.profile.get("latency_us"),
    }
