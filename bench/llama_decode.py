"""One decode step of a Llama-family decoder, built with ``onnx.helper``, and its DRAM roofline.

``llama_decode_step(cfg)`` writes the graph an exporter produces for one generated token with
``past_key_values``: ``input_ids`` [1, 1] and ``position_ids`` [1, 1] (int64), per layer
``past_key_<i>`` / ``past_value_<i>`` [1, kv_heads, "past", head_dim]; outputs ``logits``
[1, 1, vocab] and ``present_key_<i>`` / ``present_value_<i>`` (past ‖ new).  Each layer: RMSNorm
(Pow, ReduceMean, Add, Sqrt, Div, Mul), Q/K/V projections, RoPE from cos/sin tables gathered at
``position_ids`` (rotate-half: Slice, Neg, Concat), grouped-query attention with the query heads
of one KV head as the rows of one product (no K/V repeat), Softmax, output projection, residual,
RMSNorm, SwiGLU MLP (SiLU(gate) · up, down), residual; a final RMSNorm and an untied lm head.
Weights are random (std 1/√fan_in) in ``dtype``; no mask (one new token sees every past position).
With ``weight_bits = 4`` (a W4A16 checkpoint) every MatMul weight and the embedding table are int4
codes with ``dtype`` scales per block of ``group`` along K (along hidden for the table) behind an
opset-21 DequantizeLinear, as an int4 export writes them.

``roofline_bytes(cfg, past)`` is what the step must move at least: every weight it reads (all
projections, norms, the lm head, one embedding row and one cos/sin row) plus the past K/V it
reads and the present K/V it writes.  ``python bench/llama_decode.py`` builds the SmolLM2-135M
shape, compiles it for a target (fp16 build, ``--dim past=256``), runs it timing-wise in the
simulator and prints cycles against that roofline.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

_ONNX_DTYPE = {"f16": (TensorProto.FLOAT16, np.float16), "f32": (TensorProto.FLOAT, np.float32)}


@dataclass(frozen=True)
class LlamaConfig:
    """Shape of the decoder (defaults: SmolLM2-135M)."""

    hidden: int = 576
    layers: int = 30
    heads: int = 9
    kv_heads: int = 3
    head_dim: int = 64
    ffn: int = 1536
    vocab: int = 49152
    max_pos: int = 2048
    dtype: str = "f16"
    weight_bits: int = 0  # 4: every MatMul weight int4 (opset-21 blocked DequantizeLinear), 0: dtype
    group: int = 32  # block size of the int4 weights along K (symmetric round-to-nearest)


SMOLLM2_135M = LlamaConfig()


def _int4_tensor(name: str, codes: np.ndarray) -> onnx.TensorProto:
    """An INT4 initializer from int8 codes in [-8, 7]: packed two per byte, low nibble first."""
    from mcpc.arch.dtypes import pack_nibbles

    raw = pack_nibbles(codes.reshape(-1).astype(np.int8)).tobytes()
    return helper.make_tensor(name, TensorProto.INT4, codes.shape, raw, raw=True)


def llama_decode_step(cfg: LlamaConfig = SMOLLM2_135M, seed: int = 0) -> onnx.ModelProto:
    """The one-token decode graph of ``cfg`` (see the module docstring)."""
    onnx_dt, np_dt = _ONNX_DTYPE[cfg.dtype]
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    count = [0]

    def const(name: str, value) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def weight(name: str, shape, std: float | None = None, mean: float = 0.0) -> str:
        std = 1.0 / math.sqrt(shape[0]) if std is None else std
        return const(name, (mean + std * rng.standard_normal(shape, dtype=np.float32)).astype(np_dt))

    def linear_weight(name: str, shape) -> str:
        """A MatMul weight [K, N]: ``weight``, or with ``weight_bits`` 4 its int4 codes blocked along
        K (symmetric RTN, ``dtype`` scales) behind a DequantizeLinear — a W4A16 checkpoint's form."""
        if not cfg.weight_bits:
            return weight(name, shape)
        w = (rng.standard_normal(shape, dtype=np.float32) / math.sqrt(shape[0])).reshape(
            -1, cfg.group, shape[1]
        )
        scale = (np.abs(w).max(axis=1) / 7).astype(np_dt)
        codes = (
            np.clip(np.rint(w / scale.astype(np.float32)[:, None, :]), -8, 7).astype(np.int8).reshape(shape)
        )
        inits.append(_int4_tensor(f"{name}.codes", codes))
        const(f"{name}.scale", scale)
        return op("DequantizeLinear", [f"{name}.codes", f"{name}.scale"], name=f"{name}.dequant", axis=0,
                  block_size=cfg.group)  # fmt: skip

    def op(op_type: str, inputs, name: str | None = None, n_out: int = 1, outputs=None, **attrs):
        count[0] += 1
        name = name or f"{op_type.lower()}_{count[0]}"
        outs = outputs or ([f"{name}_out{i}" for i in range(n_out)] if n_out > 1 else [f"{name}_out"])
        nodes.append(helper.make_node(op_type, list(inputs), outs, name=name, **attrs))
        return outs if n_out > 1 else outs[0]

    i64 = lambda name, v: const(name, np.array(v, np.int64))  # noqa: E731
    scalar = lambda name, v: const(name, np.array(v, np_dt))  # noqa: E731
    h, hd, nkv, group = cfg.hidden, cfg.head_dim, cfg.kv_heads, cfg.heads // cfg.kv_heads
    mean_axes, two, eps = i64("mean_axes", [-1]), scalar("two", 2.0), scalar("eps", 1e-5)

    def rms_norm(x: str, prefix: str) -> str:
        var = op("ReduceMean", [op("Pow", [x, two]), mean_axes], keepdims=1)
        rms = op("Sqrt", [op("Add", [var, eps])])
        g = weight(f"{prefix}.weight", (h,), std=0.1, mean=1.0)
        return op("Mul", [op("Div", [x, rms]), g], name=prefix)

    # RoPE tables [max_pos, head_dim] (rotate-half layout), gathered at the position: [1, 1, hd]
    inv = 1.0 / (10000.0 ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    ang = np.outer(np.arange(cfg.max_pos), inv)
    ang = np.concatenate([ang, ang], axis=-1)
    cos = op("Gather", [const("rope.cos", np.cos(ang).astype(np_dt)), "position_ids"], axis=0)
    sin = op("Gather", [const("rope.sin", np.sin(ang).astype(np_dt)), "position_ids"], axis=0)
    cos = op("Unsqueeze", [cos, i64("rope_axes", [1])])  # [1, 1, 1, hd]: broadcast over heads
    sin = op("Unsqueeze", [sin, "rope_axes"])
    half_a, half_b, half_end = i64("half_a", [0]), i64("half_b", [hd // 2]), i64("half_end", [hd])
    last = i64("last_axis", [-1])

    def rope(x: str) -> str:  # x: [1, heads, 1, hd]
        x1 = op("Slice", [x, half_a, half_b, last])
        x2 = op("Slice", [x, half_b, half_end, last])
        rot = op("Concat", [op("Neg", [x2]), x1], axis=-1)
        return op("Add", [op("Mul", [x, cos]), op("Mul", [rot, sin])])

    head_shapes = {n: i64(f"heads_shape_{n}", [1, 1, n, hd]) for n in sorted({cfg.heads, nkv})}

    def heads(x: str, n: int) -> str:  # [1, 1, n * hd] -> [1, n, 1, hd]
        shape = head_shapes[n]
        return op("Transpose", [op("Reshape", [x, shape])], perm=[0, 2, 1, 3])

    if cfg.weight_bits:  # the table int4 along its rows, scales per block of hidden: one row gathered
        table = (rng.standard_normal((cfg.vocab, h), dtype=np.float32)).reshape(cfg.vocab, -1, cfg.group)
        tscale = (np.abs(table).max(axis=2) / 7).astype(np_dt)
        tcodes = np.clip(np.rint(table / tscale.astype(np.float32)[:, :, None]), -8, 7).astype(np.int8)
        inits.append(_int4_tensor("embed.codes", tcodes.reshape(cfg.vocab, h)))
        const("embed.scale", tscale)
        embed = op("DequantizeLinear", ["embed.codes", "embed.scale"], name="embed.dequant", axis=1,
                   block_size=cfg.group)  # fmt: skip
    else:
        embed = weight("embed.weight", (cfg.vocab, h), std=1.0)
    x = op("Gather", [embed, "input_ids"], axis=0)
    scale = scalar("attn_scale", 1.0 / math.sqrt(hd))
    q_group_shape = i64("q_group_shape", [1, nkv, group, hd])
    merge_shape = i64("merge_shape", [1, 1, h])
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, 1]),
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, [1, 1]),
    ]
    outputs = [helper.make_tensor_value_info("logits", onnx_dt, [1, 1, cfg.vocab])]
    for li in range(cfg.layers):
        p = f"layers.{li}"
        hn = rms_norm(x, f"{p}.input_norm")
        q = rope(heads(op("MatMul", [hn, linear_weight(f"{p}.q_proj", (h, cfg.heads * hd))]), cfg.heads))
        k = rope(heads(op("MatMul", [hn, linear_weight(f"{p}.k_proj", (h, nkv * hd))]), nkv))
        v = heads(op("MatMul", [hn, linear_weight(f"{p}.v_proj", (h, nkv * hd))]), nkv)
        for kind, new in (("key", k), ("value", v)):
            past, present = f"past_{kind}_{li}", f"present_{kind}_{li}"
            inputs.append(helper.make_tensor_value_info(past, onnx_dt, [1, nkv, "past", hd]))
            outputs.append(helper.make_tensor_value_info(present, onnx_dt, [1, nkv, "past_1", hd]))
            op("Concat", [past, new], name=f"{p}.cat_{kind}", outputs=[present], axis=2)
        # [1, nkv, group, hd]: the query heads sharing a KV head are the rows of its product
        qg = op("Reshape", [op("Transpose", [q], perm=[0, 2, 1, 3]), q_group_shape])
        kt = op("Transpose", [f"present_key_{li}"], perm=[0, 1, 3, 2])
        probs = op("Softmax", [op("Mul", [op("MatMul", [qg, kt]), scale])], axis=-1)
        ctx = op("Reshape", [op("MatMul", [probs, f"present_value_{li}"]), merge_shape])
        x = op(
            "Add", [x, op("MatMul", [ctx, linear_weight(f"{p}.o_proj", (h, h))])], name=f"{p}.attn_residual"
        )
        hn = rms_norm(x, f"{p}.post_attention_norm")
        gate = op("MatMul", [hn, linear_weight(f"{p}.gate_proj", (h, cfg.ffn))])
        up = op("MatMul", [hn, linear_weight(f"{p}.up_proj", (h, cfg.ffn))])
        act = op("Mul", [op("Mul", [gate, op("Sigmoid", [gate])]), up])
        down = op("MatMul", [act, linear_weight(f"{p}.down_proj", (cfg.ffn, h))])
        x = op("Add", [x, down], name=f"{p}.mlp_residual")
    x = rms_norm(x, "norm")
    op("MatMul", [x, linear_weight("lm_head", (h, cfg.vocab))], name="lm_head", outputs=["logits"])
    graph = helper.make_graph(nodes, "llama_decode_step", inputs, outputs, inits)
    opsets = [helper.make_opsetid("", 21 if cfg.weight_bits else 18)]  # int4 and blocked: opset 21
    model = helper.make_model(graph, opset_imports=opsets, producer_name="mcpc.bench")
    model.ir_version = helper.find_min_ir_version_for(opsets)
    return model


def roofline_bytes(cfg: LlamaConfig = SMOLLM2_135M, past: int = 256) -> dict[str, int]:
    """Bytes one decode step must move: weights read (as stored: int4 codes and their scales with
    ``weight_bits`` 4), past K/V read, present K/V written."""
    es = np.dtype(_ONNX_DTYPE[cfg.dtype][1]).itemsize
    h, hd, kvd = cfg.hidden, cfg.head_dim, cfg.kv_heads * cfg.head_dim
    # matrices (the linears and the LM head), then vectors (norm gains, the final norm, rope) and the
    # one embedding row gathered
    matrices = cfg.layers * (h * cfg.heads * hd + 2 * h * kvd + cfg.heads * hd * h + 3 * h * cfg.ffn)
    matrices += h * cfg.vocab
    vectors = cfg.layers * 2 * h + h + 2 * hd
    if cfg.weight_bits:  # int4 codes packed two per byte plus one `dtype` scale per group
        quantized = matrices + h
        weights = quantized // 2 + (quantized // cfg.group) * es + vectors * es
    else:
        weights = (matrices + vectors + h) * es
    kv_read = cfg.layers * 2 * past * kvd * es
    kv_write = cfg.layers * 2 * (past + 1) * kvd * es
    total = weights + kv_read + kv_write
    return {"weights": weights, "kv_read": kv_read, "kv_write": kv_write, "total": total}


def measure(cfg: LlamaConfig = SMOLLM2_135M, past: int = 256, target: str = "mcp2026-a100",
            qat_config: str = "fp16.yaml", seed: int = 0, workdir: str | None = None) -> dict:  # fmt: skip
    """Build, compile (``--dim past=N``) and simulate one decode step; cycles against the roofline."""
    import mcpc
    from mcpc.sim.api import load_program, run_program

    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        t0 = time.perf_counter()
        onnx_path = Path(tmp) / "decode.onnx"
        onnx.save(llama_decode_step(cfg, seed), onnx_path)
        module = mcpc.load_model(onnx_path, dims={"past": past})
        mcpb = Path(tmp) / "decode.mcpb"
        mcpc.compile(module, target=target, qat_config=qat_config, output=mcpb)
        t1 = time.perf_counter()
        program = load_program(mcpb)
        rng = np.random.default_rng(seed + 1)
        np_dt = _ONNX_DTYPE[cfg.dtype][1]
        inputs = {"input_ids": np.array([[7]], np.int64), "position_ids": np.array([[past]], np.int64)}
        for li in range(cfg.layers):
            for kind in ("key", "value"):
                shape = (1, cfg.kv_heads, past, cfg.head_dim)
                inputs[f"past_{kind}_{li}"] = rng.standard_normal(shape, dtype=np.float32).astype(np_dt)
        res = run_program(program, inputs)
        t2 = time.perf_counter()
    prof = res.profile
    roof = roofline_bytes(cfg, past)
    bpc = program.target.dram_bytes_per_cycle
    roof_cycles = roof["total"] / bpc
    return {
        "target": target,
        "cycles": prof["cycles"],
        "latency_us": prof["latency_us"],
        "dram_bytes": prof["dram_read_bytes"] + prof["dram_write_bytes"],
        "roofline_bytes": roof["total"],
        "roofline_cycles": roof_cycles,
        "ratio": prof["cycles"] / roof_cycles,
        "dram_utilization": prof["roofline"]["dram_utilization"],
        "bound": prof["roofline"]["bound"],
        "compile_s": t1 - t0,
        "sim_s": t2 - t1,
        "finite": bool(np.isfinite(res.outputs["logits"].astype(np.float32)).all()),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="mcp2026-a100")
    ap.add_argument("--past", type=int, default=256)
    ap.add_argument("--layers", type=int, default=SMOLLM2_135M.layers)
    ap.add_argument("--weight-bits", type=int, choices=(0, 4), default=0, help="4: int4 weights (W4A16)")
    args = ap.parse_args(argv)
    cfg = LlamaConfig(layers=args.layers, weight_bits=args.weight_bits)
    r = measure(cfg, past=args.past, target=args.target)
    mib = 2**20
    print(
        f"{args.target}: decode step (hidden {cfg.hidden}, {cfg.layers} layers, past {args.past}, "
        f"{cfg.dtype}): {r['cycles']:,} cycles ({r['latency_us']:.1f} µs); DRAM roofline "
        f"{r['roofline_cycles']:,.0f} cycles ({r['roofline_bytes'] / mib:.1f} MiB) -> {r['ratio']:.2f}x; "
        f"moved {r['dram_bytes'] / mib:.1f} MiB, DRAM {100 * r['dram_utilization']:.0f}% busy, "
        f"{r['bound']}-bound (compile {r['compile_s']:.0f} s, simulate {r['sim_s']:.1f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
