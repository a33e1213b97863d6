"""Data-free weight quantization: round to nearest (RTN) and a per-group clipping search (MSE).

``clip_search`` is shared with AWQ, which runs it with an output-error metric instead of the
weight-error one.
"""

from __future__ import annotations

import numpy as np

from .core import (
    F32,
    QuantizedWeight,
    QuantSpec,
    check_weight,
    dequantize_values,
    group_range,
    grouped,
    make_weight,
    qparams,
    quantize_float,
    quantize_values,
)

# Shrink factors tried by the clipping search: the full range first (so the search is never worse
# than RTN), then down to 60 % of it.
DEFAULT_MSE_GRID: tuple[float, ...] = tuple(round(1.0 - 0.02 * i, 2) for i in range(21))


def quantize_rtn(w: np.ndarray, spec: QuantSpec) -> QuantizedWeight:
    """Round to nearest with each group's full range (``core`` module docstring for the formulas).

    With ``spec.rounding == "half_away"`` and ``scale_dtype == "f32"`` the codes and scales are those
    of ONNX Runtime's ``MatMulNBitsQuantizer`` (default RTN path), except that an all-zero group gets
    a non-zero scale where ONNX Runtime stores 0.
    """
    w = check_weight(w)
    wg = grouped(w, spec)
    lo, hi = group_range(wg, spec)
    stored, zp, s32 = qparams(lo, hi, spec)
    codes = quantize_values(wg, s32[:, None, :], None if zp is None else zp[:, None, :], spec)
    return make_weight(w, codes, stored, zp, spec, "rtn")


def quantize_mse(w: np.ndarray, spec: QuantSpec, grid=DEFAULT_MSE_GRID) -> QuantizedWeight:
    """RTN with each group's range shrunk by the factor of ``grid`` that minimises the group's
    squared reconstruction error sum((W - dequant)^2) — a data-free clipping search.

    Every candidate is a full vectorised RTN of the weight; per group the best candidate wins (ties:
    the earlier factor, so a grid starting at 1.0 never does worse than RTN on any group).  Cost:
    ``len(grid)`` RTN passes.
    """
    w = check_weight(w)
    stored, zp, codes = clip_search(grouped(w, spec), spec, grid)
    return make_weight(w, codes, stored, zp, spec, "mse")


def clip_search(wg: np.ndarray, spec: QuantSpec, grid, hblocks: np.ndarray | None = None):
    """(stored scales, zero points, codes) of grouped weights ``wg`` (G, g, N), each group's range
    shrunk by the best factor of ``grid``.

    The error of a group is ``sum_n d_n^T M d_n`` over its columns, ``d`` the group's reconstruction
    error, with ``M`` the identity (weight MSE) or the group's diagonal block ``hblocks[G]`` (g, g) of
    the input second moment (the layer's output error, cross-group terms left out).
    """
    grid = [float(p) for p in grid]
    if not grid or any(not 0.0 < p <= 1.0 for p in grid):
        raise ValueError(f"clipping grid factors must lie in (0, 1], got {grid}")
    lo, hi = group_range(wg, spec)
    best = None
    for p in grid:
        stored, zp, s32 = qparams(lo * F32(p), hi * F32(p), spec)
        zpb = None if zp is None else zp[:, None, :]
        codes = quantize_float(wg, s32[:, None, :], zpb, spec)
        d = dequantize_values(codes, s32[:, None, :], zpb)
        d -= wg
        if hblocks is None:
            err = np.square(d).sum(axis=1)  # (G, N)
        else:
            # einsum, not matmul: many tiny products, where a threaded BLAS call costs more than it does
            err = (np.einsum("gij,gjn->gin", hblocks, d) * d).sum(axis=1)
        if best is None:
            best = [err, stored, zp, codes]
            continue
        better = err < best[0]
        best[0] = np.where(better, err, best[0])
        best[1] = np.where(better, stored, best[1])
        if zp is not None:
            best[2] = np.where(better, zp, best[2])
        best[3] = np.where(better[:, None, :], codes, best[3])
    return best[1], best[2], best[3].astype(spec.code_dtype)
