"""Sparsity policies: keep counts, which values they keep, the entropy split, H2O, the heat window."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mcpc.kv import policies
from mcpc.kv.policies import (
    apportion,
    attention_entropy,
    attention_heat,
    dynamic_window_left,
    heavy_hitter,
    keep_count,
    topk_entropy,
    topk_magnitude,
)

ratios = st.sampled_from([0.0, 0.3, 0.5, 0.7, 0.875, 0.9, 0.99])
shapes = st.tuples(st.integers(1, 3), st.integers(1, 64), st.sampled_from([1, 16, 64, 100, 128]))


def test_keep_count():
    assert keep_count(4096, 0.7) == 1229 and keep_count(10, 0.7) == 3 and keep_count(100, 0.29) == 71
    assert keep_count(64, 0.0) == 64 and keep_count(1, 0.99) == 1 and keep_count(0, 0.5) == 0
    with pytest.raises(ValueError):
        keep_count(10, 1.0)


@settings(max_examples=100, deadline=None)
@given(shapes, ratios, st.integers(0, 2**16))
def test_topk_magnitude_keeps_the_largest_per_tile(shape, ratio, seed):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    mask = topk_magnitude(x, ratio)
    for h in range(shape[0]):
        for c in range(0, shape[2], 64):
            tile, m = np.abs(x[h, :, c : c + 64]), mask[h, :, c : c + 64]
            assert m.sum() == keep_count(tile.size, ratio)
            if m.any() and (~m).any():
                assert tile[m].min() >= tile[~m].max()


def test_topk_ties_and_non_finite_values():
    x = np.array([[[1.0, -1.0, 1.0, np.nan, 0.5, -np.inf]]], np.float32)
    mask = topk_magnitude(x, 0.5)[0, 0]
    assert mask.tolist() == [True, False, False, True, False, True]  # NaN, -inf, then the first 1


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 10_000), hnp.arrays(np.float64, st.integers(1, 6), elements=st.floats(0, 10)),
       st.integers(0, 2**16))  # fmt: skip
def test_apportion_sums_caps_and_proportion(total, weights, seed):
    caps = np.random.default_rng(seed).integers(0, 3000, weights.size)
    alloc = apportion(total, weights, caps)
    assert alloc.sum() == min(total, caps.sum()) and (alloc >= 0).all() and (alloc <= caps).all()
    free = alloc < caps  # heads not at their cap share in proportion, within one unit
    if free.sum() >= 2 and weights[free].sum() > 0:
        w = weights[free] / weights[free].sum()
        rest = alloc[free].sum()
        assert (np.abs(alloc[free] - rest * w) <= 1 + 1e-9 * rest).all()


def test_topk_entropy_splits_the_layer_budget_by_entropy():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 64, 64)).astype(np.float16)
    mask = topk_entropy(x, 0.7, np.array([1.0, 2.0, 3.0]))
    budget = keep_count(x.size, 0.7)  # 3687 of 12288
    assert mask.sum() == budget
    per_head = mask.reshape(3, -1).sum(axis=1)
    assert per_head.tolist() == [615, 1229, 1843]  # 1/6, 2/6, 3/6 of 3687, largest remainders
    for h in range(3):  # inside a head: top-k by magnitude
        a, m = np.abs(x[h].astype(np.float32)), mask[h]
        assert a[m].min() >= a[~m].max()
    # a head cannot keep more than it holds: the excess goes to the others
    capped = topk_entropy(x, 0.5, np.array([100.0, 1.0, 1.0])).reshape(3, -1).sum(axis=1)
    assert capped.tolist() == [4096, 1024, 1024] and capped.sum() == keep_count(x.size, 0.5)
    equal = topk_entropy(x, 0.7, np.zeros(3)).reshape(3, -1).sum(axis=1)
    assert equal.tolist() == [1229, 1229, 1229]
    two_tiles = topk_entropy(rng.standard_normal((2, 64, 128)), 0.7, np.array([1.0, 1.0]))
    assert two_tiles[:, :, :64].sum(axis=(1, 2)).tolist() == two_tiles[:, :, 64:].sum(axis=(1, 2)).tolist()


@settings(max_examples=100, deadline=None)
@given(shapes, ratios, st.integers(0, 2**16))
def test_topk_entropy_keep_count_is_the_layer_budget(shape, ratio, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    mask = topk_entropy(x, ratio, rng.random(shape[0]))
    assert mask.sum() == keep_count(x.size, ratio)


def test_heavy_hitter_keeps_recent_tokens_and_hot_ones():
    x = np.ones((2, 64, 16), np.float32)
    heat = np.zeros((2, 64))
    heat[0, [3, 10, 20, 30]] = [5, 4, 3, 2]
    heat[1, [1, 2]] = [9, 9]
    mask = heavy_hitter(x, 0.7, heat, first_position=0, seq_len=64, recent=16)
    rows = mask.any(axis=2)
    assert (mask == rows[:, :, None]).all()  # whole rows
    assert rows.sum(axis=1).tolist() == [20, 20]  # keep_count(64, 0.7) = 20 tokens
    assert rows[:, 48:].all()  # the last 16 positions of the sequence
    assert sorted(np.flatnonzero(rows[0, :48])) == [3, 10, 20, 30]
    assert set(np.flatnonzero(rows[1, :48])) >= {1, 2}
    # equal heat: the later tokens first
    assert sorted(np.flatnonzero(rows[1, :48]))[-2:] == [46, 47]
    # an old block (its positions far from the end): no recent token, the hottest 20
    old = heavy_hitter(x, 0.7, heat, first_position=0, seq_len=1000, recent=16).any(axis=2)
    assert old.sum(axis=1).tolist() == [20, 20] and old[0, [3, 10, 20, 30]].all()
    # a recent window larger than the budget keeps the whole window
    wide = heavy_hitter(x, 0.9, heat, first_position=0, seq_len=64, recent=32).any(axis=2)
    assert wide.sum(axis=1).tolist() == [32, 32]


def test_attention_statistics_group_query_heads():
    p = np.zeros((4, 2, 3))  # 4 query heads, 2 rows, 3 keys
    p[0] = [[1, 0, 0], [1, 0, 0]]
    p[1] = [[0.5, 0.5, 0], [1, 0, 0]]
    p[2] = np.full((2, 3), 1 / 3)
    p[3] = np.full((2, 3), 1 / 3)
    ent = attention_entropy(p, kv_heads=2)
    assert np.allclose(ent, [np.log(2) / 4, np.log(3)])
    heat = attention_heat(p, kv_heads=2)
    assert np.allclose(heat, [[3.5, 0.5, 0.0], [4 / 3, 4 / 3, 4 / 3]])
    with pytest.raises(ValueError, match="do not group"):
        attention_entropy(p, kv_heads=3)


def test_dynamic_window_rule():
    heat = np.array([9.0, 0.1, 0.1, 5.0, 0.2, 1.0, 1.0, 1.0])
    # mean of the last 3 = 1.0; furthest position with heat >= 0.6 is 0
    assert dynamic_window_left(heat, min_window=3) == 0
    heat[0] = 0.5  # now the furthest hot one is position 3
    assert dynamic_window_left(heat, min_window=3) == 3
    cold = np.array([0.1, 0.1, 0.1, 0.1, 2.0, 1.0])
    assert dynamic_window_left(cold, min_window=2) == 4  # the last min_window positions always
    assert dynamic_window_left(cold, min_window=100) == 0
    assert dynamic_window_left(np.full(6, np.nan), min_window=2) == 4
    assert dynamic_window_left(np.zeros(5), min_window=2) == 0
    assert policies.HEAT_FACTOR == 0.6


@settings(max_examples=200, deadline=None)
@given(
    hnp.arrays(
        np.float32, st.integers(1, 300), elements=st.sampled_from([0.0, 1.0, -1.0, 2.5, np.nan, np.inf])
    ),
    st.integers(0, 300),
)
def test_topk_flat_is_a_stable_sort(x, k):
    """The O(n) selection equals the definition: a stable sort by rank key, the first k."""
    key = np.where(np.isfinite(np.abs(x)), np.abs(x), np.inf)
    want = np.zeros(x.size, bool)
    want[np.argsort(-key, kind="stable")[:k]] = True
    assert (policies.topk_flat(x, k) == want).all()


def test_heat_entropy_is_the_entropy_of_each_heads_pooled_attention():
    from mcpc.kv import heat_entropy

    heat = np.array([[1.0, 1, 1, 1], [4, 0, 0, 0], [3, 1, 0, 0], [0, 0, 0, 0]])  # 4 query heads
    p = np.array([0.75, 0.25])
    want_q = [np.log(4), 0.0, -(p * np.log(p)).sum(), 0.0]  # all-zero heat: 0
    np.testing.assert_allclose(heat_entropy(heat, 4), want_q)
    np.testing.assert_allclose(heat_entropy(heat, 2), [np.log(4) / 2, want_q[2] / 2])  # mean per KV head
    np.testing.assert_allclose(heat_entropy(heat * 7.5, 2), heat_entropy(heat, 2))  # scale-free
