"""Activation-aware weight quantization (AWQ-style): a per-input-channel smoothing scale searched
against the layer's output error, then a clipping search on the scaled weight.

Input channels that carry large activations matter more to the output; scaling their weight rows
up by ``s_k`` before quantizing (and the activations down by the same factor) gives them a finer
effective grid.  With ``s = mean|x|^alpha`` (normalised to geometric mean 1 of its extremes) and
``alpha`` searched on a grid, the weight ``W' = diag(s) W`` is quantized and the loss is the
calibration output error ``E||x W - (x / s) Q(W')||^2 = trace(dW^T H dW)`` with
``dW = W - diag(1/s) Q(W')`` and ``H = E[x^T x]`` — one (K, K) x (K, N) product per candidate, never a
pass over the calibration tokens.  ``alpha = 0`` (s = 1) is plain RTN and is always a candidate, so
the result is never worse than RTN on this loss.

How the quantization pass must use the returned ``s`` (K,):  the stored weight is ``Q(W')`` for
``W' = diag(s) W``, so the layer must see ``x' = x / s``.  Fold ``1/s`` into whatever produces
``x``: a LayerNorm/RMSNorm's gain (and bias) ``gamma / s``, ``beta / s``; a preceding linear's output
columns (and bias); otherwise insert an elementwise multiply by ``1/s``.  Weights that share one
input (Q, K and V after one LayerNorm) must share one ``s``: quantize them concatenated along N
(``np.concatenate([Wq, Wk, Wv], axis=1)``), then split with ``QuantizedWeight.columns``.
"""

from __future__ import annotations

import numpy as np

from .calib import InputStats
from .core import F32, QuantizedWeight, QuantSpec, check_weight, grouped, make_weight
from .rtn import DEFAULT_MSE_GRID, clip_search

DEFAULT_ALPHAS: tuple[float, ...] = tuple(round(0.05 * i, 2) for i in range(20))  # 0 .. 0.95


def _hblocks(h: np.ndarray, spec: QuantSpec) -> np.ndarray:
    """Diagonal (g, g) blocks of ``h`` (K, K) along the spec's groups, zero-padded: (G, g, g) f32."""
    k = h.shape[0]
    g = spec.group_len(k) or 1
    groups = spec.groups(k)
    hp = np.zeros((groups * g, groups * g), np.float32)
    hp[:k, :k] = h
    return np.stack([hp[i * g : (i + 1) * g, i * g : (i + 1) * g] for i in range(groups)])


def _quantize_scaled(w, s, spec, hess, clip_grid):
    """Quantize ``diag(s) W``; return (stored, zp, codes_grouped, W_eff = diag(1/s) dequant)."""
    ws = (w * s[:, None]).astype(F32)
    wg = grouped(ws, spec)
    hs = hess / np.outer(s, s)  # second moment of x / s
    stored, zp, codes = clip_search(wg, spec, clip_grid, _hblocks(hs, spec) if len(clip_grid) > 1 else None)
    qw = make_weight(ws, codes, stored, zp, spec, "awq")
    return qw, qw.dequantize() / s[:, None]


def quantize_awq(
    w: np.ndarray,
    x_calib,
    spec: QuantSpec,
    alphas=DEFAULT_ALPHAS,
    clip_grid=DEFAULT_MSE_GRID,
) -> tuple[QuantizedWeight, np.ndarray]:
    """(quantized ``diag(s) W``, ``s``) for the weight ``w`` (K, N) and its inputs ``x_calib``
    ((..., K) array or an ``InputStats``).  See the module docstring for how to apply ``s``.

    ``alphas``: exponents tried for ``s = mean|x|^alpha`` (each candidate quantized by RTN; 0 is
    always tried);
    ``clip_grid``: the clipping search then run on the chosen scaling with the output-error metric
    (``(1.0,)`` turns it off).  The clip search keeps the full range wherever shrinking does not
    lower that metric, so it cannot lose to the unclipped candidate per group.
    Cost: ``len(alphas)`` RTN passes plus (K, K)x(K, N) products, then ``len(clip_grid)`` RTN passes.
    """
    w = check_weight(w)
    stats = InputStats.of(x_calib)
    if stats.k != w.shape[0]:
        raise ValueError(f"calibration inputs have width {stats.k}, the weight has K = {w.shape[0]} rows")
    hess = stats.hessian
    mag = stats.mean_abs
    positive = mag > 0
    floor = mag[positive].min() if positive.any() else 1.0
    mag = np.where(positive, mag, floor)  # a channel never seen active keeps the smallest scale
    h32 = hess.astype(F32)
    best = None
    for alpha in sorted({0.0, *(float(a) for a in alphas)}):
        s = mag ** float(alpha)
        s = (s / np.sqrt(s.max() * s.min())).astype(F32)
        _, w_eff = _quantize_scaled(w, s, spec, hess, (1.0,))
        d = w - w_eff
        err = float(np.sum((h32 @ d) * d, dtype=np.float64))  # trace(dW^T H dW), f32 products
        if best is None or err < best[0]:
            best = (err, s)
    s = best[1]
    qw, _ = _quantize_scaled(w, s, spec, hess, tuple(clip_grid))
    return qw, s


def quantize_awq_gptq(
    w: np.ndarray,
    x_calib,
    spec: QuantSpec,
    desc_act: bool = True,
    alphas=DEFAULT_ALPHAS,
    **gptq_options,
) -> tuple[QuantizedWeight, np.ndarray]:
    """AWQ's smoothing scale, then GPTQ on the scaled weight: ``(GPTQ of diag(s) W, s)``.

    ``s`` is chosen as in ``quantize_awq`` (RTN candidates, no clip search); GPTQ then runs on
    ``W' = diag(s) W`` with the Hessian of the scaled input ``x / s``, ``H' = diag(1/s) H diag(1/s)``.
    The pass applies ``s`` exactly as for ``quantize_awq``.  ``gptq_options`` go to ``quantize_gptq``
    (``damp``, ``block``, ``clip_grid``).
    """
    from .gptq import quantize_gptq

    w = check_weight(w)
    stats = InputStats.of(x_calib)
    _, s = quantize_awq(w, stats, spec, alphas=alphas, clip_grid=(1.0,))
    h = stats.hessian / np.outer(s, s)
    qw = quantize_gptq((w * s[:, None]).astype(F32), None, spec, desc_act=desc_act, hessian=h, **gptq_options)
    qw.algorithm = "awq+gptq"
    return qw, s
