"""The serving scheduler's KV cache: the host's ``KVManager`` (``mcpc.sim.kv_manager``: 64-token
blocks, chained SHA-256 prefix sharing with refcounts, LRU-2 eviction of cached chain tails) plus
the one thing a scheduler adds, *reservations*.

A sequence is admitted with a reservation of tokens (a request-level batch reserves its prompt and
output, continuous batching its prompt): the blocks that reservation still needs are promised to it,
and nothing else may take them, so an admitted sequence always finds room for what it reserved.
Growth beyond the reservation (a continuous-batching decode step crossing a block boundary) takes
a block only when one is free beyond every promise; otherwise ``append`` answers False and changes
nothing (the scheduler preempts).  Invariant, checked by ``check``: the blocks free or evictable in
the manager cover every outstanding promise, so the pool is never over-committed.

Tokens reach the manager when the iteration that computes them is planned (a prefill chunk, a decode
step's input token); a prefix hit at admission can only find blocks of earlier iterations, which
have completed, because admissions are made before the iteration's appends.
"""

from __future__ import annotations

import numpy as np

from mcpc.sim.kv_manager import KVManager


class ServingKV:
    """``KVManager`` of ``num_blocks`` blocks of ``block`` tokens with per-sequence reservations."""

    def __init__(
        self, num_blocks: int, block: int = 64, bytes_per_token: int = 0, max_tokens: int | None = None
    ):
        self.kv = KVManager(num_blocks, block, bytes_per_block=block * bytes_per_token, max_tokens=max_tokens)
        self.num_blocks, self.block = num_blocks, block
        self._reserve: dict[int, int] = {}  # seq -> blocks reserved
        self._tokens: dict[int, int] = {}  # seq -> tokens appended (pending ones included)
        # tokens that fit the last block of their sequence wait here and reach the manager when the
        # sequence next needs a block or ends: the same blocks, hashes and refcounts, far fewer calls
        # (a decode step appends one token per sequence)
        self._pending: dict[int, list[int]] = {}
        self._promised = 0  # reserved blocks not yet allocated, over all sequences
        self.hit_tokens = 0
        self.lookup_tokens = 0

    def _blocks(self, seq: int) -> int:
        return -(-self._tokens[seq] // self.block)

    def num_tokens(self, seq: int) -> int:
        return self._tokens[seq]

    def _flush(self, seq: int) -> None:
        pending = self._pending.get(seq)
        if pending:
            self.kv.append(seq, pending)
            pending.clear()

    def _owed(self, seq: int) -> int:
        return max(0, self._reserve[seq] - self._blocks(seq))

    @property
    def used_blocks(self) -> int:
        return self.kv.used_blocks

    @property
    def spare(self) -> int:
        """Blocks free or evictable beyond every promise."""
        return self.kv.free_blocks - self._promised

    def admit(self, seq: int, tokens: np.ndarray, reserve: int, keep: int = 0) -> int | None:
        """Start ``seq`` reusing the cached prefix of ``tokens`` and reserve blocks for ``reserve``
        tokens, leaving ``keep`` spare blocks; returns the tokens already cached, or None (nothing
        changed) when it does not fit."""
        blocks = -(-max(reserve, len(tokens)) // self.block)
        if blocks - (len(tokens) - 1) // self.block > self.spare - keep:
            return None  # even the best prefix hit could not make it fit: do not touch the cache
        hit = self.kv.add_sequence(seq, tokens.tolist())
        owed = blocks - hit // self.block
        if owed > self.spare - keep:  # the hit was too short: undo (the LRU clock saw one more access)
            self.kv.free(seq)
            return None
        self._reserve[seq] = blocks
        self._tokens[seq] = hit
        self._pending[seq] = []
        self._promised += owed
        self.hit_tokens += hit
        self.lookup_tokens += len(tokens)
        return hit

    def extra_blocks(self, seq: int, count: int) -> int:
        """Blocks beyond ``seq``'s reservation that appending ``count`` tokens would take."""
        n = self._tokens[seq]
        if n % self.block and n % self.block + count <= self.block:
            return 0  # fits its last block (a decode step, mostly)
        return max(0, -(-(n + count) // self.block) - -(-n // self.block) - self._owed(seq))

    def append(self, seq: int, tokens) -> bool:
        """Append ``tokens`` to ``seq``; False (nothing changed) when that needs a block that is
        neither reserved for ``seq`` nor spare."""
        n, count = self._tokens[seq], len(tokens)
        if n % self.block and n % self.block + count <= self.block:  # within its last block
            self._pending[seq].extend(tokens.tolist() if isinstance(tokens, np.ndarray) else tokens)
            self._tokens[seq] = n + count
            return True
        need = -(-(n + count) // self.block) - -(-n // self.block)
        owed = self._owed(seq)
        if need > owed + self.spare:
            return False
        self._flush(seq)
        self.kv.append(seq, tokens)  # an array or list of ints (the manager takes either)
        self._tokens[seq] = n + count
        self._promised -= min(need, owed)
        return True

    def free(self, seq: int) -> None:
        self._promised -= self._owed(seq)
        self._flush(seq)
        del self._reserve[seq], self._tokens[seq], self._pending[seq]
        self.kv.free(seq)

    def check(self, live: list[int]) -> None:
        """The invariants (the tests call this after every iteration)."""
        for s in live:
            self._flush(s)
            assert self.kv.num_tokens(s) == self._tokens[s]
        assert self._promised == sum(self._owed(s) for s in self._reserve), "promises out of step"
        assert self.spare >= 0, "KV over-committed"
        assert sorted(self._reserve) == sorted(live) == sorted(self.kv.sequences)
        refs: dict[int, int] = {}
        for s in live:
            table = self.kv.block_table(s)
            assert len(table) == -(-self.kv.num_tokens(s) // self.block)
            for b in table:
                refs[b] = refs.get(b, 0) + 1
        assert all(self.kv.refcount(b) == n for b, n in refs.items())
        assert self.kv.used_blocks == len(refs) <= self.num_blocks
