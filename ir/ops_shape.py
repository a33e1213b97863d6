"""Shape ops: pure data movement, exact for every dtype (no arithmetic, no rounding).

Attributes are fully static and already normalised by the importer (no ONNX ``-1``/``0`` reshape
magic, no unclamped slice bounds), so each op's result type follows from its attributes alone.
"""

from __future__ import annotations

from math import prod

from mcpc.ir.core import Attr, Operation
from mcpc.ir.ops_core import broadcast_shapes, normalize_axis


def static_shape(dims) -> tuple[int, ...]:
    """A ``shape`` attribute as a tuple; ValueError when a dim is negative (must be fully static)."""
    shape = tuple(int(d) for d in dims)
    if any(d < 0 for d in shape):
        raise ValueError(f"shape {list(shape)} has a negative dim (must be fully static)")
    return shape


class ReshapeOp(Operation):
    """``mcp.reshape x {shape}``: same elements in row-major order, new static shape.

    Every entry of ``shape`` is a literal dim (>= 0; no -1 or copy-0); the element counts match.
    """

    name = "mcp.reshape"
    NUM_OPERANDS = 1
    ATTRS = {"shape": Attr("ints")}

    @classmethod
    def infer_types(cls, operand_types, attrs):
        (x,) = operand_types
        shape = static_shape(attrs["shape"])
        if prod(shape) != x.numel:
            raise ValueError(f"cannot reshape {x} ({x.numel} elements) to {list(shape)}")
        return [x.with_shape(shape)]


class TransposeOp(Operation):
    """``mcp.transpose x {perm}``: result dim ``i`` is operand dim ``perm[i]`` (numpy transpose)."""

    name = "mcp.transpose"
    NUM_OPERANDS = 1
    ATTRS = {"perm": Attr("ints")}

    @classmethod
    def infer_types(cls, operand_types, attrs):
        (x,) = operand_types
        perm = [int(p) for p in attrs["perm"]]
        if sorted(perm) != list(range(x.rank)):
            raise ValueError(f"perm {perm} is not a permutation of the {x.rank} dims of {x}")
        return [x.with_shape(tuple(x.shape[p] for p in perm))]


class ConcatOp(Operation):
    """``mcp.concat x0, x1, ... {axis}``: join >= 1 tensors of one dtype and rank along ``axis``;
    all other dims must be equal."""

    name = "mcp.concat"
    NUM_OPERANDS = None
    ATTRS = {"axis": Attr("int")}

    @classmethod
    def infer_types(cls, operand_types, attrs):
        if not operand_types:
            raise ValueError("needs at least one operand")
        first = operand_types[0]
        axis = normalize_axis(attrs["axis"], first.rank)
        if first.rank == 0:
            raise ValueError("cannot concatenate scalars")
        total = 0
        for i, t in enumerate(operand_types):
            if t.dtype != first.dtype or t.rank != first.rank:
                raise ValueError(f"operand #{i} is {t}, expected rank {first.rank} and {first.dtype}")
            for d in range(first.rank):
                if d != axis and t.shape[d] != first.shape[d]:
                    raise ValueError(f"operand #{i} {t} differs from {first} outside axis {axis}")
            total += t.shape[axis]
        shape = list(first.shape)
        shape[axis] = total
        return [first.with_shape(shape)]


def slice_length(dim: int, start: int, end: int, step: int) -> int:
    """Length of ``range(start, end, step)`` after checking the bounds are normalised for ``dim``:
    step > 0: 0 <= start, end <= dim; step < 0: -1 <= start, end <= dim - 1 (end -1 means
    "through index 0"); step != 0.  Raise ValueError otherwise."""
    if step == 0:
        raise ValueError("slice step must not be 0")
    lo, hi = (0, dim) if step > 0 else (-1, dim - 1)
    if not (lo <= start <= hi and lo <= end <= hi):
        raise ValueError(
            f"slice bounds start={start}, end={end}, step={step} not normalised for a dim of {dim} "
            f"(must lie in [{lo}, {hi}])"
        )
    return len(range(start, end, step))


class SliceOp(Operation):
    """``mcp.slice x {starts, ends, steps}``: one entry per dim; result dim ``i`` holds the elements
    ``range(starts[i], ends[i], steps[i])`` of operand dim ``i`` (bounds already clamped, see
    ``slice_length``; negative steps walk backwards and ``end = -1`` stops after index 0)."""

    name = "mcp.slice"
    NUM_OPERANDS = 1
    ATTRS = {"starts": Attr("ints"), "ends": Attr("ints"), "steps": Attr("ints")}

    @classmethod
    def infer_types(cls, operand_types, attrs):
        (x,) = operand_types
        starts, ends, steps = attrs["starts"], attrs["ends"], attrs["steps"]
        if not len(starts) == len(ends) == len(steps) == x.rank:
            raise ValueError(
                f"starts/ends/steps need one entry per dim of {x}, got {len(starts)}/{len(ends)}/{len(steps)}"
            )
        shape = [
            slice_length(d, int(s), int(e), int(st))
            for d, s, e, st in zip(x.shape, starts, ends, steps, strict=True)
        ]
        return [x.with_shape(shape)]


class GatherOp(Operation):
    """``mcp.gather data, indices {axis}`` (ONNX Gather): result shape is
    ``data.shape[:axis] + indices.shape + data.shape[axis+1:]``.  Indices are i32 or i64; a
    negative index ``i`` means ``i + data.shape[axis]``; an index outside ``[-n, n)`` is an error
    at evaluation time."""

    name = "mcp.gather"
    NUM_OPERANDS = 2
    ATTRS = {"axis": Attr("int", 0)}

    @classmethod
    def infer_types(cls, operand_types, attrs):
        data, idx = operand_types
        if idx.dtype.name not in ("i32", "i64"):
            raise ValueError(f"indices must be i32 or i64, got {idx}")
        if data.rank == 0:
            raise ValueError("data must have rank >= 1")
        axis = normalize_axis(attrs["axis"], data.rank)
        return [data.with_shape(data.shape[:axis] + idx.shape + data.shape[axis + 1 :])]


class BroadcastOp(Operation):
    """``mcp.broadcast x {shape}`` (ONNX Expand): result shape ``broadcast_shapes(x.shape, shape)``,
    each element copied from the broadcast operand."""

    name = "mcp.broadcast"
    NUM_OPERANDS = 1
    ATTRS = {"shape": Attr("ints")}

    @classmethod
    def infer_types(cls, operand_types, attrs):
        (x,) = operand_types
        return [x.with_shape(broadcast_shapes(x.shape, static_shape(attrs["shape"])))]
