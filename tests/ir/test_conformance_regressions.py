"""Regressions found by the ONNX node-test conformance run (``mcpc conformance``), one per fix.

Each is a small single-node model checked against the expected values the ONNX spec defines
(and ONNX Runtime where it implements the case), through the importer + IR interpreter.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from conftest import make_model, vi
from onnx import TensorProto, helper

from mcpc.errors import UnsupportedError
from mcpc.ir.interpreter import interpret
from mcpc.ir.onnx_import import import_onnx


def _run(model, feeds):
    return interpret(import_onnx(model), feeds)


@pytest.mark.parametrize("to_dtype", ["f32", "f16"])
def test_cast_to_f8e4m3fn_saturates_like_onnx_default(to_dtype):
    # test_cast_FLOAT_to_FLOAT8E4M3FN: overflow and infinities saturate to ±448, NaN stays NaN
    src = {"f32": (np.float32, TensorProto.FLOAT), "f16": (np.float16, TensorProto.FLOAT16)}[to_dtype]
    x = np.array([1e4, -1e4, np.inf, -np.inf, np.nan, 460.0, 0.47892547, -1e-7], dtype=src[0])
    node = helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT8E4M3FN)
    model = make_model([node], [vi("x", [8], src[1])], [vi("y", [8], TensorProto.FLOAT8E4M3FN)], opset=21)
    y = _run(model, {"x": x})["y"].astype(np.float32)
    want = np.clip(x.astype(np.float32), -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    np.testing.assert_array_equal(y, want)
    assert y[0] == 448 and y[3] == -448 and np.isnan(y[4])


def test_cast_saturate_false_is_a_clear_unsupported_error():
    node = helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT8E4M3FN, saturate=0)
    model = make_model([node], [vi("x", [2])], [vi("y", [2], TensorProto.FLOAT8E4M3FN)], opset=21)
    with pytest.raises(UnsupportedError, match="saturate=0"):
        import_onnx(model)


@pytest.mark.parametrize(
    ("op", "elem", "want"),
    [
        ("ReduceSum", TensorProto.FLOAT, 0.0),
        ("ReduceMax", TensorProto.FLOAT, -np.inf),
        ("ReduceMax", TensorProto.INT32, np.iinfo(np.int32).min),
        ("ReduceMax", TensorProto.BOOL, False),
    ],
)
def test_reduction_over_an_empty_set_gives_the_identity(op, elem, want, ort_run):
    # test_reduce_sum_empty_set / test_reduce_max_empty_set(_bool): axis 1 has length 0
    np_dtype = {TensorProto.FLOAT: np.float32, TensorProto.INT32: np.int32, TensorProto.BOOL: np.bool_}[elem]
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=1)
    model = make_model([node], [vi("x", [2, 0, 4], elem)], [vi("y", [2, 1, 4], elem)], [axes], opset=20)
    x = np.zeros((2, 0, 4), dtype=np_dtype)
    y = _run(model, {"x": x})["y"]
    assert y.shape == (2, 1, 4) and y.dtype == np_dtype
    np.testing.assert_array_equal(y, np.full((2, 1, 4), want, dtype=np_dtype))
    if elem != TensorProto.BOOL:  # ONNX Runtime has no bool ReduceMax kernel
        np.testing.assert_array_equal(y, ort_run(model, {"x": x})["y"])


def test_reduce_max_on_bool_is_any():
    # test_reduce_max_bool_inputs: opset 20 allows bool; the max of booleans is "any"
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    node = helper.make_node("ReduceMax", ["x", "axes"], ["y"], keepdims=1)
    model = make_model(
        [node], [vi("x", [4, 2], TensorProto.BOOL)], [vi("y", [4, 1], TensorProto.BOOL)], [axes], opset=20
    )
    x = np.array([[1, 1], [1, 0], [0, 1], [0, 0]], dtype=np.bool_)
    y = _run(model, {"x": x})["y"]
    np.testing.assert_array_equal(y, x.any(axis=1, keepdims=True))


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_layer_norm_mean_and_inv_std_dev_outputs(axis, ort_run):
    # test_layer_normalization_*: the optional Mean / InvStdDev outputs (keepdims over axis..end)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 5)).astype(np.float32)
    norm = [2, 3, 5][axis:] if axis >= 0 else [5]
    stat = [1 if i >= axis % 3 else d for i, d in enumerate((2, 3, 5))]
    w = helper.make_tensor("w", TensorProto.FLOAT, norm, rng.standard_normal(norm).ravel())
    node = helper.make_node("LayerNormalization", ["x", "w"], ["y", "m", "r"], axis=axis, epsilon=1e-3)
    model = make_model(
        [node], [vi("x", [2, 3, 5])], [vi("y", [2, 3, 5]), vi("m", stat), vi("r", stat)], [w], opset=17
    )
    got, want = _run(model, {"x": x}), ort_run(model, {"x": x})
    for name in ("y", "m", "r"):
        assert got[name].shape == want[name].shape
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)
