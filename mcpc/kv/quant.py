"""INT8_Asymmetric: the KV cache quantized per token and head, and the seed's error check.

A row is the ``head_dim`` values one token has in one KV head.  Each row gets an fp16 ``scale``
and a u8 ``zero_point`` from the range of its stored values widened to contain 0:
``lo = min(0, min x)``, ``hi = max(0, max x)``, ``scale = (hi - lo) / 255`` rounded *up* to fp16
(so that ``hi`` never needs a code above 255 for want of scale), ``zero_point = round(-lo / scale)``;
a row whose range is 0 (all zeros) gets scale 1 and zero point 0.  Codes are
``clip(round_half_even(x / scale) + zero_point, 0, 255)`` and values ``(code - zero_point) * scale``
rounded once to the activation dtype — the ``quantize``/``dequantize`` kernels of
``mcpc.arch.numerics``, so the simulator dequantizes with the very same arithmetic.

The seed's check (``CompressKVCache``: "quantization error max < 0.02") is evaluated per block (the
64 tokens x head_dim of one head): ``max|dequant(quant(x)) - x| / max|x| < tol`` over the values
the block stores.  A block that fails — including any block holding NaN or ±inf, whose error is
not finite, and blocks whose scales under- or overflow fp16 — is kept unquantized
(FP16_Retain).  An all-zero block passes with error 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mcpc.arch import numerics

LEVELS = 255  # u8 codes 0..255
DEFAULT_TOL = 0.02


@dataclass(frozen=True)
class QuantRows:
    """Quantized rows: ``codes`` u8 [rows, cols], ``scale`` f16 [rows], ``zero_point`` u8 [rows]."""

    codes: np.ndarray
    scale: np.ndarray
    zero_point: np.ndarray


def _fp16_round_up(s: np.ndarray) -> np.ndarray:
    """``s`` (f64) as the smallest fp16 >= s (inf beyond the fp16 range)."""
    with np.errstate(over="ignore"):
        h = s.astype(np.float16)
    low = h.astype(np.float64) < s
    h[low] = np.nextafter(h[low], np.float16(np.inf))
    return h


def quantize_rows(x: np.ndarray, keep: np.ndarray | None = None) -> QuantRows:
    """INT8_Asymmetric codes of ``x`` [rows, cols] (any float dtype), one scale and zero point per
    row computed over the kept values (``keep`` bool [rows, cols]; None keeps all).  Dropped
    positions get the zero point as code, so they dequantize to exactly 0."""
    x = np.asarray(x)
    keep = np.ones(x.shape, bool) if keep is None else np.asarray(keep, bool)
    xf = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        vals = np.where(keep, xf, 0.0)
        lo = np.minimum(vals.min(axis=1, initial=0.0), 0.0)
        hi = np.maximum(vals.max(axis=1, initial=0.0), 0.0)
        span = hi - lo
        scale = _fp16_round_up(np.where(span > 0, span / LEVELS, 1.0))
        s64 = scale.astype(np.float64)
        zp = np.clip(np.nan_to_num(np.rint(-lo / s64), nan=0.0), 0, LEVELS).astype(np.uint8)
    codes = numerics.quantize(x, scale[:, None], zp[:, None], "u8")
    codes = np.where(keep, codes, zp[:, None]).astype(np.uint8)
    return QuantRows(codes, scale, zp)


def dequantize_rows(q: QuantRows, out: str) -> np.ndarray:
    """``(code - zero_point) * scale`` per row, rounded once to the float dtype ``out``."""
    return numerics.dequantize(q.codes, q.scale[:, None], q.zero_point[:, None], out)


def relative_error(x: np.ndarray, y: np.ndarray, keep: np.ndarray | None = None) -> float:
    """``max|y - x| / max|x|`` over the kept positions, in f64; 0 for an all-zero (or empty) x; NaN
    or inf when either side is not finite."""
    xf = np.asarray(x, np.float64)
    yf = np.asarray(y, np.float64)
    if keep is not None:
        xf, yf = xf[np.asarray(keep, bool)], yf[np.asarray(keep, bool)]
    if xf.size == 0:
        return 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        err = float(np.max(np.abs(yf - xf)))
        ref = float(np.max(np.abs(xf)))
    if not (np.isfinite(err) and np.isfinite(ref)):
        return float("nan")
    if ref == 0.0:
        return 0.0 if err == 0.0 else float("inf")
    return err / ref


def passes_check(error: float, tol: float = DEFAULT_TOL) -> bool:
    """The seed's check: ``error < tol`` (a NaN error fails)."""
    return bool(error < tol)
