"""Structural ops: constants, function return, and shared type-inference helpers."""

from __future__ import annotations

import numpy as np

from mcpc.ir.core import Attr, Operation
from mcpc.ir.dtypes import dtype_from_numpy
from mcpc.ir.types import TensorType


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """Numpy/ONNX multidirectional broadcasting of static shapes; ValueError when incompatible."""
    rank = max(len(s) for s in shapes)
    out = []
    for i in range(rank):
        dims = {s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise ValueError(f"shapes {' and '.join(map(str, shapes))} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def normalize_axis(axis: int, rank: int) -> int:
    """Map a possibly negative axis into [0, rank); ValueError when out of range."""
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"axis {axis} out of range for rank {rank}")
    return axis % rank if rank else 0


class ConstantOp(Operation):
    """``mcp.constant``: a tensor literal.  Its result type is the literal's shape and dtype."""

    name = "mcp.constant"
    NUM_OPERANDS = 0
    ATTRS = {"value": Attr("tensor", doc="the literal (numpy array of an IR dtype)")}

    @classmethod
    def infer_types(cls, operand_types, attrs):
        value = attrs["value"]
        if not isinstance(value, np.ndarray):
            raise ValueError("attribute 'value' must be a tensor")
        return [TensorType(value.shape, dtype_from_numpy(value.dtype))]

    @property
    def value(self) -> np.ndarray:
        return self.attrs["value"]


class ReturnOp(Operation):
    """``mcp.return``: ends a function, its operands are the function's results."""

    name = "mcp.return"
    NUM_RESULTS = 0
    IS_TERMINATOR = True

    @classmethod
    def infer_types(cls, operand_types, attrs):
        return []
