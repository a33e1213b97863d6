"""Weight quantization: the spec, the quantized weight, the rounding helper and the shared group arithmetic.

A weight ``W`` of shape (K, N) is used as ``x @ W``; it is quantized in groups of ``group_size``
consecutive rows along K (axis 0) for each output column, the last group shorter when
``group_size`` does not divide K (``group_size == 0``: one group of all K rows, per output channel).
This is the layout of ONNX's blocked DequantizeLinear (axis 0, block_size) and of the IR's
dequantize op: ``W[k, n] ~ (codes[k, n] - zp[k // g, n]) * scale[k // g, n]`` in f32.

Scales and zero points (asymmetric):
    lo = min(group ∪ {0}), hi = max(group ∪ {0}), scale = (hi - lo) / (2^bits - 1),
    zp = clip(round(-lo / scale), 0, 2^bits - 1), codes unsigned in [0, 2^bits - 1].
Symmetric (as ONNX Runtime's MatMulNBits quantizer): m = the group's element of largest magnitude
(the more negative one on a tie), scale = -m / 2^(bits-1), codes signed in [-2^(bits-1), 2^(bits-1)-1].
The extreme element lands exactly on -2^(bits-1), so all 2^bits levels are used; the price is that
the scale carries the sign (negative when the extreme is positive).

The scale is computed in f32, stored in ``scale_dtype`` (f16/bf16: rounded up in magnitude, so the
grid still covers the group's range) and the codes are computed from the stored scale, so
``dequantize()`` is the best reconstruction the stored numbers allow.  An all-zero group gets the
dtype's smallest normal scale (its codes dequantize to exact zeros); a range below the dtype's
resolution rounds up to its smallest subnormal: every scale is finite and non-zero.

Two rounding modes, both through ``round_to_int``:
* ``half_even`` (default): ONNX QuantizeLinear's arithmetic, ``q = rint(w / scale) + zp`` (the f32
  quotient rounded half to even), ``zp = rint(-lo / scale)``.
* ``half_away``: ONNX Runtime's MLAS blockwise quantizer, bit for bit: ``u = roundf(w * (1/scale) +
  z)`` in f32 with ``z = 2^(bits-1)`` for symmetric (the signed code is ``u - z``) or the zero
  point, ``roundf`` rounding half away from zero; the zero point is ``roundf(-lo / scale_f32)`` from
  the unrounded f32 scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from mcpc.arch import numerics

F32 = np.float32
SCALE_DTYPES: dict[str, np.dtype] = {
    "f32": np.dtype(np.float32),
    "f16": np.dtype(np.float16),
    "bf16": np.dtype(ml_dtypes.bfloat16),
}
SCALE_BITS = {"f32": 32, "f16": 16, "bf16": 16}
ROUNDING_MODES = ("half_even", "half_away")


@dataclass(frozen=True)
class QuantSpec:
    """How to quantize a weight: bits (2..8), group size along K (0 = per output channel),
    symmetric or with zero points, the scale's storage dtype and the rounding mode."""

    bits: int = 4
    group_size: int = 32
    symmetric: bool = False
    scale_dtype: str = "f16"
    rounding: str = "half_even"

    def __post_init__(self):
        if not isinstance(self.bits, int) or not 2 <= self.bits <= 8:
            raise ValueError(f"quantization bits must be an integer in 2..8, got {self.bits!r}")
        if not isinstance(self.group_size, int) or self.group_size < 0:
            raise ValueError(f"group_size must be an integer >= 0 (0 = per channel), got {self.group_size!r}")
        if self.scale_dtype not in SCALE_DTYPES:
            raise ValueError(
                f"scale_dtype must be one of {', '.join(SCALE_DTYPES)}, got {self.scale_dtype!r}"
            )
        if self.rounding not in ROUNDING_MODES:
            raise ValueError(f"rounding must be one of {', '.join(ROUNDING_MODES)}, got {self.rounding!r}")

    @property
    def qmin(self) -> int:
        return -(1 << (self.bits - 1)) if self.symmetric else 0

    @property
    def qmax(self) -> int:
        return (1 << (self.bits - 1)) - 1 if self.symmetric else (1 << self.bits) - 1

    @property
    def code_dtype(self) -> np.dtype:
        return np.dtype(np.int8) if self.symmetric else np.dtype(np.uint8)

    def groups(self, k: int) -> int:
        """Number of groups along K for a weight of K rows."""
        return 1 if self.group_size == 0 or k == 0 else math.ceil(k / self.group_size)

    def group_len(self, k: int) -> int:
        return k if self.group_size == 0 else self.group_size


@dataclass
class QuantizedWeight:
    """A quantized (K, N) weight: unpacked codes, per-group scales (and zero points), how it was made.

    ``codes`` (K, N) int8 (symmetric) or uint8 (asymmetric), in natural K order;
    ``scales`` (ceil(K/g), N) in the numpy dtype of ``spec.scale_dtype``;
    ``zero_points`` same shape, uint8, or None when symmetric;
    ``perm``: the act-order permutation GPTQ processed the rows in (informational: the codes and
    groups are already in natural order, so the dequantize op needs no permutation).
    """

    codes: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray | None
    spec: QuantSpec
    algorithm: str
    perm: np.ndarray | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return self.codes.shape

    def dequantize(self) -> np.ndarray:
        """f32 (K, N): ``(codes - zp) * scale`` with the group's scale, exactly what the IR dequantize
        op (``numerics.dequantize`` on qparams expanded along axis 0 in blocks) computes."""
        k, n = self.codes.shape
        g = self.spec.group_len(k) or 1
        scale = numerics.expand_qparam(self.scales.astype(F32), (k, n), 0, g)
        zp = np.zeros((), np.int64) if self.zero_points is None else self.zero_points
        if self.zero_points is not None:
            zp = numerics.expand_qparam(zp, (k, n), 0, g)
        return numerics.dequantize(self.codes, scale, zp, "f32")

    def columns(self, start: int, stop: int) -> QuantizedWeight:
        """The output columns ``start:stop`` as their own QuantizedWeight (groups run along K, so a
        column slice is exact): splits weights quantized together, e.g. Q, K and V sharing one AWQ
        scale."""
        zp = None if self.zero_points is None else self.zero_points[:, start:stop].copy()
        return QuantizedWeight(
            self.codes[:, start:stop].copy(),
            self.scales[:, start:stop].copy(),
            zp,
            self.spec,
            self.algorithm,
            None if self.perm is None else self.perm.copy(),
        )

    def bits_per_weight(self) -> float:
        """(codes + scales + zero points) bits / (K*N); zero points are stored at ``spec.bits`` each."""
        k, n = self.codes.shape
        if k * n == 0:
            return 0.0
        bits = k * n * self.spec.bits + self.scales.size * SCALE_BITS[self.spec.scale_dtype]
        if self.zero_points is not None:
            bits += self.zero_points.size * self.spec.bits
        return bits / (k * n)


def round_to_int(x, mode: str = "half_even", out: np.ndarray | None = None) -> np.ndarray:
    """``x`` rounded to integral values (same float dtype; callers clip, then cast).

    ``half_even``: ties to the even neighbour (numpy ``rint``, ONNX QuantizeLinear).
    ``half_away``: ties away from zero (C ``roundf``, ONNX Runtime's block quantizer).
    NaN stays NaN.  ``out``: an array to round into (``x`` itself for in place).
    """
    x = np.asarray(x)
    if mode == "half_even":
        return np.rint(x, out=out)
    if mode == "half_away":
        t = np.trunc(x)
        frac = x - t  # exact: x and trunc(x) share the exponent range
        r = np.where(np.abs(frac) >= 0.5, t + np.sign(x), t)
        if out is None:
            return r
        out[...] = r
        return out
    raise ValueError(f"rounding must be one of {', '.join(ROUNDING_MODES)}, got {mode!r}")


# -- the group arithmetic shared by every algorithm ---------------------------------------------------
def check_weight(w: np.ndarray) -> np.ndarray:
    """``w`` as a finite 2-D f32 array; ValueError otherwise."""
    w = np.asarray(w)
    if w.ndim != 2:
        raise ValueError(f"a weight to quantize must be 2-D (K, N), got shape {w.shape}")
    w = np.ascontiguousarray(w, dtype=F32)
    if not np.all(np.isfinite(w)):
        raise ValueError("a weight to quantize holds NaN or infinity")
    return w


def grouped(w: np.ndarray, spec: QuantSpec) -> np.ndarray:
    """(G, g, N) view of ``w`` padded with zero rows to G*g (zeros never change a group's range:
    0 is always inside it)."""
    k, n = w.shape
    g = spec.group_len(k) or 1
    groups = spec.groups(k)
    pad = groups * g - k
    if pad:
        w = np.concatenate([w, np.zeros((pad, n), F32)], axis=0)
    return w.reshape(groups, g, n)


def ungroup(q: np.ndarray, k: int) -> np.ndarray:
    """Inverse of ``grouped``: (G, g, N) -> (K, N), dropping padding rows."""
    return q.reshape(-1, q.shape[-1])[:k]


def group_range(wg: np.ndarray, spec: QuantSpec) -> tuple[np.ndarray, np.ndarray]:
    """Per group (G, N): (lo, hi) for asymmetric, (m, m) with m the signed extreme for symmetric."""
    lo = wg.min(axis=1)
    hi = wg.max(axis=1)
    if spec.symmetric:
        m = np.where(np.abs(hi) > np.abs(lo), hi, lo)
        return m, m
    return np.minimum(lo, F32(0)), np.maximum(hi, F32(0))


def qparams(
    lo: np.ndarray, hi: np.ndarray, spec: QuantSpec
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """(stored scale, zero point or None, stored scale as f32) for ranges from ``group_range``
    (possibly shrunk by a clipping search)."""
    lo = np.asarray(lo, F32)
    hi = np.asarray(hi, F32)
    if spec.symmetric:
        scale_f = (-lo / F32(1 << (spec.bits - 1))).astype(F32)
    else:
        scale_f = ((hi - lo) / F32((1 << spec.bits) - 1)).astype(F32)
    sdt = SCALE_DTYPES[spec.scale_dtype]
    finfo = ml_dtypes.finfo(sdt)
    stored = np.clip(scale_f, -F32(finfo.max), F32(finfo.max)).astype(sdt)
    if sdt.itemsize == 2:
        # rounded up in magnitude (one step of the 16-bit pattern, sign-magnitude): the grid always
        # covers the group's range, even where f16/bf16 keep few mantissa bits (bf16, subnormals)
        short = np.abs(stored.astype(F32)) < np.abs(scale_f)
        stored = np.where(short, stored.view(np.uint16) + np.uint16(1), stored.view(np.uint16)).view(sdt)
        stored = np.where(np.isinf(stored.astype(F32)), np.copysign(finfo.max, scale_f).astype(sdt), stored)
    stored = np.where(stored == 0, np.asarray(finfo.smallest_normal, sdt), stored).astype(sdt)
    s32 = stored.astype(F32)
    zp = None
    if not spec.symmetric:
        with np.errstate(divide="ignore", invalid="ignore"):
            if spec.rounding == "half_away":
                # MLAS: from the unrounded f32 scale; a zero scale gives zero point 0
                zfp = np.where(scale_f != 0, F32(0) - lo / np.where(scale_f != 0, scale_f, F32(1)), F32(0))
            else:
                zfp = -lo / s32
        zp = np.clip(round_to_int(zfp.astype(F32), spec.rounding), 0, spec.qmax).astype(np.uint8)
    return stored, zp, s32


def quantize_float(w: np.ndarray, s32: np.ndarray, zp: np.ndarray | None, spec: QuantSpec) -> np.ndarray:
    """Codes of ``w`` as integral f32 values: scales ``s32`` (f32) and zero points broadcast against
    ``w``, clipped to the spec's range; the arithmetic of ``spec.rounding`` (module docstring)."""
    if spec.rounding == "half_away":
        z = F32(1 << (spec.bits - 1)) if zp is None else zp.astype(F32)
        with np.errstate(divide="ignore", over="ignore"):
            recip = np.divide(F32(1), s32, dtype=F32)
        # a subnormal scale's reciprocal overflows: saturate it, so 0 * recip stays 0 (not NaN)
        recip = np.nan_to_num(recip, posinf=np.finfo(F32).max, neginf=-np.finfo(F32).max)
        u = np.multiply(w, recip, dtype=F32)
        u += z
        u = round_to_int(u, "half_away")
        np.clip(u, 0, (1 << spec.bits) - 1, out=u)
        if zp is None:
            u -= F32(1 << (spec.bits - 1))
        return u
    q = np.divide(w, s32, dtype=F32)
    round_to_int(q, "half_even", out=q)
    if zp is not None:
        q += zp.astype(F32)
    return np.clip(q, spec.qmin, spec.qmax, out=q)


def quantize_values(w: np.ndarray, s32: np.ndarray, zp: np.ndarray | None, spec: QuantSpec) -> np.ndarray:
    """``quantize_float`` in ``spec.code_dtype``."""
    return quantize_float(w, s32, zp, spec).astype(spec.code_dtype)


def dequantize_values(q: np.ndarray, s32: np.ndarray, zp: np.ndarray | None) -> np.ndarray:
    """f32 ``(q - zp) * s`` (the dequantize op's arithmetic) for broadcastable arrays; ``q`` integer
    codes or their integral f32 values."""
    d = np.asarray(q, dtype=F32) if zp is None else np.subtract(q, zp, dtype=F32)
    return np.multiply(d, s32, dtype=F32)


def make_weight(
    w: np.ndarray, codes_g: np.ndarray, stored, zp, spec, algorithm, perm=None
) -> QuantizedWeight:
    return QuantizedWeight(ungroup(codes_g, w.shape[0]), stored, zp, spec, algorithm, perm)
