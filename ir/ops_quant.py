"""Quantization ops: ``mcp.quantize`` and ``mcp.dequantize`` (ONNX QuantizeLinear /
DequantizeLinear since opset 21: per-tensor, per-axis and blocked).

Scales and zero points are operands, typed by the verifier, so passes see them and fold them like
any other value.  Both ops take exactly three operands ``x, scale, zero_point`` (the importer
supplies a zero constant when the ONNX node has no zero point).  The quantization *granularity*
follows from the scale's shape and ``block_size``, exactly as ONNX defines it:

* per-tensor: ``scale`` has one element (rank 0, or rank 1 of size 1); ``axis`` is ignored;
* per-axis (``block_size = 0``): ``scale`` is rank 1 of size ``x.shape[axis]``;
* blocked (``block_size = B > 0``): ``scale`` has x's rank and shape except on ``axis``, where it has
  ``ceil(x.shape[axis] / B)`` entries — element ``i`` along ``axis`` uses entry ``i // B`` (the last
  block may be shorter, as ONNX allows).

``zero_point`` always has the scale's shape.  The arithmetic (``numerics.quantize`` /
``numerics.dequantize``) is f32 with one rounding; see ``mcpc.ir.interpreter``.
"""

from __future__ import annotations

from math import ceil

from mcpc.ir.core import Attr, Operation
from mcpc.ir.dtypes import QUANTIZED_DTYPES
from mcpc.ir.ops_core import normalize_axis
from mcpc.ir.types import TensorType

# dequantize also takes i32 inputs (ONNX DequantizeLinear's int32, e.g. a bias quantized to i32)
DEQUANTIZABLE_DTYPES = QUANTIZED_DTYPES | {"i32"}


def qparam_granularity(x: TensorType, scale: TensorType, axis: int, block_size: int) -> str:
    """``"tensor"``, ``"axis"`` or ``"block"``; ValueError when ``scale``'s shape does not fit ``x``,
    ``axis`` and ``block_size`` (the ONNX rules in the module docstring)."""
    if block_size < 0:
        raise ValueError(f"block_size must be >= 0, got {block_size}")
    if block_size == 0:
        if scale.rank == 0 or (scale.rank == 1 and scale.shape[0] == 1):
            return "tensor"
        if scale.rank != 1:
            raise ValueError(
                f"scale {scale} must have one element (per-tensor) or be rank 1 (per-axis) when "
                "block_size = 0; blocked quantization needs block_size > 0"
            )
        ax = normalize_axis(axis, x.rank)
        if scale.shape[0] != x.shape[ax]:
            raise ValueError(
                f"per-axis scale {scale} must have x.shape[{ax}] = {x.shape[ax]} elements (x is {x})"
            )
        return "axis"
    ax = normalize_axis(axis, x.rank)
    if scale.rank != x.rank:
        raise ValueError(f"blocked scale {scale} must have the rank of x ({x}), block_size={block_size}")
    want = tuple(ceil(d / block_size) if i == ax else d for i, d in enumerate(x.shape))
    if scale.shape != want:
        raise ValueError(
            f"blocked scale {scale} must have shape {list(want)} for x {x} with axis={ax} and "
            f"block_size={block_size} (ceil({x.shape[ax]} / {block_size}) blocks along axis {ax})"
        )
    return "block"


def _check_qparams(x: TensorType, scale: TensorType, zp: TensorType, attrs) -> None:
    if not scale.dtype.is_float:
        raise ValueError(f"scale must be a float tensor, got {scale}")
    if zp.shape != scale.shape:
        raise ValueError(f"zero_point {zp} must have the scale's shape ({scale})")
    qparam_granularity(x, scale, int(attrs["axis"]), int(attrs["block_size"]))


_QATTRS = {
    "axis": Attr("int", 1, doc="quantization axis (per-axis and blocked); ONNX default 1"),
    "block_size": Attr("int", 0, doc="elements per block along axis; 0: per-tensor or per-axis"),
}


class QuantizeOp(Operation):
    """``mcp.quantize x, scale, zero_point {axis, block_size, saturate}`` (ONNX QuantizeLinear).

    ``x`` is a float tensor; the result has x's shape and the zero point's dtype (``i8``, ``u8``,
    ``i4``, ``u4`` or ``f8e4m3fn``).  Per element, with ``s``/``z`` the scale and zero point entry of
    its group: integers ``clip(round_half_even(x / s) + z, lo, hi)``; f8e4m3fn ``x / s + z`` rounded
    half to even, saturated to ±448 (``saturate = false``: overflow gives NaN, as ONNX).  The
    division is f32.
    """

    name = "mcp.quantize"
    NUM_OPERANDS = 3
    ATTRS = {
        **_QATTRS,
        "saturate": Attr("bool", True, doc="f8 only: clamp overflow to ±448 (false: NaN)"),
    }

    @classmethod
    def infer_types(cls, operand_types, attrs):
        x, scale, zp = operand_types
        if not x.dtype.is_float:
            raise ValueError(f"x must be a float tensor, got {x}")
        if zp.dtype.name not in QUANTIZED_DTYPES:
            raise ValueError(
                f"zero_point dtype {zp.dtype} (the quantized type) must be one of "
                f"{', '.join(sorted(QUANTIZED_DTYPES))}"
            )
        _check_qparams(x, scale, zp, attrs)
        return [TensorType(x.shape, zp.dtype)]


class DequantizeOp(Operation):
    """``mcp.dequantize x, scale, zero_point {axis, block_size, out}`` (ONNX DequantizeLinear).

    ``x`` is ``i8``, ``u8``, ``i4``, ``u4``, ``f8e4m3fn`` or ``i32``; ``zero_point`` has x's dtype.
    Per element ``(x - z) · s``: the difference exact (integers) or in f32, the product in f32,
    rounded once to ``out`` (default: the scale's dtype, as ONNX; ONNX's ``output_dtype``).
    """

    name = "mcp.dequantize"
    NUM_OPERANDS = 3
    ATTRS = {**_QATTRS, "out": Attr("dtype", doc="result float dtype (the scale's when omitted)")}

    def __init__(self, operands, attrs=None, result_types=None, loc=None):
        attrs = dict(attrs or {})
        if "out" not in attrs and len(operands) > 1:
            attrs["out"] = operands[1].type.dtype
        super().__init__(operands, attrs, result_types, loc)

    @classmethod
    def infer_types(cls, operand_types, attrs):
        x, scale, zp = operand_types
        if x.dtype.name not in DEQUANTIZABLE_DTYPES:
            raise ValueError(
                f"x must be one of {', '.join(sorted(DEQUANTIZABLE_DTYPES))}, got {x} "
                "(dequantize reads quantized data)"
            )
        if zp.dtype != x.dtype:
            raise ValueError(f"zero_point dtype {zp.dtype} must equal x's dtype {x.dtype}")
        _check_qparams(x, scale, zp, attrs)
        out = attrs["out"]
        if not out.is_float:
            raise ValueError(f"result dtype 'out' must be a float type, got {out}")
        return [TensorType(x.shape, out)]
