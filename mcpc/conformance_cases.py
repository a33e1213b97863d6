"""The ONNX backend node tests as data for ``mcpc conformance``: finding or generating them, and
comparing outputs as ONNX's backend runner does.

``load_cases`` reads every node test of the installed ``onnx`` package (``onnx/backend/test/data/node/*``
when the package ships the data, else the same cases generated in memory from
``onnx.backend.test.case.node``).  ``compare_outputs`` requires the same shape and dtype, then
``|y − r| ≤ atol + rtol·|r|`` (rtol 1e-3, atol 1e-7 unless the test says otherwise; NaN matches
NaN; bfloat16 gets rtol ≥ 2⁻⁶; integers and booleans must be equal).  Running the tests through
mcpc is ``mcpc.conformance``, which re-exports these names.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DEFAULT_RTOL, DEFAULT_ATOL = 1e-3, 1e-7


@dataclass(frozen=True)
class NodeCase:
    """One ONNX node test: the model, its data sets (inputs, expected outputs) and tolerances.

    Inputs are listed in the order of the graph's real inputs, outputs in graph-output order.
    """

    name: str
    model: object  # onnx.ModelProto
    data_sets: list[tuple[list[np.ndarray], list[np.ndarray]]]
    rtol: float = DEFAULT_RTOL
    atol: float = DEFAULT_ATOL

    @property
    def op_types(self) -> tuple[str, ...]:
        """The op types of the graph's nodes (domain-qualified outside the default domain)."""
        return tuple(sorted({_op_key(n) for n in self.model.graph.node}))


def _op_key(node) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}:{node.op_type}"


def node_test_dir() -> Path:
    """Where the installed onnx package keeps its node tests (may not exist in slim wheels)."""
    import onnx.backend.test

    return Path(onnx.backend.test.__file__).parent / "data" / "node"


def load_cases(names: set[str] | None = None) -> list[NodeCase]:
    """All node tests of the installed onnx, sorted by name (only ``names`` when given).

    Reads ``data/node`` when the package ships it; otherwise generates the cases in memory with
    ``onnx.backend.test.case.node.collect_testcases`` (what ONNX itself writes to that folder).
    """
    root = node_test_dir()
    cases = _cases_from_disk(root, names) if root.is_dir() else _cases_generated(names)
    return sorted(cases, key=lambda c: c.name)


def _cases_from_disk(root: Path, names: set[str] | None) -> list[NodeCase]:
    import onnx
    from onnx import numpy_helper

    out = []
    for folder in sorted(p for p in root.iterdir() if (p / "model.onnx").is_file()):
        if names is not None and folder.name not in names:
            continue
        model = onnx.load(str(folder / "model.onnx"))
        data_sets = []
        for ds in sorted(folder.glob("test_data_set_*")):
            arrays = []
            for kind in ("input", "output"):
                files = sorted(ds.glob(f"{kind}_*.pb"), key=lambda p: int(p.stem.split("_")[1]))
                arrays.append([numpy_helper.to_array(onnx.load_tensor(str(f))) for f in files])
            data_sets.append((arrays[0], arrays[1]))
        out.append(NodeCase(folder.name, model, data_sets))
    return out


def _cases_generated(names: set[str] | None) -> list[NodeCase]:
    from onnx import TensorProto, numpy_helper
    from onnx.backend.test.case.node import collect_testcases

    def arr(x):
        return numpy_helper.to_array(x) if isinstance(x, TensorProto) else x

    with warnings.catch_warnings(), np.errstate(all="ignore"):  # the generators divide by zero on purpose
        warnings.simplefilter("ignore")
        raw = collect_testcases()
    out = []
    for c in raw:
        if c.kind != "node" or (names is not None and c.name not in names):
            continue
        data_sets = [([arr(x) for x in ins], [arr(x) for x in outs]) for ins, outs in c.data_sets or []]
        out.append(NodeCase(c.name, c.model, data_sets, c.rtol, c.atol))
    return out


def compare_outputs(
    got: list, expected: list, rtol: float, atol: float, undefined: list | None = None
) -> str | None:
    """None when ``got`` matches ``expected`` as ONNX's backend runner requires, else why not.

    ``undefined`` optionally holds, per output, a boolean mask (or None) of elements whose value the
    ONNX spec leaves undefined; those elements are not compared.
    """
    if len(got) != len(expected):
        return f"{len(got)} outputs, expected {len(expected)}"
    for i, (y, r) in enumerate(zip(got, expected, strict=True)):
        y, r = np.asarray(y), np.asarray(r)
        if y.shape != r.shape:
            return f"output {i}: shape {y.shape}, expected {r.shape}"
        if r.dtype == object:
            return f"output {i}: expected dtype object (strings) cannot match"
        if y.dtype != r.dtype:
            return f"output {i}: dtype {y.dtype}, expected {r.dtype}"
        skip = undefined[i] if undefined and i < len(undefined) else None
        if skip is not None and skip.any():
            y, r = y[~skip], r[~skip]
        if r.dtype.kind in "biu":
            bad = y != r
            if bad.any():
                return f"output {i}: {int(bad.sum())} of {r.size} elements differ (first at {_first(bad)})"
            continue
        tol_r = max(rtol, 2.0**-6) if r.dtype.name == "bfloat16" else rtol
        y64, r64 = y.astype(np.float64), r.astype(np.float64)
        with np.errstate(invalid="ignore"):
            diff = np.abs(y64 - r64)
            ok = (diff <= atol + tol_r * np.abs(r64)) | (y64 == r64)  # == covers matching infinities
        ok |= np.isnan(y64) & np.isnan(r64)
        if not ok.all():
            bad = ~ok
            j = _first(bad)
            return (
                f"output {i}: {int(bad.sum())} of {r.size} elements outside rtol {tol_r:g} atol {atol:g} "
                f"(first at {j}: got {y64[j]!r}, expected {r64[j]!r})"
            )
    return None


def _first(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(mask)[0])
