"""What the host makes of the attention heat (docs/kv-cache.md, "What heat is"): ``AttentionHeat``
counts the rows that attended each position and the share a uniform head would have given it, and
the policies and the dynamic window read the accumulated heat relative to that share.  Synthetic
attention patterns, fed as the ``kv_heat`` global a program would write, one call at a time."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from mcpc.kv import dynamic_window_left, relative_heat
from mcpc.kv.policies import heavy_hitter
from mcpc.sim.kv_store import AttentionHeat

LAYERS, QH, KVH, MAX_SEQ = 2, 4, 2, 128


class _Fake:
    """The session and META an AttentionHeat reads: one sequence, gathered from row 0."""

    def __init__(self, min_window=None):
        self.meta = SimpleNamespace(
            layers=LAYERS, q_heads=QH, kv_heads=KVH, max_seq=MAX_SEQ,
            heat={"global": "kv_heat", "positions": MAX_SEQ, "min_window": min_window},
        )  # fmt: skip
        self.buf = np.zeros((LAYERS, MAX_SEQ, QH), np.float32)
        self.heat = AttentionHeat(self.meta, self)

    def persistent_view(self, name):
        assert name == "kv_heat"
        return self.buf

    def step(self, pos: int, probs: np.ndarray, left: int = 0) -> None:
        """One decode call: the row at ``pos`` attended positions left..pos with ``probs``."""
        self.buf[:] = 0
        self.buf[:, left : pos + 1, :] = np.asarray(probs, np.float32)[None, :, None]
        self.heat.after_call([("s", 0, pos + 1, np.array([[left, pos]]))])


def _uniform(pos, left=0):
    return np.full(pos + 1 - left, 1.0 / (pos + 1 - left))


def _local(pos, left=0, width=4):
    """Most of the attention on the last ``width`` positions, a little spread over the others."""
    n = pos + 1 - left
    p = np.full(n, 0.1 / n)
    p[-min(width, n) :] += 0.9 / min(width, n)
    return p / p.sum()


def test_counts_and_uniform_shares_follow_the_rows_spans():
    f = _Fake()
    for pos in range(10):
        f.step(pos, _uniform(pos))
    f.step(10, _uniform(10, left=4), left=4)  # a narrowed row: positions 0..3 not attended
    counts, shares = f.heat.counts["s"], f.heat.shares["s"]
    assert counts[:11].tolist() == [10, 9, 8, 7, 7, 6, 5, 4, 3, 2, 1] and not counts[11:].any()
    want = [sum(1 / (q + 1) for q in range(p, 10)) + (1 / 7 if p >= 4 else 0) for p in range(11)]
    np.testing.assert_allclose(shares[:11], want)
    # uniform attention is exactly the uniform share: relative heat 1 everywhere it was attended
    np.testing.assert_allclose(f.heat.relative("s", None, 0, 11), 1.0, rtol=1e-6)
    np.testing.assert_allclose(f.heat.kv_heat("s", 1, 0, 11), 1.0, rtol=1e-6)
    assert (f.heat.relative("s", 0, 11, 20) == 0).all()  # never attended: 0
    raw = f.heat.seqs["s"][0, 0, :11]
    assert raw[0] > 2.5 * raw[9]  # what accumulated heat says of the same uniform attention
    f.heat.free("s")
    assert "s" not in f.heat.counts and (f.heat.relative("s", 0, 0, 5) == 0).all()


def test_relative_heat_divides_by_the_uniform_share():
    heat = np.array([[2.0, 1.0, 0.0], [np.nan, 3.0, 1.0]])
    np.testing.assert_allclose(relative_heat(heat, np.array([4.0, 0.5, 0.0]))[0], [0.5, 2.0, 0.0])
    assert np.isnan(relative_heat(heat, np.array([4.0, 0.5, 0.0]))[1, 0])  # NaN stays NaN


def test_heavy_hitter_keeps_the_tokens_hot_per_query_not_the_oldest():
    """Position 56 gets a tenth of every row's attention from when it appears on (about 6 times a
    uniform share); the others get uniform attention.  Accumulated heat still ranks the oldest
    positions first (they were attended by more rows, and by rows that had few positions to
    attend); relative heat ranks 56 first, and heavy_hitter keeps it."""
    f = _Fake()
    for pos in range(64):
        p = _uniform(pos)
        if pos >= 56:
            p = 0.9 * p
            p[56] += 0.1
        f.step(pos, p)
    rel = f.heat.kv_heat("s", 0, 0, 64)
    raw = f.heat.seqs["s"][0].reshape(KVH, QH // KVH, MAX_SEQ).sum(axis=1)[:, :64]
    assert (raw[:, 0] > 3 * raw[:, 56]).all()  # the bias: position 0 looks hotter than 56
    assert (rel.argmax(axis=1) == 56).all()
    x = np.ones((KVH, 64, 8), np.float32)
    keep_rel = heavy_hitter(x, 0.9, rel, 0, 64, 4)[:, :, 0]  # 7 tokens: 4 recent + 3 hottest
    keep_raw = heavy_hitter(x, 0.9, raw, 0, 64, 4)[:, :, 0]
    assert keep_rel[:, 56].all() and not keep_raw[:, 56].any()
    assert keep_raw[:, :3].all()  # accumulated heat keeps the three oldest


def test_the_dynamic_window_moves_when_recent_positions_are_hot():
    """Local attention (each row mostly on its last 4 positions): the relative heat of old
    positions falls below 0.6 x the mean of the last min_window, so the edge moves right; under
    uniform attention it stays at 0.  Accumulated heat would keep it at 0 in both."""
    mw = 8
    local, uniform = _Fake(mw), _Fake(mw)
    edges = []
    for pos in range(80):
        left = local.heat.window_left("s", pos)
        assert 0 <= left <= max(0, pos - mw + 1)
        edges.append(left)
        local.step(pos, _local(pos, left), left)
        assert uniform.heat.window_left("s", pos) == 0
        uniform.step(pos, _uniform(pos))
    assert edges[40] > 0 and edges[-1] >= 40, edges
    # the edge is the rule over the relative heat of the positions attended before the call
    heat = local.heat.relative("s", None, 0, 79).mean(axis=(0, 1))
    assert local.heat.window_left("s", 79) == min(dynamic_window_left(heat, mw), 79 - mw + 1)
    raw = local.heat.seqs["s"][:, :, :79].sum(axis=(0, 1))
    assert dynamic_window_left(raw, mw) == 0  # the rule on accumulated heat: never moves


def test_the_window_reads_only_positions_attended_before():
    """A prefill chunk's rows have no heat yet: the first call's edges are 0, and the rule's mean
    of the last min_window positions is over positions some earlier row attended."""
    f = _Fake(min_window=4)
    assert all(f.heat.window_left("s", pos) == 0 for pos in range(16))  # nothing attended yet
    f.buf[:] = 0
    for q in range(16):  # a 16-row prefill, each row local
        f.buf[:, : q + 1, :] += _local(q)[None, :, None].astype(np.float32)
    spans = np.stack([np.zeros(16, np.int64), np.arange(16)], 1)
    f.heat.after_call([("s", 0, 16, spans)])
    assert f.heat.counts["s"][:16].tolist() == list(range(16, 0, -1))
    heat = f.heat.relative("s", None, 0, 16).mean(axis=(0, 1))
    for pos in (16, 17, 20):  # positions 16.. are this call's: not part of the rule
        assert f.heat.window_left("s", pos) == min(dynamic_window_left(heat, 4), pos - 3)
