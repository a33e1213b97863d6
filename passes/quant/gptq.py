"""GPTQ: quantize a weight row by row (input channel by input channel), each row's rounding error
compensated on the rows not yet quantized through the inverse Hessian of the layer's output error.

For ``x @ W`` with W (K, N) and ``H = E[x^T x] + damp * mean(diag H) * I``, let ``U`` be the upper
Cholesky factor of ``H^-1``.  Rows are visited in order (or, with ``desc_act``, by decreasing
``H_kk``: the channels with the most input energy first, while the most rows remain to absorb
their error).  Quantizing row i gives the error ``e = (w_i - q_i) / U_ii``, and every later row j
moves by ``-U_ij * e``; updates are applied lazily in blocks of ``block`` rows (same result, fewer
passes over W).

Groups and act-order.  The dequantize op (and ONNX's blocked DequantizeLinear) takes contiguous
blocks of ``group_size`` rows along K in natural order.  Without ``desc_act`` a group's scale and
zero point are computed from the (already error-updated) weights of its rows when its first row is
reached, as in the GPTQ paper.  With ``desc_act`` the groups are *static*: every group's scale and
zero point are computed from the original weight before the loop, in natural order, and each row
is rounded with its own natural group's parameters whatever the visiting order; the codes are
stored back in natural order.  So the result needs no ``g_idx`` and no permutation at run time;
``QuantizedWeight.perm`` records the visiting order for information only.

Channels never active in calibration (``H_kk = 0``) get ``H_kk = 1``: they are rounded to nearest and
pass no error on.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

from .calib import InputStats
from .core import (
    F32,
    SCALE_DTYPES,
    QuantizedWeight,
    QuantSpec,
    check_weight,
    dequantize_values,
    group_range,
    grouped,
    qparams,
    quantize_values,
)
from .rtn import DEFAULT_MSE_GRID, clip_search


def _inverse_cholesky(h: np.ndarray, damp: float) -> np.ndarray:
    """Upper triangular U (f32) with U^T U = (H + damp*mean(diag)*I)^-1; the damping grows tenfold
    (up to 4 times) when H is not positive definite in floating point.

    One Cholesky factorisation and one triangular solve, in f32 (as GPTQ implementations run; the
    damping keeps H well conditioned): with R the index reversal and R H R = L L^T,
    U = R L^-1 R is upper triangular and U^T U = R L^-T L^-1 R = H^-1.
    """
    k = h.shape[0]
    mean_diag = float(np.mean(np.diag(h))) or 1.0
    d = float(damp)
    eye = np.eye(k, dtype=F32)
    for _ in range(5):
        hd = h[::-1, ::-1].astype(F32)  # a reversed copy, contiguous
        hd[np.diag_indices(k)] += F32(d * mean_diag)
        try:
            low = scipy.linalg.cholesky(hd, lower=True, check_finite=False)
            inv = scipy.linalg.solve_triangular(low, eye, lower=True, check_finite=False)
        except np.linalg.LinAlgError:
            d = max(d * 10.0, 1e-6)
            continue
        if np.all(np.isfinite(inv)):
            return np.ascontiguousarray(inv[::-1, ::-1])
        d = max(d * 10.0, 1e-6)
    raise ValueError("the calibration Hessian is not positive definite even with heavy damping")


def quantize_gptq(
    w: np.ndarray,
    x_calib=None,
    spec: QuantSpec | None = None,
    desc_act: bool = False,
    damp: float = 0.01,
    block: int = 128,
    hessian: np.ndarray | None = None,
    clip_grid=DEFAULT_MSE_GRID,
) -> QuantizedWeight:
    """GPTQ-quantize ``w`` (K, N) given its inputs ``x_calib`` ((..., K) array or ``InputStats``) or
    the second moment ``hessian`` = E[x^T x] (K, K).  Codes and groups in natural K order (module
    docstring); ``perm`` is the act-order visiting order when ``desc_act``.

    ``clip_grid``: range shrink factors searched for each group's scale and zero point, scored by the
    group's share of the output error (``rtn.clip_search``, default grid 1.0 .. 0.6); ``(1.0,)`` keeps
    each group's full range, as the GPTQ paper does.

    Cost: one K x K Cholesky inversion plus K row steps, each an (at most ``block``) x N update, and
    a (K, block) x (block, N) product per block: about 2 K^2 N flops, as a matmul of the layer on K
    tokens.
    """
    if spec is None:
        raise ValueError("quantize_gptq needs a QuantSpec")
    w = check_weight(w)
    k, n = w.shape
    if hessian is None:
        if x_calib is None:
            raise ValueError("quantize_gptq needs calibration inputs or a Hessian")
        stats = InputStats.of(x_calib)
        if stats.k != k:
            raise ValueError(f"calibration inputs have width {stats.k}, the weight has K = {k} rows")
        hessian = stats.hessian
    h = np.array(hessian, dtype=np.float64)
    if h.shape != (k, k) or not np.all(np.isfinite(h)):
        raise ValueError(f"the Hessian must be a finite ({k}, {k}) matrix, got shape {h.shape}")
    if not 0.0 <= damp:
        raise ValueError(f"damp must be >= 0, got {damp!r}")
    block = max(1, int(block))
    dead = np.diag(h) <= 0
    h[dead, dead] = 1.0

    g = spec.group_len(k) or 1
    n_groups = spec.groups(k)
    stored = np.empty((n_groups, n), dtype=SCALE_DTYPES[spec.scale_dtype])
    zps = None if spec.symmetric else np.empty((n_groups, n), np.uint8)
    s32 = np.empty((n_groups, n), F32)

    clip_grid = tuple(float(p) for p in clip_grid)
    h_nat = h  # natural order, for the clipping search's group blocks

    def set_group(gi: int, rows: np.ndarray) -> None:
        if len(clip_grid) > 1:
            r0 = gi * g
            hb = h_nat[r0 : r0 + rows.shape[0], r0 : r0 + rows.shape[0]].astype(F32)
            st, zp, _ = clip_search(rows[None].astype(F32), spec, clip_grid, hb[None])
            st, zp = st[0], None if zp is None else zp[0]
        else:
            lo, hi = group_range(rows[None].astype(F32), spec)
            st, zp, _ = qparams(lo[0], hi[0], spec)
        stored[gi], s32[gi] = st, st.astype(F32)
        if zps is not None:
            zps[gi] = zp

    if desc_act:
        perm = np.argsort(-np.diag(h), kind="stable")
        wg = grouped(w, spec)
        for gi in range(n_groups):
            set_group(gi, wg[gi][: min(g, k - gi * g)])
    else:
        perm = np.arange(k)
    h = h[np.ix_(perm, perm)]
    u = _inverse_cholesky(h, damp)
    wp = w[perm]  # f32, updated in place
    codes = np.empty((k, n), spec.code_dtype)

    for i1 in range(0, k, block):
        i2 = min(i1 + block, k)
        w1 = wp[i1:i2].copy()
        err1 = np.zeros_like(w1)
        u1 = u[i1:i2, i1:i2]
        for i in range(i2 - i1):
            row = i1 + i
            nat = perm[row]
            gi = nat // g
            if not desc_act and nat % g == 0:
                rows = np.concatenate([w1[i:], wp[i2 : nat + g]]) if nat + g > i2 else w1[i : i + g]
                set_group(gi, rows[: min(g, k - nat)])
            zp = None if zps is None else zps[gi]
            wrow = w1[i]
            q = quantize_values(wrow, s32[gi], zp, spec)
            codes[nat] = q
            e = (wrow - dequantize_values(q, s32[gi], zp)) / u1[i, i]
            w1[i + 1 :] -= np.outer(u1[i, i + 1 :], e)
            err1[i] = e
        if i2 < k:
            wp[i2:] -= u[i1:i2, i2:].T @ err1
    return QuantizedWeight(codes, stored, zps, spec, "gptq", perm.copy() if desc_act else None)
