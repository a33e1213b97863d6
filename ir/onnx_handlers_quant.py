"""ONNX QuantizeLinear / DequantizeLinear onto ``mcp.quantize`` / ``mcp.dequantize``, for every
opset the importer reads (13 to 28): per-tensor, per-axis and (opset 21+) blocked.

A missing zero point becomes an explicit zero constant of the quantized type (``output_dtype``,
else ONNX's default ``uint8`` for QuantizeLinear; x's type for DequantizeLinear), so both ops
always carry three operands; a per-tensor zero point takes the scale's shape (ONNX allows () and
(1,) to mix).  Refused, naming the node: quantized types the IR lacks (int16,
float8 e5m2 …), ``precision`` other than float32 (mcp.quantize divides in f32), a non-float
QuantizeLinear input.  ``com.microsoft`` MatMulNBits becomes the same dequantize + matmul pair.

A DequantizeLinear of constant codes whose result takes more bytes than the codes (an int4 or
int8 weight) is kept as ``mcp.dequantize`` rather than evaluated at import, as ``fold-constants``
keeps it: the compressed codes are what the model stores.
"""

from __future__ import annotations

import math

import numpy as np

from mcpc.errors import UnsupportedError
from mcpc.ir import ops
from mcpc.ir.dtypes import F32, QUANTIZED_DTYPES, U4, U8, DType
from mcpc.ir.onnx_handlers import DOMAIN_HANDLERS, _reshape, check, domain_check, handles, onnx_dtype
from mcpc.ir.ops_quant import DEQUANTIZABLE_DTYPES


@check("QuantizeLinear", "DequantizeLinear")
def _qdq_check(node, attrs, opset, used):
    """output_dtype must be a dtype mcpc has; precision, when given, must be f32 (mcp.quantize
    divides in f32)."""
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


# -- com.microsoft MatMulNBits (ONNX Runtime's 4-bit / 8-bit weight quantizer output) -------------
def _unpack_codes(raw: np.ndarray, bits: int, count: int, dtype) -> np.ndarray:
    """The first ``count`` codes of each row of ``raw`` (uint8 rows), low nibble first for 4 bits."""
    if bits == 8:
        return raw[:, :count].astype(dtype)
    lo, hi = raw & 0x0F, raw >> 4
    codes = np.stack([lo, hi], axis=-1).reshape(raw.shape[0], -1)[:, :count]
    return codes.astype(np.uint8).astype(dtype)


_ACCURACY_LEVEL_4 = (
    "MatMulNBits accuracy_level=4: ONNX Runtime's CPU kernel (MLAS CompInt8) quantizes A to int8 per "
    "row and per block of block_size along K (scale max|a|/127, rounded to nearest) and sums int8 x "
    "int4 products per block; mcpc does not model that: it multiplies A unquantized by the "
    "dequantized weight, as accuracy_level 0 does (expect ONNX Runtime to differ by that int8 "
    "rounding; rewrite accuracy_level to 0 to compare exactly)"
)


@domain_check("com.microsoft", "MatMulNBits")
def _matmul_nbits_check(node, attrs, opset, used):
    """bits 4 or 8; K, N > 0; block_size a power of two >= 16; accuracy_level 0 to 4. The packed
    weight, scales and zero points (uint8, constant) are checked at import."""
    k, n = int(attrs.get("K", 0)), int(attrs.get("N", 0))
    bits, block = int(attrs.get("bits", 4)), int(attrs.get("block_size", 0))
    if bits not in (4, 8):
        return f"bits={bits} is not supported (4 and 8 are)"
    if k <= 0 or n <= 0 or block < 16 or block & (block - 1):
        return f"attributes K={k}, N={n}, block_size={block} are not valid"
    level = int(attrs.get("accuracy_level", 0))
    if level not in range(5):
        return f"accuracy_level={level} is not defined (0 to 4)"
    return None


def _ms_matmul_nbits(ctx, ins):
    """``Y = A · dequantize(B)ᵀ (+ bias)``: B [N, blocks, blob] uint8 holds, per output column, the
    K codes of the weight's row (4-bit: two per byte, low nibble first), scales [N·blocks] one per
    block of ``block_size`` along K, zero points packed the same way (default 2^(bits−1)).  Imported
    as ``mcp.dequantize(codes [N, K], scale [N, blocks], zero_point) {axis 1, block_size}`` feeding
    ``mcp.matmul {trans_b}``: the IR contract of a quantized weight, which ``fuse-dequantize-matmul``
    turns into ``mcp.matmul_w4a16``.  ``accuracy_level`` (0–4) does not change the import: A is never
    quantized; level 4, where ONNX Runtime's CPU kernel quantizes A to int8, leaves an import note
    saying so (``_ACCURACY_LEVEL_4``).  Attribute refusals are ``_matmul_nbits_check``'s, before import."""
    k, n = int(ctx.attr("K", 0)), int(ctx.attr("N", 0))
    bits, block = int(ctx.attr("bits", 4)), int(ctx.attr("block_size", 0))
    if int(ctx.attr("accuracy_level", 0)) == 4:
        ctx.note(_ACCURACY_LEVEL_4)
    a = ins[0]
    raw = ctx.const(ins[1], "B (the quantized weight)")
    blocks = -(-k // block)
    if raw.dtype != np.uint8 or raw.size != n * blocks * block * bits // 8:
        want = f"uint8 [{n}, {blocks}, {block * bits // 8}]"
        raise ctx.unsupported(f"B is {raw.dtype}{list(raw.shape)}; expected {want}")
    scale = ctx.const(ins[2], "scales")
    if scale.size != n * blocks:
        raise ctx.unsupported(f"scales has {scale.size} elements; expected N·blocks = {n * blocks}")
    code_dtype = (U4 if bits == 4 else U8).np_dtype
    codes = _unpack_codes(raw.reshape(n, -1), bits, k, code_dtype)
    zp_in = ins[3] if len(ins) > 3 else None
    if zp_in is None:
        zp = np.full((n, blocks), 1 << (bits - 1), code_dtype)
    else:
        zraw = ctx.const(zp_in, "zero_points")
        if zraw.dtype != np.uint8:
            raise ctx.unsupported(f"zero_points of {zraw.dtype} (float zero points) are not supported")
        zp = _unpack_codes(zraw.reshape(n, -1), bits, blocks, code_dtype)
    g_idx = ins[4] if len(ins) > 4 else None
    if g_idx is not None:
        order = ctx.const(g_idx, "g_idx").reshape(-1)
        if not np.array_equal(order, np.arange(k) // block):
            raise ctx.unsupported("g_idx reorders the blocks (act-order); only a trivial g_idx is supported")
    w = ctx.emit(
        ops.DequantizeOp, [codes, scale.reshape(n, blocks), zp], {"axis": 1, "block_size": block}, fold=False
    )
    if ctx.dtype(w) != ctx.dtype(a):
        raise ctx.unsupported(f"scales are {ctx.dtype(w)} but A is {ctx.dtype(a)}")
    y = ctx.emit(ops.MatMulOp, [a, w], {"trans_b": True})
    bias = ins[5] if len(ins) > 5 else None
    if bias is not None:
        y = ctx.emit(ops.AddOp, [y, bias])
    return [y]


DOMAIN_HANDLERS["com.microsoft", "MatMulNBits"] = _ms_matmul_nbits
