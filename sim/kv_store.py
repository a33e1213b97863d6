"""The compressed KV cache of a decoder build whose META["decoder"]["kv_quant"] asks for one
(``kv_cache:`` of the QAT config, or ``mcp-compile --kv-quant/--kv-sparsity/--kv-policy``).

The program's cache globals (``kv_k_<i>``, ``kv_v_<i>``, docs/decoding.md) stay in the activation
dtype: they are the *decompressed view* the program's gathers and ``vattn`` read.  What the cache
stores is kept here, per block, as the bytes ``mcpc.kv.store_kv_block`` encodes (CRC-8 last), and
the view holds exactly what ``mcpc.kv.load_kv_block`` reads back from them:

* after each call (``after_call``), every block the call wrote is stored from the values the
  program just wrote: a block being filled as INT8_Asymmetric rows (per token and head, so each
  row's codes do not depend on the rows after it) with the seed's per-block error check over the
  rows so far (a block that fails is kept in the activation dtype and counted); a block that is
  full (64 tokens) is stored with the sparsity policy too.  The rows read back replace the view's.
  A filling block keeps its unrounded rows here until it is full, so that the error check and the
  policy see the values the model produced, never values already rounded once.
* before each call (``before_call``), every stored block the call gathers is read back from its
  bytes (CRC checked: a mismatch is ``KVBlockCorrupt``, a trap naming the block, exit 5, and no
  value of the block is used) into the view.

Attention statistics (``AttentionHeat``): a build whose policy or dynamic window reads the
model's attention (META ``decoder.heat``) has its ``vattn``s write the attention heat of each call
into the ``kv_heat`` global; after each call the host adds it, per sequence, layer, query head and
sequence position, to what the sequence accumulated over its calls.  When a block is stored with
the policy, ``heavy_hitter`` gets the block's positions' heat (per KV head: the sum over its query
heads) and ``topk_entropy`` each KV head's entropy of that accumulated attention (``heat_entropy``
over the sequence's positions so far); the dynamic window narrows each row's ``kv_start`` /
``kv_len`` (``DecoderSession``).  A program built without heat (an older .mcpb) falls back to the
stated approximations of before: ``heavy_hitter``'s heat of a token the L2 norm of its K row,
``topk_entropy`` equal head entropies.  A timing-only run computes no heat: its block sizes are
nominal and its rows attend every position.

This is the functional model of storing and reading compressed blocks on the host side of a
``Session``; the simulated cycles of a call are those of the program (its gathers read the view in
the activation dtype): ``kv_bytes`` and the roofline count the stored bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from mcpc.kv import (
    AttentionStats,
    KvSettings,
    dynamic_window_left,
    heat_entropy,
    load_kv_block,
    nominal_block_bytes,
    store_kv_block,
)

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

    # ------------------------------------------------------------------ the view in the globals
    def _view(self, layer: int, kind: str) -> np.ndarray:
        """Writable [kv_heads, (NB+1)*64, D] view of the cache global in the session's DRAM."""
        m = self.meta
        return self.session.persistent_view(f"kv_{kind}_{layer}").reshape(m.kv_heads, self.rows_per_head, -1)

    def size(self, block_id: int) -> int:
        b = self.blocks.get(block_id)
        return b.nbytes if b is not None else 0

    # ------------------------------------------------------------------ reads
    def before_call(self, gathered: Sequence[int]) -> None:
        """Read every stored block in ``gathered`` back from its bytes into the view (CRC-8 checked)."""
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
        changed = []
        for bid, (lo, rows, first_pos, seq) in written.items():
            b = self.blocks.get(bid)
            if b is None or lo == 0:  # a block (re)allocated: its old contents are gone
                b = self.blocks[bid] = _Block()
            b.rows = rows
            b.full = rows == self.meta.block
            if self.timing_only:
                b.nbytes = self._nominal(rows, b.full)
            else:
                self._store(bid, b, lo, first_pos, seq)
            changed.append(bid)
        return changed

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
    gathered positions per layer; ``min_window`` the dynamic window, or None)."""

    def __init__(self, meta, session, timing_only: bool = False):
        self.meta, self.session, self.timing_only = meta, session, timing_only
        self.name, self.positions = str(meta.heat["global"]), int(meta.heat["positions"])
        mw = meta.heat.get("min_window")
        self.min_window = None if mw is None else int(mw)
        self.seqs: dict[object, np.ndarray] = {}  # seq -> [layers, q_heads, max_seq] float64

    def after_call(self, items: Sequence[tuple[object, int, int]]) -> None:
        """Add this call's heat: ``items`` (sequence, its first row in the gathered buffer, its
        positions after the call); gathered row base + p is the sequence's position p."""
        if self.timing_only:
            return
        m = self.meta
        view = self.session.persistent_view(self.name).reshape(m.layers, self.positions, m.q_heads)
        for seq, base, total in items:
            acc = self.seqs.get(seq)
            if acc is None:
                acc = self.seqs[seq] = np.zeros((m.layers, m.q_heads, m.max_seq), np.float64)
            acc[:, :, :total] += view[:, base : base + total, :].transpose(0, 2, 1)

    def free(self, seq) -> None:
        self.seqs.pop(seq, None)

    def _get(self, seq) -> np.ndarray:
        acc = self.seqs.get(seq)
        if acc is None:
            m = self.meta
            return np.zeros((m.layers, m.q_heads, m.max_seq), np.float64)
        return acc

    def kv_heat(self, seq, layer: int, lo: int, hi: int) -> np.ndarray:
        """Heat of positions [lo, hi) per KV head (the sum over its query heads): [kv_heads, hi - lo]."""
        m = self.meta
        h = self._get(seq)[layer, :, lo:hi]
        return h.reshape(m.kv_heads, m.q_heads // m.kv_heads, hi - lo).sum(axis=1)

    def entropy(self, seq, layer: int, total: int) -> np.ndarray:
        """Each KV head's entropy of its accumulated attention over positions [0, total): [kv_heads]."""
        return heat_entropy(self._get(seq)[layer, :, :total], self.meta.kv_heads)

    def window_left(self, seq, pos: int) -> int:
        """The dynamic window's left edge for the query at ``pos`` (0 without a dynamic window or
        heat): the seed's heat rule over the heat of positions 0..pos summed over layers and heads."""
        if self.min_window is None or self.timing_only or seq not in self.seqs:
            return 0
        return dynamic_window_left(self.seqs[seq][:, :, : pos + 1].sum(axis=(0, 1)), self.min_window)
