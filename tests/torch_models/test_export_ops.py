"""The ONNX ops PyTorch's exporters emit that the fixtures made us add: IsNaN (both exporters guard
SDPA's softmax with ``Where(IsNaN(p), 0, p)`` when the mask is boolean) and its sibling IsInf.

Both are decompositions into existing IR ops (``isnan(x) = (x == x) == false``,
``isinf(x) = |x| == inf``), so the interpreter's and the backend's semantics are those ops'; the
tests hold them to ONNX Runtime on NaN, ±inf, ±0 and finite values, through the interpreter and
through compiled fp32/fp16 builds on the simulator.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import make_model, vi
from onnx import TensorProto, helper

import mcpc
from mcpc.ir.interpreter import interpret
from mcpc.ir.onnx_import import import_onnx
from mcpc.sim.api import load_program, run_program

SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.5, -3.0, 65504.0], dtype=np.float32)


def _x(dtype) -> np.ndarray:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 16)).astype(dtype)
    x.reshape(-1)[: SPECIALS.size] = SPECIALS.astype(dtype)
    return x


def _guard_model(elem=TensorProto.FLOAT, **isinf_attrs):
    """y = Where(IsNaN(x) or IsInf(x), 0, x) — the exporters' guard — plus both masks as outputs."""
    nodes = [
        helper.make_node("IsNaN", ["x"], ["nan"]),
        helper.make_node("IsInf", ["x"], ["inf"], **isinf_attrs),
        helper.make_node("Or", ["nan", "inf"], ["bad"]),
        helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("z", elem, [], [0.0])),
        helper.make_node("Where", ["bad", "zero", "x"], ["y"]),
    ]
    outs = [
        vi("y", [3, 16], elem),
        vi("nan", [3, 16], TensorProto.BOOL),
        vi("inf", [3, 16], TensorProto.BOOL),
    ]
    return make_model(nodes, [vi("x", [3, 16], elem)], outs, opset=20)  # IsInf takes f16 from 20


ATTRS = [{}, {"detect_positive": 0}, {"detect_negative": 0}, {"detect_positive": 0, "detect_negative": 0}]


@pytest.mark.parametrize("attrs", ATTRS)
@pytest.mark.parametrize("elem", [TensorProto.FLOAT, TensorProto.FLOAT16])
def test_interpreter_matches_onnxruntime(ort_run, elem, attrs):
    model = _guard_model(elem, **attrs)
    x = _x(np.float32 if elem == TensorProto.FLOAT else np.float16)
    ours, ref = interpret(import_onnx(model), {"x": x}), ort_run(model, {"x": x})
    for name in ("y", "nan", "inf"):
        assert ours[name].dtype == ref[name].dtype and np.array_equal(ours[name], ref[name]), name
    assert ref["nan"].sum() == 1  # the data really holds the specials the ops must find


@pytest.mark.parametrize("config", ["fp32", "fp16"])
@pytest.mark.parametrize("attrs", ATTRS[:2])
def test_compiled_build_matches_onnxruntime(ort_run, tmp_path, config, attrs):
    model = _guard_model(**attrs)
    x = _x(np.float32)
    x.reshape(-1)[-1] = 1e6  # beyond f16: the fp16 build saturates no input, it rounds x to inf
    prog, path = tmp_path / "m.mcpb", tmp_path / "m.onnx"
    onnx.save(model, path)
    mcpc.compile(path, target="mcp2026-edge", qat_config=config, output=prog)
    sim = run_program(load_program(prog), {"x": x}).outputs
    ref = ort_run(model, {"x": x})
    if config == "fp32":
        for name in ("y", "nan", "inf"):
            assert np.array_equal(sim[name], ref[name]), name
    else:  # in f16 the 1e6 is +inf: one more element detected (when +inf counts), zeroed in y
        extra = np.zeros_like(ref["inf"])
        extra.reshape(-1)[-1] = attrs.get("detect_positive", 1) == 1
        assert np.array_equal(sim["nan"], ref["nan"])
        assert np.array_equal(sim["inf"], ref["inf"] | extra)
        with np.errstate(over="ignore"):  # 1e6 → inf is the point
            x16 = x.astype(np.float16)
        want = np.where(ref["inf"] | extra | ref["nan"], 0, x16).astype(np.float32)
        assert np.array_equal(sim["y"], want)
