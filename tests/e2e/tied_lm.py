"""A small decoder with a tied embedding, built with ``onnx.helper``: the token embedding table is
the Gather table and, as exporters write it, the LM head weight.

``head`` picks the LM head pattern:

* ``transpose`` — ``MatMul(h, Transpose(embedding))``, the torch export of a tied ``lm_head``;
* ``gemm`` — ``Gemm(h2d, embedding, transB=1)`` on the flattened hidden states (``nn.Linear``);
* ``copy`` — ``Gemm(h2d, lm_head.weight, transB=1)`` where ``lm_head.weight`` is a second
  initializer holding the same bytes as the embedding (an exporter that un-ties on save);
* ``folded`` — ``MatMul(h, lm_head.weight_t)`` where ``lm_head.weight_t`` is the embedding
  transposed, a second initializer (TorchScript's constant folding of ``Transpose``).

Between embedding and head: a pre-LN FFN block with a residual and a final LayerNorm.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from mcpc.examples import _Builder

HEADS = ("transpose", "gemm", "copy", "folded")


def tied_lm(vocab: int = 4096, hidden: int = 256, seq: int = 8, head: str = "transpose") -> onnx.ModelProto:
    """The model: ``input_ids`` int64 [1, seq] -> ``logits`` f32 [1, seq, vocab] (see module doc)."""
    b = _Builder(seed=11)
    emb = b.weight("embed_tokens.weight", (vocab, hidden), std=0.05)
    h = b.op("Gather", [emb, "input_ids"], name="embed", axis=0)
    x = b.layer_norm(h, hidden, "block.ln")
    up = b.op("Relu", [b.linear(x, hidden, 2 * hidden, "block.fc1")])
    ffn = b.linear(up, 2 * hidden, hidden, "block.fc2")
    h = b.layer_norm(b.op("Add", [h, ffn], name="block.residual"), hidden, "final_ln")
    table = numpy_helper.to_array(next(t for t in b.inits if t.name == emb))
    if head in ("transpose", "folded"):
        if head == "transpose":
            w_t = b.op("Transpose", [emb], name="lm_head.transpose", perm=[1, 0])
        else:
            w_t = b.const("lm_head.weight_t", np.ascontiguousarray(table.T))
        logits = b.op("MatMul", [h, w_t], name="lm_head")
    else:
        w = emb
        if head == "copy":
            w = b.const("lm_head.weight", table.copy())
        shape2d = b.const("lm_head.shape2d", np.array([seq, hidden], dtype=np.int64))
        h2 = b.op("Reshape", [h, shape2d], name="lm_head.flatten")
        y = b.op("Gemm", [h2, w], name="lm_head", transB=1)
        shape3d = b.const("lm_head.shape3d", np.array([1, seq, vocab], dtype=np.int64))
        logits = b.op("Reshape", [y, shape3d], name="lm_head.unflatten")
    b.nodes.append(helper.make_node("Identity", [logits], ["logits"], name="output"))
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, seq])]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, seq, vocab])]
    return b.model(f"tied_lm_{head}", inputs, outputs, opset=17)


def float_initializer_bytes(model: onnx.ModelProto, distinct: bool = True) -> int:
    """Bytes of the model's float initializers; with ``distinct`` each content once, a matrix
    and its transpose (last two dims swapped) counting as one."""
    seen, total = set(), 0
    for t in model.graph.initializer:
        arr = numpy_helper.to_array(t)
        if arr.dtype.kind != "f":
            continue
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if distinct and key in seen:
            continue
        seen.add(key)
        if arr.ndim >= 2:
            swapped = np.ascontiguousarray(np.swapaxes(arr, -1, -2))
            seen.add((arr.dtype.str, swapped.shape, swapped.tobytes()))
        total += arr.nbytes
    return total
