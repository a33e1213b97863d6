"""One handler per ONNX op type: ``handler(ctx, inputs) -> outputs`` (opsets 13–28).

``inputs`` holds, per node input, a numpy array (a constant known at import), an IR ``Value`` or
None (an omitted optional input).  Handlers express the node with IR ops through ``ctx.emit``,
which evaluates them at once when every operand is a constant — so a handler never distinguishes
"shape subgraph" from "real compute".  Ops with no IR counterpart whose inputs must be constant
(Shape, Size, Range, ConstantOfShape) compute with numpy.  ``CHECKS`` hold the static reasons a
node of a supported op type is still unsupported (``DOMAIN_CHECKS`` for the other domains' ops), so
the importer can list them all up front.
The constant, shape and data-movement handlers are in ``mcpc.ir.onnx_handlers_shape``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx

from mcpc.arch.dtypes import BY_ONNX
from mcpc.errors import UnsupportedError
from mcpc.ir import ops
from mcpc.ir.dtypes import F32, I1, U8, DType
from mcpc.ir.ops_core import normalize_axis

_T = onnx.TensorProto


def onnx_dtype(elem_type: int) -> DType:
    """The IR dtype of an ONNX element type; UnsupportedError naming it otherwise."""
    if elem_type in BY_ONNX:
        return BY_ONNX[elem_type]
    name = _T.DataType.Name(elem_type) if elem_type in _T.DataType.values() else str(elem_type)
    hint = " (float64 model inputs/outputs: export the model in float32)" if elem_type == _T.DOUBLE else ""
    raise UnsupportedError(f"element type {name} is not supported{hint}")


Handler = Callable[..., list]
HANDLERS: dict[str, Handler] = {}  # default domain (ai.onnx), by op type
# Ops of other domains that map trivially onto the IR, by (domain, op type).
DOMAIN_HANDLERS: dict[tuple[str, str], Handler] = {}
CHECKS: dict[str, Callable[..., str | None]] = {}
# The same static checks for DOMAIN_HANDLERS' ops, by (domain, op type): ``onnx_support`` runs both.
DOMAIN_CHECKS: dict[tuple[str, str], Callable[..., str | None]] = {}


def handles(*op_types: str):
    def register(fn: Handler) -> Handler:
        for t in op_types:
            HANDLERS[t] = fn
        return fn

    return register


def check(*op_types: str):
    def register(fn):
        for t in op_types:
            CHECKS[t] = fn
        return fn

    return register


def domain_check(domain: str, *op_types: str):
    """Register ``fn(node, attrs, opset, used) -> reason | None`` (as ``check`` does) for the ops
    ``op_types`` of the non-default ``domain``; its docstring's first sentence is the op's row of
    docs/onnx-ops.md."""

    def register(fn):
        for t in op_types:
            DOMAIN_CHECKS[domain, t] = fn
        return fn

    return register


def given(node: onnx.NodeProto, index: int) -> bool:
    """Whether ``node`` names its input ``index`` (an omitted optional input is absent or "")."""
    return len(node.input) > index and node.input[index] != ""


def _scalar(ctx, value, like) -> np.ndarray:
    """A rank-0 constant of ``like``'s dtype."""
    return np.array(value, dtype=ctx.dtype(like).np_dtype)


def _reshape(ctx, x, shape):
    shape = [int(d) for d in shape]
    return x if list(ctx.shape(x)) == shape else ctx.emit(ops.ReshapeOp, [x], {"shape": shape})


def _slice_last(ctx, x, start: int, end: int):
    """``x[..., start:end]`` (``x`` itself when that is all of it)."""
    shape = list(ctx.shape(x))
    if start == 0 and end == shape[-1]:
        return x
    starts, ends = [0] * len(shape), list(shape)
    starts[-1], ends[-1] = start, end
    return ctx.emit(ops.SliceOp, [x], {"starts": starts, "ends": ends, "steps": [1] * len(shape)})


def _heads_first(ctx, x, heads: int):
    """[B, S, N·H] → [B, N, S, H] for N = ``heads`` (the attention ops' head split)."""
    b, s, width = ctx.shape(x)
    return ctx.emit(
        ops.TransposeOp, [_reshape(ctx, x, [b, s, heads, width // heads])], {"perm": [0, 2, 1, 3]}
    )


def _repeat_heads(ctx, x, reps: int):
    """[B, N, T, H] → [B, N·reps, T, H], each head repeated in place (h0, h0, h1, h1, …): GQA's K/V
    heads for their query heads."""
    if reps == 1:
        return x
    b, n, t, h = ctx.shape(x)
    x5 = _reshape(ctx, x, [b, n, 1, t, h])
    return _reshape(ctx, ctx.emit(ops.BroadcastOp, [x5], {"shape": [b, n, reps, t, h]}), [b, n * reps, t, h])


# -- elementwise ---------------------------------------------------------------------------------
_BINARY = {
    "Add": ops.AddOp,
    "Sub": ops.SubOp,
    "Mul": ops.MulOp,
    "Div": ops.DivOp,
    "Equal": ops.EqualOp,
    "Less": ops.LessOp,
    "Greater": ops.GreaterOp,
}
_VARIADIC = {"Max": ops.MaxOp, "Min": ops.MinOp, "Sum": ops.AddOp}
_UNARY = {
    "Sqrt": ops.SqrtOp,
    "Reciprocal": ops.ReciprocalOp,
    "Neg": ops.NegOp,
    "Abs": ops.AbsOp,
    "Exp": ops.ExpOp,
    "Tanh": ops.TanhOp,
    "Erf": ops.ErfOp,
    "Relu": ops.ReluOp,
    "Sigmoid": ops.SigmoidOp,
    "Sin": ops.SinOp,
    "Cos": ops.CosOp,
    "Log": ops.LogOp,
    "Floor": ops.FloorOp,
    "Round": ops.RoundOp,
}


@handles(*_BINARY)
def _binary(ctx, ins):
    return [ctx.emit(_BINARY[ctx.node.op_type], ins[:2])]


@handles(*_VARIADIC)
def _variadic(ctx, ins):
    acc = ins[0]
    for x in ins[1:]:
        acc = ctx.emit(_VARIADIC[ctx.node.op_type], [acc, x])
    return [acc]


@handles(*_UNARY)
def _unary(ctx, ins):
    return [ctx.emit(_UNARY[ctx.node.op_type], ins[:1])]


@handles("Ceil")
def _ceil(ctx, ins):
    # ceil(x) = -floor(-x) exactly (negation is exact; ceil(-0.5) = -0.0 as IEEE wants), so the
    # vector unit needs no separate ceil function
    neg = ctx.emit(ops.NegOp, ins[:1])
    return [ctx.emit(ops.NegOp, [ctx.emit(ops.FloorOp, [neg])])]


@handles("Clip")
def _clip(ctx, ins):
    # opset ≥ 11: y = min(max(x, lo), hi), bounds optional; with lo > hi every element is hi, as in
    # numpy.clip (ONNX's reference) — max then min gives exactly that, and NaN propagates through both
    y = ins[0]
    for bound, op in (
        (ins[1] if len(ins) > 1 else None, ops.MaxOp),
        (ins[2] if len(ins) > 2 else None, ops.MinOp),
    ):
        if bound is None:
            continue
        if ctx.shape(bound):  # the spec says scalar; exporters also write shape [1]
            bound = _reshape(ctx, bound, ())
        y = ctx.emit(op, [y, bound])
    return [y]


@handles("Pow")
def _pow(ctx, ins):
    base, exp = ins
    if ctx.dtype(exp) != ctx.dtype(base):  # ONNX allows e.g. a float base with an int exponent
        exp = ctx.emit(ops.CastOp, [exp], {"to": ctx.dtype(base)})
    return [ctx.emit(ops.PowOp, [base, exp])]


@handles("LessOrEqual", "GreaterOrEqual")
def _compare_or_equal(ctx, ins):
    strict = ops.LessOp if ctx.node.op_type == "LessOrEqual" else ops.GreaterOp
    # a <= b is (a < b) or (a == b): exact, NaN compares false as in ONNX
    lt, eq = ctx.emit(strict, ins[:2]), ctx.emit(ops.EqualOp, ins[:2])
    return [ctx.emit(ops.SelectOp, [lt, np.array(True), eq])]


@handles("Not", "And", "Or")
def _logic(ctx, ins):
    t, f = np.array(True), np.array(False)
    if ctx.node.op_type == "Not":
        return [ctx.emit(ops.EqualOp, [ins[0], f])]
    a, b = ins
    if ctx.node.op_type == "And":
        return [ctx.emit(ops.SelectOp, [a, b, f])]
    return [ctx.emit(ops.SelectOp, [a, t, b])]


@handles("IsNaN")
def _isnan(ctx, ins):
    # NaN is the only value not equal to itself: isnan(x) = (x == x) == false, exact in any float
    # dtype (exporters guard SDPA's softmax of an all-masked row with IsNaN → Where)
    x = ins[0]
    return [ctx.emit(ops.EqualOp, [ctx.emit(ops.EqualOp, [x, x]), np.array(False)])]


@handles("IsInf")
def _isinf(ctx, ins):
    x = ins[0]
    pos, neg = ctx.attr("detect_positive", 1), ctx.attr("detect_negative", 1)
    if pos and neg:  # |x| == inf; Abs is exact, so this is x == inf or x == -inf
        return [ctx.emit(ops.EqualOp, [ctx.emit(ops.AbsOp, [x]), _scalar(ctx, np.inf, x)])]
    if pos or neg:
        return [ctx.emit(ops.EqualOp, [x, _scalar(ctx, np.inf if pos else -np.inf, x)])]
    return [np.zeros(ctx.shape(x), dtype=bool)]  # detects nothing: all false, known at import


@handles("Where")
def _where(ctx, ins):
    return [ctx.emit(ops.SelectOp, ins[:3])]


@check("Gelu")
def _gelu_check(node, attrs, opset, used):
    """approximate must be "none" or "tanh" (the two ONNX defines)."""
    if attrs.get("approximate", "none") not in ("none", "tanh"):
        return f"approximate={attrs['approximate']!r} is not defined (none or tanh)"
    return None


@handles("Gelu")
def _gelu(ctx, ins):
    x = ins[0]
    if ctx.attr("approximate", "none") == "none":
        return [ctx.emit(ops.GeluOp, [x])]
    # 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), as ONNX defines approximate="tanh"
    x3 = ctx.emit(ops.MulOp, [ctx.emit(ops.MulOp, [x, x]), x])
    inner = ctx.emit(ops.AddOp, [x, ctx.emit(ops.MulOp, [x3, _scalar(ctx, 0.044715, x)])])
    t = ctx.emit(ops.TanhOp, [ctx.emit(ops.MulOp, [inner, _scalar(ctx, math.sqrt(2 / math.pi), x)])])
    half_x = ctx.emit(ops.MulOp, [x, _scalar(ctx, 0.5, x)])
    return [ctx.emit(ops.MulOp, [half_x, ctx.emit(ops.AddOp, [t, _scalar(ctx, 1.0, x)])])]


def _ms_gelu(ctx, ins):
    """The exact (erf) GELU, as ``mcp.gelu``."""
    return [ctx.emit(ops.GeluOp, ins[:1])]  # com.microsoft Gelu is the exact (erf) GELU


DOMAIN_HANDLERS["com.microsoft", "Gelu"] = _ms_gelu


@check("Cast", "CastLike")
def _cast_check(node, attrs, opset, used):
    """to must be a dtype mcpc has (DOUBLE is imported as f32, a rounding); saturate=0 is refused
    (casts to f8 saturate)."""
    if node.op_type == "Cast":
        to = attrs.get("to")
        if to != _T.DOUBLE:
            try:
                onnx_dtype(to)
            except UnsupportedError as e:
                return str(e)
    if attrs.get("saturate", 1) == 0:
        # mcp.cast saturates f8 overflow (ONNX's default); saturate=0 asks for NaN instead
        return "saturate=0 is not supported (casts to f8e4m3fn saturate to ±448)"
    return None


@handles("Cast", "CastLike")
def _cast(ctx, ins):
    if ctx.node.op_type == "CastLike":
        to = ctx.dtype(ins[1])
    else:
        to = F32 if ctx.attr("to") == _T.DOUBLE else onnx_dtype(ctx.attr("to"))  # f64 → f32, documented
    x = ins[0]
    if ctx.dtype(x) == to:
        return [x]
    return [ctx.emit(ops.CastOp, [x], {"to": to})]


@handles("Identity")
def _identity(ctx, ins):
    return [ins[0]]


@check("Dropout")
def _dropout_check(node, attrs, opset, used):
    """Inference only: the mask output must be unused (training_mode=true is refused at conversion)."""
    if len(node.output) > 1 and node.output[1] in used:
        return "the mask output is used (only inference-mode Dropout is supported)"
    return None


@handles("Dropout")
def _dropout(ctx, ins):
    if len(ins) > 2 and ins[2] is not None and bool(ctx.const(ins[2], "training_mode").reshape(-1)[0]):
        raise ctx.unsupported("training_mode=true is not supported (inference only)")
    return [ins[0]]


# -- nn ------------------------------------------------------------------------------------------
@handles("MatMul")
def _matmul(ctx, ins):
    a, b = ins
    sa, sb = ctx.shape(a), ctx.shape(b)
    if len(sa) == 1:  # ONNX/numpy promote a vector: prepend (a) or append (b) a 1, then drop it
        a = _reshape(ctx, a, (1, sa[0]))
    if len(sb) == 1:
        b = _reshape(ctx, b, (sb[0], 1))
    y = ctx.emit(ops.MatMulOp, [a, b])
    out = list(ctx.shape(y))
    if len(sb) == 1:
        out.pop(-1)
    if len(sa) == 1:
        out.pop(-1 if len(sb) == 1 else -2)
    return [_reshape(ctx, y, out)]


@handles("Gemm")
def _gemm(ctx, ins):
    a, b = ins[0], ins[1]
    c = ins[2] if len(ins) > 2 else None
    alpha, beta = ctx.attr("alpha", 1.0), ctx.attr("beta", 1.0)
    if ctx.attr("transA", 0):
        a = ctx.emit(ops.TransposeOp, [a], {"perm": [1, 0]})
    trans_b = bool(ctx.attr("transB", 0))  # a constant weight is read transposed, never copied
    if alpha != 1.0 and isinstance(b, np.ndarray):
        b, alpha = ctx.emit(ops.MulOp, [b, _scalar(ctx, alpha, b)]), 1.0
    y = ctx.emit(ops.MatMulOp, [a, b], {"trans_b": trans_b})
    if alpha != 1.0:
        y = ctx.emit(ops.MulOp, [y, _scalar(ctx, alpha, y)])
    if c is not None and beta != 0.0:
        if beta != 1.0:
            c = ctx.emit(ops.MulOp, [c, _scalar(ctx, beta, c)])
        y = ctx.emit(ops.AddOp, [y, c])
    return [y]


@handles("Softmax", "LogSoftmax")
def _softmax(ctx, ins):
    cls = ops.SoftmaxOp if ctx.node.op_type == "Softmax" else ops.LogSoftmaxOp
    return [ctx.emit(cls, ins[:1], {"axis": ctx.attr("axis", -1)})]


@handles("LayerNormalization")
def _layer_norm(ctx, ins):
    x, scale = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    shape = ctx.shape(x)
    axis = normalize_axis(ctx.attr("axis", -1), len(shape))
    norm = list(shape[axis:])
    if bias is None:
        bias = np.zeros(norm, dtype=ctx.dtype(x).np_dtype)
    parts = []
    for p in (scale, bias):  # ONNX lets scale/bias broadcast to the normalised shape
        if list(ctx.shape(p)) != norm:
            p = ctx.emit(ops.BroadcastOp, [p], {"shape": norm})
        parts.append(p)
    eps = ctx.attr("epsilon", 1e-5)
    y = ctx.emit(ops.LayerNormOp, [x, *parts], {"axis": axis, "epsilon": eps})
    if not any(ctx.node.output[1:]):
        return [y]
    mean, inv = _layer_norm_stats(ctx, x, axis, eps, onnx_dtype(ctx.attr("stash_type", _T.FLOAT)))
    return [y, mean, inv]


def _layer_norm_stats(ctx, x, axis: int, eps: float, stash: DType):
    """Mean and InvStdDev (training-style outputs) over dims ``axis..`` in the ``stash`` type, from
    separate reductions with the same steps as mcp.layer_norm: mean, d = x - mean, var = mean(d*d),
    rsqrt(var + eps); both keep the reduced dims as 1."""
    xs = x if ctx.dtype(x) == stash else ctx.emit(ops.CastOp, [x], {"to": stash})
    axes = {"axes": list(range(axis, len(ctx.shape(x)))), "keepdims": True}
    mean = ctx.emit(ops.ReduceMeanOp, [xs], axes)
    d = ctx.emit(ops.SubOp, [xs, mean])
    var = ctx.emit(ops.ReduceMeanOp, [ctx.emit(ops.MulOp, [d, d])], axes)
    inv = ctx.emit(ops.RsqrtOp, [ctx.emit(ops.AddOp, [var, np.array(eps, dtype=stash.np_dtype)])])
    return mean, inv


_REDUCE = {"ReduceMean": ops.ReduceMeanOp, "ReduceSum": ops.ReduceSumOp, "ReduceMax": ops.ReduceMaxOp}


@handles(*_REDUCE)
def _reduce(ctx, ins):
    x = ins[0]
    rank = len(ctx.shape(x))
    if "axes" in ctx.attrs:
        axes = list(ctx.attr("axes"))
    elif len(ins) > 1 and ins[1] is not None:
        axes = ctx.ints(ins[1], "the axes input")
    else:
        axes = []
    keepdims = bool(ctx.attr("keepdims", 1))
    if not axes:
        if ctx.attr("noop_with_empty_axes", 0):
            return [x]
        axes = list(range(rank))
    if rank == 0:
        return [x]
    attrs = {"axes": axes, "keepdims": keepdims}
    if ctx.dtype(x) == I1 and ctx.node.op_type == "ReduceMax":  # bool max is "any": reduce as u8
        y = ctx.emit(ops.ReduceMaxOp, [ctx.emit(ops.CastOp, [x], {"to": U8})], attrs)
        return [ctx.emit(ops.CastOp, [y], {"to": I1})]
    return [ctx.emit(_REDUCE[ctx.node.op_type], [x], attrs)]


@handles("ArgMax")
def _argmax(ctx, ins):
    if ctx.attr("select_last_index", 0):
        raise ctx.unsupported("ArgMax with select_last_index=1 (the last maximum) is not supported")
    x = ins[0]
    if ctx.dtype(x) == I1:
        x = ctx.emit(ops.CastOp, [x], {"to": U8})
    axis = int(ctx.attr("axis", 0))
    return [ctx.emit(ops.ArgMaxOp, [x], {"axes": [axis], "keepdims": bool(ctx.attr("keepdims", 1))})]


@handles("TopK")
def _topk(ctx, ins):
    """TopK-1 (``k`` an attribute), -10 (``k`` an input) and -11 (``largest``, ``sorted``, negative
    axes); ``k`` must be a constant.  Two outputs: values and i64 indices."""
    x = ins[0]
    if len(ins) > 1 and ins[1] is not None:
        ks = ctx.ints(ins[1], "k")
        if len(ks) != 1:
            raise ctx.unsupported(f"k must hold exactly one value, got {len(ks)}")
        k = ks[0]
    elif "k" in ctx.attrs:
        k = int(ctx.attr("k"))
    else:
        raise ctx.unsupported("TopK without k (neither an input nor an attribute)")
    rank = len(ctx.shape(x))
    axis = int(ctx.attr("axis", -1))
    if not -rank <= axis < rank:
        raise ctx.unsupported(f"axis {axis} is out of range for rank {rank}")
    size = ctx.shape(x)[axis]
    if not 0 <= k <= size:
        raise ctx.unsupported(f"k = {k} is outside [0, {size}] (the size of axis {axis})")
    largest, srt = bool(ctx.attr("largest", 1)), bool(ctx.attr("sorted", 1))
    attrs = {"axis": axis, "k": k, "largest": largest, "sorted": srt}
    return list(ctx.emit(ops.TopKOp, [x], attrs))


# The constant, shape and data-movement handlers live in their own module and register into the
# tables above when imported; importing them here keeps HANDLERS complete for every caller.
from mcpc.ir import (  # noqa: E402, F401
    onnx_handlers_attention,
    onnx_handlers_contrib,
    onnx_handlers_genai,
    onnx_handlers_quant,
    onnx_handlers_shape,
)
