"""``mcp.matmul_w4a16``: a matmul whose weight is stored quantized (the ``matmul_w4a16`` instruction).

The fused form of ``mcp.matmul(a, mcp.dequantize(codes, scale, zero_point))`` for a constant 2-D
weight quantized along its contraction dim (``fuse-dequantize-matmul`` builds it): the codes —
int4 packed two per byte, or int8 — are what is stored and streamed, the weights are dequantized
tile by tile next to the MAC array.
"""

from __future__ import annotations

from math import ceil

import numpy as np

from mcpc.ir.core import Attr, Operation
from mcpc.ir.dtypes import DType
from mcpc.ir.ops_nn import OutDtypeOfA
from mcpc.ir.types import TensorType

WEIGHT_CODE_DTYPES = frozenset({"i4", "u4", "i8", "u8"})


def scale_shape(codes: tuple[int, ...], group: int, trans_b: bool) -> tuple[int, int]:
    """Shape of the scales (and zero points) of weight codes of shape ``codes`` (k x n, or n x k
    when ``trans_b``) with ``group`` elements of K per scale (0: one scale per column)."""
    n, k = codes if trans_b else codes[::-1]
    groups = ceil(k / group) if group else 1
    return (n, groups) if trans_b else (groups, n)


class MatMulW4A16Op(OutDtypeOfA):
    """``mcp.matmul_w4a16 a, codes, scale, zero_point {out, trans_b, tile, group_size}``.

    ``a`` is ``[..., M, K]`` of a float dtype; ``codes`` is the weight ``[K, N]`` (``[N, K]`` when
    ``trans_b``) of ``i4``, ``u4``, ``i8`` or ``u8``; ``scale`` (float) and ``zero_point`` (the codes'
    dtype) hold one entry per ``group_size`` consecutive elements of K and per column:
    ``[ceil(K/group_size), N]`` (``[N, ceil(K/group_size)]`` when ``trans_b``; ``group_size`` 0 means
    one group spanning K).  The result is ``[..., M, N]`` of dtype ``out``.

    Semantics: ``w = (codes - zero_point) · scale`` computed as ``mcp.dequantize`` does and rounded
    once to a's dtype, then ``mcp.matmul a, w {trans_b, tile}`` (f32 accumulation in the order of
    ``tile``), rounded once to ``out``.  So the op computes exactly the bits of the unfused pair
    ``mcp.matmul(a, mcp.dequantize(codes, ...) {out = a's dtype})`` with the same tile.
    """

    name = "mcp.matmul_w4a16"
    NUM_OPERANDS = 4
    ATTRS = {
        "out": Attr("dtype", doc="result dtype (a's dtype when omitted)"),
        "trans_b": Attr("bool", False, doc="codes are stored [N, K]"),
        "tile": Attr("ints", [], doc="[] or [tm, tn, tk]: accumulation order"),
        "group_size": Attr("int", 0, doc="elements of K per scale; 0: one scale per column"),
    }

    @classmethod
    def infer_types(cls, operand_types, attrs):
        a, codes, scale, zp = operand_types
        if not a.dtype.is_float:
            raise ValueError(f"operand a must be a float tensor, got {a}")
        if a.rank < 2:
            raise ValueError(f"operand a must have rank >= 2, got {a}")
        if codes.dtype.name not in WEIGHT_CODE_DTYPES or codes.rank != 2:
            raise ValueError(
                f"codes must be a rank-2 tensor of {', '.join(sorted(WEIGHT_CODE_DTYPES))}, got {codes}"
            )
        trans_b, group = bool(attrs["trans_b"]), int(attrs["group_size"])
        if group < 0:
            raise ValueError(f"group_size must be >= 0, got {group}")
        n, k = codes.shape if trans_b else codes.shape[::-1]
        if a.shape[-1] != k:
            raise ValueError(f"contracted dims differ: {a} @ {codes} (trans_b={trans_b})")
        want = scale_shape(codes.shape, group, trans_b)
        if not scale.dtype.is_float or scale.shape != want:
            raise ValueError(f"scale must be a float tensor of shape {list(want)}, got {scale}")
        if zp.shape != want or zp.dtype != codes.dtype:
            raise ValueError(f"zero_point must be {TensorType(want, codes.dtype)}, got {zp}")
        out: DType = attrs["out"]
        if not out.is_float:
            raise ValueError(f"result dtype 'out' must be a float type, got {out}")
        return [TensorType((*a.shape[:-1], n), out)]

    def verify_extra(self):
        tile = list(self.attrs["tile"])
        if tile and (len(tile) != 3 or any(t < 0 for t in tile)):
            raise ValueError(f"tile must be [] or [tm, tn, tk] with non-negative ints, got {tile}")
        group, tk = int(self.attrs["group_size"]), tile[2] if tile else 0
        k = self.operands[0].type.shape[-1]
        if tile and group and 0 < tk < k and tk % group:
            raise ValueError(f"tile K {tk} must be a multiple of group_size {group} (or all of K = {k})")


def rows_dequantize(op: Operation) -> bool:
    """Whether an ``mcp.dequantize`` is one the ``vdequant`` instruction computes directly: integer
    codes (``i4``/``u4``/``i8``/``u8``) blocked along their last axis (rows of codes, one scale per
    group of columns), whose rows start on a byte (an even row length for 4-bit codes), with f16,
    bf16 or f32 scales and result."""
    x, scale = op.operands[0].type, op.operands[1].type
    if x.dtype.name not in WEIGHT_CODE_DTYPES or x.rank == 0 or int(op.attrs["block_size"]) <= 0:
        return False
    if int(op.attrs["axis"]) % x.rank != x.rank - 1:
        return False
    floats = ("f16", "bf16", "f32")
    if scale.dtype.name not in floats or op.result.type.dtype.name not in floats:
        return False
    if x.dtype.packed and x.shape[-1] % 2:
        return False
    # a 4-bit zero-point tile of an odd number of groups per row does not start each row on a byte
    # (fuse-dequantize-matmul splits such groups); all-zero constant zero points are not read
    zp = op.operands[2].owner
    zeros = getattr(zp, "name", "") == "mcp.constant" and not np.asarray(zp.attrs["value"]).any()
    return not (x.dtype.packed and scale.shape[-1] % 2 and not zeros)


ACTIVATION_CODE_DTYPES = frozenset({"i4", "i8", "u8"})
QA_WEIGHT_DTYPES = frozenset({"i4", "i8", "f8e4m3fn"})


class MatMulQAOp(OutDtypeOfA):
    """``mcp.matmul_qa a, codes, scale, zero_point {scale_a, out, trans_b, tile}``: a matmul whose
    activations are quantized on the fly (the ``vmmul.q4f8`` and ``matmul_i8`` instructions).

    ``a`` is ``[..., M, K]`` float; it is quantized per tensor to ``zero_point``'s dtype (``i4``,
    ``i8`` or ``u8``) with ``scale_a`` and that zero point (``mcp.quantize``); ``codes`` is the
    weight ``[K, N]`` (``[N, K]`` with ``trans_b``) of ``i4``, ``i8`` or ``f8e4m3fn`` (zero point 0);
    ``scale`` (f32, ``[N]`` or ``[1]``) is the *fused* scale ``scale_a · scale_w`` of each column
    (``numerics.fused_scale``).  Per K tile (``tile``, as ``mcp.matmul``) the product
    ``Σ (qa − za) · w`` is exact, rounded once to f32 and multiplied by the column's fused scale;
    the tiles accumulate in f32 (``numerics.matmul_qa_2d``), rounded once to ``out``.
    """

    name = "mcp.matmul_qa"
    NUM_OPERANDS = 4
    ATTRS = {
        "scale_a": Attr("float", doc="activation scale (per tensor)"),
        "out": Attr("dtype", doc="result dtype (a's dtype when omitted)"),
        "trans_b": Attr("bool", False, doc="codes are stored [N, K]"),
        "tile": Attr("ints", [], doc="[] or [tm, tn, tk]: accumulation order"),
    }

    @classmethod
    def infer_types(cls, operand_types, attrs):
        a, codes, scale, zp = operand_types
        if not a.dtype.is_float or a.rank < 2:
            raise ValueError(f"operand a must be a float tensor of rank >= 2, got {a}")
        if codes.dtype.name not in QA_WEIGHT_DTYPES or codes.rank != 2:
            raise ValueError(
                f"codes must be a rank-2 tensor of {', '.join(sorted(QA_WEIGHT_DTYPES))}, got {codes}"
            )
        n, k = codes.shape if attrs["trans_b"] else codes.shape[::-1]
        if a.shape[-1] != k:
            raise ValueError(f"contracted dims differ: {a} @ {codes} (trans_b={attrs['trans_b']})")
        if scale.dtype.name != "f32" or scale.shape not in ((n,), (1,)):
            raise ValueError(f"scale must be f32 [{n}] or [1] (the fused scale per column), got {scale}")
        if zp.dtype.name not in ACTIVATION_CODE_DTYPES or zp.shape != (1,):
            raise ValueError(
                f"zero_point must be one element of {', '.join(sorted(ACTIVATION_CODE_DTYPES))}, got {zp}"
            )
        if not attrs["out"].is_float:
            raise ValueError(f"result dtype 'out' must be a float type, got {attrs['out']}")
        return [TensorType((*a.shape[:-1], n), attrs["out"])]

    def verify_extra(self):
        tile = list(self.attrs["tile"])
        if tile and (len(tile) != 3 or any(t < 0 for t in tile)):
            raise ValueError(f"tile must be [] or [tm, tn, tk] with non-negative ints, got {tile}")
        if not float(self.attrs["scale_a"]) > 0:
            raise ValueError(f"scale_a must be > 0, got {self.attrs['scale_a']}")
