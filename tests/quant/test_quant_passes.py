"""fuse-dequantize-matmul and expand-quantize: what fuses and what does not, same bits as the
unfused IR, and the exit-4 refusals naming the node."""

from __future__ import annotations

import numpy as np
import pytest
from qmodels import qdq_mlp

from mcpc.errors import UnsupportedError
from mcpc.ir.interpreter import interpret
from mcpc.ir.onnx_import import import_onnx
from mcpc.passes import PassContext, PassManager, build_pipeline, load_all_passes

load_all_passes()


def _run(module, pipeline: str):
    return PassManager(build_pipeline(pipeline)).run(module, PassContext())


def _names(module) -> list[str]:
    return [op.name for op in module.main.ops]


@pytest.mark.parametrize("dtype, block, trans", [("i4", 32, False), ("u4", 16, True), ("i8", 0, False)])
def test_fused_equals_unfused_bits(dtype, block, trans):
    model = qdq_mlp(dtype=dtype, block=block, symmetric=False, transposed_last=trans)
    x = np.random.default_rng(0).standard_normal((2, 3, 64)).astype(np.float32)
    unfused = import_onnx(model)
    expect = interpret(unfused, {"x": x})["y"]
    fused = _run(import_onnx(model), "fuse-dequantize-matmul,dce")
    assert _names(fused).count("mcp.matmul_w4a16") == 2 and "mcp.dequantize" not in _names(fused)
    np.testing.assert_array_equal(interpret(fused, {"x": x})["y"], expect)


def test_weight_quantized_along_n_is_left_unfused():
    """Blocks along N do not match the instruction's groups along K: the dequantize stays."""
    from onnx import helper

    model = qdq_mlp(dtype="i8", block=0, symmetric=True, dims=(64, 32))
    dq = next(n for n in model.graph.node if n.op_type == "DequantizeLinear")
    for init in model.graph.initializer:  # per-channel along axis 0 (K) instead of 1 (N)
        if init.name in ("w0_s", "w0_z"):
            init.dims[:] = [64]
            arr = np.ones(64, np.float32) * 0.01 if init.name == "w0_s" else np.zeros(64, np.int8)
            init.CopyFrom(helper.make_tensor(init.name, init.data_type, [64], arr.tolist()))
    dq.attribute[0].i = 0
    module = _run(import_onnx(model), "fuse-dequantize-matmul,dce")
    assert "mcp.matmul_w4a16" not in _names(module) and "mcp.dequantize" in _names(module)
    # it still runs: expand-quantize writes the dequantize as vector ops, same bits
    x = np.random.default_rng(1).standard_normal((2, 3, 64)).astype(np.float32)
    expanded = _run(import_onnx(model), "fuse-dequantize-matmul,expand-quantize,dce")
    assert not any("quantize" in n for n in _names(expanded))
    np.testing.assert_array_equal(interpret(expanded, {"x": x})["y"], interpret(module, {"x": x})["y"])


def test_unfused_int4_dequantize_is_refused_naming_the_node():
    from onnx import helper

    model = qdq_mlp(dtype="i4", block=32, symmetric=True, dims=(64, 32))
    # the dequantized weight also feeds an Add: that use cannot read the packed codes
    model.graph.node.append(helper.make_node("ReduceSum", ["w0"], ["wsum"], keepdims=0, name="uses_w0"))
    model.graph.output.append(helper.make_tensor_value_info("wsum", 1, []))
    with pytest.raises(UnsupportedError, match=r"DequantizeLinear.*i4 codes that do not feed a matmul"):
        _run(import_onnx(model), "fuse-dequantize-matmul,expand-quantize,dce")


@pytest.mark.parametrize("hidden, block", [(64, 64), (96, 32), (64, 128)])
def test_odd_4bit_zero_point_groups_are_split_with_the_same_bits(hidden, block):
    """A tied uint4 table whose rows hold an odd number of groups (one group per row when the
    block spans it) has zero-point rows that do not start on a byte: fuse-dequantize-matmul splits
    the blocks (scales and zero points repeated) so the LM head fuses and the gathered rows
    dequantize with vdequant; the values are the unsplit dequantize's, bit for bit."""
    from qmodels import quantized_tied_lm

    from mcpc.ir.ops_qmatmul import rows_dequantize
    from mcpc.ir.ops_quant import DequantizeOp

    model = quantized_tied_lm(hidden=hidden, block=min(block, hidden), dtype="u4", symmetric=False)
    if block > hidden:  # an imported block larger than the axis: still one group per row
        next(n for n in model.graph.node if n.op_type == "DequantizeLinear").attribute[1].i = block
    ids = np.array([[3, 95, 0, 41, 3]], np.int64)
    expect = interpret(import_onnx(model), {"ids": ids})["logits"]
    fused = _run(import_onnx(model), "fuse-dequantize-matmul,dce")
    assert _names(fused).count("mcp.matmul_w4a16") == 1
    deqs = [op for op in fused.main.ops if isinstance(op, DequantizeOp)]
    assert len(deqs) == 1 and rows_dequantize(deqs[0]) and deqs[0].operands[1].type.shape[-1] % 2 == 0
    np.testing.assert_array_equal(interpret(fused, {"ids": ids})["logits"], expect)


def test_rows_dequantize_refuses_odd_4bit_zero_point_rows():
    """vdequant reads each row of a zero-point tile from a byte: a [rows, 1] uint4 zero point
    stored packed two rows per byte is not such a tile (all-zero constant zero points are not read)."""
    import ml_dtypes

    from mcpc.ir.ops_core import ConstantOp
    from mcpc.ir.ops_qmatmul import rows_dequantize
    from mcpc.ir.ops_quant import DequantizeOp

    def deq(groups: int, zp_value: int) -> DequantizeOp:
        codes = ConstantOp([], {"value": np.zeros((4, 64), ml_dtypes.uint4)})
        scale = ConstantOp([], {"value": np.ones((4, groups), np.float16)})
        zp = ConstantOp([], {"value": np.full((4, groups), zp_value, ml_dtypes.uint4)})
        return DequantizeOp([codes.result, scale.result, zp.result], {"axis": 1, "block_size": 64 // groups})

    assert not rows_dequantize(deq(1, 8))
    assert rows_dequantize(deq(1, 0)) and rows_dequantize(deq(2, 8))
