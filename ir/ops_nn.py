"""Neural-network ops: matmul, softmax, layer norm and reductions.

Every op here computes in f32 and rounds once to its result dtype; the exact sequence of
``mcpc.arch.numerics`` calls that defines each op lives in ``mcpc.ir.interpreter`` (the simulator
runs the same sequence on the same tiles).  Axes may be given negative; they are interpreted
against the operand's rank.
"""

from __future__ import annotations

import math

from mcpc.ir.core import Attr, Operation
from mcpc.ir.dtypes import I64
from mcpc.ir.ops_core import broadcast_shapes, normalize_axis
from mcpc.ir.types import TensorType


def _require_float(what: str, t: TensorType) -> None:
    if not t.dtype.is_float:
        raise ValueError(f"{what} must be a float tensor, got {t}")


def normalize_axes(axes, rank: int) -> list[int]:
    """Axes mapped into [0, rank), in the given order; ValueError on out-of-range or repeats."""
    out = [normalize_axis(int(a), rank) for a in axes]
    if len(set(out)) != len(out):
        raise ValueError(f"repeated axis in {list(axes)}")
    return out


class OutDtypeOfA(Operation):
    """An op whose ``out`` attribute (the result dtype) defaults to its first operand's dtype: the
    matmuls, float and quantized."""

    def __init__(self, operands, attrs=None, result_types=None, loc=None):
        attrs = dict(attrs or {})
        if "out" not in attrs and operands:
            attrs["out"] = operands[0].type.dtype
        super().__init__(operands, attrs, result_types, loc)


class MatMulOp(OutDtypeOfA):
    """``mcp.matmul a, b {out, trans_b, tile}``: batched matrix product with numpy broadcasting.

    Operands: ``a`` of shape ``[..., M, K]`` and ``b`` of shape ``[..., K, N]`` (``[..., N, K]``
    when ``trans_b``), both rank >= 2 and of the same float dtype (rank-1 operands are not
    allowed; the importer reshapes them).  Batch dims broadcast like numpy.  The result is
    ``[batch..., M, N]`` of dtype ``out`` (default: the operand dtype): every product is
    accumulated in f32 in the order of ``numerics.matmul_2d`` with ``tile`` (``[]`` or
    ``[tm, tn, tk]``, 0 meaning the whole dim, set by the backend's tiling pass) and rounded once.
    When ``b`` holds one matrix (no batch dim above 1, ``folds_rows``) the rows of every batch of
    ``a`` form M, as for ``mcp.matmul_w4a16``: the tiles run over ``[prod(batch)·M, K]``, so a
    kernel streams the weight once for all batch rows.
    """

    name = "mcp.matmul"
    NUM_OPERANDS = 2
    ATTRS = {
        "out": Attr("dtype", doc="result dtype (filled from the operands when omitted)"),
        "trans_b": Attr("bool", False, doc="b's last two dims are swapped"),
        "tile": Attr("ints", [], doc="[] or [tm, tn, tk]: accumulation order"),
    }

    @classmethod
    def infer_types(cls, operand_types, attrs):
        a, b = operand_types
        _require_float("operand a", a)
        if a.dtype != b.dtype:
            hint = "mcp.dequantize" if not b.dtype.is_float else "mcp.cast"
            raise ValueError(
                f"operand dtypes differ: {a.dtype} vs {b.dtype}; mcp.matmul multiplies two tensors of "
                f"one float dtype (convert the other operand first, e.g. with {hint})"
            )
        if a.rank < 2 or b.rank < 2:
            raise ValueError(f"operands must have rank >= 2, got {a} and {b}")
        m, k = a.shape[-2:]
        kb, n = b.shape[-2:][::-1] if attrs["trans_b"] else b.shape[-2:]
        if k != kb:
            raise ValueError(f"contracted dims differ: {a} @ {b} (trans_b={attrs['trans_b']})")
        out = attrs["out"]
        if not out.is_float:
            raise ValueError(f"result dtype 'out' must be a float type, got {out}")
        batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
        return [TensorType((*batch, m, n), out)]

    def verify_extra(self):
        tile = list(self.attrs["tile"])
        if tile and (len(tile) != 3 or any(t < 0 for t in tile)):
            raise ValueError(f"tile must be [] or [tm, tn, tk] with non-negative ints, got {tile}")

    def folds_rows(self) -> bool:
        """Whether ``b`` is one matrix (every batch dim 1 or none), so the rows of all batches of
        ``a`` (never broadcast then: its batch has the result's size) form one [rows, K] matrix."""
        return math.prod(self.operands[1].type.shape[:-2]) == 1


class SoftmaxOp(Operation):
    """``mcp.softmax x {axis}``: ``exp(x - max) / sum(exp(x - max))`` along ``axis``.

    Float operand; result has the operand's type.  Steps (f32): row max, subtract, exp, row sum,
    divide (rounded once to the result dtype).
    """

    name = "mcp.softmax"
    NUM_OPERANDS = 1
    ATTRS = {"axis": Attr("int", -1)}

    @classmethod
    def infer_types(cls, operand_types, attrs):
        (x,) = operand_types
        _require_float("operand", x)
        normalize_axis(attrs["axis"], x.rank)
        return [x]


class LogSoftmaxOp(SoftmaxOp):
    """``mcp.log_softmax x {axis}``: ``(x - max) - log(sum(exp(x - max)))`` along ``axis``.

    Float operand; result has the operand's type.  Steps (f32): row max, subtract, exp, row sum,
    log, subtract (rounded once to the result dtype).
    """

    name = "mcp.log_softmax"


class LayerNormOp(Operation):
    """``mcp.layer_norm x, scale, bias {axis, epsilon}`` (ONNX LayerNormalization).

    Normalizes over all dims from ``axis`` to the end: ``(x - mean) * rsqrt(var + epsilon) * scale
    + bias`` with the biased variance.  ``scale`` and ``bias`` have shape ``x.shape[axis:]`` and
    x's float dtype; the result has x's type.  All steps in f32, one rounding at the end.
    """

    name = "mcp.layer_norm"
    NUM_OPERANDS = 3
    ATTRS = {"axis": Attr("int", -1), "epsilon": Attr("float", 1e-5)}

    @classmethod
    def infer_types(cls, operand_types, attrs):
        x, scale, bias = operand_types
        _require_float("operand x", x)
        if x.rank == 0:
            raise ValueError("operand x must have rank >= 1")
        axis = normalize_axis(attrs["axis"], x.rank)
        want = x.shape[axis:]
        for what, t in (("scale", scale), ("bias", bias)):
            if t.dtype != x.dtype or t.shape != want:
                raise ValueError(f"{what} must be {TensorType(want, x.dtype)}, got {t}")
        return [x]

    def verify_extra(self):
        if not self.attrs["epsilon"] >= 0:
            raise ValueError(f"epsilon must be >= 0, got {self.attrs['epsilon']}")


class ReduceOp(Operation):
    """Base of reductions ``{axes, keepdims}`` over the listed axes (non-empty, no repeats).

    The result keeps reduced dims as 1 when ``keepdims``, else drops them; dtype unchanged.
    ``func`` names the ``numerics.row_reduce`` kernel.
    """

    NUM_OPERANDS = 1
    ATTRS = {"axes": Attr("ints"), "keepdims": Attr("bool", True)}
    func = ""
    FLOAT_ONLY = False

    @classmethod
    def infer_types(cls, operand_types, attrs):
        (x,) = operand_types
        if cls.FLOAT_ONLY:
            _require_float("operand", x)
        elif x.dtype.name == "i1":
            raise ValueError(f"cannot reduce an i1 tensor ({x})")
        if not attrs["axes"]:
            raise ValueError("axes must not be empty")
        axes = set(normalize_axes(attrs["axes"], x.rank))
        if attrs["keepdims"]:
            shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
        else:
            shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
        return [TensorType(shape, x.dtype)]


class ReduceSumOp(ReduceOp):
    """``mcp.reduce_sum``: sum (f32 accumulation for floats, i64 for ints), rounded once."""

    name, func = "mcp.reduce_sum", "sum"


class ReduceMeanOp(ReduceOp):
    """``mcp.reduce_mean``: f32 sum divided by the number of reduced elements (floats only)."""

    name, func, FLOAT_ONLY = "mcp.reduce_mean", "sum", True


class ReduceMaxOp(ReduceOp):
    """``mcp.reduce_max``: maximum over the axes (exact)."""

    name, func = "mcp.reduce_max", "max"


class ArgMaxOp(ReduceOp):
    """``mcp.argmax {axes = [a], keepdims}``: index (i64) of the first maximum along one axis; a NaN
    counts as the maximum (ONNX ArgMax with select_last_index = 0)."""

    name, func = "mcp.argmax", "argmax"

    @classmethod
    def infer_types(cls, operand_types, attrs):
        if len(attrs["axes"]) != 1:
            raise ValueError(f"argmax takes exactly one axis, got {list(attrs['axes'])}")
        if operand_types[0].shape[normalize_axis(attrs["axes"][0], operand_types[0].rank)] == 0:
            raise ValueError("argmax over an axis of 0 elements")
        (result,) = super().infer_types(operand_types, attrs)
        return [result.with_dtype(I64)]


class TopKOp(Operation):
    """``mcp.topk x {axis, k, largest = true, sorted = true}``: the ``k`` largest (descending) or
    smallest (ascending) elements of ``x`` along ``axis`` and their indices (i64), as ONNX TopK:
    equal values keep ascending index order, a NaN counts as larger than +inf.  Two results:
    values (``x``'s dtype) and indices, both ``x``'s shape with ``k`` along ``axis``.  ``sorted =
    false`` leaves the order unspecified (ONNX); the op returns it sorted all the same."""

    name = "mcp.topk"
    NUM_OPERANDS = 1
    NUM_RESULTS = 2
    ATTRS = {
        "axis": Attr("int", -1),
        "k": Attr("int", doc="how many elements to keep (0 <= k <= the axis size)"),
        "largest": Attr("bool", True),
        "sorted": Attr("bool", True),
    }

    @classmethod
    def infer_types(cls, operand_types, attrs):
        (x,) = operand_types
        if x.dtype.name == "i1":
            raise ValueError(f"cannot take the top-k of an i1 tensor ({x})")
        if x.rank == 0:
            raise ValueError("topk needs an operand of rank >= 1")
        axis = normalize_axis(attrs["axis"], x.rank)
        k = attrs["k"]
        if not 0 <= k <= x.shape[axis]:
            raise ValueError(f"k = {k} is outside [0, {x.shape[axis]}] (the size of axis {axis} of {x})")
        shape = tuple(k if i == axis else d for i, d in enumerate(x.shape))
        return [TensorType(shape, x.dtype), TensorType(shape, I64)]
