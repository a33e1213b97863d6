"""Small ONNX models with quantized weights for the quantization tests: an MLP whose MatMul weights
are opset-21 DequantizeLinear of int4/uint4 (blocked along K) or int8 (per channel) initializers."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

_QTYPES = {"i4": (TensorProto.INT4, ml_dtypes.int4, -8, 7), "u4": (TensorProto.UINT4, ml_dtypes.uint4, 0, 15),
           "i8": (TensorProto.INT8, np.int8, -128, 127)}  # fmt: skip


def quantize_rtn(w: np.ndarray, dtype: str, block: int, symmetric: bool):
    """Round-to-nearest codes, scales and zero points of ``w`` [K, N], blocked along K (block 0:
    per output channel)."""
    _, npd, lo, hi = _QTYPES[dtype]
    k, n = w.shape
    b = block or k
    wb = w.reshape(k // b, b, n)
    if symmetric:
        scale = np.abs(wb).max(axis=1) / max(-lo, hi)
        zp = np.zeros_like(scale, dtype=np.int64)
    else:
        mn, mx = np.minimum(wb.min(axis=1), 0), np.maximum(wb.max(axis=1), 0)
        scale = (mx - mn) / (hi - lo)
        zp = np.clip(np.rint(lo - mn / np.where(scale == 0, 1, scale)), lo, hi).astype(np.int64)
    scale = np.where(scale == 0, 1.0, scale).astype(np.float32)
    codes = np.clip(np.rint(wb / scale[:, None, :]) + zp[:, None, :], lo, hi).reshape(k, n)
    return codes.astype(npd), scale, zp.astype(npd)


def qdq_mlp(dims=(64, 128, 96), dtype="i4", block=32, symmetric=False, batch=(2, 3), seed=0,
            transposed_last=False) -> onnx.ModelProto:  # fmt: skip
    """x [*batch, dims[0]] -> MatMul(DQ W1) -> Relu -> MatMul(DQ W2) -> y, weights quantized with
    ``quantize_rtn``.  ``transposed_last``: the second weight is stored [N, K] and transposed by a
    Transpose node (the layout of a tied LM head), quantized along its K axis (1)."""
    rng = np.random.default_rng(seed)
    qtype = _QTYPES[dtype][0]
    nodes, inits = [], []
    cur = "x"
    for i, (k, n) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
        w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
        codes, scale, zp = quantize_rtn(w, dtype, block, symmetric)
        attrs = {"axis": 0, "block_size": block} if block else {"axis": 1}
        if not block:
            scale, zp = scale.reshape(n), zp.reshape(n)
        trans = transposed_last and i == len(dims) - 2
        if trans:
            codes, scale, zp = codes.T.copy(), scale.T.copy(), zp.T.copy()
            attrs = {"axis": 1, "block_size": block} if block else {"axis": 0}
        inits += [
            helper.make_tensor(f"w{i}_q", qtype, codes.shape, codes.astype(np.int64).reshape(-1).tolist()),
            numpy_helper.from_array(scale, f"w{i}_s"),
            helper.make_tensor(f"w{i}_z", qtype, zp.shape, zp.astype(np.int64).reshape(-1).tolist()),
        ]
        nodes.append(
            helper.make_node("DequantizeLinear", [f"w{i}_q", f"w{i}_s", f"w{i}_z"], [f"w{i}"], **attrs)
        )
        wname = f"w{i}"
        if trans:
            nodes.append(helper.make_node("Transpose", [wname], [f"w{i}_t"], perm=[1, 0]))
            wname = f"w{i}_t"
        out = "y" if i == len(dims) - 2 else f"h{i}"
        nodes.append(helper.make_node("MatMul", [cur, wname], [f"{out}_mm" if out != "y" else "y"]))
        if out != "y":
            nodes.append(helper.make_node("Relu", [f"{out}_mm"], [out]))
        cur = out
    graph = helper.make_graph(
        nodes, "qdq_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [*batch, dims[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [*batch, dims[-1]])],
        inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


def quantized_tied_lm(vocab=96, hidden=64, seq=5, dtype="i4", block=32, symmetric=True, seed=0):
    """ids [1, seq] -> Gather(DQ(table)) -> Tanh -> MatMul(., Transpose(DQ(table))) -> logits: an
    int4 embedding table blocked along hidden, read by the Gather and as the tied LM head."""
    rng = np.random.default_rng(seed)
    qtype = _QTYPES[dtype][0]
    table = rng.standard_normal((vocab, hidden)).astype(np.float32)
    codes, scale, zp = quantize_rtn(table.T.copy(), dtype, block, symmetric)  # blocks along hidden
    codes, scale, zp = codes.T.copy(), scale.T.copy(), zp.T.copy()  # [V, H], [V, H/B]
    inits = [
        helper.make_tensor("t_q", qtype, codes.shape, codes.astype(np.int64).reshape(-1).tolist()),
        numpy_helper.from_array(scale, "t_s"),
        helper.make_tensor("t_z", qtype, zp.shape, zp.astype(np.int64).reshape(-1).tolist()),
    ]
    nodes = [
        helper.make_node("DequantizeLinear", ["t_q", "t_s", "t_z"], ["table"], axis=1, block_size=block),
        helper.make_node("Gather", ["table", "ids"], ["emb"], axis=0),
        helper.make_node("Tanh", ["emb"], ["h"]),
        helper.make_node("Transpose", ["table"], ["table_t"], perm=[1, 0]),
        helper.make_node("MatMul", ["h", "table_t"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes, "tied_lm",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, seq])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, seq, vocab])],
        inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


def qdq_q4f8_linear(k=64, n=32, rows=4, seed=0, per_channel=True):
    """x -> QuantizeLinear(int4) -> DequantizeLinear -> MatMul <- DequantizeLinear(fp8 e4m3fn W): the
    INT4 x FP8 layer of the seed (opset 21)."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    sw = (
        (np.abs(w).max(axis=0) / 448).astype(np.float32) if per_channel else np.float32(np.abs(w).max() / 448)
    )
    codes = np.clip(w / sw, -448, 448).astype(ml_dtypes.float8_e4m3fn)
    inits = [
        numpy_helper.from_array(np.array(0.4, np.float32), "sa"),
        helper.make_tensor("za", TensorProto.INT4, [], [0]),
        helper.make_tensor(
            "w_q", TensorProto.FLOAT8E4M3FN, codes.shape, codes.view(np.uint8).tobytes(), raw=True
        ),
        numpy_helper.from_array(np.asarray(sw, np.float32), "sw"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sa", "za"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "sa", "za"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w_q", "sw"], ["w"], axis=1),
        helper.make_node("MatMul", ["xd", "w"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "q4f8",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, n])],
        inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model
