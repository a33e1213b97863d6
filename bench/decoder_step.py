"""A Llama-family decoder step with past K/V at a fixed context, and inputs for it.

``decoder_step(...)`` returns ``(model, inputs)``: the one-token decode graph of
``llama_decode.llama_decode_step`` (RMSNorm, RoPE, grouped-query attention, SwiGLU MLP, lm head;
random weights) in f32, with its ``past`` length fixed to ``context`` in the graph's inputs and
outputs, so ONNX Runtime and the compiler need no dim binding; and inputs: one new token
(``input_ids`` and ``position_ids`` [1, 1], int64, at position ``context``) after ``context``
cached positions (``past_key_i`` / ``past_value_i`` [1, kv_heads, context, head_dim], normal).
The defaults are SmolLM2-135M's shape (hidden 576, 30 layers, 9 query and 3 K/V heads of 64, MLP
1536, vocabulary 49 152).  Only the shapes and the op mix matter to the benchmark; ONNX Runtime
computes the same model on the same inputs.
"""

from __future__ import annotations

import numpy as np
import onnx
from llama_decode import LlamaConfig, llama_decode_step


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
    hd = hidden // heads
    cfg = LlamaConfig(hidden, layers, heads, kv_heads, hd, mlp, vocab, max_positions, "f32")
    model = llama_decode_step(cfg, seed)
    for value in list(model.graph.input) + list(model.graph.output):
        for d in value.type.tensor_type.shape.dim:
            if d.dim_param in ("past", "past_1"):
                d.dim_value = context + (d.dim_param == "past_1")  # setting the value clears the name
    rng = np.random.default_rng(seed + 1)
    inputs = {
        "input_ids": rng.integers(0, vocab, (1, 1)).astype(np.int64),
        "position_ids": np.array([[context]], dtype=np.int64),
    }
    for i in range(layers):
        for kind in ("key", "value"):
            inputs[f"past_{kind}_{i}"] = rng.standard_normal((1, kv_heads, context, hd), dtype=np.float32)
    return model, inputs
