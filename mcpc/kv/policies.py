"""KV sparsity policies (which values of a block are kept) and the dynamic attention window.

A policy sees one layer's block of K or V: ``x`` [heads, rows, cols] (rows = the block's tokens, up
to 64; cols = head_dim) and returns a keep mask of that shape.  ``ratio`` is the fraction dropped:
a set of ``n`` values keeps ``keep_count(n, ratio) = n - floor(ratio * n)`` (so at least
``(1 - ratio) * n``).  Ties in a ranking go to the lower index (element or earlier token), except
``heavy_hitter``, where equal heat prefers the more recent token.  NaN and ±inf rank above every
finite magnitude, so the element-wise policies keep a non-finite value while the budget allows;
``heavy_hitter`` ranks tokens by heat alone (a NaN heat ranks first).

* ``topk_magnitude``: in each tile (the rows x 64 head-dim columns of one head) keep the
  ``keep_count`` largest |values|.
* ``topk_entropy`` (the seed's): the layer block's budget ``keep_count(heads * rows * cols)`` is split
  across heads in proportion to the entropy of each head's attention rows (largest-remainder
  apportionment; a head never gets more than it holds, the excess goes to the others); each head's
  share is split over its tiles in proportion to their sizes, then top-k by magnitude per tile.
* ``heavy_hitter`` (H2O, token level): per head, the tokens of the last ``recent`` positions of the
  sequence are always kept; on top, the tokens with the largest heat (on the served path the
  attention received relative to a uniform head's, ``relative_heat``) up to ``keep_count(rows)``
  tokens in all.  A kept token keeps its whole row.
"""

from __future__ import annotations

import math

import numpy as np

from mcpc.kv.sparse import TILE

POLICIES = ("none", "topk_magnitude", "topk_entropy", "heavy_hitter")
HEAT_FACTOR = 0.6


def keep_count(n: int, ratio: float) -> int:
    """How many of ``n`` values a drop ``ratio`` in [0, 1) keeps: ``n - floor(ratio * n)``."""
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"a sparsity ratio lies in [0, 1), got {ratio}")
    return n - math.floor(ratio * n + 1e-9)


def _rank_key(x: np.ndarray) -> np.ndarray:
    mag = np.abs(np.asarray(x, np.float64))
    return np.where(np.isfinite(mag), mag, np.inf)


def topk_flat(x: np.ndarray, k: int) -> np.ndarray:
    """Mask of the ``k`` largest |x| (any shape; ties to the lower flat index; NaN/inf first)."""
    flat = _rank_key(x).reshape(-1)
    n = flat.size
    if k >= n:
        return np.ones(np.shape(x), bool)
    if k <= 0:
        return np.zeros(np.shape(x), bool)
    threshold = np.partition(flat, n - k)[n - k]  # the k-th largest
    mask = flat > threshold
    ties = np.flatnonzero(flat == threshold)[: k - int(mask.sum())]  # the lowest indices
    mask[ties] = True
    return mask.reshape(np.shape(x))


def _tiles(cols: int) -> list[slice]:
    return [slice(c, min(c + TILE, cols)) for c in range(0, cols, TILE)]


def apportion(total: int, weights: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """Integers summing to ``min(total, sum(caps))``, proportional to ``weights`` (non-negative;
    all zero = equal), none above its cap: largest remainders (ties to the lower index), capped
    shares fixed and the rest re-split among the others."""
    weights = np.asarray(weights, np.float64)
    caps = np.asarray(caps, np.int64)
    if weights.shape != caps.shape or (weights < 0).any() or not np.isfinite(weights).all():
        raise ValueError(f"apportion: weights must be finite and >= 0, one per cap, got {weights}")
    alloc = np.zeros(caps.shape, np.int64)
    remaining = min(int(total), int(caps.sum()))
    active = caps > 0
    while remaining > 0 and active.any():
        w = np.where(active, weights, 0.0)
        if w.sum() <= 0:
            w = active.astype(np.float64)
        share = remaining * w / w.sum()
        room = caps - alloc
        full = active & (share >= room)
        if full.any():  # these heads get all they hold; re-split the rest
            remaining -= int(room[full].sum())
            alloc[full] = caps[full]
            active &= ~full
            continue
        base = np.floor(share).astype(np.int64)
        left = remaining - int(base.sum())
        order = np.argsort(-(share - base), kind="stable")
        base[order[:left]] += 1
        alloc += base
        remaining = 0
    return alloc


def topk_magnitude(x: np.ndarray, ratio: float) -> np.ndarray:
    """Per head and tile, the ``keep_count`` largest |values| of ``x`` [heads, rows, cols]."""
    x = np.asarray(x)
    mask = np.zeros(x.shape, bool)
    for h in range(x.shape[0]):
        for cols in _tiles(x.shape[2]):
            tile = x[h, :, cols]
            mask[h, :, cols] = topk_flat(tile, keep_count(tile.size, ratio))
    return mask


def topk_entropy(x: np.ndarray, ratio: float, head_entropy: np.ndarray) -> np.ndarray:
    """The seed's policy: the layer budget split across heads by attention entropy (``head_entropy``
    [heads], >= 0), then per-tile top-k by magnitude inside each head."""
    x = np.asarray(x)
    heads, rows, cols = x.shape
    head_entropy = np.asarray(head_entropy, np.float64).reshape(-1)
    if head_entropy.shape != (heads,):
        raise ValueError(f"topk_entropy needs one entropy per KV head ({heads}), got {head_entropy.shape}")
    budget = keep_count(x.size, ratio)
    per_head = apportion(budget, head_entropy, np.full(heads, rows * cols))
    tiles = _tiles(cols)
    sizes = np.array([rows * (t.stop - t.start) for t in tiles])
    mask = np.zeros(x.shape, bool)
    for h in range(heads):
        for t, k in zip(tiles, apportion(int(per_head[h]), sizes, sizes), strict=True):
            mask[h, :, t] = topk_flat(x[h, :, t], int(k))
    return mask


def heavy_hitter(
    x: np.ndarray, ratio: float, heat: np.ndarray, first_position: int, seq_len: int, recent: int
) -> np.ndarray:
    """H2O at token level: per head, the rows (tokens at positions ``first_position + i``) of the
    last ``recent`` positions of a ``seq_len``-token sequence, plus the hottest others (``heat``
    [heads, rows]: on the served path ``relative_heat``) up to ``keep_count(rows, ratio)`` tokens."""
    x = np.asarray(x)
    heads, rows, _ = x.shape
    heat = np.asarray(heat, np.float64)
    if heat.shape != (heads, rows):
        raise ValueError(f"heavy_hitter needs heat [{heads} heads, {rows} rows], got {heat.shape}")
    positions = first_position + np.arange(rows)
    is_recent = positions >= seq_len - recent
    budget = keep_count(rows, ratio)
    keep_rows = np.zeros((heads, rows), bool)
    for h in range(heads):
        keep_rows[h] = is_recent
        extra = budget - int(is_recent.sum())
        if extra > 0:
            key = np.where(np.isnan(heat[h]), np.inf, heat[h])
            # hottest first; equal heat: the later token first
            order = np.lexsort((-positions, -key))
            order = order[~is_recent[order]]
            keep_rows[h, order[:extra]] = True
    return np.broadcast_to(keep_rows[:, :, None], x.shape).copy()


# -- attention statistics ---------------------------------------------------------------------


def _grouped(values: np.ndarray, kv_heads: int) -> np.ndarray:
    q_heads = values.shape[0]
    if kv_heads <= 0 or q_heads % kv_heads:
        raise ValueError(f"{q_heads} query heads do not group onto {kv_heads} KV heads")
    return values.reshape(kv_heads, q_heads // kv_heads, *values.shape[1:])


def attention_entropy(probs: np.ndarray, kv_heads: int) -> np.ndarray:
    """Entropy (nats) of attention rows ``probs`` [q_heads, rows, keys], averaged over the rows
    and over the query heads sharing a KV head: [kv_heads].  Zero probabilities contribute 0."""
    p = np.asarray(probs, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, -p * np.log(p), 0.0)
    per_q = terms.sum(axis=2).mean(axis=1)
    return _grouped(per_q, kv_heads).mean(axis=1)


def attention_heat(probs: np.ndarray, kv_heads: int) -> np.ndarray:
    """Attention received by each key position: ``probs`` [q_heads, rows, keys] summed over rows
    and over the query heads of each KV head: [kv_heads, keys].  Heat accumulates over steps by
    adding these."""
    p = np.asarray(probs, np.float64).sum(axis=1)
    return _grouped(p, kv_heads).sum(axis=1)


def relative_heat(heat: np.ndarray, share: np.ndarray) -> np.ndarray:
    """Accumulated attention made comparable across positions: ``heat`` [..., positions] (the
    attention each position received, summed over the query rows that saw it) divided by
    ``share`` [positions], what a uniform head would have given it over the same rows (the sum of
    1 / (positions the row attended) over the rows that attended it).  1 = attended as much as
    uniform attention would have; a position no row has seen yet (share 0) has 0.  The causal
    mask makes raw accumulated heat favour old positions twice: they have been seen by more rows,
    and by early rows that spread their attention over few positions; both cancel here
    (docs/kv-cache.md, "What heat is")."""
    heat = np.asarray(heat, np.float64)
    share = np.asarray(share, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(share > 0, heat / np.where(share > 0, share, 1.0), 0.0)


def heat_entropy(heat: np.ndarray, kv_heads: int) -> np.ndarray:
    """Entropy (nats) of each query head's heat: ``heat`` [q_heads, positions] (on the served path
    ``relative_heat``, the attention received relative to a uniform head's) normalized to a
    distribution over the positions; averaged over the query heads sharing a KV head:
    [kv_heads].  A head whose heat is all zero (or not finite) has entropy 0."""
    h = np.asarray(heat, np.float64)
    total = h.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = h / total
        terms = np.where(p > 0, -p * np.log(p), 0.0)
    ent = terms.sum(axis=1)
    ent = np.where(np.isfinite(ent) & (total[:, 0] > 0), ent, 0.0)
    return _grouped(ent, kv_heads).mean(axis=1)


def dynamic_window_left(heat: np.ndarray, min_window: int, factor: float = HEAT_FACTOR) -> int:
    """The seed's dynamic attention window for the query at position ``pos = len(heat) - 1``:
    ``heat`` [pos + 1] the heat of positions 0..pos (on the served path ``relative_heat``, the mean
    over layers and query heads).  The left edge is the
    furthest (smallest) position whose heat >= ``factor`` x the mean heat of the last
    ``min_window`` positions, and never right of ``pos - min_window + 1`` (the window keeps at
    least ``min_window`` positions; when no position qualifies, e.g. NaN heat, it is exactly
    that).  Positions left of the edge are not attended."""
    heat = np.asarray(heat, np.float64).reshape(-1)
    if heat.size == 0:
        raise ValueError("dynamic_window_left needs the heat of at least one position")
    if min_window < 1:
        raise ValueError(f"min_window must be >= 1, got {min_window}")
    floor_edge = max(0, heat.size - min_window)
    threshold = factor * heat[floor_edge:].mean()
    hot = np.flatnonzero(heat >= threshold)
    return int(min(hot[0], floor_edge)) if hot.size else floor_edge
