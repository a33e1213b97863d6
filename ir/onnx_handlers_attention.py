"""The ONNX handlers for the transformer ops of opsets 23–25: ``Attention``, ``RMSNormalization`` and
``RotaryEmbedding`` (torch's dynamo exporter writes them at opset 23: SDPA as ``Attention``, and the
onnxscript optimizer fuses RMSNorm and RoPE).

Same contract as ``mcpc.ir.onnx_handlers``, whose tables these register into (that module imports
this one).  Each op is expressed with existing IR ops, step by step as the ONNX specification's
function body and ``onnx.reference`` compute it; ONNX Runtime is the conformance oracle
(``tests/ir/test_onnx_attention_ops.py``).  What is not supported is refused naming the node, in
``CHECKS`` where it can be seen statically (so ``inspect-model`` says why):

* ``Attention`` (opsets 23–25): ``nonpad_kv_seqlen`` beside a past (the specification forbids
  it); everything else — 3-D or 4-D Q/K/V, GQA, ``past_key`` / ``past_value`` with the
  ``present_*`` outputs, ``nonpad_kv_seqlen`` (opset 24: per-sequence key counts, computed on at
  run time), a boolean or additive ``attn_mask`` (shorter than the keys: padded), ``is_causal``
  (bottom-right aligned after the past or the non-padded keys), the sliding window of opset 25,
  the ``qk_matmul_output`` output in its four modes (ONNX Runtime's: 0 the scaled QK, 1 after the
  softcap, 2 after the bias, 3 the probabilities; onnx.reference applies the softcap in mode 0
  too), ``scale``,
  ``softcap``, ``softmax_precision`` (all computed in f32: float16 inputs are rounded once, at
  the output), the fully-masked-row guard (such rows give 0);
* ``RMSNormalization``: ``stash_type`` other than float;
* ``RotaryEmbedding``: nothing (3-D input with ``num_heads`` or 4-D [batch, heads, seq, head],
  with or without ``position_ids``, interleaved or halves, partial ``rotary_embedding_dim``).
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from mcpc.ir import ops
from mcpc.ir.dtypes import F32, I1
from mcpc.ir.onnx_handlers import _heads_first, _repeat_heads, _reshape, _scalar, _slice_last, check, handles
from mcpc.ir.ops_core import normalize_axis

_T = onnx.TensorProto


def _cast(ctx, x, dtype):
    return x if ctx.dtype(x) == dtype else ctx.emit(ops.CastOp, [x], {"to": dtype})


# -- RMSNormalization ----------------------------------------------------------------------------
@check("RMSNormalization")
def _rms_check(node, attrs, opset, used):
    """stash_type float only (the computation is in f32)."""
    if attrs.get("stash_type", _T.FLOAT) != _T.FLOAT:
        return f"stash_type {attrs['stash_type']} is not supported (float only, as ONNX Runtime computes)"
    return None


@handles("RMSNormalization")
def _rms_norm(ctx, ins):
    """Y = Cast(X · 1/sqrt(mean(X², axes axis..) + epsilon), X's type) · Scale, computed in f32."""
    x, scale = ins[0], ins[1]
    shape = ctx.shape(x)
    axis = normalize_axis(ctx.attr("axis", -1), len(shape))
    eps = float(ctx.attr("epsilon", 1e-5))
    xs = _cast(ctx, x, F32)
    mean = ctx.emit(
        ops.ReduceMeanOp, [ctx.emit(ops.MulOp, [xs, xs])], {"axes": list(range(axis, len(shape)))}
    )
    rms = ctx.emit(ops.SqrtOp, [ctx.emit(ops.AddOp, [mean, np.array(eps, np.float32)])])
    y = ctx.emit(ops.MulOp, [xs, ctx.emit(ops.ReciprocalOp, [rms])])
    return [ctx.emit(ops.MulOp, [_cast(ctx, y, ctx.dtype(x)), scale])]


# -- RotaryEmbedding -----------------------------------------------------------------------------
@handles("RotaryEmbedding")
def _rotary(ctx, ins):
    """ONNX RotaryEmbedding (opset 23): X [batch, seq, hidden] with ``num_heads``, or [batch, heads,
    seq, head]; cos/sin [batch, seq, rd/2], or [max_pos, rd/2] gathered at ``position_ids``
    [batch, seq].  The first ``rd`` (``rotary_embedding_dim``, default head) features rotate:
    halves (x1, x2) or interleaved pairs, real = cos·x1 − sin·x2, imag = sin·x1 + cos·x2."""
    x, cos, sin = ins[0], ins[1], ins[2]
    pos = ins[3] if len(ins) > 3 else None
    shape = list(ctx.shape(x))
    if len(shape) not in (3, 4):
        raise ctx.unsupported(f"input of rank {len(shape)} (3 or 4 expected)")
    if len(shape) == 3:
        heads = int(ctx.attr("num_heads", 0))
        if heads <= 0 or shape[2] % heads:
            raise ctx.unsupported(f"a 3-D input of hidden size {shape[2]} needs num_heads dividing it")
        b, s, head = shape[0], shape[1], shape[2] // heads
        x4 = ctx.emit(ops.TransposeOp, [_reshape(ctx, x, [b, s, heads, head])], {"perm": [0, 2, 1, 3]})
    else:
        b, heads, s, head = shape
        x4 = x
    rd = int(ctx.attr("rotary_embedding_dim", 0)) or head
    if rd % 2 or rd > head:
        raise ctx.unsupported(f"rotary_embedding_dim {rd} must be even and at most the head size {head}")
    if pos is not None:
        cos, sin = (ctx.emit(ops.GatherOp, [t, pos], {"axis": 0}) for t in (cos, sin))
    for t, what in ((cos, "cos_cache"), (sin, "sin_cache")):
        if list(ctx.shape(t)) != [b, s, rd // 2]:
            raise ctx.unsupported(
                f"{what} has shape {list(ctx.shape(t))}, expected [batch, seq, rotary_dim / 2] = "
                f"{[b, s, rd // 2]}"
            )
    cos, sin = (_reshape(ctx, t, [b, 1, s, rd // 2]) for t in (cos, sin))
    half = rd // 2
    end = [b, heads, s]
    if ctx.attr("interleaved", 0):
        pairs = _slice_last(ctx, x4, 0, rd)
        pairs = _reshape(ctx, pairs, [*end, half, 2])
        x1 = _reshape(ctx, _slice_last(ctx, pairs, 0, 1), [*end, half])
        x2 = _reshape(ctx, _slice_last(ctx, pairs, 1, 2), [*end, half])
    else:
        x1, x2 = _slice_last(ctx, x4, 0, half), _slice_last(ctx, x4, half, rd)
    real = ctx.emit(ops.SubOp, [ctx.emit(ops.MulOp, [cos, x1]), ctx.emit(ops.MulOp, [sin, x2])])
    imag = ctx.emit(ops.AddOp, [ctx.emit(ops.MulOp, [sin, x1]), ctx.emit(ops.MulOp, [cos, x2])])
    if ctx.attr("interleaved", 0):
        parts = [_reshape(ctx, t, [*end, half, 1]) for t in (real, imag)]
        rotated = _reshape(ctx, ctx.emit(ops.ConcatOp, parts, {"axis": -1}), [*end, rd])
    else:
        rotated = ctx.emit(ops.ConcatOp, [real, imag], {"axis": -1})
    if rd < head:
        rotated = ctx.emit(ops.ConcatOp, [rotated, _slice_last(ctx, x4, rd, head)], {"axis": -1})
    if len(shape) == 3:
        rotated = ctx.emit(ops.TransposeOp, [rotated], {"perm": [0, 2, 1, 3]})
        return [_reshape(ctx, rotated, shape)]
    return [rotated]


# -- Attention -----------------------------------------------------------------------------------
@check("Attention")
def _attention_check(node, attrs, opset, used):
    """No nonpad_kv_seqlen beside past_key/past_value (the specification forbids it); softmax_precision
    float, float16 or bfloat16 (the softmax is computed in f32); window sizes -1 or non-negative."""
    ins = list(node.input)
    past = bool(len(ins) > 4 and ins[4]), bool(len(ins) > 5 and ins[5])
    if past[0] != past[1]:
        return "past_key and past_value must be given together"
    if past[0] and len(ins) > 6 and ins[6]:
        return "nonpad_kv_seqlen cannot be combined with past_key / past_value (the specification forbids it)"
    if attrs.get("qk_matmul_output_mode", 0) not in (0, 1, 2, 3):
        return f"qk_matmul_output_mode {attrs['qk_matmul_output_mode']} is not one of 0..3"
    for a in ("left_window_size", "right_window_size"):
        if attrs.get(a, -1) < -1:
            return f"{a} = {attrs[a]} (must be -1 or non-negative)"
    precision = attrs.get("softmax_precision")
    if precision is not None and precision not in (_T.FLOAT, _T.FLOAT16, _T.BFLOAT16):
        return f"softmax_precision {precision} is not supported (float, float16 or bfloat16)"
    return None


def _split_heads(ctx, t, heads: int):
    """[batch, seq, heads·d] -> [batch, heads, seq, d]."""
    hidden = ctx.shape(t)[2]
    if heads <= 0 or hidden % heads:
        raise ctx.unsupported(
            f"a 3-D input of hidden size {hidden} needs a head count dividing it, got {heads}"
        )
    return _heads_first(ctx, t, heads)


@handles("Attention")
def _attention(ctx, ins):
    """ONNX Attention (opsets 23/24) as the specification's function body computes it: Q·√scale and
    K·√scale, Q·Kᵀ, softcap, + bias (attn_mask, causal), softmax (in softmax_precision), the
    fully-masked-row guard, · V.  Outputs: Y, present_key, present_value."""
    q, k, v = ins[0], ins[1], ins[2]
    mask = ins[3] if len(ins) > 3 else None
    past_k = ins[4] if len(ins) > 4 else None
    past_v = ins[5] if len(ins) > 5 else None
    rank = len(ctx.shape(q))
    if rank == 3:
        qh, kvh = int(ctx.attr("q_num_heads", 0)), int(ctx.attr("kv_num_heads", 0))
        q, k, v = _split_heads(ctx, q, qh), _split_heads(ctx, k, kvh), _split_heads(ctx, v, kvh)
    elif rank != 4:
        raise ctx.unsupported(f"Q of rank {rank} (3 or 4 expected)")
    if past_k is not None:
        k = ctx.emit(ops.ConcatOp, [past_k, k], {"axis": 2})
        v = ctx.emit(ops.ConcatOp, [past_v, v], {"axis": 2})
    present_k, present_v = k, v
    b, hq, s, d = ctx.shape(q)
    hk, t = ctx.shape(k)[1], ctx.shape(k)[2]
    if hq % hk or ctx.shape(v)[1] != hk:
        raise ctx.unsupported(f"{hq} query heads cannot share {hk} key / {ctx.shape(v)[1]} value heads")
    out_dtype = ctx.dtype(q)
    # narrower floats are computed in f32 and rounded once (the exact result's rounding, which the
    # ONNX node tests' fp16 data hold; rounding every step as the reference does misses by 2 ulp)
    reps = hq // hk
    q = _cast(ctx, q, F32)
    k_rep, v_rep = (_cast(ctx, _repeat_heads(ctx, t, reps), F32) for t in (k, v))
    scale = ctx.attr("scale", None)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    root = np.array(math.sqrt(scale), dtype=np.float32)
    qs = ctx.emit(ops.MulOp, [q, root])
    ks = ctx.emit(ops.MulOp, [k_rep, root])
    kt = ctx.emit(ops.TransposeOp, [ks], {"perm": [0, 1, 3, 2]})
    scores = ctx.emit(ops.MatMulOp, [qs, kt])
    raw = scores  # the QK output of mode 0 (ONNX Runtime's: before the softcap)
    softcap = float(ctx.attr("softcap", 0.0) or 0.0)
    if softcap > 0:
        c = _scalar(ctx, softcap, scores)
        scores = ctx.emit(ops.MulOp, [ctx.emit(ops.TanhOp, [ctx.emit(ops.DivOp, [scores, c])]), c])
    nonpad = ins[6] if len(ins) > 6 else None
    bias = _bias(ctx, mask, s, t, 0 if past_k is None else ctx.shape(past_k)[2], nonpad)
    capped = scores  # mode 1: after the softcap
    if bias is not None:
        scores = ctx.emit(ops.AddOp, [scores, bias])
    with_bias = scores
    masked_rows = _masked_rows(ctx, bias)
    if masked_rows is not None:  # no NaN from an all −inf row: softmax a zero row, then zero it
        scores = ctx.emit(ops.SelectOp, [masked_rows, _scalar(ctx, 0.0, scores), scores])
    probs = ctx.emit(ops.SoftmaxOp, [scores], {"axis": -1})  # f32: at least any softmax_precision
    if masked_rows is not None:
        probs = ctx.emit(ops.SelectOp, [masked_rows, _scalar(ctx, 0.0, probs), probs])
    y = _cast(ctx, ctx.emit(ops.MatMulOp, [probs, v_rep]), out_dtype)
    if rank == 3:
        y = _reshape(
            ctx, ctx.emit(ops.TransposeOp, [y], {"perm": [0, 2, 1, 3]}), [b, s, hq * ctx.shape(v)[3]]
        )
    outs = [y, present_k, present_v]
    if len(ctx.node.output) > 3 and ctx.node.output[3]:
        mode = int(ctx.attr("qk_matmul_output_mode", 0))
        picked = (raw, capped, with_bias, probs)[mode]
        if list(ctx.shape(picked)) != [b, hq, s, t]:  # a bias broadcast smaller than the scores
            picked = ctx.emit(ops.BroadcastOp, [picked], {"shape": [b, hq, s, t]})
        outs.append(_cast(ctx, picked, out_dtype))
    return outs


def _bias(ctx, mask, s: int, t: int, offset: int, nonpad):
    """The additive f32 bias [.., s, t], or None when there is none: ``attn_mask`` (boolean -> 0 /
    −inf; padded with −inf to t keys) plus −inf where a key is outside the causal frontier
    (``is_causal``: key j > query i + offset) or the sliding window (opset 25: i + offset − j >
    left, j − i − offset > right).  With ``nonpad_kv_seqlen`` (no past) the offset is per sequence,
    nonpad[b] − s, and keys j ≥ nonpad[b] are padding: that part is computed at run time."""
    bias = None
    if mask is not None:
        if ctx.dtype(mask) == I1:
            mask = ctx.emit(ops.SelectOp, [mask, np.zeros((), np.float32), np.array(-np.inf, np.float32)])
        mshape = list(ctx.shape(mask))
        if mshape[-1] < t:
            pad = np.full([*mshape[:-1], t - mshape[-1]], -np.inf, np.float32)
            mask = ctx.emit(ops.ConcatOp, [_cast(ctx, mask, F32), pad], {"axis": -1})
        bias = _cast(ctx, mask, F32)
    causal = bool(ctx.attr("is_causal", 0))
    left, right = int(ctx.attr("left_window_size", -1)), int(ctx.attr("right_window_size", -1))
    i, j = np.arange(s)[:, None], np.arange(t)[None, :]
    if nonpad is None:
        allowed = np.ones((s, t), bool)
        if causal:
            allowed &= j <= i + offset
        if left >= 0:
            allowed &= i + offset - j <= left
        if right >= 0:
            allowed &= j - i - offset <= right
        if not allowed.all():
            const = np.where(allowed, 0.0, -np.inf).astype(np.float32)
            bias = const if bias is None else ctx.emit(ops.AddOp, [bias, const])
        return bias
    n = _reshape(ctx, nonpad, [ctx.shape(nonpad)[0], 1, 1, 1])
    # each condition as Less(constant, n) or Less(n, constant), the constant [s, t] built from i, j
    # (with o_b = n_b − s): key padding j < n; causal j ≤ i + o ⟺ j − i + s − 1 < n; window left
    # i + o − j ≤ left ⟺ n < left + s + j − i + 1; right j − i − o ≤ right ⟺ j − i + s − right − 1 < n
    below = [j + 0 * i]
    above = []
    if causal:
        below.append(j - i + s - 1)
    if left >= 0:
        above.append(left + s + j - i + 1)
    if right >= 0:
        below.append(j - i + s - right - 1)
    allowed = None
    for c, n_is_greater in [(c, True) for c in below] + [(c, False) for c in above]:
        c = c.astype(np.int64)
        cond = ctx.emit(ops.LessOp, [c, n] if n_is_greater else [n, c])
        allowed = cond if allowed is None else ctx.emit(ops.SelectOp, [allowed, cond, np.array(False)])
    runtime = ctx.emit(ops.SelectOp, [allowed, np.zeros((), np.float32), np.array(-np.inf, np.float32)])
    return runtime if bias is None else ctx.emit(ops.AddOp, [bias, runtime])


def _masked_rows(ctx, bias):
    """[.., s, 1] booleans: the query rows whose bias is −inf for every key (None when no row can
    be: no bias, or a constant bias with none)."""
    if bias is None:
        return None
    if isinstance(bias, np.ndarray):
        rows = np.isneginf(bias.max(axis=-1, keepdims=True))
        return rows if rows.any() else None
    top = ctx.emit(ops.ReduceMaxOp, [bias], {"axes": [-1], "keepdims": True})
    return ctx.emit(ops.EqualOp, [top, np.array(-np.inf, ctx.dtype(top).np_dtype)])
