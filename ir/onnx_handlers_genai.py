"""The ops of ONNX Runtime GenAI's model builder, onto IR ops: ``SimplifiedLayerNormalization``
(ONNX Runtime registers it in the default domain only, and so do we),
``com.microsoft`` ``SkipSimplifiedLayerNormalization``, ``GroupQueryAttention``,
``RotaryEmbedding``, ``GatherBlockQuantized``, and ``Tile`` of the fp16 CPU build's mask subgraph
(that build's ``MultiHeadAttention`` is ``ir/onnx_handlers_contrib.py``'s).  Their semantics are
ONNX Runtime's CPU kernels (``docs/ContribOperators.md`` and ``onnxruntime/contrib_ops/cpu/bert/``
of microsoft/onnxruntime);
every handler has a conformance test against ONNX Runtime (``tests/ir/test_onnx_genai_ops.py``).

``GroupQueryAttention`` (GQA) is expressed with plain IR ops: Q/K/V cut from the packed input,
RoPE from ``cos_cache``/``sin_cache`` gathered at the positions ONNX Runtime derives from
``seqlens_k``, the K/V of this call written after the ``seqlens_k + 1 - S`` valid past rows
(``present`` holds ``max(total_sequence_length, past rows)`` rows, zeros after the valid ones, as
ONNX Runtime writes a present that does not share past's buffer), K/V heads repeated for their
query heads, causal (and ``local_window_size``) masking, ``softcap`` and softmax.  What it
assumes: ``total_sequence_length`` is known at import (a constant or a shape of bound inputs) —
it decides, as in ONNX Runtime, whether the call is a first prompt (``S == total``: positions
``0..S-1``, past ignored) or a continuation (positions ``seqlens_k + 1 - S + s``).  Refused,
naming the node and the field: ``smooth_softmax``, ``qk_output``, the ``position_ids``,
``attention_bias`` and ``head_sink`` inputs, a run-time ``total_sequence_length``.

The refusals decided from the node alone (attributes, which optional inputs and outputs it names)
are ``CHECKS`` / ``DOMAIN_CHECKS`` functions (``_*_check``), run on every node before import so that
a model's unsupported nodes are all named in one message (``mcpc.ir.onnx_support``); the handlers
keep the refusals that need bound shapes or constant values.
"""

from __future__ import annotations

import math

import numpy as np

from mcpc.ir import ops
from mcpc.ir.dtypes import I32, U4, U8
from mcpc.ir.onnx_handlers import (
    DOMAIN_HANDLERS,
    HANDLERS,
    _heads_first,
    _repeat_heads,
    _reshape,
    _scalar,
    _slice_last,
    check,
    domain_check,
    given,
)

# Ops ONNX Runtime registers in the default (ai.onnx) domain although the ONNX standard has no such
# op: onnx.checker refuses them ("No Op registered for ..."), the importer accepts a model whose
# only checker complaint is one of these (``mcpc.ir.onnx_import``).
ORT_DEFAULT_DOMAIN_OPS = frozenset({"SimplifiedLayerNormalization"})

_MS = "com.microsoft"


# -- RMS normalisation ---------------------------------------------------------------------------
def _rms_norm(ctx, x, gamma, axis: int, eps: float, bias=None):
    """``x / sqrt(mean(x², axes ≥ axis) + eps) · gamma (+ bias)`` in x's dtype (f32 for the
    builder's fp32 graphs, as ONNX Runtime's stash type); returns (y, inv_std_var keepdims)."""
    rank = len(ctx.shape(x))
    axis = axis % rank if rank else 0
    axes = {"axes": list(range(axis, rank)), "keepdims": True}
    ms = ctx.emit(ops.ReduceMeanOp, [ctx.emit(ops.MulOp, [x, x])], axes)
    inv = ctx.emit(ops.RsqrtOp, [ctx.emit(ops.AddOp, [ms, _scalar(ctx, eps, x)])])
    y = ctx.emit(ops.MulOp, [ctx.emit(ops.MulOp, [x, inv]), gamma])
    if bias is not None:
        y = ctx.emit(ops.AddOp, [y, bias])
    return y, inv


@check("SimplifiedLayerNormalization")
def _simplified_layer_norm_check(node, attrs, opset, used):
    """stash_type must be 1 (float32)."""
    if int(attrs.get("stash_type", 1)) != 1:
        return f"stash_type={attrs['stash_type']} is not supported (1, float32, is)"
    return None


def _simplified_layer_norm(ctx, ins):
    """Y = x / sqrt(mean(x²) + epsilon) · scale over the dims from ``axis`` on; optional second
    output inv_std_var (keepdims shape).  ``stash_type`` other than float32 is refused."""
    x, scale = ins[0], ins[1]
    y, inv = _rms_norm(ctx, x, scale, int(ctx.attr("axis", -1)), float(ctx.attr("epsilon", 1e-5)))
    return [y, inv]


HANDLERS["SimplifiedLayerNormalization"] = _simplified_layer_norm


@domain_check(_MS, "SkipSimplifiedLayerNormalization")
def _skip_simplified_layer_norm_check(node, attrs, opset, used):
    """Output 1 (mean) must not be named: the simplified form has no mean."""
    if len(node.output) > 1 and node.output[1]:
        return "output 1 (mean) is requested; SkipSimplifiedLayerNormalization has no mean"
    return None


def _skip_simplified_layer_norm(ctx, ins):
    """s = input + skip (+ bias); output = s / sqrt(mean(s²) + epsilon) · gamma over the last dim.
    Outputs: output, mean (not defined for the simplified form: refused when used), inv_std_var,
    input_skip_bias_sum (s)."""
    x, skip, gamma = ins[0], ins[1], ins[2]
    bias = ins[3] if len(ins) > 3 else None
    s = ctx.emit(ops.AddOp, [x, skip])
    if bias is not None:
        s = ctx.emit(ops.AddOp, [s, bias])
    y, inv = _rms_norm(ctx, s, gamma, -1, float(ctx.attr("epsilon", 1e-5)))
    return [y, None, inv, s]


DOMAIN_HANDLERS[_MS, "SkipSimplifiedLayerNormalization"] = _skip_simplified_layer_norm


# -- rotary embedding ----------------------------------------------------------------------------
def _rotate(ctx, x, cos, sin, interleaved: bool):
    """RoPE on the last dim of ``x`` [..., H] with ``cos``/``sin`` [..., R/2] broadcastable to x's
    leading dims (R = 2·cos's last dim ≤ H; dims past R pass through), as ONNX Runtime's
    RunRotaryEmbedding: halves (x1, x2) → (x1·cos − x2·sin, x2·cos + x1·sin), or with
    ``interleaved`` the pairs (x[2k], x[2k+1])."""
    shape = list(ctx.shape(x))
    head, half = shape[-1], ctx.shape(cos)[-1]
    rot = 2 * half

    def cut(t, lo, hi, step=1):
        s = ctx.shape(t)
        starts, ends, steps = [0] * len(s), list(s), [1] * len(s)
        starts[-1], ends[-1], steps[-1] = lo, hi, step
        return ctx.emit(ops.SliceOp, [t], {"starts": starts, "ends": ends, "steps": steps})

    xr = cut(x, 0, rot) if rot < head else x
    if interleaved:
        x1, x2 = cut(xr, 0, rot, 2), cut(xr, 1, rot, 2)
    else:
        x1, x2 = cut(xr, 0, half), cut(xr, half, rot)
    mul = ops.MulOp
    o1 = ctx.emit(ops.SubOp, [ctx.emit(mul, [x1, cos]), ctx.emit(mul, [x2, sin])])
    o2 = ctx.emit(ops.AddOp, [ctx.emit(mul, [x2, cos]), ctx.emit(mul, [x1, sin])])
    if interleaved:  # (o1[k], o2[k]) back into pairs
        lead = shape[:-1]
        pair = [_reshape(ctx, o, [*lead, half, 1]) for o in (o1, o2)]
        out = _reshape(ctx, ctx.emit(ops.ConcatOp, pair, {"axis": -1}), [*lead, rot])
    else:
        out = ctx.emit(ops.ConcatOp, [o1, o2], {"axis": -1})
    if rot < head:
        out = ctx.emit(ops.ConcatOp, [out, cut(x, rot, head)], {"axis": -1})
    return out


def _rope(ctx, xs: list, cos, sin, pos, interleaved: bool) -> list:
    """RoPE of each of ``xs`` [B, N, S, H] at positions ``pos`` [B', S] from the caches [P, R/2].

    Halves with constant caches (the builders' case) read tables widened at import, [cos, cos] and
    [−sin, sin], gathered once for all of ``xs``: x·cos₂ + [x₂, x₁]·sin₂ over the rotary width,
    equal to ``_rotate``'s x₁·cos − x₂·sin, x₂·cos + x₁·sin bit for bit (a − b is a + (−b)) with two
    products a tensor instead of four.  Otherwise ``_rotate``."""
    if interleaved or not (isinstance(cos, np.ndarray) and isinstance(sin, np.ndarray)):
        c, sn = _angles(ctx, cos, sin, pos)
        return [_rotate(ctx, x, c, sn, interleaved) for x in xs]
    half = cos.shape[1]
    rot = 2 * half
    c2, s2 = _angles(ctx, np.concatenate([cos, cos], 1), np.concatenate([-sin, sin], 1), pos)
    out = []
    for x in xs:
        head = ctx.shape(x)[-1]
        xr = _slice_last(ctx, x, 0, rot) if rot < head else x
        swap = ctx.emit(
            ops.ConcatOp, [_slice_last(ctx, xr, half, rot), _slice_last(ctx, xr, 0, half)], {"axis": -1}
        )
        y = ctx.emit(ops.AddOp, [ctx.emit(ops.MulOp, [xr, c2]), ctx.emit(ops.MulOp, [swap, s2])])
        if rot < head:
            y = ctx.emit(ops.ConcatOp, [y, _slice_last(ctx, x, rot, head)], {"axis": -1})
        out.append(y)
    return out


def _angles(ctx, cos, sin, pos):
    """cos/sin caches gathered at ``pos`` [B', S] as [B', 1, S, R/2] (broadcast over heads)."""
    shape = [ctx.shape(pos)[0], 1, ctx.shape(pos)[1], ctx.shape(cos)[1]]
    return tuple(_reshape(ctx, ctx.emit(ops.GatherOp, [t, pos], {"axis": 0}), shape) for t in (cos, sin))


def _check_caches(ctx, cos, sin, head: int) -> int:
    cs, ss = ctx.shape(cos), ctx.shape(sin)
    if len(cs) != 2 or cs != ss:
        raise ctx.unsupported(f"cos_cache {list(cs)} and sin_cache {list(ss)} must be equal 2-D shapes")
    if 2 * cs[1] > head:
        raise ctx.unsupported(
            f"cos_cache holds {cs[1]} angles per position, more than head_size/2 = {head // 2}"
        )
    return cs[0]


@domain_check(_MS, "RotaryEmbedding")
def _rotary_embedding_check(node, attrs, opset, used):
    """is_packed_batching must be 0. The input's rank, num_heads and the caches' widths are
    checked at import."""
    if int(attrs.get("is_packed_batching", 0)):
        return f"is_packed_batching={attrs['is_packed_batching']} is not supported (0 is)"
    return None


def _ms_rotary_embedding(ctx, ins):
    """com.microsoft RotaryEmbedding: input [B, S, N·H] (H = hidden / ``num_heads``; without
    num_heads, H is the caches' rotary width 2·cos.shape[1]) or [B, N, S, H]; position_ids [B, S], or
    one offset (positions offset..offset+S−1); cos/sin caches [max_pos, R/2].  ``is_packed_batching``
    is refused."""
    x, pos, cos, sin = ins[0], ins[1], ins[2], ins[3]
    shape = list(ctx.shape(x))
    interleaved = bool(ctx.attr("interleaved", 0))
    rot_dim, heads = int(ctx.attr("rotary_embedding_dim", 0)), int(ctx.attr("num_heads", 0))
    if len(shape) == 4:
        b, _, s, head = shape
        xs = x
    elif len(shape) == 3:
        b, s, hidden = shape
        if heads <= 0:  # as ONNX Runtime: the head size is the caches' rotary width
            if rot_dim > 0:
                raise ctx.unsupported("rotary_embedding_dim is given without num_heads")
            heads = hidden // (2 * ctx.shape(cos)[1])
        head = hidden // heads
        if heads * head != hidden:
            raise ctx.unsupported(f"hidden size {hidden} is not num_heads ({heads}) times a head size")
        xs = ctx.emit(ops.TransposeOp, [_reshape(ctx, x, [b, s, heads, head])], {"perm": [0, 2, 1, 3]})
    else:
        raise ctx.unsupported(f"input of rank {len(shape)}; 3-D [B, S, hidden] or 4-D [B, N, S, H] expected")
    if rot_dim and rot_dim != 2 * ctx.shape(cos)[1]:
        raise ctx.unsupported(
            f"rotary_embedding_dim={rot_dim} but the caches hold {ctx.shape(cos)[1]} angles"
        )
    _check_caches(ctx, cos, sin, head)
    if math.prod(ctx.shape(pos)) == 1 and ctx.shape(pos) != (b, s):
        pos = ctx.emit(ops.AddOp, [_reshape(ctx, pos, [1, 1]), np.arange(s, dtype=np.int64).reshape(1, s)])
    pos = _reshape(ctx, pos, [b if ctx.shape(pos)[0] == b else 1, s])
    (y,) = _rope(ctx, [xs], cos, sin, pos, interleaved)
    if len(shape) == 3:
        y = _reshape(ctx, ctx.emit(ops.TransposeOp, [y], {"perm": [0, 2, 1, 3]}), shape)
    return [y]


DOMAIN_HANDLERS[_MS, "RotaryEmbedding"] = _ms_rotary_embedding


# -- GatherBlockQuantized ------------------------------------------------------------------------
def _unpack_last(raw: np.ndarray, bits: int) -> np.ndarray:
    """uint8 ``raw`` holding ``bits``-bit codes along its last dim (4 bits: low nibble first)."""
    if bits == 8:
        return raw
    lo, hi = raw & 0x0F, raw >> 4
    return np.stack([lo, hi], axis=-1).reshape(*raw.shape[:-1], raw.shape[-1] * 2).astype(np.uint8)


def _block_check(attrs, default_block: int) -> str | None:
    """bits 4 or 8 and block_size a power of two >= 16, else why not."""
    bits, block = int(attrs.get("bits", 4)), int(attrs.get("block_size", default_block))
    if bits not in (4, 8):
        return f"bits={bits} is not supported (4 and 8 are)"
    if block < 16 or block & (block - 1):
        return f"block_size={block} is not valid (a power of two >= 16)"
    return None


@domain_check(_MS, "GatherBlockQuantized")
def _gather_block_quantized_check(node, attrs, opset, used):
    """bits 4 or 8, block_size a power of two >= 16. The data's dtype and quantize_axis (the
    last) are checked at import."""
    return _block_check(attrs, 128)


def _gather_block_quantized(ctx, ins):
    """``Gather(dequantize(data), indices, gather_axis)``: data uint8 (4-bit codes packed two per
    byte along the last dim, low nibble first, or 8-bit codes), scales one per ``block_size``
    along ``quantize_axis`` (the last dim), zero points packed like data (default 2^(bits−1)).
    The dequantized table is an ``mcp.dequantize`` of the constant codes, kept as codes."""
    bits, block = int(ctx.attr("bits", 4)), int(ctx.attr("block_size", 128))
    g_axis, q_axis = int(ctx.attr("gather_axis", 0)), int(ctx.attr("quantize_axis", 1))
    raw = ctx.const(ins[0], "data (the quantized table)")
    rank = raw.ndim
    if raw.dtype != np.uint8:
        raise ctx.unsupported(f"data of {raw.dtype} is not supported (uint8 is)")
    if q_axis % rank != rank - 1:
        raise ctx.unsupported(f"quantize_axis={q_axis} is not supported (the last axis, {rank - 1}, is)")
    codes = _unpack_last(raw, bits)
    cols = codes.shape[-1]
    blocks = -(-cols // block)
    scale = ctx.const(ins[2], "scales")
    want = (*codes.shape[:-1], blocks)
    if tuple(scale.shape) != want:
        raise ctx.unsupported(f"scales are {list(scale.shape)}; expected {list(want)}")
    code_dtype = (U4 if bits == 4 else U8).np_dtype
    zp_in = ins[3] if len(ins) > 3 else None
    if zp_in is None:
        zp = np.full(want, 1 << (bits - 1), code_dtype)
    else:
        zraw = ctx.const(zp_in, "zero_points")
        if zraw.dtype != np.uint8:
            raise ctx.unsupported(f"zero_points of {zraw.dtype} are not supported (uint8 is)")
        zp = _unpack_last(zraw, bits)[..., :blocks].astype(code_dtype)
    table = ctx.emit(
        ops.DequantizeOp,
        [codes.astype(code_dtype), scale, zp],
        {"axis": rank - 1, "block_size": block},
        fold=False,
    )
    return [ctx.emit(ops.GatherOp, [table, ins[1]], {"axis": g_axis})]


DOMAIN_HANDLERS[_MS, "GatherBlockQuantized"] = _gather_block_quantized


# -- GroupQueryAttention -------------------------------------------------------------------------
_GQA_REFUSED_INPUTS = {9: "position_ids", 10: "attention_bias", 11: "head_sink"}


@domain_check(_MS, "GroupQueryAttention")
def _group_query_attention_check(node, attrs, opset, used):
    """smooth_softmax = qk_output = 0; num_heads a multiple of kv_num_heads > 0; key with value
    (or packed QKV), past_key with past_value; inputs 5 (seqlens_k) and 6 (total_sequence_length)
    given, 7 and 8 (cos/sin caches) with do_rotary, no 9 (position_ids), 10 (attention_bias) or 11
    (head_sink); output 3 (output_qk) unused. Shapes, and total_sequence_length known at compile
    time, are checked at import."""
    for key in ("smooth_softmax", "qk_output"):
        if int(attrs.get(key, 0)):
            return f"{key}={attrs[key]} is not supported (0 is)"
    heads, kv_heads = int(attrs.get("num_heads", 0)), int(attrs.get("kv_num_heads", 0))
    if heads <= 0 or kv_heads <= 0 or heads % kv_heads:
        return f"num_heads={heads}, kv_num_heads={kv_heads}: num_heads must be a multiple"
    if given(node, 1) != given(node, 2):
        return "key and value must be both given or both omitted (packed QKV)"
    if given(node, 3) != given(node, 4):
        return "past_key and past_value must be both given or both omitted"
    if not (given(node, 5) and given(node, 6)):
        return "inputs 5 (seqlens_k) and 6 (total_sequence_length) are required"
    if int(attrs.get("do_rotary", 0)) and not (given(node, 7) and given(node, 8)):
        return "do_rotary=1 needs inputs 7 (cos_cache) and 8 (sin_cache)"
    for index, name in _GQA_REFUSED_INPUTS.items():
        if given(node, index):
            return f"input {index} ({name}) is not supported"
    if len(node.output) > 3 and node.output[3] in used:
        return "output 3 (output_qk) is used; it is not supported"
    return None


def _gqa_attrs(ctx) -> dict:
    heads, kv_heads = int(ctx.attr("num_heads", 0)), int(ctx.attr("kv_num_heads", 0))
    return {
        "heads": heads,
        "kv_heads": kv_heads,
        "scale": float(ctx.attr("scale", 0.0)),
        "softcap": float(ctx.attr("softcap", 0.0)),
        "window": int(ctx.attr("local_window_size", -1)),
        "rotary": bool(ctx.attr("do_rotary", 0)),
        "interleaved": bool(ctx.attr("rotary_interleaved", 0)),
    }


def _split_qkv(ctx, ins, a):
    """(q, k, v) as [B, N, S, H] and the head size, from packed or separate inputs."""
    query = ins[0]
    key, value = (ins[1] if len(ins) > 1 else None), (ins[2] if len(ins) > 2 else None)
    qs = ctx.shape(query)
    if len(qs) != 3:
        raise ctx.unsupported(f"query is {list(qs)}; 3-D [batch, sequence, hidden] is supported")
    b, s, width = qs
    nq, nkv = a["heads"], a["kv_heads"]
    if key is None:
        h = width // (nq + 2 * nkv)
        if h * (nq + 2 * nkv) != width:
            raise ctx.unsupported(f"packed QKV width {width} is not (num_heads + 2·kv_num_heads)·head_size")
        parts = []
        for lo, n in ((0, nq), (nq * h, nkv), ((nq + nkv) * h, nkv)):
            t = ctx.emit(
                ops.SliceOp, [query], {"starts": [0, 0, lo], "ends": [b, s, lo + n * h], "steps": [1, 1, 1]}
            )
            parts.append(_heads_first(ctx, t, n))
        return (*parts, h)
    h = width // nq
    for name, t in (("key", key), ("value", value)):
        if tuple(ctx.shape(t)) != (b, s, nkv * h):
            raise ctx.unsupported(f"{name} is {list(ctx.shape(t))}; expected {[b, s, nkv * h]}")
    return (
        _heads_first(ctx, query, nq),
        _heads_first(ctx, key, nkv),
        _heads_first(ctx, value, nkv),
        h,
    )


def _present(ctx, past, new, past_rows, rows: int, first: bool):
    """The present K or V [B, Nkv, rows, H]: past's first ``past_rows[b]`` rows, then ``new``'s S
    rows, then zeros (ONNX Runtime's ConcatStateChunkGQA into a zeroed present buffer)."""
    b, nkv, s, h = ctx.shape(new)
    dt = ctx.dtype(new).np_dtype
    if first or past is None:  # rows 0..S-1 are this call's; the past is not read
        if rows == s:
            return new
        return ctx.emit(ops.ConcatOp, [new, np.zeros((b, nkv, rows - s, h), dt)], {"axis": 2})
    plen = ctx.shape(past)[2]
    if plen < rows:
        past = ctx.emit(ops.ConcatOp, [past, np.zeros((b, nkv, rows - plen, h), dt)], {"axis": 2})
    j = np.arange(rows, dtype=np.int32).reshape(1, 1, rows, 1)
    pr = _reshape(ctx, past_rows, [b, 1, 1, 1])
    keep = ctx.emit(ops.LessOp, [j, pr])  # [B, 1, rows, 1]
    kept = ctx.emit(ops.SelectOp, [keep, past, np.array(0, dt)])
    # row j of the new part is new[j - past_rows[b]] when that lies in [0, S): a one-hot matmul
    # (one 1 per row, exact for finite values) places the S rows at a run-time offset
    offs = ctx.emit(ops.SubOp, [j.reshape(1, 1, rows, 1), pr])  # [B, 1, rows, 1]
    hot = ctx.emit(ops.EqualOp, [offs, np.arange(s, dtype=np.int32).reshape(1, 1, 1, s)])
    onehot = ctx.emit(ops.CastOp, [hot], {"to": ctx.dtype(new)})  # [B, 1, rows, S]
    placed = ctx.emit(ops.MatMulOp, [onehot, new])  # [B, Nkv, rows, H]
    return ctx.emit(ops.AddOp, [kept, placed])


def _group_query_attention(ctx, ins):
    a = _gqa_attrs(ctx)
    q, k, v, h = _split_qkv(ctx, ins, a)
    b, nq, s, _ = ctx.shape(q)
    nkv = a["kv_heads"]
    past_k, past_v = (ins[3] if len(ins) > 3 else None), (ins[4] if len(ins) > 4 else None)
    plen = 0
    if past_k is not None:
        for name, t in (("past_key", past_k), ("past_value", past_v)):
            ps = ctx.shape(t)
            if len(ps) != 4 or ps[0] != b or ps[1] != nkv or ps[3] != h or ps[2] != ctx.shape(past_k)[2]:
                raise ctx.unsupported(f"{name} is {list(ps)}; expected [{b}, {nkv}, past, {h}]")
        plen = ctx.shape(past_k)[2]
    seqlens = _reshape(ctx, ins[5], [b])
    if ctx.dtype(seqlens) != I32:
        seqlens = ctx.emit(ops.CastOp, [seqlens], {"to": I32})
    if not isinstance(ins[6], np.ndarray):
        raise ctx.unsupported(
            "input 6 (total_sequence_length) is computed at run time; bind the model's dims (--dim) "
            "so that it is known at compile time"
        )
    total = int(ins[6].reshape(-1)[0])
    first = s == total
    if not first and s != 1 and b != 1:
        raise ctx.unsupported(f"sequence_length {s} != total_sequence_length {total} with batch {b} > 1")
    rows = max(total, plen)
    # positions: 0..S-1 in a first prompt (padding rows too, as ONNX Runtime's CPU kernel), else
    # seqlens_k + 1 - S + s; past_rows: the valid past rows this call appends after
    si = np.arange(s, dtype=np.int32).reshape(1, s)
    if first:
        past_rows, pos = np.zeros((b,), np.int32), si
    else:
        past_rows = ctx.emit(ops.SubOp, [seqlens, np.array(s - 1, np.int32)])
        pos = ctx.emit(ops.AddOp, [_reshape(ctx, past_rows, [b, 1]), si])
    if a["rotary"]:
        cos, sin = ins[7], ins[8]
        _check_caches(ctx, cos, sin, h)
        q, k = _rope(ctx, [q, k], cos, sin, pos, a["interleaved"])
    present_k = _present(ctx, past_k, k, past_rows, rows, first)
    present_v = _present(ctx, past_v, v, past_rows, rows, first)
    groups = nq // nkv
    kk, vv = _repeat_heads(ctx, present_k, groups), _repeat_heads(ctx, present_v, groups)
    scale = a["scale"] or 1.0 / math.sqrt(h)
    scores = ctx.emit(ops.MatMulOp, [q, kk], {"trans_b": True})  # [B, Nq, S, rows]
    scores = ctx.emit(ops.MulOp, [scores, _scalar(ctx, scale, scores)])
    if a["softcap"] > 0:
        cap = _scalar(ctx, a["softcap"], scores)
        scores = ctx.emit(ops.MulOp, [ctx.emit(ops.TanhOp, [ctx.emit(ops.DivOp, [scores, cap])]), cap])
    # key j is seen by query s when j <= p (p = past_rows + s, its position in the cache) and, with
    # a local window w > 0, j > p - w (the last w keys, itself included: ONNX Runtime 1.32's CPU kernel)
    j = np.arange(rows, dtype=np.int32).reshape(1, 1, 1, rows)
    if first:
        p = np.arange(s, dtype=np.int32).reshape(1, 1, s, 1)
    else:
        p = ctx.emit(ops.AddOp, [_reshape(ctx, past_rows, [b, 1, 1, 1]), si.reshape(1, 1, s, 1)])
    allowed = ctx.emit(ops.EqualOp, [ctx.emit(ops.GreaterOp, [j, p]), np.array(False)])
    if a["window"] > 0:
        lo = ctx.emit(ops.SubOp, [p, np.array(a["window"] - 1, np.int32)])
        near = ctx.emit(ops.EqualOp, [ctx.emit(ops.LessOp, [j, lo]), np.array(False)])
        allowed = ctx.emit(ops.SelectOp, [allowed, near, np.array(False)])
    low = _scalar(ctx, np.finfo(ctx.dtype(scores).np_dtype).min, scores)
    scores = ctx.emit(ops.SelectOp, [allowed, scores, low])
    probs = ctx.emit(ops.SoftmaxOp, [scores], {"axis": -1})
    out = ctx.emit(ops.MatMulOp, [probs, vv])  # [B, Nq, S, H]
    out = _reshape(ctx, ctx.emit(ops.TransposeOp, [out], {"perm": [0, 2, 1, 3]}), [b, s, nq * h])
    return [out, present_k, present_v]


DOMAIN_HANDLERS[_MS, "GroupQueryAttention"] = _group_query_attention


# -- Tile (the GenAI builder's fp16 attention-mask subgraph) --------------------------------------
def _tile(ctx, ins):
    """ONNX Tile with constant ``repeats``: x [d0, d1, …] as [1, d0, 1, d1, …] broadcast to
    [r0, d0, r1, d1, …] and flattened to [r0·d0, r1·d1, …] (row-major: element x[i mod d])."""
    x = ins[0]
    reps = ctx.ints(ins[1], "repeats")
    shape = list(ctx.shape(x))
    if len(reps) != len(shape) or any(r < 0 for r in reps):
        raise ctx.unsupported(f"repeats {reps} do not give one count >= 0 per dim of {shape}")
    if all(r == 1 for r in reps):
        return [x]
    lifted = _reshape(ctx, x, [d for dim in shape for d in (1, dim)])
    wide = ctx.emit(
        ops.BroadcastOp,
        [lifted],
        {"shape": [d for r, dim in zip(reps, shape, strict=True) for d in (r, dim)]},
    )
    return [_reshape(ctx, wide, [r * dim for r, dim in zip(reps, shape, strict=True)])]


HANDLERS.setdefault("Tile", _tile)  # a default-domain op: a handler registered elsewhere wins
