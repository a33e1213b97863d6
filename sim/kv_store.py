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

Attention statistics: the program's ``vattn`` does not output attention probabilities, so the
attention-driven policies use stated approximations: ``heavy_hitter``'s heat of a token is the L2
norm of its K row in that head (the same tokens are kept in K and V); ``topk_entropy`` is given
equal head entropies (the layer budget is split evenly across KV heads, then top-k by magnitude per
tile).  The dynamic window is not applied (it changes which positions a query attends, and the
program attends the whole context).

This is the functional model of storing and reading compressed blocks on the host side of a
``Session``; the simulated cycles of a call are those of the program (its gathers read the view in
the activation dtype): ``kv_bytes`` and the roofline count the stored bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from mcpc.kv import AttentionStats, KvSettings, load_kv_block, nominal_block_bytes, store_kv_block

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

    def __init__(self, settings: KvSettings, meta, session, timing_only: bool = False):
        self.settings, self.meta, self.session = settings, meta, session
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
    def after_call(self, written: dict[int, tuple[int, int, int]]) -> list[int]:
        """Store the blocks a call wrote: ``written`` maps a block id to (first row written, rows held
        after the call, position of the block's first row); returns the block ids whose size changed."""
        changed = []
        for bid, (lo, rows, first_pos) in written.items():
            b = self.blocks.get(bid)
            if b is None or lo == 0:  # a block (re)allocated: its old contents are gone
                b = self.blocks[bid] = _Block()
            b.rows = rows
            b.full = rows == self.meta.block
            if self.timing_only:
                b.nbytes = self._nominal(rows, b.full)
            else:
                self._store(bid, b, lo, first_pos)
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

    def _store(self, bid: int, b: _Block, lo: int, first_pos: int) -> None:
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
            stats = None
            if b.full and settings.policy == "heavy_hitter":
                k = b.raw[layer, "k"][:, :rows].astype(np.float32)
                stats = AttentionStats(
                    heat=np.sqrt((k * k).sum(-1)), first_position=first_pos, seq_len=first_pos + rows
                )
            elif b.full and settings.policy == "topk_entropy":
                stats = AttentionStats(head_entropy=np.zeros(m.kv_heads))
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
            "stats": "heavy_hitter heat = L2 norm of the K row; topk_entropy: equal head entropies",
        }
