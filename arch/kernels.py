"""Exact f16 <-> f32 conversions and f16/f32 elementwise arithmetic: native when built, else numpy.

numpy converts float16 one value at a time in software (about 1.6 ns per value to f32 and 2.4 ns
back on the machines we measure on) and computes f16 arithmetic as two such widenings, the f32
operation and one narrowing.  ``mcpc._kernels`` (``mcpc/_kernels.c``, built by ``pip install``
when a C compiler is present; optional) does the same arithmetic with the F16C instructions, eight
values at a time, and gives the very bits numpy gives: IEEE f32 operations, f32 -> f16 rounding
half to even with overflow to infinity, NaN payloads as numpy's routines keep them (a NaN or an
infinity is converted by a software routine written to numpy's rules).  tests/sim/test_kernels.py
compares all 65,536 f16 values, random and special f32 values and every operation against numpy
(and, marked slow, all 2^32 f32 values).

Every function says when it did not do the work (-1, or None for those returning an array or a
bool), leaving the destination untouched for the caller to compute with numpy: when the module is
not built (or ``MCPC_NO_KERNELS=1`` is set), for shapes or dtypes it does not take, for all-f32
arithmetic without AVX-512 (numpy's own loops are as fast there), and when a source overlaps the
destination without being exactly it (numpy's buffering defines that case).
"""

from __future__ import annotations

import os

import numpy as np
from scipy import special as _scipy_special

try:
    if os.environ.get("MCPC_NO_KERNELS", "") not in ("", "0"):
        raise ImportError("disabled by MCPC_NO_KERNELS")
    from mcpc import _kernels as _native
except ImportError:  # not built (no C compiler at install time) or disabled: numpy does the work
    _native = None

AVAILABLE = _native is not None
# Whether all-f32 arithmetic is worth a native call: with AVX-512 it is faster than numpy's own
# loops and tests finiteness in the same pass (the numeric guard then skips its own); without, numpy's.
_F32_FAST = AVAILABLE and bool(_native.f32_vectorized())
# The operations ``binary`` takes, with their codes in mcpc/_kernels.c.
OPS = {"add": 0, "sub": 1, "mul": 2, "div": 3}
_REVERSED = {"sub": 4, "div": 5, "add": 6, "mul": 7}  # imm - a, imm / a, imm + a, imm * a
_F16, _F32 = np.dtype(np.float16), np.dtype(np.float32)
FLOATS = frozenset({_F16, _F32})


def convert(dst: np.ndarray, src: np.ndarray) -> int:
    """``dst[...] = src`` between 2-D float16 / float32 arrays (src may broadcast).  Returns 1 when
    every value written is finite, 0 when some is not, -1 when not done (dst untouched)."""
    if (
        _native is None
        or dst.ndim != 2
        or src.ndim != 2
        or dst.dtype not in FLOATS
        or src.dtype not in FLOATS
    ):
        return -1
    return _native.convert(dst, src)


def binary(
    func: str, dst: np.ndarray, a: np.ndarray, b: np.ndarray | None, imm: float = 0.0, rev: bool = False
) -> int:
    """``dst[...] = f32(a) FUNC f32(b)`` rounded to dst's dtype (``b`` None: the f32 immediate
    ``imm``, ``imm FUNC a`` when ``rev``), for 2-D float16 / float32 arrays; a and b may broadcast.
    Returns 1 (all written values finite), 0 (some not), or -1 (not done: dst untouched)."""
    op = OPS.get(func)
    if _native is None or op is None or dst.ndim != 2 or a.ndim != 2:
        return -1
    if dst.dtype not in FLOATS or a.dtype not in FLOATS:
        return -1
    if b is None:
        if rev:
            op = _REVERSED[func]
    elif b.ndim != 2 or b.dtype not in FLOATS:
        return -1
    if not _F32_FAST and dst.dtype == _F32 and a.dtype == _F32 and (b is None or b.dtype == _F32):
        return -1
    return _native.binary(op, dst, a, b, float(imm))


def widen(x: np.ndarray) -> np.ndarray | None:
    """A new C-contiguous f32 array equal to the f16 array ``x`` (any strides, rank 1 or 2), or
    None when not done."""
    return _converted(x, _F16, _F32)


def narrow(x: np.ndarray) -> np.ndarray | None:
    """A new C-contiguous f16 array: the f32 array ``x`` rounded half to even (rank 1 or 2), or
    None when not done."""
    return _converted(x, _F32, _F16)


def _converted(x: np.ndarray, src: np.dtype, dst: np.dtype) -> np.ndarray | None:
    if _native is None or x.dtype != src or x.ndim not in (1, 2):
        return None
    x2 = x if x.ndim == 2 else x.reshape(1, -1)
    out = np.empty(x2.shape, dst)
    if _native.convert(out, x2) < 0:
        return None
    return out if x.ndim == 2 else out.reshape(-1)


def _special(fn: int, dst: np.ndarray, src: np.ndarray, exact) -> int:
    if _native is None or dst.ndim != 2 or src.ndim != 2 or dst.dtype != _F32 or src.dtype != _F32:
        return -1
    left = _native.special(fn, dst, src)
    if left is None:
        return -1
    idx, x = left
    if not idx:
        return 1
    flat = np.frombuffer(idx, np.int64)
    with np.errstate(all="ignore"):
        y = exact(np.frombuffer(x, np.float32).astype(np.float64)).astype(np.float32)
    rows, cols = np.divmod(flat, dst.shape[1])
    dst[rows, cols] = y
    return int(bool(np.isfinite(y).all()))


def erf(dst: np.ndarray, src: np.ndarray) -> int:
    """``dst[...] = f32(scipy.special.erf(f64(src)))`` for 2-D float32 arrays (src may broadcast;
    dst may be src itself).  The kernel evaluates its own f64 erf and keeps the f32 rounding only
    where every value within a relative 2^-40 of it rounds the same (mcpc/_kernels.c, "erf"); the
    few values near a rounding boundary, and NaNs, it hands back, and scipy computes them here.
    Returns 1 (all finite), 0 (not), -1 (not done: dst untouched)."""
    return _special(0, dst, src, _scipy_special.erf)


def exp(dst: np.ndarray, src: np.ndarray) -> int:
    """``dst[...] = f32(numpy.exp(max(f64(src), -200)))`` (arch/numerics.py's exp) for 2-D float32
    arrays, the same way as ``erf`` with numpy's exp for the values handed back; declined (-1)
    without AVX-512 or for strided rows."""
    return _special(1, dst, src, _numpy_exp)


def _numpy_exp(x: np.ndarray) -> np.ndarray:
    return np.exp(np.maximum(x, -200.0))


def all_finite(x: np.ndarray) -> bool | None:
    """Whether every value of the 2-D float16/float32 array ``x`` is finite (one pass, no
    temporary), or None when not done."""
    if _native is None or x.ndim != 2 or x.dtype not in FLOATS:
        return None
    return _native.all_finite(x)
