"""ONNX Runtime's fused ``com.microsoft`` ops, as ``onnxruntime.transformers.optimizer`` writes them
for BERT-style encoders and GPT-2 style decoders, decomposed into IR ops.

Semantics are ONNX Runtime's CPU kernels (``docs/ContribOperators.md`` and
``onnxruntime/contrib_ops/cpu/bert``), checked op by op against ONNX Runtime 1.32 in
``tests/ir/test_onnx_contrib.py``:

* ``Attention``: ``x · W (+ bias)`` split into Q, K, V (``qkv_hidden_sizes`` or three equal parts),
  heads of ``num_heads``; an optional ``past`` [2, B, N, P, H] is put before K and V and the
  ``present`` output (also without a past) is [2, B, N, P + L, H]; scores ``Q·Kᵀ · scale``
  (default 1/√head_size) plus an additive mask, plus ``attention_bias``; softmax; times V.
  The mask, as the CPU kernel builds it: a key position masked by ``mask_index`` adds
  ``mask_filter_value`` (default −10000); with ``unidirectional`` a future key position
  (``t > past + s``) is set to the lowest f32 instead (not added: a row whose every key is masked
  by padding stays uniform, as ONNX Runtime's does).
  ``mask_index`` forms: 1-D [B] (end positions: keys at or after the end are masked), 1-D [2B]
  (end positions then start positions: keys before the start are masked too), any other 1-D length
  (the CPU kernel reads the first B values as end positions), 2-D [B, T] and 3-D [B, S, T] raw masks
  (a value ``> 0`` keeps the key).  Refused, naming the node: a 4-D mask (the CPU kernel refuses
  it), ``do_rotary`` (so does the CPU kernel), ``past_present_share_buffer``,
  ``past_sequence_length``.
* ``MultiHeadAttention`` (``--use_multi_head_attention``): the same core with separate query, key
  and value ([B, L, D], or [B, N, L, H] already split into heads), one packed ``bias`` added after
  the projections, ``key_padding_mask`` in the mask forms above, ``past_key``/``past_value``
  [B, N, P, H] giving ``present_key``/``present_value``; packed QKV/KV inputs,
  ``past_sequence_length``, ``cache_indirection`` and the ``qk`` output refused.
* ``EmbedLayerNormalization``: word + position (+ segment) embeddings, then layer norm; position
  ids default to 0..S−1; outputs ``mask_index`` (per batch row, the count of mask values equal
  to 1; zeros without a mask) and ``embedding_sum`` (the three embeddings' sum before the norm).
* ``SkipLayerNormalization``: ``input + skip (+ bias)`` then layer norm (``beta`` optional); the
  optional outputs ``mean`` and ``inv_std_var`` ([..., 1], f32) and ``input_skip_bias_sum``.
* ``BiasGelu`` (exact erf GELU of ``A + B``), ``FastGelu`` (``0.5·x·(1 + tanh(x·(α + γ·x²)))``
  with α = √(2/π), γ = 0.044715·α, of ``X (+ bias)``), ``FusedMatMul`` (``alpha · op(A) ·
  op(B)`` with ``transA``/``transB``; ``transBatchA``/``transBatchB`` refused).
``com.microsoft`` ``Gelu`` is in ``mcpc.ir.onnx_handlers``.

The refusals decided from the node alone (attributes, which optional inputs and outputs it names)
are ``DOMAIN_CHECKS`` functions (``_*_check``), run on every node before import so that a model's
unsupported nodes are all named in one message (``mcpc.ir.onnx_support``); the handlers keep the
refusals that need bound shapes.
"""

from __future__ import annotations

import math

import numpy as np

from mcpc.ir import ops
from mcpc.ir.dtypes import F32, I32
from mcpc.ir.onnx_handlers import (
    DOMAIN_HANDLERS,
    HANDLERS,
    _heads_first,
    _layer_norm_stats,
    _reshape,
    _scalar,
    _slice_last,
    domain_check,
    given,
)

_LOWEST_F32 = float(np.finfo(np.float32).min)


def _opt(ins, i):
    return ins[i] if len(ins) > i else None


def _transpose(ctx, x, perm):
    return ctx.emit(ops.TransposeOp, [x], {"perm": list(perm)})


def _slice_axis0(ctx, x, i: int):
    """``x[i]`` (dropping axis 0)."""
    shape = ctx.shape(x)
    starts, ends = [i] + [0] * (len(shape) - 1), [i + 1, *shape[1:]]
    part = ctx.emit(ops.SliceOp, [x], {"starts": starts, "ends": ends, "steps": [1] * len(shape)})
    return _reshape(ctx, part, shape[1:])


# -- Attention -----------------------------------------------------------------------------------
def _mask_bias(ctx, mask, batch: int, seq: int, past: int, total: int, filt: float, causal: bool, dt):
    """The additive mask of shape [B or 1, 1, S or 1, T] the CPU kernel adds to the scaled scores
    (a constant when ``mask`` is a constant or absent), or None when nothing is masked."""
    zero, fv = _scalar(ctx, 0.0, np.zeros((), dt.np_dtype)), np.array(filt, dtype=dt.np_dtype)
    bias = None
    if mask is not None:
        mshape = ctx.shape(mask)
        if ctx.dtype(mask) != I32:
            raise ctx.unsupported(f"mask_index is {ctx.dtype(mask)}; ONNX Runtime takes int32")
        keys = np.arange(total, dtype=np.int32)
        if len(mshape) == 1:
            if mshape[0] < batch:
                raise ctx.unsupported(f"mask_index has {mshape[0]} values for batch {batch}")
            end = _reshape(ctx, _slice_last(ctx, mask, 0, batch), (batch, 1))
            # masked: key >= end, i.e. not (key < end)
            valid = ctx.emit(ops.LessOp, [keys.reshape(1, total), end])
            if mshape[0] == 2 * batch:  # left padding: keys before the start are masked too
                start = _reshape(ctx, _slice_last(ctx, mask, batch, 2 * batch), (batch, 1))
                before = ctx.emit(ops.LessOp, [keys.reshape(1, total), start])
                valid = ctx.emit(ops.SelectOp, [before, np.array(False), valid])
            valid = _reshape(ctx, valid, (batch, 1, 1, total))
        elif len(mshape) == 2:
            if tuple(mshape) != (batch, total):
                raise ctx.unsupported(f"a 2-D mask_index must be [{batch}, {total}], got {list(mshape)}")
            valid = _reshape(
                ctx, ctx.emit(ops.GreaterOp, [mask, np.array(0, np.int32)]), (batch, 1, 1, total)
            )
        elif len(mshape) == 3:
            if tuple(mshape) != (batch, seq, total):
                raise ctx.unsupported(
                    f"a 3-D mask_index must be [{batch}, {seq}, {total}], got {list(mshape)}"
                )
            valid = _reshape(
                ctx, ctx.emit(ops.GreaterOp, [mask, np.array(0, np.int32)]), (batch, 1, seq, total)
            )
        else:
            raise ctx.unsupported(
                f"a {len(mshape)}-D mask_index is not supported (ONNX Runtime's CPU kernel takes 1-D, "
                "2-D and 3-D masks)"
            )
        bias = ctx.emit(ops.SelectOp, [valid, zero, fv])
    if causal:
        future = np.arange(total)[None, :] > (past + np.arange(seq))[:, None]  # [S, T]
        if bias is None:
            bias = np.where(future, _LOWEST_F32, 0.0).astype(dt.np_dtype).reshape(1, 1, seq, total)
        else:
            lowest = np.array(_LOWEST_F32, dtype=dt.np_dtype)
            bias = ctx.emit(ops.SelectOp, [future.reshape(1, 1, seq, total), lowest, bias])
    return bias


_MS = "com.microsoft"


def _heads_check(attrs) -> str | None:
    heads = int(attrs.get("num_heads", 0))
    return None if heads > 0 else f"num_heads={heads} is not valid (a count > 0 is required)"


@domain_check(_MS, "Attention")
def _attention_check(node, attrs, opset, used):
    """No ``do_rotary`` (nor in ONNX Runtime's CPU kernel), ``past_present_share_buffer`` or input 6
    (``past_sequence_length``); ``num_heads`` > 0; ``qkv_hidden_sizes``, when given, three sizes,
    multiples of ``num_heads``, Q's equal to K's (and V's too when ``present`` is used). The mask
    forms and weight shapes are checked at import."""
    if int(attrs.get("do_rotary", 0)):  # ONNX Runtime's CPU kernel refuses it too (MHA + RotaryEmbedding)
        return f"do_rotary={attrs['do_rotary']} is not supported (nor by ONNX Runtime's CPU kernel)"
    if int(attrs.get("past_present_share_buffer", 0)):
        return f"past_present_share_buffer={attrs['past_present_share_buffer']} is not supported"
    if given(node, 6):
        return "input 6 (past_sequence_length, a shared past/present buffer) is not supported"
    if reason := _heads_check(attrs):
        return reason
    heads, sizes = int(attrs["num_heads"]), list(attrs.get("qkv_hidden_sizes") or [])
    if sizes:
        if len(sizes) != 3 or sizes[0] != sizes[1] or any(s <= 0 or s % heads for s in sizes):
            return (
                f"qkv_hidden_sizes={sizes} are not three sizes > 0, multiples of num_heads={heads}, "
                "Q's equal to K's"
            )
        if sizes[2] != sizes[0] and len(node.output) > 1 and node.output[1] in used:
            return f"the present output is used but qkv_hidden_sizes={sizes} are not one hidden size"
    return None


def _ms_attention(ctx, ins):
    x, w = ins[0], ins[1]
    bias, mask, past, attn_bias = _opt(ins, 2), _opt(ins, 3), _opt(ins, 4), _opt(ins, 5)
    heads = int(ctx.attr("num_heads", 0))
    xs, ws = ctx.shape(x), ctx.shape(w)
    if len(xs) != 3 or len(ws) != 2 or ws[0] != xs[2]:
        raise ctx.unsupported(f"input {list(xs)} and weights {list(ws)} are not [B, S, D] and [D, Dq+Dk+Dv]")
    sizes = list(ctx.attr("qkv_hidden_sizes", []) or [ws[1] // 3] * 3)
    if heads <= 0 or len(sizes) != 3 or sum(sizes) != ws[1] or sizes[0] != sizes[1]:
        raise ctx.unsupported(f"num_heads={heads}, qkv_hidden_sizes={sizes} do not fit weights {list(ws)}")
    if any(s % heads for s in sizes):
        raise ctx.unsupported(f"qkv_hidden_sizes {sizes} are not multiples of num_heads={heads}")
    batch, seq = xs[0], xs[1]
    qkv = ctx.emit(ops.MatMulOp, [x, w])
    if bias is not None:
        qkv = ctx.emit(ops.AddOp, [qkv, bias])
    cut = [0, sizes[0], sizes[0] + sizes[1], sum(sizes)]
    q, k, v = (_heads_first(ctx, _slice_last(ctx, qkv, cut[i], cut[i + 1]), heads) for i in range(3))
    past_len = 0
    if past is not None:
        ps = ctx.shape(past)
        head = sizes[0] // heads
        if (
            len(ps) != 5
            or ps[0] != 2
            or ps[1] != batch
            or ps[2] != heads
            or ps[4] != head
            or sizes[2] != sizes[0]
        ):
            raise ctx.unsupported(
                f"past {list(ps)} is not [2, {batch}, {heads}, past_sequence_length, {head}] "
                "(with past, Q, K and V have one hidden size)"
            )
        past_len = ps[3]
        k = ctx.emit(ops.ConcatOp, [_slice_axis0(ctx, past, 0), k], {"axis": 2})
        v = ctx.emit(ops.ConcatOp, [_slice_axis0(ctx, past, 1), v], {"axis": 2})
    out = _attend(ctx, q, k, v, mask, attn_bias, past_len, sizes[0] // heads)
    if len(ctx.node.output) < 2 or not ctx.node.output[1] or sizes[2] != sizes[0]:
        return [out]  # present is unbound: with V's size differing, _attention_check refuses its use
    # present [2, B, N, P + S, H]: K and V (after the past), also without a past
    kv_shape = (1, batch, heads, past_len + seq, sizes[0] // heads)
    present = ctx.emit(ops.ConcatOp, [_reshape(ctx, k, kv_shape), _reshape(ctx, v, kv_shape)], {"axis": 0})
    return [out, present]


def _attend(ctx, q, k, v, mask, attn_bias, past_len: int, head_size: int):
    """The CPU kernels' shared core (``AttentionCPUBase::ApplyAttention``): q [B, N, S, H], k and v
    [B, N, T, H] (past already in front), ``softmax(Q·Kᵀ·scale + (attention_bias + mask))·V``
    as [B, S, N·Hv]."""
    batch, heads, seq, _ = ctx.shape(q)
    total = ctx.shape(k)[2]
    scale = float(ctx.attr("scale", 0.0)) or 1.0 / math.sqrt(head_size)
    scores = ctx.emit(ops.MatMulOp, [q, k], {"trans_b": True})
    scores = ctx.emit(ops.MulOp, [scores, _scalar(ctx, scale, scores)])
    causal = bool(ctx.attr("unidirectional", 0)) and seq > 1
    filt = float(ctx.attr("mask_filter_value", -10000.0))
    add = _mask_bias(ctx, mask, batch, seq, past_len, total, filt, causal, ctx.dtype(q))
    if attn_bias is not None:  # the kernel starts from attention_bias and adds the mask to it
        ab = ctx.shape(attn_bias)
        if (
            len(ab) != 4
            or ab[0] not in (1, batch)
            or ab[1] not in (1, heads)
            or tuple(ab[2:]) != (seq, total)
        ):
            raise ctx.unsupported(f"attention_bias {list(ab)} is not [B or 1, N or 1, {seq}, {total}]")
        add = attn_bias if add is None else ctx.emit(ops.AddOp, [attn_bias, add])
    if add is not None:
        scores = ctx.emit(ops.AddOp, [scores, add])
    probs = ctx.emit(ops.SoftmaxOp, [scores], {"axis": -1})
    out = _transpose(ctx, ctx.emit(ops.MatMulOp, [probs, v]), (0, 2, 1, 3))
    return _reshape(ctx, out, (batch, seq, heads * ctx.shape(v)[3]))


@domain_check(_MS, "MultiHeadAttention")
def _multi_head_attention_check(node, attrs, opset, used):
    """Query, key and value separate (no packed QKV/KV), past_key with past_value, no inputs 8
    (``past_sequence_length``) or 9 (``cache_indirection``), the ``qk`` output unused, ``num_heads``
    > 0. Shapes (and ``unidirectional`` over more keys than queries without a past) are checked at
    import."""
    if not (given(node, 1) and given(node, 2)):
        return "packed QKV or packed KV inputs are not supported (query, key and value separate are)"
    if given(node, 6) != given(node, 7):
        return "past_key and past_value must be given together"
    for index, name in ((8, "past_sequence_length"), (9, "cache_indirection")):
        if given(node, index):
            return f"input {index} ({name}) is not supported"
    if len(node.output) > 3 and node.output[3] in used:
        return "output 3 (qk) is used; it is not supported"
    return _heads_check(attrs)


def _ms_multi_head_attention(ctx, ins):
    """MultiHeadAttention with separate Q, K, V: query [B, S, Dq], key/value [B, L, D] (or [B, N, L,
    H] already split into heads, then without bias), ``bias`` [Dq + Dk + Dv] added after the
    projections, ``key_padding_mask`` in the forms of Attention's ``mask_index``, ``attention_bias``,
    ``past_key``/``past_value`` [B, N, P, H] with ``present_key``/``present_value`` [B, N, P + L, H].
    Packed QKV/KV, ``past_sequence_length``, ``cache_indirection`` and the ``qk`` output refused."""
    q, k, v = ins[0], _opt(ins, 1), _opt(ins, 2)
    bias, mask, attn_bias = _opt(ins, 3), _opt(ins, 4), _opt(ins, 5)
    past_k, past_v = _opt(ins, 6), _opt(ins, 7)
    heads = int(ctx.attr("num_heads", 0))
    qs = ctx.shape(q)
    if len(qs) != 3 or len(ctx.shape(k)) not in (3, 4):
        raise ctx.unsupported(
            f"query {list(qs)} and key {list(ctx.shape(k))} are not [B, S, D] and [B, L, D] or [B, N, L, H]"
        )
    if qs[2] % heads:
        raise ctx.unsupported(f"num_heads={heads} does not divide the query's hidden size {qs[2]}")
    batch, seq = qs[0], qs[1]
    bnsh = len(ctx.shape(k)) == 4
    keys = ctx.shape(k)[2 if bnsh else 1]
    if int(ctx.attr("unidirectional", 0)) and past_k is None and keys != seq:
        # without a past ONNX Runtime 1.32's CPU kernel then masks neither j <= i nor j <= i + T - S
        # (measured); with a past it is the offset causal mask _attend applies (tested)
        raise ctx.unsupported(
            f"unidirectional=1 with {seq} queries over {keys} keys (no past) is not supported"
        )
    if bias is not None:
        if bnsh:
            raise ctx.unsupported("bias with key/value already split into heads is not supported")
        dq, dk = qs[2], ctx.shape(k)[2]
        q = ctx.emit(ops.AddOp, [q, _slice_last(ctx, bias, 0, dq)])
        k = ctx.emit(ops.AddOp, [k, _slice_last(ctx, bias, dq, dq + dk)])
        v = ctx.emit(ops.AddOp, [v, _slice_last(ctx, bias, dq + dk, ctx.shape(bias)[0])])
    q = _heads_first(ctx, q, heads)
    if not bnsh:
        k = _heads_first(ctx, k, heads)
        v = _heads_first(ctx, v, heads)
    past_len = 0
    if past_k is not None:
        pk, pv = ctx.shape(past_k), ctx.shape(past_v)
        if len(pk) != 4 or tuple(pk[:2]) != (batch, heads) or pk[3] != ctx.shape(k)[3] or pk[2] != pv[2]:
            raise ctx.unsupported(f"past_key {list(pk)} / past_value {list(pv)} are not [B, N, P, H]")
        past_len = pk[2]
        k = ctx.emit(ops.ConcatOp, [past_k, k], {"axis": 2})
        v = ctx.emit(ops.ConcatOp, [past_v, v], {"axis": 2})
    out = _attend(ctx, q, k, v, mask, attn_bias, past_len, ctx.shape(q)[3])
    return [out, k, v]


# -- EmbedLayerNormalization, SkipLayerNormalization ----------------------------------------------
def _norm_outputs(ctx, total, gamma, beta, eps: float, want_stats: bool):
    """``[layer_norm(total), mean, inv_std_var]`` over the last axis (stats only when asked)."""
    width = ctx.shape(total)[-1]
    dt = ctx.dtype(total)
    beta = beta if beta is not None else np.zeros((width,), dt.np_dtype)
    y = ctx.emit(ops.LayerNormOp, [total, gamma, beta], {"axis": -1, "epsilon": eps})
    if not want_stats:
        return [y, None, None]
    mean, inv = _layer_norm_stats(ctx, total, len(ctx.shape(total)) - 1, eps, F32)
    return [y, mean, inv]


@domain_check(_MS, "EmbedLayerNormalization")
def _embed_layer_norm_check(node, attrs, opset, used):
    """segment_ids and segment_embedding given together (or neither). Shapes are checked at import."""
    if given(node, 1) != given(node, 4):
        return "segment_ids and segment_embedding must be given together"
    return None


def _ms_embed_layer_norm(ctx, ins):
    ids, seg_ids, word, pos_table = ins[0], _opt(ins, 1), ins[2], ins[3]
    seg_table, gamma, beta, mask, pos_ids = _opt(ins, 4), ins[5], ins[6], _opt(ins, 7), _opt(ins, 8)
    shape = ctx.shape(ids)
    if len(shape) != 2:
        raise ctx.unsupported(f"input_ids is {list(shape)}; expected [batch, sequence]")
    batch, seq = shape
    if pos_ids is None:
        if seq > ctx.shape(pos_table)[0]:
            raise ctx.unsupported(
                f"sequence length {seq} exceeds the {ctx.shape(pos_table)[0]} rows of position_embedding"
            )
        pos_ids = np.arange(seq, dtype=np.int32).reshape(1, seq)
    total = ctx.emit(
        ops.AddOp,
        [
            ctx.emit(ops.GatherOp, [word, ids], {"axis": 0}),
            ctx.emit(ops.GatherOp, [pos_table, pos_ids], {"axis": 0}),
        ],
    )
    if seg_ids is not None:
        total = ctx.emit(ops.AddOp, [total, ctx.emit(ops.GatherOp, [seg_table, seg_ids], {"axis": 0})])
    if list(ctx.shape(total)) != [batch, seq, ctx.shape(word)[1]]:
        total = ctx.emit(ops.BroadcastOp, [total], {"shape": [batch, seq, ctx.shape(word)[1]]})
    y = _norm_outputs(ctx, total, gamma, beta, float(ctx.attr("epsilon", 1e-12)), False)[0]
    if mask is None:
        index = np.zeros((batch,), np.int32)
    else:  # the count of mask values equal to 1 in each row
        ones = ctx.emit(ops.EqualOp, [mask, np.array(1, dtype=ctx.dtype(mask).np_dtype)])
        index = ctx.emit(
            ops.ReduceSumOp, [ctx.emit(ops.CastOp, [ones], {"to": I32})], {"axes": [1], "keepdims": False}
        )
    return [y, index, total]


def _ms_skip_layer_norm(ctx, ins):
    x, skip, gamma, beta, bias = ins[0], ins[1], ins[2], _opt(ins, 3), _opt(ins, 4)
    total = ctx.emit(ops.AddOp, [x, skip])
    if bias is not None:
        total = ctx.emit(ops.AddOp, [total, bias])
    outs = ctx.node.output
    want_stats = any(o for o in outs[1:3])
    y, mean, inv = _norm_outputs(ctx, total, gamma, beta, float(ctx.attr("epsilon", 1e-12)), want_stats)
    return [y, mean, inv, total]


# -- activations and FusedMatMul ------------------------------------------------------------------
def _ms_bias_gelu(ctx, ins):
    return [ctx.emit(ops.GeluOp, [ctx.emit(ops.AddOp, ins[:2])])]


def _ms_fast_gelu(ctx, ins):
    x = ins[0]
    if _opt(ins, 1) is not None:
        x = ctx.emit(ops.AddOp, [x, ins[1]])
    alpha = math.sqrt(2.0 / math.pi)
    gamma = 0.044715 * alpha
    # 0.5·x·(1 + tanh(x·(α + γ·x²))), ONNX Runtime's FastGelu
    inner = ctx.emit(
        ops.AddOp,
        [ctx.emit(ops.MulOp, [ctx.emit(ops.MulOp, [x, x]), _scalar(ctx, gamma, x)]), _scalar(ctx, alpha, x)],
    )
    t = ctx.emit(ops.TanhOp, [ctx.emit(ops.MulOp, [x, inner])])
    half_x = ctx.emit(ops.MulOp, [x, _scalar(ctx, 0.5, x)])
    return [ctx.emit(ops.MulOp, [half_x, ctx.emit(ops.AddOp, [t, _scalar(ctx, 1.0, x)])])]


def _swap_last(ctx, x):
    rank = len(ctx.shape(x))
    if rank < 2:
        raise ctx.unsupported("transA/transB on a rank-1 operand")
    return _transpose(ctx, x, (*range(rank - 2), rank - 1, rank - 2))


@domain_check(_MS, "FusedMatMul")
def _fused_matmul_check(node, attrs, opset, used):
    """transBatchA = transBatchB = 0 (transA, transB and alpha are imported)."""
    for key in ("transBatchA", "transBatchB"):
        if int(attrs.get(key, 0)):
            return f"{key}={attrs[key]} is not supported (0 is)"
    return None


def _ms_fused_matmul(ctx, ins):
    a, b = ins[0], ins[1]
    if ctx.attr("transA", 0):
        a = _swap_last(ctx, a)
    if ctx.attr("transB", 0):
        b = _swap_last(ctx, b)
    y = HANDLERS["MatMul"](ctx, [a, b])[0]
    alpha = float(ctx.attr("alpha", 1.0))
    if alpha != 1.0:
        y = ctx.emit(ops.MulOp, [y, _scalar(ctx, alpha, y)])
    return [y]


DOMAIN_HANDLERS[_MS, "Attention"] = _ms_attention
DOMAIN_HANDLERS[_MS, "MultiHeadAttention"] = _ms_multi_head_attention
DOMAIN_HANDLERS[_MS, "EmbedLayerNormalization"] = _ms_embed_layer_norm
DOMAIN_HANDLERS[_MS, "SkipLayerNormalization"] = _ms_skip_layer_norm
DOMAIN_HANDLERS[_MS, "BiasGelu"] = _ms_bias_gelu
DOMAIN_HANDLERS[_MS, "FastGelu"] = _ms_fast_gelu
DOMAIN_HANDLERS[_MS, "FusedMatMul"] = _ms_fused_matmul
