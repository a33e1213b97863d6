"""Shared test helpers: run an ONNX model with ONNX Runtime / the ONNX reference evaluator, build
single-node models, and the normalized max error every accuracy check uses.

Skips: a test of our own code never skips.  The legal skips are an optional extra that is not
installed, taken through ``require_extra``, and a browser test on a machine without Chromium
(``require_chromium``; `.ci/run` installs it, so CI always runs them); any other skip fails the run
(``pytest_sessionfinish``) and every run prints how many tests skipped and why.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper


def norm_max_err(y: np.ndarray, r: np.ndarray) -> float:
    """max|y − r| / max|r| (absolute error when r is all zeros), in f64."""
    y = np.asarray(y, dtype=np.float64)
    r = np.asarray(r, dtype=np.float64)
    if y.shape != r.shape:
        raise AssertionError(f"shape {y.shape} differs from reference {r.shape}")
    if y.size == 0:
        return 0.0
    scale = np.max(np.abs(r))
    err = np.max(np.abs(y - r))
    return float(err / scale) if scale > 0 else float(err)


def _ort_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    # no graph rewrites: the reference should be the plain op-by-op semantics
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds), strict=True))


def _ref_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    from onnx.reference import ReferenceEvaluator

    sess = ReferenceEvaluator(model)
    names = [o.name for o in model.graph.output]
    return dict(zip(names, sess.run(None, feeds), strict=True))


@pytest.fixture
def ort_run():
    """``ort_run(model, feeds) -> {output name: array}`` with ONNX Runtime (CPU, no optimizations)."""
    return _ort_run


@pytest.fixture
def ref_run():
    """``ref_run(model, feeds)`` with onnx.reference.ReferenceEvaluator (the second oracle)."""
    return _ref_run


def make_model(nodes, inputs, outputs, initializers=(), opset=17, name="test") -> onnx.ModelProto:
    """A checked ModelProto from onnx.helper parts; ``inputs``/``outputs`` are ValueInfoProtos."""
    graph = helper.make_graph(list(nodes), name, list(inputs), list(outputs), list(initializers))
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, opset_imports=opsets)
    # the oldest IR version for this opset: ONNX Runtime may lag behind the onnx package
    model.ir_version = helper.find_min_ir_version_for(opsets)
    onnx.checker.check_model(model)
    return model


def vi(name: str, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def _negate_largest_weight(model: onnx.ModelProto) -> str:
    """Break ``model`` in place the way a corrupted build would be broken: negate the element of
    largest magnitude among the float matrix weights of its MatMul/Gemm nodes, read directly or
    through a Transpose (an embedding row of a token the inputs never use would change nothing).
    Returns what was changed."""
    from onnx import numpy_helper

    transposed = {n.output[0]: n.input[0] for n in model.graph.node if n.op_type == "Transpose"}
    matmul_inputs = {
        transposed.get(x, x) for n in model.graph.node if n.op_type in ("MatMul", "Gemm") for x in n.input
    }
    best = None
    for t in model.graph.initializer:
        if t.name not in matmul_inputs or len(t.dims) < 2:
            continue
        if t.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16):
            a = numpy_helper.to_array(t)
            i = int(np.argmax(np.abs(a)))
            if best is None or abs(float(a.flat[i])) > abs(best[2]):
                best = (t, i, float(a.flat[i]))
    if best is None:
        raise ValueError("the model has no float MatMul/Gemm weight to break")
    t, i, value = best
    a = numpy_helper.to_array(t).copy()
    a.flat[i] = -a.flat[i]
    t.CopyFrom(numpy_helper.from_array(a, t.name))
    return f"{t.name}[{np.unravel_index(i, a.shape)}] {value:g} -> {-value:g}"


@pytest.fixture
def negate_largest_weight():
    """``negate_largest_weight(model) -> str``: flips the sign of the largest-magnitude weight."""
    return _negate_largest_weight


@pytest.fixture
def f32_only_op():
    """A test-only op that accepts f32 operands only (stands for an op that must stay f32),
    registered for the duration of one test so registry-wide tests never see it."""
    from mcpc.ir.core import OP_REGISTRY, Operation

    class F32OnlyOp(Operation):
        name = "test.f32_only"
        NUM_OPERANDS = 1

        @classmethod
        def infer_types(cls, operand_types, attrs):
            if operand_types[0].dtype.name != "f32":
                raise ValueError("f32 only")
            return [operand_types[0]]

    try:
        yield F32OnlyOp
    finally:
        OP_REGISTRY.pop(F32OnlyOp.name, None)


@pytest.fixture(scope="session")
def examples_dir(tmp_path_factory):
    """The bundled examples (``NAME.onnx`` + ``NAME.npz``, mcpc.examples) written once per test
    session; tests read them and write their own outputs elsewhere."""
    from mcpc.examples import build_examples

    out = tmp_path_factory.mktemp("examples")
    build_examples(out)
    return out


# -- skips ---------------------------------------------------------------------------------------

OPTIONAL_EXTRA_SKIP = "optional extra not installed"
BROWSER_SKIP = "headless Chromium not installed"
ALLOWED_SKIPS = (OPTIONAL_EXTRA_SKIP, BROWSER_SKIP)
_skipped: list[tuple[str, str]] = []


def require_extra(module: str, extra: str) -> ModuleType:
    """Import ``module`` from the optional extra ``extra``, or skip with the one allowed reason."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        pytest.skip(f"{OPTIONAL_EXTRA_SKIP}: {extra} ({err}); pip install -e '.[{extra}]'")


def require_chromium() -> str:
    """The path of a Chromium for headless browser tests, or skip with the one reason allowed."""
    import shutil

    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip(
        f"{BROWSER_SKIP}: no chromium on PATH (Debian: apt-get install chromium; .ci/run installs it)"
    )


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    return str(longrepr[2] if isinstance(longrepr, tuple) else longrepr)


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail"):
        _skipped.append((report.nodeid, _skip_reason(report)))


def _forbidden_skips() -> list[tuple[str, str]]:
    return [(node, why) for node, why in _skipped if not any(ok in why for ok in ALLOWED_SKIPS)]


def pytest_sessionfinish(session, exitstatus):
    if _forbidden_skips() and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    forbidden = _forbidden_skips()
    allowed = len(_skipped) - len(forbidden)
    terminalreporter.write_line(
        f"skips: {len(_skipped)} ({allowed} for optional extras or Chromium not installed)"
    )
    for node, why in forbidden:
        terminalreporter.write_line(f"FORBIDDEN SKIP (our own code must fail, not skip): {node}: {why}")
