"""The ONNX handlers for constants, shape subgraphs and data movement (Constant, Shape, Size,
ConstantOfShape, Range, Reshape, Flatten, (Un)Squeeze, Transpose, Concat, Slice, Split, Gather,
GatherND, Expand, Trilu).

Same contract as ``mcpc.ir.onnx_handlers``, whose tables these register into: that module imports
this one, so ``HANDLERS`` is complete once either is imported.  Ops with no IR counterpart whose
inputs must be constant (Shape, Size, Range, ConstantOfShape) compute with numpy.
"""

from __future__ import annotations

import math

import numpy as np

from mcpc.errors import InputError
from mcpc.ir import ops
from mcpc.ir.onnx_handlers import _reshape, check, handles
from mcpc.ir.ops_core import broadcast_shapes, normalize_axis

# A Transpose of a float constant larger than this stays an op for fold-constants (see _transpose).
TRANSPOSE_FOLD_MAX_ELEMENTS = 1 << 12


# -- constants and shape subgraphs ---------------------------------------------------------------
@check("Constant")
def _constant_check(node, attrs, opset, used):
    """Only value, value_float(s) and value_int(s) attributes (no sparse or string constants)."""
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


# -- shape ---------------------------------------------------------------------------------------
@handles("Reshape")
def _reshape_node(ctx, ins):
    x, target = ins[0], ctx.ints(ins[1], "the shape input")
    shape = ctx.shape(x)
    allowzero = ctx.attr("allowzero", 0)
    if not allowzero and any(d == 0 and i >= len(shape) for i, d in enumerate(target)):
        # ONNX reads a 0 as "copy the input's dim": a shape computed from a dim bound to 0 lands here
        raise InputError(
            f"{ctx.where()}: shape {target} has a 0 at a position the input of rank {len(shape)} lacks "
            f"(Reshape copies the input's dim for a 0); a dim bound to 0 reaches this Reshape (inputs "
            f"bound as {ctx.bindings()})"
        )
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
    x = ins[0]
    if isinstance(x, np.ndarray) and x.dtype.kind == "f" and x.size > TRANSPOSE_FOLD_MAX_ELEMENTS:
        # a weight, not a shape tensor: fold-constants, which sees all its uses, lets a matmul
        # read it transposed and copies it only when nothing else reads it (a tied embedding)
        x = ctx.value(x)
    return [ctx.emit(ops.TransposeOp, [x], {"perm": perm})]


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


@handles("GatherND")
def _gather_nd(ctx, ins):
    """ONNX GatherND (any ``batch_dims``, opset 12 on) as Reshape → Gather → Reshape.

    data [B..., D_0 .. D_{K-1}, R...] with ``b = batch_dims`` leading batch axes, indices
    [B..., I..., K]: each index row picks ``data[b..., i_0, .., i_{K-1}]`` (negative i_j counts from
    the end of D_j), giving [B..., I..., R...].  The indices must be known at import (computed from
    shapes and constants, as the causal-mask construction of torch's dynamo exporter computes them);
    they are checked against the dims here and flattened into one row index of data reshaped to
    [prod(B) · prod(D), R...].  Indices computed from the model's inputs are refused naming the node.
    """
    data, idx_term = ins
    dshape, ishape = list(ctx.shape(data)), list(ctx.shape(idx_term))
    b = int(ctx.attr("batch_dims", 0))
    if not ishape or b < 0 or b >= min(len(dshape), len(ishape)):
        raise ctx.unsupported(
            f"batch_dims {b} must be less than the ranks of data ({len(dshape)}) and indices ({len(ishape)})"
        )
    if dshape[:b] != ishape[:b]:
        raise InputError(
            f"{ctx.where()}: the batch dims of data {dshape[:b]} and indices {ishape[:b]} differ"
        )
    k = ishape[-1]
    if not 1 <= k <= len(dshape) - b:
        raise InputError(
            f"{ctx.where()}: an index row has {k} entries but data {dshape} has {len(dshape) - b} "
            f"axes after batch_dims {b}"
        )
    if not isinstance(idx_term, np.ndarray):
        raise ctx.unsupported(
            "its indices are computed at run time (from the model's inputs); GatherND is supported when "
            "its indices are known at compile time (computed from shapes and constants, with every dim bound)"
        )
    idx = idx_term.astype(np.int64)
    dims = np.array(dshape[b : b + k], np.int64)
    bad = (idx < -dims) | (idx >= dims)
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        raise InputError(
            f"{ctx.where()}: index {int(idx[at])} at indices{list(at)} is out of range for a dim of "
            f"size {int(dims[at[-1]])} (data {dshape}, batch_dims {b})"
        )
    idx = np.where(idx < 0, idx + dims, idx)
    batch, inner = math.prod(dshape[:b]), int(np.prod(dims))
    strides = np.array([math.prod(dshape[b + j + 1 : b + k]) for j in range(k)], np.int64)
    rows = (idx * strides).sum(axis=-1)  # [B..., I...]
    rows = (
        rows.reshape(batch, rows.size // batch if batch else 0)
        + (np.arange(batch, dtype=np.int64) * inner)[:, None]
    )
    rest = dshape[b + k :]
    flat = _reshape(ctx, data, [batch * inner, *rest])
    picked = ctx.emit(ops.GatherOp, [flat, rows.reshape(-1)], {"axis": 0})
    return [_reshape(ctx, picked, [*ishape[:-1], *rest])]


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
