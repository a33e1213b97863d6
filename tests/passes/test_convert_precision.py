"""convert-precision: the fp16 build keeps the interface, converts weights and activations,
keeps f32 accumulation, leaves ints and ops that refuse the new dtype alone."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from conftest import norm_max_err

from mcpc.errors import UsageError
from mcpc.examples import causal_mask, encoder_block
from mcpc.ir import parse_module, print_module
from mcpc.ir.dtypes import F16
from mcpc.ir.interpreter import interpret
from mcpc.ir.onnx_import import import_onnx
from mcpc.passes import PassManager, build_pipeline, load_all_passes
from mcpc.passes.convert_precision import convert_constant

load_all_passes()


def _pipeline(text):
    return PassManager(build_pipeline(text))


@pytest.mark.parametrize("dtype,tol", [("f16", 5e-3), ("bf16", 4e-2)])
def test_encoder_reduced_precision_build(dtype, tol, ort_run):
    model = encoder_block(hidden=64, heads=2, seq=16)
    feeds = {
        "x": np.random.default_rng(0).standard_normal((1, 16, 64)).astype(np.float32),
        "mask": causal_mask(16),
    }
    module = _pipeline(f"fold-constants,convert-precision{{dtype={dtype}}},dce").run(import_onnx(model))
    func = module.main
    assert [str(a.type) for a in func.args] == ["tensor<1x16x64xf32>", "tensor<1x1x16x16xi1>"]
    assert [str(v.type) for v in func.outputs] == ["tensor<1x16x64xf32>"]
    floats = {v.type.dtype.name for op in func.ops[1:-2] for v in op.results if v.type.dtype.is_float}
    assert floats == {dtype}  # every activation and weight between the boundary casts
    assert all(op.attrs["out"].name == dtype for op in func.ops if op.name == "mcp.matmul")
    assert Counter(op.name for op in func.ops)["mcp.cast"] == 2  # in and out, nothing else
    y = interpret(module, feeds)["y"]
    err = norm_max_err(y, ort_run(model, feeds)["y"])
    assert 0 < err <= tol  # really reduced precision, and still accurate
    text = print_module(module)
    assert print_module(parse_module(text)) == text


def test_constants_round_and_saturate():
    v = np.array([1e9, -1e9, np.inf, -np.inf, 1 / 3, 65519.0, 65520.0], np.float32)
    out = convert_constant(v, F16)
    assert out.dtype == np.float16
    assert out[0] == 65504 and out[1] == -65504 and np.isposinf(out[2]) and np.isneginf(out[3])
    assert out[4] == np.float16(1 / 3)
    assert out[5] == 65504 and out[6] == 65504  # clamp before rounding: no overflow to inf


def test_ints_and_f32_only_ops_are_left_alone(f32_only_op):
    results = '"y": tensor<2xf32>, "z": tensor<4xf32>, "k": tensor<2xi32>'
    text = f"""module @m {{
  func @main(%x: tensor<4xf32>, %i: tensor<2xi32>) -> ({results}) {{
    %0 = mcp.constant {{value = dense<[1, 1]> : tensor<2xi32>}} : () -> tensor<2xi32>
    %1 = mcp.add %i, %0 : (tensor<2xi32>, tensor<2xi32>) -> tensor<2xi32>
    %2 = mcp.gather %x, %1 {{axis = 0}} : (tensor<4xf32>, tensor<2xi32>) -> tensor<2xf32>
    %3 = mcp.exp %x : (tensor<4xf32>) -> tensor<4xf32>
    %4 = test.f32_only %3 : (tensor<4xf32>) -> tensor<4xf32>
    %5 = mcp.neg %4 : (tensor<4xf32>) -> tensor<4xf32>
    mcp.return %2, %5, %1 : (tensor<2xf32>, tensor<4xf32>, tensor<2xi32>) -> ()
  }}
}}
"""
    out = print_module(_pipeline("convert-precision").run(parse_module(text)))
    assert "mcp.add %i, %1 : (tensor<2xi32>, tensor<2xi32>) -> tensor<2xi32>" in out
    assert "mcp.gather %0, %2 {axis = 0} : (tensor<4xf16>, tensor<2xi32>) -> tensor<2xf16>" in out
    assert "mcp.exp %0 : (tensor<4xf16>) -> tensor<4xf16>" in out
    # the f32-only op gets its operand cast back to f32 and stays as it was
    assert "mcp.cast %4 {to = f32} : (tensor<4xf16>) -> tensor<4xf32>" in out
    assert "test.f32_only %5 : (tensor<4xf32>) -> tensor<4xf32>" in out
    # an f32 island: its result goes back to f16 for its consumer
    assert "mcp.cast %6 {to = f16} : (tensor<4xf32>) -> tensor<4xf16>" in out
    assert "mcp.neg %7 : (tensor<4xf16>) -> tensor<4xf16>" in out


def test_casts_to_f32_become_casts_to_target_and_noop_casts_vanish():
    text = """module @m {
  func @main(%i: tensor<3xi32>, %h: tensor<3xf16>) -> ("y": tensor<3xf32>, "z": tensor<3xf32>) {
    %0 = mcp.cast %i {to = f32} : (tensor<3xi32>) -> tensor<3xf32>
    %1 = mcp.cast %h {to = f32} : (tensor<3xf16>) -> tensor<3xf32>
    %2 = mcp.add %0, %1 : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32>
    mcp.return %2, %1 : (tensor<3xf32>, tensor<3xf32>) -> ()
  }
}
"""
    module = _pipeline("convert-precision{dtype=f16},dce").run(parse_module(text))
    out = print_module(module)
    assert "mcp.cast %i {to = f16}" in out
    assert "mcp.add %0, %h : (tensor<3xf16>, tensor<3xf16>) -> tensor<3xf16>" in out
    i = np.array([1, 2, 3], np.int32)
    h = np.array([0.5, 0.25, -1], np.float16)
    got = interpret(module, {"i": i, "h": h})
    np.testing.assert_array_equal(got["y"], np.array([1.5, 2.25, 2.0], np.float32))
    np.testing.assert_array_equal(got["z"], h.astype(np.float32))


def test_invalid_dtype_is_a_usage_error():
    with pytest.raises(UsageError, match="f16, bf16"):
        build_pipeline("convert-precision{dtype=i8}")
