"""The compressed KV cache of a decoder build whose META["decoder"]["kv_quant"] asks for one
(``kv_cache:`` of the QAT config, or ``mcp-compile --kv-quant/--kv-sparsity/--kv-policy``).

The program's cache globals (``kv_k_<i>``, ``kv_v_<i>``, docs/decoding.md) stay in the activation
dtype: the *plain view*, where new rows are written and whence blocks being filled are read.
What the cache stores is kept here, per block, as the bytes ``mcpc.kv.store_kv_block`` encodes
(CRC-8 last), and the view holds exactly what ``mcpc.kv.load_kv_block`` reads back from them:

* after each call (``after_call``), every block the call wrote is stored from the values the
  program just wrote: a block being filled as INT8_Asymmetric rows (per token and head, so each
  row's codes do not depend on the rows after it) with the seed's per-block error check over the
  rows so far (a block that fails is kept in the activation dtype and counted); a block that is
  full (64 tokens) is stored with the sparsity policy too.  The rows read back replace the view's.
  A filling block keeps its unrounded rows here until it is full, so that the error check and the
  policy see the values the model produced, never values already rounded once.
* before each call (``before_call``), in a build with a pool (META ``decoder.kv_pool``: every
  compressing build), the descriptors of the blocks the call writes are marked
  plain; after the call a block that became full has its stored bytes written into its slots of the
  ``kv_pool`` buffer in the simulated DRAM and its descriptors (``kv_desc``) marked compressed: the
  program's ``kvdecomp`` reads them from there, checks their CRC-8 (a mismatch is a trap naming the
  block, exit 5, and no value of the block is used) and decodes them (``_Pool``, ``mcpc.kv.pool``).
  A build without a pool (an older .mcpb) keeps the host path: every stored block the call
  gathers is read back from its bytes into the view (CRC checked, ``KVBlockCorrupt``).

Attention statistics (``AttentionHeat``): a build whose policy or dynamic window reads the
model's attention (META ``decoder.heat``) has its ``vattn``s write the attention heat of each call
into the ``kv_heat`` global; after each call the host adds it, per sequence, layer, query head and
sequence position, to what the sequence accumulated over its calls, and counts, per position, the
rows that attended it and a uniform head's share (the sum of 1 / (positions attended) over those
rows).  What the policies and the window read is ``relative_heat``: accumulated over uniform share
(docs/kv-cache.md, "What heat is").  When a block is stored with the policy, ``heavy_hitter`` gets
the block's positions' relative heat (per KV head: the mean over its query heads) and
``topk_entropy`` each KV head's entropy of it (``heat_entropy`` over the sequence's positions so
far); the dynamic window narrows each row's ``kv_start`` / ``kv_len`` (``DecoderSession``).
A program built without heat (an older .mcpb) falls back to the
stated approximations of before: ``heavy_hitter``'s heat of a token the L2 norm of its K row,
``topk_entropy`` equal head entropies.  A timing-only run computes no heat: its block sizes are
nominal and its rows attend every position.

Compressing a block is the host's work (``kvcomp`` is not modelled); reading it is the program's,
so the simulated cycles of a step follow the stored bytes; ``kv_bytes`` and the roofline count them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from mcpc.errors import InputError, InternalError
from mcpc.kv import (
    AttentionStats,
    KvSettings,
    dynamic_window_left,
    heat_entropy,
    load_kv_block,
    nominal_block_bytes,
    relative_heat,
    store_kv_block,
)
from mcpc.kv.pool import COMPRESSED, DESC, PLAIN, POOL, desc_column, descriptor, slot_offset

KINDS = ("k", "v")


@dataclass
class _Block:
    """One cache block: its stored bytes per (layer, kind, head), rows held, the unrounded rows of a
    block being filled, and whether the block is final (full and stored with the policy)."""

    rows: int = 0
    data: dict[tuple[int, str, int], bytearray] = field(default_factory=dict)
    raw: dict[tuple[int, str], np.ndarray] = field(default_factory=dict)  # [heads, 64, D] while filling
    full: bool = False
    retained: int = 0  # head blocks kept unquantized by the error check
    nbytes: int = 0


class CompressedKV:
    """The stored blocks of one DecoderSession's cache (module docstring)."""

    def __init__(self, settings: KvSettings, meta, session, timing_only: bool = False, heat=None):
        self.settings, self.meta, self.session = settings, meta, session
        self.heat: AttentionHeat | None = heat  # the model's attention, when the program writes it
        self.filling = KvSettings(quant=settings.quant, quant_tol=settings.quant_tol)  # no policy
        self.timing_only = timing_only
        self.blocks: dict[int, _Block] = {}
        self.rows_per_head = (meta.kv_blocks + 1) * meta.block
        self.retained_blocks = 0  # head blocks stored unquantized by the error check (final blocks)
        self.stored_blocks = 0
        self.pool = _Pool(meta, session, timing_only) if getattr(meta, "kv_pool", None) else None
        self._sized: list[int] = []  # blocks sized before a call (_placed), reported after it

    # ------------------------------------------------------------------ the view in the globals
    def _view(self, layer: int, kind: str) -> np.ndarray:
        """Writable [kv_heads, (NB+1)*64, D] view of the cache global in the session's DRAM."""
        m = self.meta
        return self.session.persistent_view(f"kv_{kind}_{layer}").reshape(m.kv_heads, self.rows_per_head, -1)

    def size(self, block_id: int) -> int:
        b = self.blocks.get(block_id)
        return b.nbytes if b is not None else 0

    # ------------------------------------------------------------------ reads
    def before_call(self, gathered: Sequence[int], written: dict[int, tuple[int, int, int]]) -> None:
        """A build with a pool (``kvdecomp`` reads the stored blocks in NPU DRAM): the blocks the
        call writes are marked plain (their rows are in the view, where the call's ``scatter``
        writes).  A build without one: every stored block in ``gathered`` is read back from its
        bytes into the view (CRC-8 checked)."""
        if self.pool is not None:
            if self.timing_only:  # full blocks the host placed without a call (a serving cost grid)
                for bid in dict.fromkeys(int(b) for b in gathered):
                    if bid not in written and bid not in self.pool.compressed:
                        self._placed(bid)
            self.pool.mark_plain(written)
            return
        if self.timing_only:
            return
        blk = self.meta.block
        for bid in dict.fromkeys(int(b) for b in gathered):
            b = self.blocks.get(bid)
            if b is None or not b.data:
                continue
            for layer in range(self.meta.layers):
                for kind in KINDS:
                    view = self._view(layer, kind)
                    for h in range(self.meta.kv_heads):
                        name = f"{bid} (layer {layer} {kind.upper()} head {h})"
                        rows = load_kv_block(bytes(b.data[layer, kind, h]), self.meta.kv_dtype, name)
                        view[h, bid * blk : bid * blk + rows.shape[0]] = rows

    # ------------------------------------------------------------------ writes
    def after_call(self, written: dict[int, tuple[int, int, int, object]]) -> list[int]:
        """Store the blocks a call wrote: ``written`` maps a block id to (first row written, rows held
        after the call, position of the block's first row, the sequence that wrote it); returns the
        block ids whose size changed."""
        changed, self._sized = self._sized, []
        for bid, (lo, rows, first_pos, seq) in written.items():
            b = self.blocks.get(bid)
            if b is None or lo == 0:  # a block (re)allocated: its old contents are gone
                b = self.blocks[bid] = _Block()
            b.rows = rows
            b.full = rows == self.meta.block
            if self.timing_only:
                b.nbytes = self._nominal(rows, b.full)
                if self.pool is not None and b.full:
                    self.pool.put_nominal(bid, self._nominal_heads())
            else:
                self._store(bid, b, lo, first_pos, seq)
                if self.pool is not None and b.full:
                    self.pool.put(bid, b.data)
            changed.append(bid)
        return changed

    def _placed(self, bid: int) -> None:
        """Timing-only: a gathered block the call does not write, that no call stored.  It precedes
        the written blocks of its sequence (every sequence of a call gets new tokens), so it is
        full: its descriptors get the nominal sizes, and its size is reported after the call."""
        b = self.blocks[bid] = _Block(rows=self.meta.block, full=True)
        b.nbytes = self._nominal(self.meta.block, True)
        self.pool.put_nominal(bid, self._nominal_heads())
        self._sized.append(bid)

    def _nominal_heads(self) -> dict[tuple[int, str, int], int]:
        m = self.meta
        return {
            (layer, kind, h): n
            for layer in range(m.layers)
            for kind in KINDS
            for h, n in enumerate(nominal_block_bytes(self.settings, layer, m.kv_heads, m.block, m.head_dim,
                                                      m.kv_dtype))
        }  # fmt: skip

    def _nominal(self, rows: int, full: bool) -> int:
        m = self.meta
        settings = self.settings if full else self.filling
        return sum(
            sum(nominal_block_bytes(settings, layer, m.kv_heads, rows, m.head_dim, m.kv_dtype))
            for layer in range(m.layers)
            for _ in KINDS
        )

    def _stats(self, b: _Block, layer: int, first_pos: int, seq) -> AttentionStats | None:
        """What the policy needs about ``layer``'s part of a full block, from the sequence's heat
        (or, in a program without heat, the approximations of the module docstring)."""
        policy, rows, m = self.settings.policy, b.rows, self.meta
        if policy not in ("heavy_hitter", "topk_entropy"):
            return None
        if self.heat is None:
            if policy == "topk_entropy":
                return AttentionStats(head_entropy=np.zeros(m.kv_heads))
            k = b.raw[layer, "k"][:, :rows].astype(np.float32)
            heat = np.sqrt((k * k).sum(-1))
        elif policy == "topk_entropy":
            return AttentionStats(head_entropy=self.heat.entropy(seq, layer, first_pos + rows))
        else:
            heat = self.heat.kv_heat(seq, layer, first_pos, first_pos + rows)
        return AttentionStats(heat=heat, first_position=first_pos, seq_len=first_pos + rows)

    def _store(self, bid: int, b: _Block, lo: int, first_pos: int, seq) -> None:
        m, blk = self.meta, self.meta.block
        rows, settings = b.rows, self.settings if b.full else self.filling
        b.nbytes, b.retained = 0, 0
        for layer in range(m.layers):
            views = {kind: self._view(layer, kind) for kind in KINDS}
            for kind in KINDS:
                raw = b.raw.get((layer, kind))
                if raw is None:
                    raw = b.raw[layer, kind] = np.zeros((m.kv_heads, blk, m.head_dim), views[kind].dtype)
                raw[:, lo:rows] = views[kind][:, bid * blk + lo : bid * blk + rows]
            stats = self._stats(b, layer, first_pos, seq) if b.full else None
            for kind in KINDS:
                stored = store_kv_block(b.raw[layer, kind][:, :rows], settings, layer, stats)
                for h, s in enumerate(stored):
                    b.data[layer, kind, h] = bytearray(s.data)
                    b.nbytes += s.nbytes
                    b.retained += int(s.fp16_retained)
                    views[kind][h, bid * blk : bid * blk + rows] = load_kv_block(s, m.kv_dtype, str(bid))
        if b.full:
            b.raw.clear()  # the block is final: only its stored bytes remain
            self.stored_blocks += 1
            self.retained_blocks += b.retained

    def report(self) -> dict:
        """What the cache stored: final blocks, head blocks kept unquantized, the settings."""
        return {
            "settings": self.settings.to_json(),
            "stored_blocks": self.stored_blocks,
            "head_blocks_per_block": self.meta.layers * 2 * self.meta.kv_heads,
            "fp16_retained_head_blocks": self.retained_blocks,
            "stats": (
                "heavy_hitter heat = L2 norm of the K row; topk_entropy: equal head entropies"
                if self.heat is None
                else "the model's attention (vattn heat)"
            ),
        }


class AttentionHeat:
    """The attention each sequence's positions received, accumulated over its calls, from the
    ``kv_heat`` global the program writes (META ``decoder.heat``: its name and ``positions``, the
    gathered positions per layer; ``min_window`` the dynamic window, or None).  Beside it, per
    position, the rows that attended it (``counts``) and the uniform share (``shares``: the sum of
    1 / (positions the row attended) over those rows), so that the policies and the window read
    ``relative_heat``: attention received relative to what a uniform head would have given."""

    def __init__(self, meta, session, timing_only: bool = False):
        self.meta, self.session, self.timing_only = meta, session, timing_only
        self.name, self.positions = str(meta.heat["global"]), int(meta.heat["positions"])
        mw = meta.heat.get("min_window")
        self.min_window = None if mw is None else int(mw)
        self.seqs: dict[object, np.ndarray] = {}  # seq -> [layers, q_heads, max_seq] float64
        self.counts: dict[object, np.ndarray] = {}  # seq -> [max_seq] rows that attended a position
        self.shares: dict[object, np.ndarray] = {}  # seq -> [max_seq] a uniform head's heat

    def after_call(self, items: Sequence[tuple[object, int, int, np.ndarray]]) -> None:
        """Add this call's heat: ``items`` (sequence, its first row in the gathered buffer, its
        positions after the call, the call's query rows as [n, 2] spans (left, pos): row i
        attended positions left..pos); gathered row base + p is the sequence's position p."""
        if self.timing_only:
            return
        m = self.meta
        view = self.session.persistent_view(self.name).reshape(m.layers, self.positions, m.q_heads)
        for seq, base, total, spans in items:
            acc = self.seqs.get(seq)
            if acc is None:
                acc = self.seqs[seq] = np.zeros((m.layers, m.q_heads, m.max_seq), np.float64)
                self.counts[seq] = np.zeros(m.max_seq, np.int64)
                self.shares[seq] = np.zeros(m.max_seq, np.float64)
            acc[:, :, :total] += view[:, base : base + total, :].transpose(0, 2, 1)
            for left, pos in np.asarray(spans, np.int64).reshape(-1, 2):
                self.counts[seq][left : pos + 1] += 1
                self.shares[seq][left : pos + 1] += 1.0 / (pos - left + 1)

    def free(self, seq) -> None:
        for d in (self.seqs, self.counts, self.shares):
            d.pop(seq, None)

    def relative(self, seq, layer: int | None, lo: int, hi: int) -> np.ndarray:
        """``relative_heat`` of positions [lo, hi): [q_heads, hi - lo] for a ``layer``, or
        [layers, q_heads, hi - lo] for None (all zero for a sequence without heat)."""
        acc = self.seqs.get(seq)
        if acc is None:
            m = self.meta
            shape = (m.q_heads, hi - lo) if layer is not None else (m.layers, m.q_heads, hi - lo)
            return np.zeros(shape, np.float64)
        acc = acc[:, :, lo:hi] if layer is None else acc[layer, :, lo:hi]
        return relative_heat(acc, self.shares[seq][lo:hi])

    def kv_heat(self, seq, layer: int, lo: int, hi: int) -> np.ndarray:
        """Relative heat of positions [lo, hi) per KV head (the mean over its query heads):
        [kv_heads, hi - lo]."""
        m = self.meta
        h = self.relative(seq, layer, lo, hi)
        return h.reshape(m.kv_heads, m.q_heads // m.kv_heads, hi - lo).mean(axis=1)

    def entropy(self, seq, layer: int, total: int) -> np.ndarray:
        """Each KV head's entropy of its relative heat over positions [0, total): [kv_heads]."""
        return heat_entropy(self.relative(seq, layer, 0, total), self.meta.kv_heads)

    def window_left(self, seq, pos: int) -> int:
        """The dynamic window's left edge for the query at ``pos`` (0 without a dynamic window or
        heat): the seed's heat rule over the relative heat, the mean over layers and query heads, of
        the positions some earlier call's rows attended (those of this call, ``pos`` among them,
        have none yet: they would read as cold); the edge is at most ``pos - min_window + 1``."""
        if self.min_window is None or self.timing_only or seq not in self.seqs:
            return 0
        seen = int((self.counts[seq][:pos] > 0).sum())  # positions 0..seen-1 (a prefix)
        if seen == 0:
            return 0
        heat = self.relative(seq, None, 0, seen).mean(axis=(0, 1))
        return min(dynamic_window_left(heat, self.min_window), max(0, pos - self.min_window + 1))


class _Pool:
    """The compressed blocks in simulated NPU DRAM (``mcpc.kv.pool``): the host writes a full
    block's stored bytes into its slots of the persistent buffer ``kv_pool`` and its descriptors
    into ``kv_desc`` (kind compressed), which the program's ``kvdecomp`` reads; a block a call
    writes is marked plain before the call (its rows are in the view).  A timing-only run has no
    machine to keep: the descriptors (nominal sizes, ``nominal_block_bytes``) are kept here and
    written into the scratch DRAM of each timing-only run (``Session.timing_dram``), so
    ``kvdecomp`` charges the compressed sizes from the descriptor table as in a functional run."""

    def __init__(self, meta, session, timing_only: bool):
        self.meta, self.session, self.timing_only = meta, session, timing_only
        layout = meta.kv_pool
        self.slot = int(layout["slot_bytes"])
        regions = {r.get("name"): r for r in session.program.memory_map.get("regions") or []}
        missing = [n for n in (POOL, DESC) if n not in regions]
        if missing:
            raise InputError(
                f"{session.program.source}: META decoder.kv_pool is set but the program has no "
                f"persistent buffer {', '.join(missing)}"
            )
        self.pool_addr = int(regions[POOL]["dram"])
        self.compressed: set[int] = set()  # blocks whose descriptors say compressed
        if regions[POOL]["bytes"] < layout["pool_bytes"] or regions[DESC]["bytes"] < layout["desc_bytes"]:
            raise InputError(f"{session.program.source}: kv_pool / kv_desc are smaller than META says")
        if timing_only:
            self._desc = np.zeros(int(regions[DESC]["bytes"]) // 4, np.uint32)
            if hasattr(session, "timing_dram"):  # a Session (a stand-in without it charges plain)
                session.timing_dram[DESC] = self._desc

    def _desc_view(self) -> np.ndarray | None:
        """The descriptor table (u32 words); None before the session's first run (all zero then:
        every block plain)."""
        if self.timing_only:
            return self._desc
        if getattr(self.session, "_machine", True) is None:
            return None
        return self.session.persistent_view(DESC).view(np.uint32)

    def _entry(self, block: int, layer: int, kind: int, head: int) -> int:
        m = self.meta
        return 4 * (desc_column(layer, kind, head, m.kv_heads, m.kv_blocks) + block)

    def mark_plain(self, written: dict[int, tuple[int, int, int]]) -> None:
        if not written:
            return
        desc, m = self._desc_view(), self.meta
        self.compressed.difference_update(written)
        if desc is None:
            return
        for bid in written:
            for layer in range(m.layers):
                for kind in range(2):
                    for h in range(m.kv_heads):
                        e = self._entry(bid, layer, kind, h)
                        desc[e : e + 4] = descriptor(0, 0, PLAIN, kind, h, layer)

    def _put(self, bid: int, sizes: dict, data: dict | None) -> None:
        m = self.meta
        self.compressed.add(bid)
        desc = self._desc_view()
        pool = None if data is None else self.session.persistent_view(POOL).view(np.uint8)
        for (layer, kind_name, h), n in sizes.items():
            kind = KINDS.index(kind_name)
            off = slot_offset(bid, layer, kind, h, m.layers, m.kv_heads, self.slot)
            if n > self.slot:
                raise InternalError(f"a stored KV block of {n} bytes exceeds its pool slot of {self.slot}")
            if pool is not None:
                pool[off : off + n] = np.frombuffer(bytes(data[layer, kind_name, h]), np.uint8)
            e = self._entry(bid, layer, kind, h)
            desc[e : e + 4] = descriptor(self.pool_addr + off, n, COMPRESSED, kind, h, layer)

    def put(self, bid: int, data: dict[tuple[int, str, int], bytearray]) -> None:
        """A full block's stored bytes into the pool, its descriptors compressed."""
        self._put(bid, {key: len(v) for key, v in data.items()}, data)

    def put_nominal(self, bid: int, sizes: dict[tuple[int, str, int], int]) -> None:
        """Timing-only: a full block's descriptors with its nominal sizes (no bytes)."""
        self._put(bid, sizes, None)
