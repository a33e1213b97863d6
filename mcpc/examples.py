"""Bundled example models, built with ``onnx.helper`` only and deterministic for a given seed.

* ``mlp`` — Gemm(transB) → Relu → MatMul + Add: the PyTorch ``nn.Linear`` export pattern.
* ``encoder_block`` — a pre-LN transformer encoder layer: LayerNorm, Q/K/V MatMul + bias, reshape
  and transpose to heads, scaled QKᵀ, a **bool** ``mask`` input (True = may attend) applied as
  ``Where(mask, scores, -1e9)``, Softmax, ·V, output projection, residual, LayerNorm, FFN with
  GELU written with Erf (``x·0.5·(1 + Erf(x/√2))``), residual.
* ``decoder_block`` — a causal self-attention layer whose input has a symbolic ``seq`` dim: the
  causal mask and every reshape target are computed inside the graph from Shape/Gather/Range/
  Unsqueeze/Concat, so importing it exercises shape-subgraph folding.  LayerNorm is written out
  (ReduceMean/Sub/Pow/Sqrt/Div), Q/K/V come from one fused MatMul and a Split, the FFN uses SiLU.

Weights are normal with std ``1/√fan_in`` (0.02–0.06 at these sizes), LayerNorm gains near 1 and
small biases, so activations stay O(1) and attention is not uniform: well-conditioned outputs.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from mcpc.fileio import write_atomic_with

_NEG = -1e9  # masked attention logit (saturates to the dtype's lowest finite value in f16 builds)


class _Builder:
    """Collects nodes and initializers with unique names; draws weights from one seeded RNG."""

    def __init__(self, seed: int, opset: int = 17):
        self.opset = opset
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def const(self, name: str, value) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def weight(self, name: str, shape, std: float | None = None, mean: float = 0.0) -> str:
        std = 1.0 / math.sqrt(shape[0]) if std is None else std
        return self.const(name, (mean + std * self.rng.standard_normal(shape)).astype(np.float32))

    def op(self, op_type: str, inputs, n_out: int = 1, name: str | None = None, **attrs):
        self.count += 1
        name = name or f"{op_type.lower()}_{self.count}"
        outs = [f"{name}_out{i}" if n_out > 1 else f"{name}_out" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=name, **attrs))
        return outs if n_out > 1 else outs[0]

    def linear(self, x: str, d_in: int, d_out: int, prefix: str) -> str:
        w = self.weight(f"{prefix}.weight", (d_in, d_out))
        b = self.weight(f"{prefix}.bias", (d_out,), std=0.02)
        return self.op("Add", [self.op("MatMul", [x, w], name=f"{prefix}.matmul"), b], name=f"{prefix}.add")

    def layer_norm(self, x: str, d: int, prefix: str) -> str:
        g = self.weight(f"{prefix}.weight", (d,), std=0.1, mean=1.0)
        b = self.weight(f"{prefix}.bias", (d,), std=0.02)
        if self.opset >= 17:
            return self.op("LayerNormalization", [x, g, b], name=prefix, axis=-1, epsilon=1e-5)
        # LayerNormalization is opset 17: older exports spell it out (ReduceMean axes: an attribute < 18)
        d = self.op("Sub", [x, self.op("ReduceMean", [x], axes=[-1])])
        var = self.op("ReduceMean", [self.op("Mul", [d, d])], axes=[-1])
        std = self.op("Sqrt", [self.op("Add", [var, self.const(f"{prefix}.eps", np.float32(1e-5))])])
        return self.op("Add", [self.op("Mul", [self.op("Div", [d, std]), g]), b], name=prefix)

    def model(self, name: str, inputs, outputs, opset: int) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        opsets = [helper.make_opsetid("", opset)]
        model = helper.make_model(graph, opset_imports=opsets, producer_name="mcpc.examples")
        # the oldest IR version that carries this opset: loadable by ONNX Runtime releases that lag onnx
        model.ir_version = helper.find_min_ir_version_for(opsets)
        onnx.checker.check_model(model)
        return model


def mlp(batch: int = 4, d_in: int = 256, d_hidden: int = 1024, d_out: int = 256, seed: int = 0):
    """``y = Relu(x Wᵀ + b1) W2 + b2`` with x: [batch, d_in] f32 (opset 17, static shapes)."""
    b = _Builder(seed)
    w1 = b.weight("fc1.weight", (d_hidden, d_in), std=1 / math.sqrt(d_in))  # nn.Linear layout [out, in]
    b1 = b.weight("fc1.bias", (d_hidden,), std=0.02)
    h = b.op("Relu", [b.op("Gemm", ["x", w1, b1], name="fc1", transB=1)], name="relu")
    y = b.linear(h, d_hidden, d_out, "fc2")
    b.nodes.append(helper.make_node("Identity", [y], ["y"], name="output"))
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, d_in])
    y_info = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, d_out])
    return b.model("mlp", [x_info], [y_info], 17)


def _gelu_erf(b: _Builder, x: str) -> str:
    e = b.op("Erf", [b.op("Div", [x, b.const(f"sqrt2_{b.count}", np.float32(math.sqrt(2.0)))])])
    one = b.op("Add", [e, b.const(f"one_{b.count}", np.float32(1.0))])
    return b.op("Mul", [b.op("Mul", [x, one]), b.const(f"half_{b.count}", np.float32(0.5))])


def _heads(b: _Builder, x: str, shape: str, perm) -> str:
    return b.op("Transpose", [b.op("Reshape", [x, shape])], perm=list(perm))


def encoder_block(
    hidden: int = 256,
    heads: int = 4,
    seq: int = 64,
    opset: int = 17,
    causal_mask_input: bool = True,
    batch: int = 1,
    ffn: int | None = None,
    seed: int = 0,
) -> onnx.ModelProto:
    """Pre-LN encoder layer on x: [batch, seq, hidden] f32 → y of the same shape.

    With ``causal_mask_input`` the model has a second input ``mask``: bool [batch, 1, seq, seq],
    True where a query may attend a key (``causal_mask(seq)`` makes the causal one).
    """
    if hidden % heads:
        raise ValueError(f"hidden {hidden} is not divisible by heads {heads}")
    hd, ffn = hidden // heads, ffn or 4 * hidden
    b = _Builder(seed, opset)
    h = b.layer_norm("x", hidden, "ln1")
    # Reshape with 0 = "copy this dim", as exporters write it
    split_shape = b.const("heads_shape", np.array([0, 0, heads, hd], np.int64))
    q = _heads(b, b.linear(h, hidden, hidden, "q_proj"), split_shape, (0, 2, 1, 3))
    k_t = _heads(b, b.linear(h, hidden, hidden, "k_proj"), split_shape, (0, 2, 3, 1))
    v = _heads(b, b.linear(h, hidden, hidden, "v_proj"), split_shape, (0, 2, 1, 3))
    scores = b.op("Mul", [b.op("MatMul", [q, k_t]), b.const("attn_scale", np.float32(1 / math.sqrt(hd)))])
    if causal_mask_input:
        scores = b.op("Where", ["mask", scores, b.const("mask_fill", np.float32(_NEG))], name="apply_mask")
    probs = b.op("Softmax", [scores], name="softmax", axis=-1)
    ctx = b.op("Transpose", [b.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
    ctx = b.op("Reshape", [ctx, b.const("merge_shape", np.array([0, 0, hidden], np.int64))])
    h1 = b.op("Add", ["x", b.linear(ctx, hidden, hidden, "o_proj")], name="residual1")
    f = _gelu_erf(b, b.linear(b.layer_norm(h1, hidden, "ln2"), hidden, ffn, "fc1"))
    y = b.op("Add", [h1, b.linear(f, ffn, hidden, "fc2")], name="residual2")
    b.nodes.append(helper.make_node("Identity", [y], ["y"], name="output"))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, seq, hidden])]
    if causal_mask_input:
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.BOOL, [batch, 1, seq, seq]))
    y_info = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, seq, hidden])
    return b.model("encoder_block", inputs, [y_info], opset)


def causal_mask(seq: int, batch: int = 1) -> np.ndarray:
    """bool [batch, 1, seq, seq]: True on and below the diagonal (query i may attend keys ≤ i)."""
    return np.broadcast_to(np.tril(np.ones((seq, seq), dtype=bool)), (batch, 1, seq, seq)).copy()


def decoder_block(hidden: int = 256, heads: int = 4, opset: int = 17, seed: int = 0) -> onnx.ModelProto:
    """Causal self-attention layer on x: [1, "seq", hidden] f32 (``seq`` symbolic) → y, same shape."""
    hd = hidden // heads
    b = _Builder(seed, opset)
    i64 = lambda name, v: b.const(name, np.array(v, np.int64))  # noqa: E731

    def mean(x: str) -> str:  # axes became an input in opset 18
        if opset >= 18:
            return b.op("ReduceMean", [x, i64(f"mean_axes_{b.count}", [-1])], keepdims=1)
        return b.op("ReduceMean", [x], axes=[-1], keepdims=1)

    def norm(x: str, prefix: str) -> str:  # LayerNorm written out, as older exporters emit it
        mu = mean(x)
        d = b.op("Sub", [x, mu])
        var = mean(b.op("Pow", [d, b.const(f"{prefix}.two", np.float32(2.0))]))
        std = b.op("Sqrt", [b.op("Add", [var, b.const(f"{prefix}.eps", np.float32(1e-5))])])
        g = b.weight(f"{prefix}.weight", (hidden,), std=0.1, mean=1.0)
        return b.op("Mul", [b.op("Div", [d, std]), g])

    shape = b.op("Shape", ["x"], name="x_shape")
    seq = b.op("Gather", [shape, i64("one", 1)], axis=0)  # scalar: the bound seq length
    seq_1d = b.op("Unsqueeze", [seq, i64("axes0", [0])])
    batch_1d = b.op("Slice", [shape, i64("s0", [0]), i64("s1", [1])])
    heads_shape = b.op("Concat", [batch_1d, seq_1d, i64("heads_hd", [heads, hd])], axis=0)
    merge_shape = b.op("Concat", [batch_1d, seq_1d, i64("hidden", [hidden])], axis=0)
    pos = b.op("Range", [i64("zero", 0), seq, i64("step", 1)])
    future = b.op(
        "Greater",
        [b.op("Unsqueeze", [pos, i64("axes_row", [0])]), b.op("Unsqueeze", [pos, i64("axes_col", [1])])],
        name="causal_future",
    )
    qkv = b.linear(norm("x", "ln1"), hidden, 3 * hidden, "qkv_proj")
    q, k, v = b.op("Split", [qkv, i64("qkv_split", [hidden] * 3)], n_out=3, axis=-1)
    q = _heads(b, q, heads_shape, (0, 2, 1, 3))
    k_t = _heads(b, k, heads_shape, (0, 2, 3, 1))
    v = _heads(b, v, heads_shape, (0, 2, 1, 3))
    scores = b.op("Div", [b.op("MatMul", [q, k_t]), b.const("attn_div", np.float32(math.sqrt(hd)))])
    scores = b.op("Where", [future, b.const("mask_fill", np.float32(_NEG)), scores], name="apply_causal")
    probs = b.op("Softmax", [scores], axis=-1)
    ctx = b.op("Transpose", [b.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
    ctx = b.op("Reshape", [ctx, merge_shape])
    h1 = b.op("Add", ["x", b.linear(ctx, hidden, hidden, "o_proj")])
    f = b.linear(norm(h1, "ln2"), hidden, 4 * hidden, "fc1")
    f = b.op("Mul", [f, b.op("Sigmoid", [f])], name="silu")
    y = b.op("Add", [h1, b.linear(f, 4 * hidden, hidden, "fc2")])
    b.nodes.append(helper.make_node("Identity", [y], ["y"], name="output"))
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seq", hidden])
    y_info = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "seq", hidden])
    return b.model("decoder_block", [x_info], [y_info], opset)


def build_examples(out_dir: str | Path, seed: int = 0, decoder_seq: int = 32) -> list[Path]:
    """Write ``mlp``, ``encoder_block`` and ``decoder_block`` as ``NAME.onnx`` plus ``NAME.npz``
    (random inputs keyed by input name; the decoder's for ``--dim seq=decoder_seq``) into
    ``out_dir`` (created if missing).  Each file is written to a temp file and renamed."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed + 1)
    enc = encoder_block(seed=seed)
    enc_x = enc.graph.input[0].type.tensor_type.shape
    batch, seq, hidden = (d.dim_value for d in enc_x.dim)
    models = {
        "mlp": (mlp(seed=seed), {"x": rng.standard_normal((4, 256)).astype(np.float32)}),
        "encoder_block": (
            enc,
            {
                "x": rng.standard_normal((batch, seq, hidden)).astype(np.float32),
                "mask": causal_mask(seq, batch),
            },
        ),
        "decoder_block": (
            decoder_block(seed=seed),
            {"x": rng.standard_normal((1, decoder_seq, 256)).astype(np.float32)},
        ),
    }
    written = []
    for name, (model, inputs) in models.items():
        written.append(write_atomic_with(out / f"{name}.onnx", lambda p, m=model: onnx.save(m, p)))
        written.append(write_atomic_with(out / f"{name}.npz", lambda p, i=inputs: _save_npz(p, i)))
    return written


def _save_npz(path: str, arrays: dict[str, np.ndarray]) -> None:
    with open(path, "wb") as f:  # a file object: np.savez would append ".npz" to a bare name
        np.savez(f, **arrays)
