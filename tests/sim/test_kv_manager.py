"""mcpc.sim.kv_manager: block tables, chained-hash prefix sharing, LRU-K eviction, byte accounting.

The property test drives random add/append/free programs (token ids from a tiny alphabet so that
prefixes collide) against a model of the cache contents: every slot a sequence appends is "written"
with the hash of the sequence's tokens up to that position, and every sequence must read back its
own history through its block table — a block shared or evicted wrongly shows up as a wrong read.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcpc.errors import EXIT_DOES_NOT_FIT, InputError
from mcpc.sim.kv_manager import ROOT_HASH, KVManager, OutOfBlocks, block_hash

B = 4  # small blocks keep the examples readable; the decoder uses 64


def test_block_table_and_slots():
    kv = KVManager(8, block=B)
    kv.add_sequence("a")
    assert kv.append("a", [1, 2, 3]) == [0, 1, 2]
    assert kv.append("a", [4, 5]) == [3, 4]  # the second block is block 1
    assert kv.block_table("a") == [0, 1]
    assert kv.slot("a", 4) == 4 and kv.num_tokens("a") == 5
    kv.add_sequence("b")
    assert kv.append("b", [9]) == [8]
    assert kv.trash_block == 8 and 8 not in kv.block_table("a") + kv.block_table("b")


def test_block_hash_is_chained_sha256():
    import hashlib

    toks = [1, 2, 3, 4]
    want = hashlib.sha256(ROOT_HASH + b"".join(t.to_bytes(8, "little") for t in toks)).digest()
    assert block_hash(ROOT_HASH, toks) == want
    assert block_hash(want, toks) != want  # the same tokens under another parent hash differently


def test_shared_prefix_is_stored_once_and_the_last_prompt_token_is_computed():
    kv = KVManager(16, block=B, bytes_per_block=100)
    system = [7, 7, 7, 7, 8, 8, 8, 8]  # two full blocks
    assert kv.add_sequence("a", system + [1, 2]) == 0
    kv.append("a", system + [1, 2])
    assert kv.add_sequence("b", system + [3]) == 8
    assert kv.block_table("b") == kv.block_table("a")[:2]
    assert kv.refcount(kv.block_table("a")[0]) == 2
    kv.append("b", [3])
    assert kv.kv_bytes == 400  # a: 3 blocks, b: one own block, 2 shared
    assert kv.unshared_bytes == 600 and kv.peak_unshared_bytes == 600
    # a prompt that is exactly the cached blocks reuses all but the last block (its logits are needed)
    assert kv.add_sequence("c", system) == 4
    assert kv.prefix_hit_tokens == 12


def test_a_prompt_diverging_inside_a_block_shares_only_the_full_blocks_before():
    kv = KVManager(16, block=B)
    kv.add_sequence("a")
    kv.append("a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert kv.add_sequence("b", [1, 2, 3, 4, 5, 6, 0, 8, 9]) == 4
    assert kv.add_sequence("c", [2, 2, 3, 4, 5, 6, 7, 8, 9]) == 0  # first block differs: no hit


def test_freed_blocks_stay_cached_until_needed_and_a_partial_block_is_freed_at_once():
    kv = KVManager(4, block=B, bytes_per_block=10)
    kv.add_sequence("a")
    kv.append("a", [1, 2, 3, 4, 5, 6])
    kv.free("a")
    assert kv.kv_bytes == 0 and kv.peak_kv_bytes == 20
    assert kv.cached_blocks == 1 and kv.free_blocks == 4  # the full block cached, the partial one free
    assert kv.add_sequence("b", [1, 2, 3, 4, 9]) == 4  # revived by a prefix hit
    assert kv.cached_blocks == 0 and kv.kv_bytes == 10


def test_out_of_blocks_changes_nothing_and_names_the_way_out():
    kv = KVManager(2, block=B)
    kv.add_sequence("a")
    kv.append("a", [1, 2, 3, 4, 5])
    assert not kv.can_append("a", 4) and kv.can_append("a", 3)
    with pytest.raises(OutOfBlocks, match="--kv-blocks") as err:
        kv.append("a", [1, 2, 3, 4])
    assert err.value.exit_code == EXIT_DOES_NOT_FIT
    assert kv.num_tokens("a") == 5 and kv.block_table("a") == [0, 1]


def test_max_tokens_and_unknown_sequences_are_refused():
    kv = KVManager(8, block=B, max_tokens=6)
    kv.add_sequence("a")
    with pytest.raises(InputError, match="--max-seq"):
        kv.append("a", range(7))
    with pytest.raises(InputError, match="no sequence"):
        kv.append("z", [1])
    with pytest.raises(InputError, match="already exists"):
        kv.add_sequence("a")


def _one_block_seq(kv, name, first, uses=1):
    """A sequence whose prompt fills one block (tokens first..first+3), used ``uses`` times."""
    toks = list(range(first, first + B))
    for u in range(uses):
        kv.add_sequence((name, u), toks + [0])
        kv.append((name, u), (toks + [0])[kv.num_tokens((name, u)) :])
        kv.free((name, u))
    return toks


def test_lru_k_evicts_blocks_used_once_first_then_the_oldest_second_access():
    # 5 blocks; three cached full blocks X (used twice, early), Y (used once, latest), Z (used twice)
    kv = KVManager(5, block=B)
    x = _one_block_seq(kv, "x", 100, uses=2)
    y = _one_block_seq(kv, "y", 200, uses=1)
    z = _one_block_seq(kv, "z", 300, uses=2)
    assert kv.cached_blocks == 3
    kv.add_sequence("n")
    kv.append("n", range(2 * B))  # two free blocks: nothing evicted yet
    assert kv.evictions == 0
    kv.append("n", range(B))  # one more: Y goes first although it was used last (used once)
    assert kv.add_sequence("py", y + [0]) == 0
    assert kv.add_sequence("pz", z + [0]) == B
    kv.free("pz")
    assert kv.add_sequence("px", x + [0]) == B
    kv.free("px")
    # X was used last (plain LRU would evict Z), but its second-most-recent access (its 2nd use)
    # is older than Z's (Z's 2nd use came after it): LRU-2 evicts X
    kv.append("n", range(B))
    assert kv.add_sequence("qz", z + [0]) == B
    assert kv.add_sequence("qx", x + [0]) == 0


def test_lru_k_ties_among_blocks_used_once_go_by_least_recent_use():
    kv = KVManager(3, block=B)
    a = _one_block_seq(kv, "a", 10)
    b = _one_block_seq(kv, "b", 20)
    c = _one_block_seq(kv, "c", 30)
    kv.add_sequence("n")
    kv.append("n", range(2 * B))  # evicts a, then b (c, used last, survives)
    assert [kv.add_sequence(s, t + [0]) for s, t in (("qa", a), ("qb", b), ("qc", c))] == [0, 0, B]


def test_only_a_chains_tail_is_evicted():
    # a two-block chain P -> C, C used twice (later than P's first use), P twice too; an unrelated
    # block U used twice after both.  The parent P has the oldest history but is not a tail: C goes.
    kv = KVManager(4, block=B)
    chain = list(range(1, 2 * B + 1))
    for u in range(2):
        kv.add_sequence(("c", u), chain + [0])
        kv.append(("c", u), (chain + [0])[kv.num_tokens(("c", u)) :])
        kv.free(("c", u))
    u_toks = _one_block_seq(kv, "u", 50, uses=2)
    assert kv.cached_blocks == 3
    kv.add_sequence("n")
    kv.append("n", range(2 * B))  # one free block, then one eviction: the chain's tail C
    assert kv.add_sequence("q", chain + [0]) == B  # P still cached, C gone
    assert kv.add_sequence("qu", u_toks + [0]) == B


def test_block_bytes_from_a_function_and_per_block_updates():
    kv = KVManager(4, block=B, bytes_per_block=lambda bid: 100 + bid)
    kv.add_sequence("a")
    kv.append("a", range(2 * B))
    assert kv.kv_bytes == 201
    kv.set_block_bytes(1, 30)  # block 1 compressed
    assert kv.kv_bytes == 130 and kv.bytes_of(["a"]) == 130 and kv.peak_kv_bytes == 201
    kv.free("a")
    assert kv.kv_bytes == 0 and kv.unshared_bytes == 0


def test_without_prefix_sharing_nothing_is_shared():
    kv = KVManager(8, block=B, prefix_sharing=False)
    kv.add_sequence("a")
    kv.append("a", range(2 * B))
    assert kv.add_sequence("b", list(range(2 * B)) + [1]) == 0
    kv.free("a")
    assert kv.cached_blocks == 0 and kv.free_blocks == 8


# ------------------------------------------------------------------------------- properties
ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 5), st.lists(st.integers(0, 2), max_size=14)),
        st.tuples(st.just("append"), st.integers(0, 5), st.lists(st.integers(0, 2), max_size=9)),
        st.tuples(st.just("free"), st.integers(0, 5), st.just([])),
    ),
    max_size=60,
)


def _check_invariants(kv: KVManager, written: dict, history: dict) -> None:
    owners: dict[int, int] = {}
    for seq in kv.sequences:
        table = kv.block_table(seq)
        assert len(set(table)) == len(table), "a block twice in one sequence"
        assert len(table) == -(-kv.num_tokens(seq) // kv.block)
        for bid in table:
            assert 0 <= bid < kv.num_blocks  # never the trash block
            owners[bid] = owners.get(bid, 0) + 1
        toks = kv.tokens(seq)
        assert toks == history[seq]
        for i in range(len(toks)):  # every position reads back this sequence's own history
            assert written[kv.slot(seq, i)] == tuple(toks[: i + 1])
    for bid, n in owners.items():
        assert kv.refcount(bid) == n
    assert kv.used_blocks == len(owners)
    assert len(kv._free) + kv.cached_blocks + kv.used_blocks == kv.num_blocks  # no block leaked
    assert not set(kv._free) & (set(owners) | {b for b, blk in kv._blocks.items() if blk.refs == 0})
    assert len(set(kv._free)) == len(kv._free)
    assert kv.kv_bytes == sum(kv.block_bytes(b) for b in owners)
    assert kv.unshared_bytes == sum(kv.block_bytes(b) * n for b, n in owners.items())
    for bid, blk in kv._blocks.items():  # cached chains: parents cached, child counts right
        if blk.hash is not None:
            assert kv._cache[blk.hash] == bid
            if blk.parent is not None:
                assert kv._blocks[blk.parent].hash is not None
        assert blk.children == sum(1 for c in kv._blocks.values() if c.hash is not None and c.parent == bid)


@settings(max_examples=150, deadline=None)
@given(ops, st.integers(3, 12))
def test_random_programs_keep_every_invariant(program, num_blocks):
    kv = KVManager(num_blocks, block=B, bytes_per_block=lambda bid: 10 + bid)
    written: dict[int, tuple] = {}  # slot -> the writer's token history up to that slot
    history: dict[int, list] = {}
    for op, seq, toks in program:
        if op == "add" and seq not in kv:
            cached = kv.add_sequence(seq, toks)
            assert cached % B == 0 and cached <= max(len(toks) - 1, 0)
            history[seq] = toks[:cached]
            rest = toks[cached:]
            if kv.can_append(seq, len(rest)):
                slots = kv.append(seq, rest)
                for i, s in enumerate(slots):
                    written[s] = tuple(toks[: cached + i + 1])
                history[seq] = list(toks)
            else:
                with pytest.raises(OutOfBlocks):
                    kv.append(seq, rest)
        elif op == "append" and seq in kv:
            base = history[seq]
            if kv.can_append(seq, len(toks)):
                for i, s in enumerate(kv.append(seq, toks)):
                    written[s] = tuple(base + toks[: i + 1])
                history[seq] = base + toks
            else:
                with pytest.raises(OutOfBlocks):
                    kv.append(seq, toks)
        elif op == "free" and seq in kv:
            kv.free(seq)
            del history[seq]
        _check_invariants(kv, written, history)
