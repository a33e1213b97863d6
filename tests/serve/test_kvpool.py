"""The serving KV pool: prefix sharing by chained hashes, LRU-K eviction of chain tails, and never
over-committing, under random operation sequences too."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mcpc.serve import KVPool


def toks(*parts):
    return np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])


PREFIX = np.arange(1000, 1256)  # four full blocks


def test_shared_prefix_is_stored_once():
    pool = KVPool(20)
    a, b = toks(PREFIX, [1, 2, 3]), toks(PREFIX, [7, 8])
    assert pool.admit(0, a, len(a), now=0) == 0  # nothing cached yet
    pool.computed(0, len(a))
    assert pool.used_blocks == 5
    assert pool.admit(1, b, len(b), now=1) == 256  # the four prefix blocks come from the cache
    assert pool.blocks_of(1)[:4] == pool.blocks_of(0)[:4]
    assert pool.used_blocks == 6  # 5 + one block of b's own
    pool.check()
    # a different first block breaks the chain even when later blocks match
    c = toks([0], PREFIX[1:], [5])
    assert pool.admit(2, c, len(c), now=2) == 0
    pool.check()


def test_prefix_hit_leaves_the_last_token_to_compute():
    pool = KVPool(8)
    a = PREFIX[:128]
    pool.admit(0, a, 128, now=0)
    pool.computed(0, 128)
    pool.free(0, now=1)
    assert pool.prefix_hit(a) == 64  # 128 tokens: block 2 holds the last token, which must be computed
    assert pool.admit(1, a, 128, now=2) == 64


def test_lru_k_evicts_single_use_blocks_first_and_only_tails():
    pool = KVPool(4)
    x, y = np.arange(0, 128), np.arange(500, 564)
    pool.admit(0, x, 128, now=0)  # blocks x0, x1 (a chain)
    pool.computed(0, 128)
    pool.free(0, now=1)
    pool.admit(1, toks(x, [1]), 129, now=2)  # x0 and x1 accessed again: two accesses each
    pool.computed(1, 129)
    pool.free(1, now=3)
    pool.admit(2, y, 64, now=4)  # y0: one block used once
    pool.computed(2, 64)
    pool.free(2, now=5)
    assert pool.available == 4 and pool.used_blocks == 0
    # two new blocks: one free block, then y0 (its 2nd-most-recent access is the oldest: only one)
    pool.admit(3, np.arange(900, 1028), 128, now=6)
    assert pool.prefix_hit(toks(y, [0])) == 0
    assert pool.prefix_hit(toks(x, [0])) == 128
    # next victim is x1, the chain's tail, although x0's accesses are as old
    pool.admit(4, np.arange(2000, 2064), 64, now=7)
    assert pool.prefix_hit(toks(x, [0])) == 64
    assert pool.evictions == 2
    pool.check()


def test_admit_refuses_without_changing_anything():
    pool = KVPool(3)
    assert pool.admit(0, np.arange(100), 100, now=0) == 0
    assert pool.admit(1, np.arange(200, 300), 100, now=0) is None  # needs 2, 1 left
    assert pool.used_blocks == 2 and pool.blocks_of(1) == []
    assert pool.ensure(0, 192, now=1) and not pool.ensure(0, 193, now=1)
    assert len(pool.blocks_of(0)) == 3
    pool.check()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5), st.integers(1, 300)), min_size=1, max_size=60)
)
def test_random_operations_keep_the_invariants(ops):
    pool = KVPool(10)
    prefixes = [np.arange(64 * k, 64 * k + 192) for k in range(3)]
    live: dict[int, int] = {}
    for t, (op, who, n) in enumerate(ops):
        if op == 0 and who not in live:
            tokens = toks(prefixes[who % 3][: n % 192], np.arange(10_000 + 1000 * t, 10_000 + 1000 * t + n))
            before = (pool.used_blocks, pool.available)
            hit = pool.admit(who, tokens, len(tokens), now=t)
            if hit is None:
                assert (pool.used_blocks, pool.available) == before
            else:
                assert hit % 64 == 0 and hit < len(tokens)
                live[who] = len(tokens)
                pool.computed(who, len(tokens))
        elif op == 1 and who in live:
            if pool.ensure(who, live[who] + n, now=t):
                live[who] += n
        elif op == 2 and who in live:
            pool.free(who, now=t)
            del live[who]
        pool.check()
        assert pool.used_blocks <= pool.num_blocks
        assert sum(-(-c // 64) for c in live.values()) >= pool.used_blocks  # shared blocks count once
