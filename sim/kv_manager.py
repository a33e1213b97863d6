"""The host's paged KV-cache manager: blocks, block tables, prefix sharing and LRU-K eviction.

A decoder build (docs/simulator.md, "Decoding") keeps K/V in NPU memory as ``num_blocks`` blocks of
``block`` (64) token slots; block ``num_blocks`` is the trash block that padding rows write, never
handed out.  This module decides which block holds which tokens of which sequence; it never sees a
K/V value.  It is pure Python so that the decoding driver (``decoder.py``) and the serving
scheduler share it.

* A sequence owns a block table (physical block ids, in token order): token ``i`` of the sequence
  lives in slot ``table[i // block] * block + i % block``.
* Prefix sharing: every FULL block gets a chained SHA-256 hash (of the parent block's hash and the
  block's token ids), and a full block whose parent is itself shared (or that starts its sequence)
  is registered in the prefix cache under that hash.  ``add_sequence`` takes a prompt and maps its
  longest cached prefix of full blocks onto the cached blocks (refcounts), so prompts sharing a system
  prompt store it once and the caller computes only the rest.  A block a sequence is still writing
  (not full) is never shared.
* Eviction: a block no sequence references stays cached (its K/V still valid, reusable by a prefix
  hit) until a new block is needed and the free list is empty.  Then LRU-K with K = 2 picks the
  victim among the cached unreferenced blocks that are a chain's tail (no cached child): the block
  whose second-most-recent access is oldest, a block accessed once counting as infinitely old (so
  blocks used once go first), ties broken by least recent use, then by block id.  An access is a
  sequence taking the block (allocation or prefix hit); recent use is when the last sequence holding
  it let it go (or took it, while held).
* Out of blocks (nothing free, nothing evictable): ``OutOfBlocks``, raised before anything changes,
  so a scheduler can preempt a sequence and retry; ``can_append`` asks without raising.
* Bytes: each block has a byte size (K and V of every layer, scales and metadata included), from
  ``bytes_per_block`` (an int, or a function of the block id) and ``set_block_bytes`` updates (a
  compressed block's size follows its data).  ``kv_bytes`` counts the blocks some sequence
  references (KV in use), ``peak_kv_bytes`` its maximum; ``unshared_bytes`` / ``peak_unshared_bytes``
  count what the live sequences would hold without sharing (each of its blocks once per sequence).
"""

from __future__ import annotations

import hashlib
import heapq
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from mcpc.errors import EXIT_DOES_NOT_FIT, InputError, McpcError

ROOT_HASH = b"\0" * 32  # the parent hash of a sequence's first block


class OutOfBlocks(McpcError):
    """No free or evictable KV block is left for an allocation (nothing was changed).  A serving
    scheduler preempts a sequence and retries; a single request needs a bigger ``--kv-blocks``."""

    exit_code = EXIT_DOES_NOT_FIT


def block_hash(parent: bytes, tokens: Sequence[int]) -> bytes:
    """SHA-256 of the parent block's hash and the block's token ids (each as 8 little-endian bytes)."""
    h = hashlib.sha256(parent)
    h.update(struct.pack(f"<{len(tokens)}q", *tokens))
    return h.digest()


@dataclass
class _Block:
    refs: int = 0
    hash: bytes | None = None  # set when registered in the prefix cache
    parent: int | None = None  # the cached block before it in its chain (cached blocks only)
    children: int = 0  # cached blocks whose parent it is
    accesses: list[int] = field(default_factory=list)  # the last two access times (oldest first)
    last_use: int = 0
    version: int = 0  # invalidates stale eviction-heap entries


@dataclass
class _Seq:
    blocks: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    hashes: list[bytes] = field(default_factory=list)  # chained hash of each full block


class KVManager:
    """Paged KV blocks for any number of sequences (see the module docstring).

    ``num_blocks`` allocatable blocks (ids 0 .. num_blocks - 1; id num_blocks is the trash block),
    ``block`` token slots each; ``bytes_per_block``: an int or ``f(block_id) -> int``;
    ``max_tokens``: the longest a sequence may grow (None: unbounded).
    """

    def __init__(
        self,
        num_blocks: int,
        block: int = 64,
        bytes_per_block: int | Callable[[int], int] = 0,
        max_tokens: int | None = None,
        prefix_sharing: bool = True,
    ):
        if num_blocks < 1 or block < 1:
            raise InputError(f"KV manager: num_blocks ({num_blocks}) and block ({block}) must be >= 1")
        self.num_blocks, self.block, self.max_tokens = num_blocks, block, max_tokens
        self.prefix_sharing = prefix_sharing
        self.trash_block = num_blocks
        fixed = None if callable(bytes_per_block) else int(bytes_per_block)
        self._size_of = bytes_per_block if fixed is None else (lambda _b: fixed)
        self._sizes: dict[int, int] = {}
        self._blocks: dict[int, _Block] = {}  # every block that is referenced or cached
        self._free = list(range(num_blocks - 1, -1, -1))  # pop() hands out the lowest id first
        self._cache: dict[bytes, int] = {}
        self._heap: list[tuple] = []  # (second access, last use, id, version) of evictable tails
        self._seqs: dict[object, _Seq] = {}
        self._clock = 0
        self._idle = 0  # cached blocks no sequence references
        self.kv_bytes = self.peak_kv_bytes = 0
        self.unshared_bytes = self.peak_unshared_bytes = 0
        self.prefix_hit_tokens = 0
        self.evictions = 0

    # ----------------------------------------------------------------------------- queries
    def __contains__(self, seq) -> bool:
        return seq in self._seqs

    @property
    def sequences(self) -> list:
        return list(self._seqs)

    def block_table(self, seq) -> list[int]:
        return list(self._get(seq).blocks)

    def num_tokens(self, seq) -> int:
        return len(self._get(seq).tokens)

    def tokens(self, seq) -> list[int]:
        return list(self._get(seq).tokens)

    def slot(self, seq, position: int) -> int:
        """The cache slot of token ``position`` of ``seq``."""
        s = self._get(seq)
        return s.blocks[position // self.block] * self.block + position % self.block

    def is_cached(self, block_hash: bytes) -> bool:
        """Whether a full block of chained hash ``block_hash`` is in the prefix cache."""
        return block_hash in self._cache

    def refcount(self, block_id: int) -> int:
        b = self._blocks.get(block_id)
        return b.refs if b else 0

    def block_bytes(self, block_id: int) -> int:
        size = self._sizes.get(block_id)
        return int(self._size_of(block_id)) if size is None else size

    @property
    def free_blocks(self) -> int:
        """Blocks an allocation can take now: free ones plus cached unreferenced ones."""
        return len(self._free) + self._idle

    @property
    def cached_blocks(self) -> int:
        """Cached blocks no sequence references (evictable, reusable by a prefix hit)."""
        return self._idle

    @property
    def used_blocks(self) -> int:
        """Blocks at least one sequence references."""
        return len(self._blocks) - self._idle

    def blocks_needed(self, seq, count: int) -> int:
        """New blocks appending ``count`` tokens to ``seq`` (an existing sequence) takes."""
        have = len(self._get(seq).tokens)
        return -(-(have + count) // self.block) - -(-have // self.block)

    def can_append(self, seq, count: int) -> bool:
        return self.blocks_needed(seq, count) <= self.free_blocks

    def bytes_of(self, seqs: Iterable) -> int:
        """Bytes of the distinct blocks the sequences ``seqs`` reference (a shared block once)."""
        ids = {b for s in seqs for b in self._get(s).blocks}
        return sum(self.block_bytes(b) for b in ids)

    # ----------------------------------------------------------------------------- updates
    def add_sequence(self, seq, prompt: Sequence[int] = ()) -> int:
        """Start sequence ``seq`` and map the longest cached prefix of ``prompt``'s full blocks onto
        the cached blocks (unless ``prefix_sharing`` is off).  Returns the number of tokens already
        cached; the caller appends (and computes) the rest of the prompt.  At most
        ``len(prompt) - 1`` tokens are reused, so the last prompt token is always computed (its
        logits are needed)."""
        if seq in self._seqs:
            raise InputError(f"KV manager: sequence {seq!r} already exists")
        s = self._seqs[seq] = _Seq()
        if not self.prefix_sharing:
            return 0
        parent = ROOT_HASH
        for j in range((len(prompt) - 1) // self.block if prompt else 0):
            toks = [int(t) for t in prompt[j * self.block : (j + 1) * self.block]]
            h = block_hash(parent, toks)
            bid = self._cache.get(h)
            if bid is None:
                break
            self._acquire(bid)
            s.blocks.append(bid)
            s.tokens += toks
            s.hashes.append(h)
            parent = h
        self.prefix_hit_tokens += len(s.tokens)
        return len(s.tokens)

    def append(self, seq, tokens: Sequence[int]) -> list[int]:
        """Append ``tokens`` to ``seq``; returns the cache slot of each (allocating blocks, evicting
        cached ones if the free list is empty).  OutOfBlocks (nothing changed) when they do not fit."""
        s = self._get(seq)
        tokens = tokens.tolist() if hasattr(tokens, "tolist") else [int(t) for t in tokens]
        if self.max_tokens is not None and len(s.tokens) + len(tokens) > self.max_tokens:
            raise InputError(
                f"KV manager: sequence {seq!r} would hold {len(s.tokens) + len(tokens)} tokens, more than "
                f"the {self.max_tokens} one sequence may reach (--max-seq)"
            )
        need = self.blocks_needed(seq, len(tokens))
        if need > self.free_blocks:
            raise OutOfBlocks(
                f"out of KV blocks: sequence {seq!r} needs {need} more block(s) of {self.block} tokens, "
                f"{self.free_blocks} of {self.num_blocks} are free or evictable (raise --kv-blocks, or "
                "run fewer sequences at once)"
            )
        slots: list[int] = []
        blk, pos, i, n = self.block, len(s.tokens), 0, len(tokens)
        while i < n:  # a block at a time: the rest of the last block, then fresh blocks
            off = pos % blk
            if off == 0:
                bid = self._take()
                self._acquire(bid)
                s.blocks.append(bid)
            take = min(blk - off, n - i)
            first = s.blocks[-1] * blk + off
            slots.extend(range(first, first + take))
            s.tokens.extend(tokens[i : i + take])
            pos, i = pos + take, i + take
            if pos % blk == 0:
                self._full(s)
        return slots

    def free(self, seq) -> None:
        """End ``seq``: its blocks lose a reference (tail first); a registered block stays cached."""
        s = self._get(seq)
        del self._seqs[seq]
        self._tick()
        for bid in reversed(s.blocks):
            b = self._blocks[bid]
            b.refs -= 1
            b.last_use = self._clock
            size = self.block_bytes(bid)
            self.unshared_bytes -= size
            if b.refs == 0:
                self.kv_bytes -= size
                if b.hash is None:
                    del self._blocks[bid]
                    self._sizes.pop(bid, None)
                    self._free.append(bid)
                else:
                    self._idle += 1
                    self._maybe_evictable(bid)

    def set_block_bytes(self, block_id: int, nbytes: int) -> None:
        """The byte size of ``block_id`` from now on (e.g. its compressed size once written)."""
        delta = int(nbytes) - self.block_bytes(block_id)
        self._sizes[block_id] = int(nbytes)
        refs = self.refcount(block_id)
        if refs:
            self.unshared_bytes += refs * delta
            self.kv_bytes += delta
            self._peaks()

    # ----------------------------------------------------------------------------- internals
    def _get(self, seq) -> _Seq:
        s = self._seqs.get(seq)
        if s is None:
            raise InputError(f"KV manager: no sequence {seq!r}")
        return s

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _acquire(self, bid: int) -> None:
        b = self._blocks.setdefault(bid, _Block())
        size = self.block_bytes(bid)
        if b.refs == 0:
            self.kv_bytes += size
            if b.hash is not None:
                self._idle -= 1
        self.unshared_bytes += size
        b.refs += 1
        b.version += 1  # an evictable entry of it in the heap is stale now
        b.accesses = [*b.accesses[-1:], self._tick()]
        b.last_use = self._clock
        self._peaks()

    def _take(self) -> int:
        if self._free:
            return self._free.pop()
        while self._heap:
            _, _, bid, version = heapq.heappop(self._heap)
            b = self._blocks.get(bid)
            if b is not None and b.version == version and b.refs == 0 and b.children == 0:
                self._evict(bid)
                return bid
        raise AssertionError("KV manager: no evictable block although free_blocks said so")

    def _evict(self, bid: int) -> None:
        b = self._blocks.pop(bid)
        del self._cache[b.hash]
        self._idle -= 1
        self._sizes.pop(bid, None)
        self.evictions += 1
        if b.parent is not None:
            p = self._blocks[b.parent]
            p.children -= 1
            self._maybe_evictable(b.parent)

    def _maybe_evictable(self, bid: int) -> None:
        b = self._blocks[bid]
        if b.refs == 0 and b.children == 0 and b.hash is not None:
            second = b.accesses[0] if len(b.accesses) == 2 else -1  # used once: infinitely old
            heapq.heappush(self._heap, (second, b.last_use, bid, b.version))

    def _full(self, s: _Seq) -> None:
        """The last block of ``s`` just filled: hash it, and register it when its chain is cached."""
        j = len(s.blocks) - 1
        parent_hash = s.hashes[-1] if j else ROOT_HASH
        h = block_hash(parent_hash, s.tokens[j * self.block :])
        s.hashes.append(h)
        bid = s.blocks[j]
        parent = s.blocks[j - 1] if j else None
        private_parent = parent is not None and self._blocks[parent].hash != parent_hash
        if not self.prefix_sharing or h in self._cache or private_parent:
            return  # a duplicate of a cached block, or its parent is private: it stays private
        self._cache[h] = bid
        b = self._blocks[bid]
        b.hash, b.parent = h, parent
        if parent is not None:
            self._blocks[parent].children += 1

    def _peaks(self) -> None:
        self.peak_kv_bytes = max(self.peak_kv_bytes, self.kv_bytes)
        self.peak_unshared_bytes = max(self.peak_unshared_bytes, self.unshared_bytes)
