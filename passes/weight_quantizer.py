"""Quantizing one weight: the settings of a layer in, the codes, scales and zero points the IR
stores out (``QuantResult``), through the algorithms of ``mcpc.passes.quant`` (``fp8`` is done here:
one scale per group mapping its largest magnitude to 448).

``quantize_weight`` checks what an algorithm returns: codes inside the spec's range, and the stored
codes / scales / zero points dequantizing (as the IR's ``mcp.dequantize`` does) to exactly the
algorithm's own reconstruction.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from mcpc.arch import numerics as nx
from mcpc.errors import PassError, UnsupportedError

F32 = np.float32
INT_CODE_TYPES = {
    ("i", 4): ml_dtypes.int4,
    ("u", 4): ml_dtypes.uint4,
    ("i", 8): np.int8,
    ("u", 8): np.uint8,
}


@dataclass
class QuantResult:
    """A quantized (K, N) weight as the IR stores it, before the layout change."""

    codes: np.ndarray  # (K, N) in the IR code dtype
    scales: np.ndarray  # (G, N) f16/f32
    zero_points: np.ndarray  # (G, N), the codes' dtype
    block: int
    algorithm: str
    in_scale: np.ndarray | None = None  # AWQ: the matmul reads x / in_scale

    def dequantize(self) -> np.ndarray:
        """f32 (K, N): exactly what the IR dequantize op computes."""
        k, n = self.codes.shape
        s = nx.expand_qparam(self.scales, (k, n), 0, self.block)
        z = nx.expand_qparam(self.zero_points, (k, n), 0, self.block)
        return nx.dequantize(self.codes, s, z, "f32")

    @property
    def nbytes(self) -> int:
        return sum(_stored_bytes(a) for a in (self.codes, self.scales, self.zero_points))


def _stored_bytes(a: np.ndarray) -> int:
    from mcpc.ir.dtypes import dtype_from_numpy

    return dtype_from_numpy(a.dtype).storage_bytes(a.size)


def _algos():
    from mcpc.passes import quant

    return quant


def _algorithm(name: str):
    fn = getattr(_algos(), f"quantize_{name}", None)
    if fn is None:
        raise UnsupportedError(f"quantize-weights: algorithm {name} is not available in this build of mcpc")
    return fn


def resolve_algorithm(settings, have_data: bool) -> str:
    """``auto`` is GPTQ with calibration data, else the data-free clipping search ``mse``."""
    if settings.format == "f8e4m3fn":
        return "fp8"
    if settings.algorithm == "auto":
        return "gptq" if have_data else "mse"
    return settings.algorithm


def quantize_weight(w: np.ndarray, settings, x: np.ndarray | None, where: str) -> QuantResult:
    """Quantize the (K, N) f32 weight ``w`` with ``settings`` (a ``WeightQuant``); ``x`` the
    calibration inputs of its matmul(s) (an ``InputStats`` or a (rows, K) array), or None."""
    k = w.shape[0]
    group = settings.group_size if settings.group_size < k else 0  # a group of >= K rows: one group
    block = group or k
    algorithm = resolve_algorithm(settings, x is not None)
    if algorithm == "fp8":
        return _quantize_fp8(w, settings, block)
    if algorithm in ("awq", "gptq") and x is None:
        raise PassError(f"quantize-weights: {where}: algorithm {algorithm} needs calibration data")
    spec = _algos().QuantSpec(
        bits=settings.bits,
        group_size=group,
        symmetric=settings.symmetric,
        scale_dtype=settings.scale_dtype,
        rounding=settings.rounding,
    )
    in_scale = None
    if algorithm == "gptq":
        qw = _algorithm("gptq")(w, x, spec, desc_act=settings.desc_act)
    elif algorithm == "awq":
        qw, in_scale = _algorithm("awq")(w, x, spec)
        in_scale = np.asarray(in_scale, F32)
    else:
        qw = _algorithm(algorithm)(w, spec)
    sign = "i" if settings.symmetric else "u"
    code_type = INT_CODE_TYPES[(sign, 4 if settings.bits == 4 else 8)]
    codes = np.asarray(qw.codes).astype(np.int64)
    lo, hi = (
        (-(1 << (settings.bits - 1)), (1 << (settings.bits - 1)) - 1)
        if settings.symmetric
        else (0, (1 << settings.bits) - 1)
    )
    if codes.min(initial=0) < lo or codes.max(initial=0) > hi:
        raise PassError(f"quantize-weights: {where}: {algorithm} produced codes outside [{lo}, {hi}]")
    zp = (
        np.zeros(qw.scales.shape, np.int64)
        if qw.zero_points is None
        else np.asarray(qw.zero_points, np.int64)
    )
    result = QuantResult(
        codes.astype(code_type), np.asarray(qw.scales), zp.astype(code_type), block, qw.algorithm, in_scale
    )
    if not np.array_equal(result.dequantize(), np.asarray(qw.dequantize(), F32), equal_nan=True):
        raise PassError(f"quantize-weights: {where}: the stored codes do not reproduce {algorithm}'s weight")
    return result


def _quantize_fp8(w: np.ndarray, settings, block: int) -> QuantResult:
    """fp8 e4m3 codes: one scale per group mapping its largest magnitude to 448 (saturating cast)."""
    k, n = w.shape
    groups = -(-k // block)
    pad = np.zeros((groups * block - k, n), F32)
    amax = np.abs(np.concatenate([w, pad])).reshape(groups, block, n).max(axis=1)
    sdt = np.float16 if settings.scale_dtype == "f16" else np.float32
    scales = (amax / F32(448.0)).astype(sdt)
    tiny = np.finfo(sdt).smallest_normal
    scales = np.where(scales == 0, sdt(tiny), scales).astype(sdt)
    zeros = np.zeros((groups, n), ml_dtypes.float8_e4m3fn)
    codes = nx.quantize(w, nx.expand_qparam(scales, (k, n), 0, block), np.zeros((), np.float32), "f8e4m3fn")
    return QuantResult(codes, scales, zeros, block, "fp8")
