"""Small ONNX models for the quantization pass tests: a tied-embedding language model."""

from __future__ import annotations

import numpy as np
from conftest import make_model, vi
from onnx import TensorProto, helper, numpy_helper


def tiny_lm(
    vocab: int = 50,
    hidden: int = 64,
    ffn: int = 80,
    seq: int = 8,
    seed: int = 0,
    untied: bool = False,
    out: int | None = None,
):
    """``ids`` [1, seq] -> Gather(E) -> MatMul W1 + b1 -> Relu -> MatMul W2 -> + residual ->
    MatMul(h, Transpose(E)) = ``logits`` [1, seq, vocab]: the embedding table is tied to the LM
    head.  ``ffn`` not a multiple of 32 gives W2 a short last group.  ``untied``: the last matmul
    reads its own weight H [hidden, out] (``out`` defaults to ``vocab``), plus a bias, then a
    Reshape to [seq, out]."""
    rng = np.random.default_rng(seed)
    inits = {
        "E": rng.standard_normal((vocab, hidden)).astype(np.float32) * np.float32(0.5),
        "W1": (rng.standard_normal((hidden, ffn)) / np.sqrt(hidden)).astype(np.float32),
        "b1": rng.standard_normal(ffn).astype(np.float32) * np.float32(0.1),
        "W2": (rng.standard_normal((ffn, hidden)) / np.sqrt(ffn)).astype(np.float32),
    }
    nodes = [
        helper.make_node("Gather", ["E", "ids"], ["h0"], name="embed"),
        helper.make_node("MatMul", ["h0", "W1"], ["m1"], name="up"),
        helper.make_node("Add", ["m1", "b1"], ["a1"], name="up_bias"),
        helper.make_node("Relu", ["a1"], ["r1"], name="act"),
        helper.make_node("MatMul", ["r1", "W2"], ["m2"], name="down"),
        helper.make_node("Add", ["h0", "m2"], ["h1"], name="residual"),
        helper.make_node("Transpose", ["E"], ["Et"], name="tie", perm=[1, 0]),
        helper.make_node("MatMul", ["h1", "Et"], ["logits"], name="lm_head"),
    ]
    out_shape = [1, seq, vocab]
    if untied:
        out = vocab if out is None else out
        inits["H"] = (rng.standard_normal((hidden, out)) / np.sqrt(hidden)).astype(np.float32)
        inits["hb"] = rng.standard_normal(out).astype(np.float32) * np.float32(0.1)
        inits["shape"] = np.array([seq, out], np.int64)
        nodes[-2:] = [
            helper.make_node("MatMul", ["h1", "H"], ["mh"], name="lm_head"),
            helper.make_node("Add", ["mh", "hb"], ["ah"], name="lm_head_bias"),
            helper.make_node("Reshape", ["ah", "shape"], ["logits"], name="flat"),
        ]
        out_shape = [seq, out]
    return make_model(
        nodes,
        [vi("ids", [1, seq], TensorProto.INT64)],
        [vi("logits", out_shape)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
        name="tiny_lm",
    )


def token_batches(n: int, vocab: int = 50, seq: int = 8, seed: int = 1) -> np.ndarray:
    """``n`` samples of token ids, [n, seq] int64."""
    return np.random.default_rng(seed).integers(0, vocab, size=(n, seq)).astype(np.int64)
