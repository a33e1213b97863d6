"""Elementwise ops: binary arithmetic/comparison with broadcasting, unary math, select, cast.

Semantics (``mcpc.arch.numerics``): operands are widened to f32 (floats) or i64 (ints), computed,
and rounded once to the result dtype.  Binary ops broadcast like numpy/ONNX.
"""

from __future__ import annotations

from mcpc.ir.core import Attr, Operation
from mcpc.ir.dtypes import I1
from mcpc.ir.ops_core import broadcast_shapes
from mcpc.ir.types import TensorType


class BinaryOp(Operation):
    """Base of two-operand elementwise ops: equal dtypes, broadcast shapes, ``func`` names the
    numerics kernel (``add``, ``sub`` …)."""

    NUM_OPERANDS = 2
    func: str = ""
    IS_COMPARISON = False

    @classmethod
    def infer_types(cls, operand_types, attrs):
        a, b = operand_types
        if a.dtype != b.dtype:
            raise ValueError(f"operand dtypes differ: {a.dtype} vs {b.dtype}")
        if a.dtype.name == "i1" and not cls.IS_COMPARISON:
            raise ValueError("arithmetic on i1 is not defined")
        shape = broadcast_shapes(a.shape, b.shape)
        return [TensorType(shape, I1 if cls.IS_COMPARISON else a.dtype)]


class AddOp(BinaryOp):
    name, func = "mcp.add", "add"


class SubOp(BinaryOp):
    name, func = "mcp.sub", "sub"


class MulOp(BinaryOp):
    name, func = "mcp.mul", "mul"


class DivOp(BinaryOp):
    """Division; integer division truncates toward zero (ONNX Div)."""

    name, func = "mcp.div", "div"


class PowOp(BinaryOp):
    name, func = "mcp.pow", "pow"


class MaxOp(BinaryOp):
    name, func = "mcp.max", "max"


class MinOp(BinaryOp):
    name, func = "mcp.min", "min"


class ModOp(BinaryOp):
    """Remainder with the sign of the divisor, ``a - floor(a / b)·b`` (Python ``%``; ONNX Mod
    fmod=0).  Exact for ints (a zero divisor gives 0); floats: ``numerics.binary("mod")``."""

    name, func = "mcp.mod", "mod"


class FmodOp(BinaryOp):
    """Remainder with the sign of the dividend, ``a - trunc(a / b)·b`` (C ``fmod``; ONNX Mod
    fmod=1).  Exact for ints (a zero divisor gives 0) and floats."""

    name, func = "mcp.fmod", "fmod"


class EqualOp(BinaryOp):
    name, func, IS_COMPARISON = "mcp.equal", "eq", True


class LessOp(BinaryOp):
    name, func, IS_COMPARISON = "mcp.less", "lt", True


class GreaterOp(BinaryOp):
    name, func, IS_COMPARISON = "mcp.greater", "gt", True


class UnaryOp(Operation):
    """Base of one-operand elementwise math on floats (``func`` names the numerics kernel)."""

    NUM_OPERANDS = 1
    func: str = ""
    FLOAT_ONLY = True

    @classmethod
    def infer_types(cls, operand_types, attrs):
        (x,) = operand_types
        if cls.FLOAT_ONLY and not x.dtype.is_float:
            raise ValueError(f"operand must be a float tensor, got {x}")
        return [x]


class NegOp(UnaryOp):
    name, func, FLOAT_ONLY = "mcp.neg", "neg", False


class AbsOp(UnaryOp):
    name, func, FLOAT_ONLY = "mcp.abs", "abs", False


class ExpOp(UnaryOp):
    name, func = "mcp.exp", "exp"


class TanhOp(UnaryOp):
    name, func = "mcp.tanh", "tanh"


class ErfOp(UnaryOp):
    name, func = "mcp.erf", "erf"


class SqrtOp(UnaryOp):
    name, func = "mcp.sqrt", "sqrt"


class RsqrtOp(UnaryOp):
    name, func = "mcp.rsqrt", "rsqrt"


class ReciprocalOp(UnaryOp):
    name, func = "mcp.reciprocal", "recip"


class ReluOp(UnaryOp):
    name, func, FLOAT_ONLY = "mcp.relu", "relu", False


class SigmoidOp(UnaryOp):
    name, func = "mcp.sigmoid", "sigmoid"


class GeluOp(UnaryOp):
    """Exact GELU, 0.5·x·(1 + erf(x/√2)) (ONNX Gelu approximate="none")."""

    name, func = "mcp.gelu", "gelu"


class SinOp(UnaryOp):
    name, func = "mcp.sin", "sin"


class CosOp(UnaryOp):
    name, func = "mcp.cos", "cos"


class LogOp(UnaryOp):
    """Natural logarithm: log(0) = -inf, log(x < 0) = NaN."""

    name, func = "mcp.log", "log"


class FloorOp(UnaryOp):
    """Largest integer not above x, exact (keeps -0.0, inf and NaN).  Ceil is ``-floor(-x)``."""

    name, func = "mcp.floor", "floor"


class RoundOp(UnaryOp):
    """Nearest integer, ties to even (ONNX Round), exact (keeps -0.0, inf and NaN)."""

    name, func = "mcp.round", "round"


class SiluOp(UnaryOp):
    """SiLU (swish), x·sigmoid(x), evaluated in f64 and rounded once."""

    name, func = "mcp.silu", "silu"


class CastOp(Operation):
    """``mcp.cast {to = f16}``: convert element type (rounding rules in numerics.cast)."""

    name = "mcp.cast"
    NUM_OPERANDS = 1
    ATTRS = {"to": Attr("dtype")}

    @classmethod
    def infer_types(cls, operand_types, attrs):
        return [operand_types[0].with_dtype(attrs["to"])]


class SelectOp(Operation):
    """``mcp.select cond, a, b``: ``cond ? a : b`` with broadcasting (ONNX Where)."""

    name = "mcp.select"
    NUM_OPERANDS = 3

    @classmethod
    def infer_types(cls, operand_types, attrs):
        cond, a, b = operand_types
        if cond.dtype != I1:
            raise ValueError(f"condition must be i1, got {cond.dtype}")
        if a.dtype != b.dtype:
            raise ValueError(f"branch dtypes differ: {a.dtype} vs {b.dtype}")
        return [TensorType(broadcast_shapes(cond.shape, a.shape, b.shape), a.dtype)]
