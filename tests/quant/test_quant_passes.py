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
