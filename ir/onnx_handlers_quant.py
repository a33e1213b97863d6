"""ONNX QuantizeLinear / DequantizeLinear onto ``mcp.quantize`` / ``mcp.dequantize``, for every
opset the importer reads (13 to 28): per-tensor, per-axis and (opset 21+) blocked.

A missing zero point becomes an explicit zero constant of the quantized type (``output_dtype``,
else ONNX's default ``uint8`` for QuantizeLinear; x's type for DequantizeLinear), so both ops
always carry three operands; a per-tensor zero point takes the scale's shape (ONNX allows () and
(1,) to mix).  Refused, naming the node: quantized types the IR lacks (int16,
float8 e5m2 …), ``precision`` other than float32 (mcp.quantize divides in f32), a non-float
QuantizeLinear input.

A DequantizeLinear of constant codes whose result takes more bytes than the codes (an int4 or
int8 weight) is kept as ``mcp.dequantize`` rather than evaluated at import, as ``fold-constants``
keeps it: the compressed codes are what the model stores.
"""

from __future__ import annotations

import math

import numpy as np

from mcpc.errors import UnsupportedError
from mcpc.ir import ops
from mcpc.ir.dtypes import F32, QUANTIZED_DTYPES, U8, DType
from mcpc.ir.onnx_handlers import _reshape, check, handles, onnx_dtype
from mcpc.ir.ops_quant import DEQUANTIZABLE_DTYPES


@check("QuantizeLinear", "DequantizeLinear")
def _qdq_check(node, attrs, opset, used):
    """Attribute problems found before conversion, so that every unsupported node is listed."""
    for key in ("output_dtype", "precision"):
        if attrs.get(key):
            try:
                dtype = onnx_dtype(attrs[key])
            except UnsupportedError as e:
                return f"{key}: {e}"
            if key == "precision" and dtype != F32:
                return f"precision={dtype} is not supported (mcp.quantize divides in f32)"
    return None


def _type_attr(ctx, key: str) -> DType | None:
    code = ctx.attr(key, 0)
    if not code:
        return None
    try:
        return onnx_dtype(code)
    except UnsupportedError as e:
        raise ctx.unsupported(f"{key}: {e}") from None


def _zero_point(ctx, ins, dtype: DType):
    """The node's zero point, or a zero constant of ``dtype`` shaped like the scale."""
    if len(ins) > 2 and ins[2] is not None:
        zp, sshape = ins[2], ctx.shape(ins[1])
        if ctx.shape(zp) != sshape and math.prod(ctx.shape(zp)) == 1 == math.prod(sshape):
            zp = _reshape(ctx, zp, sshape)  # ONNX lets per-tensor qparams be shape () or (1,)
        return zp
    return np.zeros(ctx.shape(ins[1]), dtype=dtype.np_dtype)


def _qattrs(ctx) -> dict:
    return {"axis": int(ctx.attr("axis", 1)), "block_size": int(ctx.attr("block_size", 0))}


@handles("QuantizeLinear")
def _quantize(ctx, ins):
    x, scale = ins[0], ins[1]
    if not ctx.dtype(x).is_float:
        raise ctx.unsupported(f"x is {ctx.dtype(x)}; only float inputs are quantized")
    # ``precision`` other than float32 is refused by _qdq_check before conversion
    out = _type_attr(ctx, "output_dtype")
    zp = _zero_point(ctx, ins, out or U8)
    qtype = ctx.dtype(zp)
    if out is not None and out != qtype:
        raise ctx.unsupported(f"output_dtype {out} differs from the zero point's type {qtype}")
    if qtype.name not in QUANTIZED_DTYPES:
        raise ctx.unsupported(
            f"quantized type {qtype} is not supported (one of {', '.join(sorted(QUANTIZED_DTYPES))})"
        )
    attrs = {**_qattrs(ctx), "saturate": bool(ctx.attr("saturate", 1))}
    return [ctx.emit(ops.QuantizeOp, [x, scale, zp], attrs)]


@handles("DequantizeLinear")
def _dequantize(ctx, ins):
    x, scale = ins[0], ins[1]
    xtype = ctx.dtype(x)
    if xtype.name not in DEQUANTIZABLE_DTYPES:
        raise ctx.unsupported(
            f"x is {xtype}; dequantized types are {', '.join(sorted(DEQUANTIZABLE_DTYPES))}"
        )
    attrs = _qattrs(ctx)
    out = _type_attr(ctx, "output_dtype")
    if out is not None:
        attrs["out"] = out
    out_bits = (out or ctx.dtype(scale)).bits
    widens = isinstance(x, np.ndarray) and out_bits > xtype.bits
    return [ctx.emit(ops.DequantizeOp, [x, scale, _zero_point(ctx, ins, xtype)], attrs, fold=not widens)]
