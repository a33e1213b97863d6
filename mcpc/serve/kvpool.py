"""The serving simulator's view of the paged KV cache: which blocks each sequence holds.

Semantics of the decoder build's KV manager (64-token blocks, the trash block never handed out):
a sequence holds a list of blocks; a FULL block is named by a chained SHA-256 hash (parent hash +
the block's token ids), so a prompt starting with an already cached chain reuses those blocks
(prefix sharing, refcounted) and skips their prefill.  When a sequence ends its hashed blocks stay
cached, unreferenced, until a new block is needed: then LRU-K (K = 2) evicts the cached block whose
second-most-recent access is oldest (a block used once goes first; ties by the most recent access),
and only ever a chain's tail (a block no cached block extends), so every cached chain stays a
prefix.  Blocks without a hash (partly filled) go straight back to the free list.

``ensure`` never over-commits: it grows a sequence only when free or evictable blocks exist, else
answers False and changes nothing (the scheduler then preempts or waits).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

import numpy as np


@dataclass
class _Block:
    id: int
    refs: int = 0
    hash: bytes | None = None
    parent: bytes | None = None
    children: int = 0  # cached blocks whose parent hash is this block's
    access: list[float] = field(default_factory=list)  # the last two access times


class KVPool:
    """``num_blocks`` blocks of ``block`` tokens (ids 0..num_blocks-1; the trash block is not here)."""

    def __init__(self, num_blocks: int, block: int = 64):
        self.num_blocks, self.block = int(num_blocks), int(block)
        self._blocks = [_Block(i) for i in range(self.num_blocks)]
        self._free = list(range(self.num_blocks - 1, -1, -1))  # pop() hands out low ids first
        self._cached: dict[bytes, int] = {}  # hash -> block id (referenced or not)
        self._evictable: set[int] = set()  # cached, unreferenced, chain tails or not
        self._seqs: dict[int, list[int]] = {}
        self._hashed: dict[int, int] = {}  # seq -> how many of its blocks carry their hash
        self._tokens: dict[int, np.ndarray] = {}
        self.hit_tokens = 0
        self.lookup_tokens = 0
        self.evictions = 0

    # -- accounting -------------------------------------------------------------------------
    @property
    def used_blocks(self) -> int:
        """Blocks referenced by a live sequence."""
        return self.num_blocks - len(self._free) - len(self._evictable)

    @property
    def available(self) -> int:
        """Blocks a new allocation may take: free plus evictable cached ones."""
        return len(self._free) + len(self._evictable)

    def blocks_of(self, seq: int) -> list[int]:
        return list(self._seqs.get(seq, ()))

    def check(self) -> None:
        """Assert the invariants (used by the tests after every step)."""
        refs = [0] * self.num_blocks
        for blocks in self._seqs.values():
            for b in blocks:
                refs[b] += 1
        assert refs == [b.refs for b in self._blocks], "refcounts disagree with the sequences' blocks"
        assert len(set(self._free)) == len(self._free)
        assert not set(self._free) & self._evictable
        assert all(self._blocks[b].refs == 0 for b in self._free + list(self._evictable))
        assert self.used_blocks + self.available == self.num_blocks

    # -- the chain of hashes -----------------------------------------------------------------
    def _hashes(self, tokens: np.ndarray) -> list[bytes]:
        out, parent = [], b""
        for i in range(len(tokens) // self.block):
            chunk = np.ascontiguousarray(tokens[i * self.block : (i + 1) * self.block], dtype=np.int64)
            parent = hashlib.sha256(parent + chunk.tobytes()).digest()
            out.append(parent)
        return out

    def _touch(self, b: _Block, now: float) -> None:
        b.access = (b.access + [now])[-2:]

    def _take(self) -> int | None:
        if self._free:
            return self._free.pop()
        tails = [i for i in self._evictable if self._blocks[i].children == 0]
        if not tails:
            return None

        def key(i):
            acc = self._blocks[i].access
            return (acc[-2] if len(acc) == 2 else -math.inf, acc[-1] if acc else -math.inf, i)

        victim = min(tails, key=key)
        b = self._blocks[victim]
        self._evictable.discard(victim)
        del self._cached[b.hash]
        if b.parent is not None and b.parent in self._cached:
            self._blocks[self._cached[b.parent]].children -= 1
        b.hash = b.parent = None
        b.access = []
        self.evictions += 1
        return victim

    # -- sequences ---------------------------------------------------------------------------
    def prefix_hit(self, tokens: np.ndarray) -> int:
        """Tokens at the start of ``tokens`` whose blocks are cached (full blocks; at most len - 1,
        so the last prompt token is always computed and yields the next token's logits)."""
        n = 0
        for h in self._hashes(tokens[: max(len(tokens) - 1, 0)]):
            if h not in self._cached:
                break
            n += self.block
        return n

    def admit(self, seq: int, tokens: np.ndarray, reserve: int, now: float) -> int | None:
        """Give ``seq`` blocks for ``reserve`` tokens (>= len(tokens)), reusing cached blocks of the
        prompt's prefix.  Returns the tokens already cached (prefill skips them), or None (nothing
        changed) when there are not enough blocks."""
        assert seq not in self._seqs
        hashes = self._hashes(tokens[: max(len(tokens) - 1, 0)])
        hit = []
        for h in hashes:
            if h not in self._cached:
                break
            hit.append(self._cached[h])
        need = -(-max(reserve, len(tokens)) // self.block) - len(hit)
        revived = sum(1 for b in hit if self._blocks[b].refs == 0)
        # reviving cached blocks takes them out of the evictable set before we evict for the rest
        if need > self.available - revived:
            return None
        for b in hit:
            blk = self._blocks[b]
            if blk.refs == 0:
                self._evictable.discard(b)
            blk.refs += 1
            self._touch(blk, now)
        blocks = list(hit)
        for _ in range(need):
            b = self._take()
            assert b is not None
            self._blocks[b].refs = 1
            self._touch(self._blocks[b], now)
            blocks.append(b)
        self._seqs[seq] = blocks
        self._hashed[seq] = len(hit)
        self._tokens[seq] = np.asarray(tokens, dtype=np.int64)
        self.lookup_tokens += len(tokens)
        self.hit_tokens += len(hit) * self.block
        return len(hit) * self.block

    def ensure(self, seq: int, tokens: int, now: float) -> bool:
        """Grow ``seq`` to hold ``tokens`` tokens; False (nothing changed) when blocks run out."""
        blocks = self._seqs[seq]
        need = -(-tokens // self.block) - len(blocks)
        if need <= 0:
            return True
        if need > self.available:
            return False
        for _ in range(need):
            b = self._take()
            self._blocks[b].refs = 1
            self._touch(self._blocks[b], now)
            blocks.append(b)
        return True

    def computed(self, seq: int, n_tokens: int) -> None:
        """``seq``'s first ``n_tokens`` prompt tokens now have their K/V: name its full prompt blocks
        by their hash so later prompts can share them (a block someone else cached first stays
        private to this sequence: two copies of one content, as a real cache would hold)."""
        tokens = self._tokens[seq]
        done = min(n_tokens, len(tokens)) // self.block
        start = self._hashed[seq]
        if done <= start:
            return
        hashes = self._hashes(tokens[: done * self.block])
        blocks = self._seqs[seq]
        for i in range(start, done):
            h, blk = hashes[i], self._blocks[blocks[i]]
            if h in self._cached or blk.hash is not None:
                continue
            blk.hash, blk.parent = h, hashes[i - 1] if i else None
            self._cached[h] = blk.id
            if blk.parent is not None and blk.parent in self._cached:
                self._blocks[self._cached[blk.parent]].children += 1
        self._hashed[seq] = done

    def free(self, seq: int, now: float) -> None:
        """``seq`` ends (or is preempted): its hashed blocks stay cached, the rest are freed."""
        for b in reversed(self._seqs.pop(seq)):
            blk = self._blocks[b]
            blk.refs -= 1
            if blk.refs:
                continue
            if blk.hash is not None:  # releasing is not an access: LRU-K counts uses only
                self._evictable.add(b)
            else:
                blk.access = []
                self._free.append(b)
        del self._hashed[seq], self._tokens[seq]
