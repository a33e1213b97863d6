"""A Llama-family decoder step with past K/V, written with ``onnx.helper`` and random weights.

``decoder_step(...)`` returns ``(model, inputs)``: one new token (``input_ids`` and
``position_ids`` [1, 1], int64) after ``context`` cached positions (``past_key_i`` /
``past_value_i`` [1, kv_heads, context, head_dim], f32) through ``layers`` pre-norm layers —
RMSNorm (Pow, ReduceMean, Add, Sqrt, Reciprocal, Mul), Q/K/V projections, rotary embedding (cos
and sin rows gathered by ``position_ids``, rotate-half by Slice/Neg/Concat), grouped-query
attention computed per K/V head (the query heads of a group reshaped beside each other, so K/V
are never repeated), softmax, output projection, SwiGLU MLP — then a final RMSNorm and the
language-model head.  Outputs: ``logits`` [1, 1, vocab] and ``present_key_i`` /
``present_value_i`` [1, kv_heads, context + 1, head_dim].  The defaults are SmolLM2-135M's shape
(hidden 576, 30 layers, 9 query and 3 K/V heads of 64, MLP 1536, vocabulary 49 152).

Weights are normal with std 1/√fan_in (norm gains near 1), inputs normal: only the shapes and the
op mix matter to the benchmark, and ONNX Runtime computes the same model on the same inputs.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def decoder_step(
    hidden: int = 576,
    layers: int = 30,
    heads: int = 9,
    kv_heads: int = 3,
    mlp: int = 1536,
    vocab: int = 49152,
    context: int = 256,
    max_positions: int = 2048,
    seed: int = 0,
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    if hidden % heads or heads % kv_heads:
        raise ValueError(f"hidden {hidden} / heads {heads} / kv_heads {kv_heads} do not divide")
    hd, group = hidden // heads, heads // kv_heads
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    count = [0]

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def weight(name, shape, std=None, mean=0.0):
        std = 1.0 / math.sqrt(shape[0]) if std is None else std
        return const(name, (mean + std * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32))

    def op(op_type, inputs, **attrs):
        count[0] += 1
        out = f"{op_type.lower()}_{count[0]}"
        nodes.append(helper.make_node(op_type, list(inputs), [out], name=out, **attrs))
        return out

    def shape(name, dims):
        return const(name, np.array(dims, dtype=np.int64))

    eps = const("eps", np.float32(1e-5))
    two = const("two", np.float32(2.0))

    def rms_norm(x, prefix):
        var = op("ReduceMean", [op("Pow", [x, two])], axes=[-1], keepdims=1)
        inv = op("Reciprocal", [op("Sqrt", [op("Add", [var, eps])])])
        return op("Mul", [op("Mul", [x, inv]), weight(f"{prefix}.weight", (hidden,), std=0.1, mean=1.0)])

    half = hd // 2
    starts0, starts1 = const("half.s0", np.array([0], np.int64)), const("half.s1", np.array([half], np.int64))
    ends1, ends2 = const("half.e1", np.array([half], np.int64)), const("half.e2", np.array([hd], np.int64))
    last = const("half.axis", np.array([-1], np.int64))

    def rotary(x, cos, sin):
        x1 = op("Slice", [x, starts0, ends1, last])
        x2 = op("Slice", [x, starts1, ends2, last])
        rot = op("Concat", [op("Neg", [x2]), x1], axis=-1)
        return op("Add", [op("Mul", [x, cos]), op("Mul", [rot, sin])])

    inv_freq = 1.0 / (100000.0 ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    angles = np.outer(np.arange(max_positions), inv_freq)
    angles = np.concatenate([angles, angles], axis=-1)
    cos_t = const("rope.cos", np.cos(angles).astype(np.float32))
    sin_t = const("rope.sin", np.sin(angles).astype(np.float32))
    rope_shape = shape("rope.shape", [1, 1, 1, hd])
    cos = op("Reshape", [op("Gather", [cos_t, "position_ids"], axis=0), rope_shape])
    sin = op("Reshape", [op("Gather", [sin_t, "position_ids"], axis=0), rope_shape])

    q_shape = shape("q.shape", [1, kv_heads, group, hd])  # one token: (kv head, its query heads, dim)
    kv_shape = shape("kv.shape", [1, 1, kv_heads, hd])
    out_shape = shape("attn.shape", [1, 1, hidden])
    scale = const("attn.scale", np.float32(1.0 / math.sqrt(hd)))
    x = op("Gather", [weight("embed.weight", (vocab, hidden), std=1.0), "input_ids"], axis=0)
    in_infos = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, 1]),
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, [1, 1]),
    ]
    out_infos = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 1, vocab])]
    for i in range(layers):
        p = f"layers.{i}"
        h = rms_norm(x, f"{p}.input_norm")
        q = rotary(op("Reshape", [op("MatMul", [h, weight(f"{p}.q", (hidden, hidden))]), q_shape]), cos, sin)
        k = op("Reshape", [op("MatMul", [h, weight(f"{p}.k", (hidden, kv_heads * hd))]), kv_shape])
        v = op("Reshape", [op("MatMul", [h, weight(f"{p}.v", (hidden, kv_heads * hd))]), kv_shape])
        k = rotary(op("Transpose", [k], perm=[0, 2, 1, 3]), cos, sin)
        v = op("Transpose", [v], perm=[0, 2, 1, 3])
        present_k = f"present_key_{i}"
        present_v = f"present_value_{i}"
        nodes.append(helper.make_node("Concat", [f"past_key_{i}", k], [present_k], name=f"{p}.cat_k", axis=2))
        nodes.append(
            helper.make_node("Concat", [f"past_value_{i}", v], [present_v], name=f"{p}.cat_v", axis=2)
        )
        scores = op("Mul", [op("MatMul", [q, op("Transpose", [present_k], perm=[0, 1, 3, 2])]), scale])
        ctx = op("MatMul", [op("Softmax", [scores], axis=-1), present_v])
        attn = op("MatMul", [op("Reshape", [ctx, out_shape]), weight(f"{p}.o", (hidden, hidden))])
        x = op("Add", [x, attn])
        h = rms_norm(x, f"{p}.post_norm")
        gate = op("MatMul", [h, weight(f"{p}.gate", (hidden, mlp))])
        up = op("MatMul", [h, weight(f"{p}.up", (hidden, mlp))])
        act = op("Mul", [op("Mul", [gate, op("Sigmoid", [gate])]), up])
        x = op("Add", [x, op("MatMul", [act, weight(f"{p}.down", (mlp, hidden))])])
        for name in (f"past_key_{i}", f"past_value_{i}"):
            in_infos.append(
                helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, kv_heads, context, hd])
            )
        for name in (present_k, present_v):
            out_infos.append(
                helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, kv_heads, context + 1, hd])
            )
    logits = op("MatMul", [rms_norm(x, "final_norm"), weight("lm_head", (hidden, vocab))])
    nodes.append(helper.make_node("Identity", [logits], ["logits"], name="logits"))
    graph = helper.make_graph(nodes, "decoder_step", in_infos, out_infos, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="mcpc.bench")
    model.ir_version = 8  # loadable by ONNX Runtime releases that lag onnx
    inputs = {
        "input_ids": rng.integers(0, vocab, (1, 1), dtype=np.int64),
        "position_ids": np.array([[context]], dtype=np.int64),
    }
    for i in range(layers):
        for kind in ("key", "value"):
            inputs[f"past_{kind}_{i}"] = rng.standard_normal((1, kv_heads, context, hd), dtype=np.float32)
    return model, inputs
