"""``mcpc conformance``: the ONNX backend node tests as mcpc's conformance yardstick.

Every node test of the installed ``onnx`` package (``onnx/backend/test/data/node/*`` when the
package ships the data, else generated in memory from ``onnx.backend.test.case.node``, the same
cases ONNX writes to disk) whose op types the importer lists as supported is run at two levels:

* level 1 — import + IR reference interpreter vs the expected outputs;
* level 2 (``compile_target``) — fp32 build for the target + functional simulator vs the expected
  outputs.

Outputs are compared as ONNX's backend runner does: same shape and dtype, then
``|y − r| ≤ atol + rtol·|r|`` (rtol 1e-3, atol 1e-7 unless the test says otherwise; NaN matches NaN;
bfloat16 gets rtol ≥ 2⁻⁶; integers and booleans must be equal).  Each attempted test gets one status
per level: ``pass``; ``fail`` (wrong numbers — a bug); ``unsupported`` (an ``UnsupportedError``:
an op, attribute or dtype mcpc says it does not implement); ``error`` (any other exception — a
bug).  Tests using an op type the importer does not list are ``not attempted`` and counted apart,
so totals are honest.  Results never depend on the order tests run in.
"""

from __future__ import annotations

import time
import warnings
from collections import Counter
from dataclasses import asdict, dataclass, field

import numpy as np

from mcpc.conformance_cases import (  # noqa: F401  (re-exported: the cases are part of this API)
    DEFAULT_ATOL,
    DEFAULT_RTOL,
    NodeCase,
    compare_outputs,
    load_cases,
    node_test_dir,
)

STATUSES = ("pass", "fail", "unsupported", "error")


@dataclass
class CaseResult:
    """The outcome of one test: per level a status (None when not run) and a one-line detail."""

    name: str
    op_types: list[str]
    attempted: bool
    level1: str | None = None
    level1_detail: str = ""
    level2: str | None = None
    level2_detail: str = ""
    seconds: float = 0.0
    missing_ops: list[str] = field(default_factory=list)
    frozen_inputs: list[str] = field(default_factory=list)  # integer inputs bound as constants


def supported_op_types() -> frozenset[str]:
    """Op types the importer lists (default domain by name, others as ``domain:OpType``)."""
    from mcpc.ir.onnx_handlers import DOMAIN_HANDLERS, HANDLERS

    return frozenset(HANDLERS) | frozenset(f"{d}:{t}" for d, t in DOMAIN_HANDLERS)


def _is_float(dt: np.dtype) -> bool:
    """numpy floats and ml_dtypes' (bfloat16, float8 …), whose numpy kind is not 'f'."""
    import ml_dtypes

    try:
        ml_dtypes.finfo(dt)
    except ValueError:
        return False
    return True


def _feeds(case: NodeCase, inputs: list[np.ndarray]) -> dict[str, np.ndarray]:
    inits = {t.name for t in case.model.graph.initializer}
    names = [i.name for i in case.model.graph.input if i.name not in inits]
    return dict(zip(names, inputs, strict=False))


def _classify(exc: BaseException) -> tuple[str, str]:
    from mcpc.errors import UnsupportedError

    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, UnsupportedError):
        return "unsupported", text
    return "error", f"{type(exc).__name__}: {text}"


def _frozen(case: NodeCase, inputs: list[np.ndarray]) -> tuple[object, list[str]]:
    """The model with its integer inputs turned into initializers holding this data set's values.

    ONNX node tests feed axes, shapes, starts … as graph inputs; mcpc compiles static graphs, where
    those are constants.  Only used when the plain import is unsupported.
    """
    import onnx
    from onnx import numpy_helper

    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    feeds = _feeds(case, inputs)
    names = [
        n for n, a in feeds.items() if np.asarray(a).dtype.kind in "iu" and np.asarray(a).dtype.itemsize >= 4
    ]
    keep = [i for i in model.graph.input if i.name not in names]
    del model.graph.input[:]
    model.graph.input.extend(keep)
    model.graph.initializer.extend(numpy_helper.from_array(np.asarray(feeds[n]), n) for n in names)
    return model, names


def _data_sets(case: NodeCase):
    """Per data set: (imported module, feeds, expected outputs, integer inputs bound as constants).

    Imports the model as is; when that is unsupported, retries with the integer inputs bound to
    each data set's values (see ``_frozen``), re-raising the original error if that fails too.
    """
    from mcpc.errors import UnsupportedError
    from mcpc.ir.onnx_import import import_onnx

    try:
        module = import_onnx(case.model)
    except UnsupportedError as original:
        for inputs, expected in case.data_sets:
            model, names = _frozen(case, inputs)
            if not names:
                raise
            try:
                frozen = import_onnx(model)
            except UnsupportedError:
                raise original from None
            feeds = {k: v for k, v in _feeds(case, inputs).items() if k not in names}
            yield frozen, feeds, expected, names
        return
    for inputs, expected in case.data_sets:
        yield module, _feeds(case, inputs), expected, []


def _run_level(case: NodeCase, outputs_of) -> tuple[str, str, list[str]]:
    """Compare ``outputs_of(module, feeds)`` (outputs by name) with every data set's expected
    outputs; the first data set that differs fails the level."""
    names, frozen = [o.name for o in case.model.graph.output], []
    for k, (module, feeds, expected, frozen) in enumerate(_data_sets(case)):
        got = outputs_of(module, feeds)
        why = compare_outputs(
            [got[n] for n in names], expected, case.rtol, case.atol, _undefined(case, feeds)
        )
        if why:
            return "fail", f"data set {k}: {why}", frozen
    return "pass", "", frozen


def _level1(case: NodeCase) -> tuple[str, str, list[str]]:
    from mcpc.ir.interpreter import interpret

    return _run_level(case, interpret)


def _level2(case: NodeCase, target: str) -> tuple[str, str, list[str]]:
    from mcpc.driver import compile as mcpc_compile
    from mcpc.sim.api import from_program, run_program

    def simulate(module, feeds):
        result = mcpc_compile(module, target=target, qat_config="fp32.yaml", emit="mcpb")
        return run_program(from_program(result.program, source=case.name), feeds).outputs

    return _run_level(case, simulate)


def _undefined(case: NodeCase, feeds: dict[str, np.ndarray]) -> list[np.ndarray | None] | None:
    """Per output, a mask of elements whose value the ONNX spec leaves undefined, or None.

    Cast (and CastLike) from floating point to an integer type: "fixed point: undefined if out of
    range" — the test data hold one implementation's choice there (ml_dtypes' for int4), so those
    elements are not compared.  Only single-node Cast/CastLike graphs are recognised.
    """
    import ml_dtypes
    import onnx

    nodes = case.model.graph.node
    if len(nodes) != 1 or nodes[0].op_type not in ("Cast", "CastLike") or not feeds:
        return None
    x = np.asarray(feeds.get(nodes[0].input[0], np.empty(0)))
    to = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(case.model.graph.output[0].type.tensor_type.elem_type))
    if not _is_float(x.dtype) or _is_float(to) or to == np.bool_:
        return None
    info = ml_dtypes.iinfo(to)
    with np.errstate(invalid="ignore"):
        t = np.trunc(x.astype(np.float64))
        return [~((t >= info.min) & (t <= info.max))]


def run_case(
    case: NodeCase, target: str | None = None, supported: frozenset[str] | None = None
) -> CaseResult:
    """Run one test at level 1 and, when ``target`` is given, level 2; never raises for a test's
    own failure (every exception becomes a status)."""
    supported = supported_op_types() if supported is None else supported
    ops = list(case.op_types)
    res = CaseResult(case.name, ops, attempted=True, missing_ops=[o for o in ops if o not in supported])
    if res.missing_ops:
        res.attempted = False
        return res
    start = time.perf_counter()
    levels = [("level1", _level1, ())] + ([("level2", _level2, (target,))] if target else [])
    for attr, fn, args in levels:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            try:
                status, detail, frozen = fn(case, *args)
                res.frozen_inputs = frozen
            except Exception as exc:  # noqa: BLE001 - every failure is a result, classified below
                status, detail = _classify(exc)
        setattr(res, attr, status)
        setattr(res, f"{attr}_detail", detail)
    res.seconds = time.perf_counter() - start
    return res


def run_conformance(
    ops: list[str] | None = None,
    target: str | None = None,
    names: set[str] | None = None,
    progress=None,
) -> list[CaseResult]:
    """Run every node test (only those using one of ``ops`` / named in ``names`` when given).

    ``progress(i, n, result)`` is called after each test.  Returns results sorted by test name.
    """
    cases = load_cases(names)
    if ops:
        wanted = set(ops)
        cases = [c for c in cases if wanted & set(c.op_types)]
    supported = supported_op_types()
    results = []
    for i, case in enumerate(cases):
        results.append(run_case(case, target, supported))
        if progress is not None:
            progress(i + 1, len(cases), results[-1])
    return results


# -- summary, JSON and the command -------------------------------------------------------------
def summarize(results: list[CaseResult]) -> dict:
    """Totals per level, per op type (a test counts under every op type it uses) and the op types
    that keep the most tests from being attempted."""
    attempted = [r for r in results if r.attempted]
    levels = [lv for lv in ("level1", "level2") if any(getattr(r, lv) for r in attempted)]
    totals = {lv: {s: sum(getattr(r, lv) == s for r in attempted) for s in STATUSES} for lv in levels}
    per_op: dict[str, dict] = {}
    for r in attempted:
        for op in r.op_types:
            row = per_op.setdefault(op, {lv: dict.fromkeys(STATUSES, 0) for lv in levels})
            for lv in levels:
                row[lv][getattr(r, lv)] += 1
    blockers = Counter(op for r in results if not r.attempted for op in r.missing_ops)
    return {
        "tests": len(results),
        "attempted": len(attempted),
        "not_attempted": len(results) - len(attempted),
        "totals": totals,
        "ops": dict(sorted(per_op.items())),
        "missing_ops": dict(blockers.most_common()),
    }


def report(results: list[CaseResult], target: str | None) -> dict:
    """The JSON document ``--json`` writes: versions, the summary and every test's result."""
    import onnx

    from mcpc import __version__

    return {
        "mcpc_version": __version__,
        "onnx_version": onnx.__version__,
        "source": "data/node" if node_test_dir().is_dir() else "onnx.backend.test.case.node (generated)",
        "target": target,
        "summary": summarize(results),
        "results": [asdict(r) for r in results],
    }


def print_summary(results: list[CaseResult], console, verbose: bool = False) -> None:
    """A rich table per op type, the totals, and each failing/erroring test with its reason."""
    from rich.table import Table

    s = summarize(results)
    levels = list(s["totals"])
    table = Table(
        title="ONNX node tests by op type (a test counts under each op it uses)", title_justify="left"
    )
    table.add_column("op type")
    for lv in levels:
        for st in STATUSES:
            table.add_column(f"{lv[-1]}:{st}", justify="right")
    for op, row in s["ops"].items():
        cells = [str(row[lv][st] or "") for lv in levels for st in STATUSES]
        bad = any(row[lv]["fail"] or row[lv]["error"] for lv in levels)
        table.add_row(f"[red]{op}[/red]" if bad else op, *cells)
    if verbose:
        console.print(table)
    for r in results:
        for lv in levels:
            if getattr(r, lv) in ("fail", "error") or (verbose and getattr(r, lv) == "unsupported"):
                detail = getattr(r, lv + "_detail")[:300]
                console.print(f"{lv} {getattr(r, lv):<11} {r.name}: {detail}", soft_wrap=True, markup=False)
    console.print(
        f"{s['tests']} node tests: {s['attempted']} attempted, {s['not_attempted']} not attempted "
        f"(they use op types the importer does not list; most common: "
        + ", ".join(f"{k} {v}" for k, v in list(s["missing_ops"].items())[:8])
        + ")",
        soft_wrap=True,
    )
    frozen = sum(1 for r in results if r.frozen_inputs)
    if frozen:
        console.print(
            f"{frozen} attempted tests ran with their integer inputs bound as constants", soft_wrap=True
        )
    for lv in levels:
        t = s["totals"][lv]
        console.print(f"{lv}: " + ", ".join(f"{t[st]} {st}" for st in STATUSES))
