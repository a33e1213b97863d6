"""Small models for the numeric guards: a Llama-style block whose activations are large enough that
their square overflows fp16, with RMSNorm written out as PyTorch exports it for Llama models
(Pow → ReduceMean → Add eps → Sqrt → Div), an additive causal mask holding -inf, and a softmax
written out (ReduceMax, Sub, Exp, ReduceSum, Div)."""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def llama_block(seq: int = 8, hidden: int = 64, ffn: int = 128, seed: int = 0) -> onnx.ModelProto:
    """x: [1, seq, hidden] f32 → y, same shape: RMSNorm, single-head causal attention, residual,
    RMSNorm, SiLU FFN, residual, final RMSNorm and an output projection (so the output depends on the
    norms, as logits do).  The RMSNorm nodes are named ``ln1.pow``, ``ln1.mean`` …"""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(op_type, inputs, name, **attrs):
        nodes.append(helper.make_node(op_type, list(inputs), [name], name=name, **attrs))
        return name

    def weight(name, shape):
        return const(name, (rng.standard_normal(shape) / math.sqrt(shape[0])).astype(np.float32))

    axes = const("axes_last", np.array([-1], np.int64))

    def rms_norm(x, p):
        sq = op("Pow", [x, const(f"{p}.two", np.float32(2.0))], f"{p}.pow")
        mean = op("ReduceMean", [sq, axes], f"{p}.mean", keepdims=1)
        eps = op("Add", [mean, const(f"{p}.eps", np.float32(1e-6))], f"{p}.add_eps")
        std = op("Sqrt", [eps], f"{p}.sqrt")
        g = const(f"{p}.weight", (1.0 + 0.1 * rng.standard_normal(hidden)).astype(np.float32))
        return op("Mul", [op("Div", [x, std], f"{p}.div"), g], f"{p}.scale")

    h = rms_norm("x", "ln1")
    q = op("MatMul", [h, weight("wq", (hidden, hidden))], "q")
    k = op("MatMul", [h, weight("wk", (hidden, hidden))], "k")
    v = op("MatMul", [h, weight("wv", (hidden, hidden))], "v")
    kt = op("Transpose", [k], "kt", perm=[0, 2, 1])
    scores = op("Mul", [op("MatMul", [q, kt], "qk"), const("scale", np.float32(1 / math.sqrt(hidden)))], "s")
    mask = np.triu(np.full((seq, seq), -np.inf, np.float32), 1)  # the -inf causal mask of exports
    scores = op("Add", [scores, const("causal_mask", mask)], "masked")
    z = op("Sub", [scores, op("ReduceMax", [scores, axes], "smax", keepdims=1)], "shifted")
    e = op("Exp", [z], "exp")
    probs = op("Div", [e, op("ReduceSum", [e, axes], "ssum", keepdims=1)], "probs")
    attn = op("MatMul", [op("MatMul", [probs, v], "ctx"), weight("wo", (hidden, hidden))], "o")
    h1 = op("Add", ["x", attn], "residual1")
    f = op("MatMul", [rms_norm(h1, "ln2"), weight("w1", (hidden, ffn))], "fc1")
    f = op("Mul", [f, op("Sigmoid", [f], "sig")], "silu")
    h2 = op("Add", [h1, op("MatMul", [f, weight("w2", (ffn, hidden))], "fc2")], "residual2")
    op("MatMul", [rms_norm(h2, "ln_f"), weight("w_out", (hidden, hidden))], "y")  # the final norm, head
    graph = helper.make_graph(
        nodes,
        "llama_block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, hidden])],
        inits,
    )
    opsets = [helper.make_opsetid("", 18)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = helper.find_min_ir_version_for(opsets)
    onnx.checker.check_model(model)
    return model


def large_inputs(seq: int = 8, hidden: int = 64, seed: int = 1) -> dict[str, np.ndarray]:
    """Activations of magnitude 300–1000 (their squares, 9e4–1e6, overflow fp16's 65504)."""
    rng = np.random.default_rng(seed)
    mag = rng.uniform(300.0, 1000.0, (1, seq, hidden))
    return {"x": (mag * rng.choice([-1.0, 1.0], mag.shape)).astype(np.float32)}
