"""One handler per ONNX op type: ``handler(ctx, inputs) -> outputs`` (opsets 13–28).

``inputs`` holds, per node input, a numpy array (a constant known at import), an IR ``Value`` or
None (an omitted optional input).  Handlers express the node with IR ops through ``ctx.emit``,
which evaluates them at once when every operand is a constant — so a handler never distinguishes
"shape subgraph" from "real compute".  Ops with no IR counterpart whose inputs must be constant
(Shape, Size, Range, ConstantOfShape) compute with numpy.  ``CHECKS`` hold the static reasons a
node of a supported op type is still unsupported, so the importer can list them all up front.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx

from mcpc.errors import UnsupportedError
from mcpc.ir import ops
from mcpc.ir.dtypes import BF16, F8E4M3FN, F16, F32, I1, I4, I8, I32, I64, U4, U8, DType
from mcpc.ir.ops_core import broadcast_shapes, normalize_axis

_T = onnx.TensorProto
_ONNX_DTYPES: dict[int, DType] = {
    _T.FLOAT: F32,
    _T.FLOAT16: F16,
    _T.BFLOAT16: BF16,
    _T.FLOAT8E4M3FN: F8E4M3FN,
    _T.INT64: I64,
    _T.INT32: I32,
    _T.INT8: I8,
    _T.UINT8: U8,
    _T.INT4: I4,
    _T.UINT4: U4,
    _T.BOOL: I1,
}


def onnx_dtype(elem_type: int) -> DType:
    """The IR dtype of an ONNX element type; UnsupportedError naming it otherwise."""
    if elem_type in _ONNX_DTYPES:
        return _ONNX_DTYPES[elem_type]
    name = _T.DataType.Name(elem_type) if elem_type in _T.DataType.values() else str(elem_type)
    hint = " (float64 model inputs/outputs: export the model in float32)" if elem_type == _T.DOUBLE else ""
    raise UnsupportedError(f"element type {name} is not supported{hint}")


Handler = Callable[..., list]
HANDLERS: dict[str, Handler] = {}  # default domain (ai.onnx), by op type
# Ops of other domains that map trivially onto the IR, by (domain, op type).
DOMAIN_HANDLERS: dict[tuple[str, str], Handler] = {}
CHECKS: dict[str, Callable[..., str | None]] = {}


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


def _scalar(ctx, value, like) -> np.ndarray:
    """A rank-0 constant of ``like``'s dtype."""
    return np.array(value, dtype=ctx.dtype(like).np_dtype)


def _reshape(ctx, x, shape):
    shape = [int(d) for d in shape]
    return x if list(ctx.shape(x)) == shape else ctx.emit(ops.ReshapeOp, [x], {"shape": shape})


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


@handles("Where")
def _where(ctx, ins):
    return [ctx.emit(ops.SelectOp, ins[:3])]


@check("Gelu")
def _gelu_check(node, attrs, opset, used):
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
    return [ctx.emit(ops.GeluOp, ins[:1])]  # com.microsoft Gelu is the exact (erf) GELU


DOMAIN_HANDLERS["com.microsoft", "Gelu"] = _ms_gelu


@check("Cast", "CastLike")
def _cast_check(node, attrs, opset, used):
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
    if len(node.output) > 1 and node.output[1] in used:
        return "the mask output is used (only inference-mode Dropout is supported)"
    return None


@handles("Dropout")
def _dropout(ctx, ins):
    if len(ins) > 2 and ins[2] is not None and bool(ctx.const(ins[2], "training_mode").reshape(-1)[0]):
        raise ctx.unsupported("training_mode=true is not supported (inference only)")
    return [ins[0]]


# -- constants and shape subgraphs ---------------------------------------------------------------
@check("Constant")
def _constant_check(node, attrs, opset, used):
    known = {"value", "value_float", "value_floats", "value_int", "value_ints"}
    other = sorted(set(attrs) - known)
    return f"attribute {other[0]} is not supported" if other else None


@handles("Constant")
def _constant(ctx, ins):
    a = ctx.attrs
    if "value" in a:
        return [ctx.tensor(a["value"], "value")]
    if "value_float" in a:
        return [np.array(a["value_float"], dtype=np.float32)]
    if "value_floats" in a:
        return [np.array(a["value_floats"], dtype=np.float32)]
    if "value_int" in a:
        return [np.array(a["value_int"], dtype=np.int64)]
    return [np.array(a["value_ints"], dtype=np.int64)]


@handles("Shape")
def _shape(ctx, ins):
    shape = ctx.shape(ins[0])
    start, end = ctx.attr("start", 0), ctx.attr("end", None)
    return [np.array(shape[start:end], dtype=np.int64)]


@handles("Size")
def _size(ctx, ins):
    return [np.array(math.prod(ctx.shape(ins[0])), dtype=np.int64)]


@handles("ConstantOfShape")
def _constant_of_shape(ctx, ins):
    shape = ctx.ints(ins[0], "the shape input")
    value = ctx.tensor(ctx.attrs["value"], "value") if "value" in ctx.attrs else np.zeros(1, np.float32)
    return [np.full(shape, value.reshape(-1)[0], dtype=value.dtype)]


@handles("Range")
def _range(ctx, ins):
    start, limit, delta = (ctx.const(t, "Range's inputs") for t in ins[:3])
    n = max(int(math.ceil((limit.item() - start.item()) / delta.item())), 0)
    # ONNX defines element i as start + i·delta, in the inputs' type
    return [(start + np.arange(n, dtype=start.dtype) * delta).astype(start.dtype)]


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
    trans_b = bool(ctx.attr("transB", 0))
    if trans_b and isinstance(b, np.ndarray):  # fold the transpose of a constant weight
        b, trans_b = ctx.emit(ops.TransposeOp, [b], {"perm": [1, 0]}), False
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


@handles("Softmax")
def _softmax(ctx, ins):
    return [ctx.emit(ops.SoftmaxOp, ins[:1], {"axis": ctx.attr("axis", -1)})]


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
    # Mean and InvStdDev (training-style outputs) in the stash type, from separate reductions with
    # the same steps as mcp.layer_norm: mean, d = x - mean, var = mean(d*d), rsqrt(var + eps)
    stash = onnx_dtype(ctx.attr("stash_type", _T.FLOAT))
    xs = x if ctx.dtype(x) == stash else ctx.emit(ops.CastOp, [x], {"to": stash})
    axes = {"axes": list(range(axis, len(shape))), "keepdims": True}
    mean = ctx.emit(ops.ReduceMeanOp, [xs], axes)
    d = ctx.emit(ops.SubOp, [xs, mean])
    var = ctx.emit(ops.ReduceMeanOp, [ctx.emit(ops.MulOp, [d, d])], axes)
    inv = ctx.emit(ops.RsqrtOp, [ctx.emit(ops.AddOp, [var, np.array(eps, dtype=stash.np_dtype)])])
    return [y, mean, inv]


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


# -- shape ---------------------------------------------------------------------------------------
@handles("Reshape")
def _reshape_node(ctx, ins):
    x, target = ins[0], ctx.ints(ins[1], "the shape input")
    shape = ctx.shape(x)
    allowzero = ctx.attr("allowzero", 0)
    out = [shape[i] if d == 0 and not allowzero else d for i, d in enumerate(target)]
    if out.count(-1) > 1:
        raise ctx.unsupported(f"shape {target} has more than one -1")
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        total = math.prod(shape)
        if known == 0 or total % known:
            raise ctx.unsupported(
                f"cannot infer the -1 in shape {target} for an input of shape {list(shape)}"
            )
        out[out.index(-1)] = total // known
    return [_reshape(ctx, x, out)]


@handles("Flatten")
def _flatten(ctx, ins):
    shape = ctx.shape(ins[0])
    axis = ctx.attr("axis", 1)
    axis = axis + len(shape) if axis < 0 else axis
    return [_reshape(ctx, ins[0], (math.prod(shape[:axis]), math.prod(shape[axis:])))]


def _axes(ctx, ins):
    if "axes" in ctx.attrs:
        return list(ctx.attr("axes"))
    if len(ins) > 1 and ins[1] is not None:
        return ctx.ints(ins[1], "the axes input")
    return None


@handles("Unsqueeze")
def _unsqueeze(ctx, ins):
    shape = list(ctx.shape(ins[0]))
    axes = _axes(ctx, ins) or []
    rank = len(shape) + len(axes)
    for a in sorted(normalize_axis(a, rank) for a in axes):
        shape.insert(a, 1)
    return [_reshape(ctx, ins[0], shape)]


@handles("Squeeze")
def _squeeze(ctx, ins):
    shape = ctx.shape(ins[0])
    axes = _axes(ctx, ins)
    if axes is None:
        drop = {i for i, d in enumerate(shape) if d == 1}
    else:
        drop = {normalize_axis(a, len(shape)) for a in axes}
        if any(shape[a] != 1 for a in drop):
            raise ctx.unsupported(f"cannot squeeze axes {axes} of shape {list(shape)}: not all are 1")
    return [_reshape(ctx, ins[0], [d for i, d in enumerate(shape) if i not in drop])]


@handles("Transpose")
def _transpose(ctx, ins):
    rank = len(ctx.shape(ins[0]))
    perm = list(ctx.attr("perm", list(range(rank))[::-1]))
    if perm == list(range(rank)):
        return [ins[0]]
    return [ctx.emit(ops.TransposeOp, ins[:1], {"perm": perm})]


@handles("Concat")
def _concat(ctx, ins):
    parts = [t for t in ins if t is not None]
    return [ctx.emit(ops.ConcatOp, parts, {"axis": ctx.attr("axis")})]


def _slice_bounds(dim: int, start: int, end: int, step: int) -> tuple[int, int]:
    """ONNX Slice clamping of one axis into the IR's normalised bounds (see ops_shape.slice_length)."""
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        return min(max(start, 0), dim), min(max(end, 0), dim)
    return min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)


def _emit_slice(ctx, x, per_axis: dict[int, tuple[int, int, int]]):
    shape = ctx.shape(x)
    starts, ends, steps = [0] * len(shape), list(shape), [1] * len(shape)
    for axis, (s, e, st) in per_axis.items():
        starts[axis], ends[axis] = _slice_bounds(shape[axis], s, e, st)
        steps[axis] = st
    if starts == [0] * len(shape) and ends == list(shape) and steps == [1] * len(shape):
        return x
    return ctx.emit(ops.SliceOp, [x], {"starts": starts, "ends": ends, "steps": steps})


@handles("Slice")
def _slice(ctx, ins):
    x = ins[0]
    rank = len(ctx.shape(x))
    starts, ends = ctx.ints(ins[1], "starts"), ctx.ints(ins[2], "ends")
    axes = ctx.ints(ins[3], "axes") if len(ins) > 3 and ins[3] is not None else list(range(len(starts)))
    steps = ctx.ints(ins[4], "steps") if len(ins) > 4 and ins[4] is not None else [1] * len(starts)
    if 0 in steps:
        raise ctx.unsupported("a slice step of 0 is invalid")
    per_axis = {}
    for s, e, a, st in zip(starts, ends, axes, steps, strict=True):
        per_axis[normalize_axis(a, rank)] = (s, e, st)
    return [_emit_slice(ctx, x, per_axis)]


@handles("Split")
def _split(ctx, ins):
    x = ins[0]
    shape = ctx.shape(x)
    axis = normalize_axis(ctx.attr("axis", 0), len(shape))
    dim, n_out = shape[axis], len(ctx.node.output)
    if len(ins) > 1 and ins[1] is not None:
        sizes = ctx.ints(ins[1], "the split input")
    elif "split" in ctx.attrs:
        sizes = list(ctx.attr("split"))
    else:
        n = ctx.attr("num_outputs", n_out)
        chunk = -(-dim // n)  # opset 18: equal chunks, the last one smaller when uneven
        sizes = [min(chunk, max(dim - i * chunk, 0)) for i in range(n)]
    if sum(sizes) != dim:
        raise ctx.unsupported(f"split sizes {sizes} do not add up to dim {axis} of size {dim}")
    outs, start = [], 0
    for size in sizes:
        outs.append(_emit_slice(ctx, x, {axis: (start, start + size, 1)}))
        start += size
    return outs


@handles("Gather")
def _gather(ctx, ins):
    data, idx = ins
    return [ctx.emit(ops.GatherOp, [data, idx], {"axis": ctx.attr("axis", 0)})]


@handles("Expand")
def _expand(ctx, ins):
    x, target = ins[0], ctx.ints(ins[1], "the shape input")
    out = list(broadcast_shapes(ctx.shape(x), tuple(target)))
    if out == list(ctx.shape(x)):
        return [x]
    return [ctx.emit(ops.BroadcastOp, [x], {"shape": out})]


@handles("Trilu")
def _trilu(ctx, ins):
    x = ins[0]
    k = int(ctx.const(ins[1], "k").reshape(-1)[0]) if len(ins) > 1 and ins[1] is not None else 0
    rows, cols = ctx.shape(x)[-2:]
    diff = np.arange(cols)[None, :] - np.arange(rows)[:, None]  # j - i: a constant built from shapes
    keep = diff >= k if ctx.attr("upper", 1) else diff <= k
    return [ctx.emit(ops.SelectOp, [keep, x, np.zeros((), dtype=ctx.dtype(x).np_dtype)])]
