"""Where a decoder build keeps its compressed KV blocks in NPU DRAM: the pool and the descriptor
table that ``kvdecomp`` reads (docs/kv-cache.md, "In NPU memory").

A build whose cache is stored compressed (META ``decoder.kv_quant`` not null) has two more
persistent buffers beside the plain view ``kv_k_<i>``/``kv_v_<i>``:

* ``kv_pool`` (u8): one fixed slot of ``slot_bytes`` per (block < NB, layer, K|V, KV head), sized
  for the largest block ``store_kv_block`` can produce (``max_block_bytes``), so any setting fits;
  the slot of (b, layer, kind, h) starts at ``(((b·layers + layer)·2 + kind)·Hkv + h)·slot_bytes``.
* ``kv_desc`` (i32, 4 per entry): one 16-byte descriptor per (layer, K|V, KV head, block ≤ NB),
  the column of (layer, kind, h) starting at entry ``((layer·2 + kind)·Hkv + h)·(NB+1)``.  An
  entry is four little-endian u32: the DRAM address of the block's bytes (low, high word), their
  count, and a tag (``tag``): the kind in bits 0-7 (``PLAIN`` 0: the block's rows are read from
  the plain view; ``COMPRESSED`` 1: decoded from the bytes), K (0) or V (1) in bit 8, the KV head
  in bits 9-15 and the layer in bits 16-31 -- the
  names a corrupt block's trap reports.

numpy only, like the rest of ``mcpc.kv``.
"""

from __future__ import annotations

import numpy as np

from mcpc.kv.codec import HEADER_BYTES, MAX_ROWS
from mcpc.kv.sparse import TILE

DESC_BYTES = 16
PLAIN, COMPRESSED = 0, 1
POOL, DESC = "kv_pool", "kv_desc"
_ALIGN = 16


def max_block_bytes(rows: int, head_dim: int, act_bytes: int) -> int:
    """An upper bound of the bytes one stored head block of ``rows`` tokens can take, whatever the
    settings: the larger of a dense block in the activation dtype (FP16_Retain, ``act_bytes`` a
    value) and a dense INT8 block (its scales and zero points), plus three bytes per tile for the
    format byte and a sparse tile's count (a bitmap or coordinate tile is chosen only when it is
    smaller than dense); rounded up to 16 bytes."""
    tiles = -(-head_dim // TILE)
    body = max(rows * head_dim * act_bytes, 3 * rows + rows * head_dim)
    need = HEADER_BYTES + body + 3 * tiles + 1
    return -(-need // _ALIGN) * _ALIGN


def pool_layout(layers: int, kv_heads: int, kv_blocks: int, head_dim: int, act_bytes: int) -> dict:
    """The sizes of a build's pool and descriptor table (recorded in META ``decoder.kv_pool``)."""
    slot = max_block_bytes(MAX_ROWS, head_dim, act_bytes)
    return {
        "slot_bytes": slot,
        "pool_bytes": kv_blocks * layers * 2 * kv_heads * slot,
        "desc_entries": layers * 2 * kv_heads * (kv_blocks + 1),
        "desc_bytes": DESC_BYTES * layers * 2 * kv_heads * (kv_blocks + 1),
    }


def desc_column(layer: int, kind: int, head: int, kv_heads: int, kv_blocks: int) -> int:
    """The first descriptor entry of (layer, K=0|V=1, head): block b's entry follows at + b."""
    return ((layer * 2 + kind) * kv_heads + head) * (kv_blocks + 1)


def slot_offset(block: int, layer: int, kind: int, head: int, layers: int, kv_heads: int, slot: int) -> int:
    """Byte offset in the pool of the slot of (block, layer, K=0|V=1, head)."""
    return (((block * layers + layer) * 2 + kind) * kv_heads + head) * slot


def tag(kind: int, kv: int, head: int, layer: int) -> int:
    """The fourth word of a descriptor."""
    return (kind & 0xFF) | (kv & 1) << 8 | (head & 0x7F) << 9 | (layer & 0xFFFF) << 16


def untag(word: int) -> tuple[int, int, int, int]:
    """(kind, K=0|V=1, head, layer) of a descriptor's fourth word."""
    return word & 0xFF, (word >> 8) & 1, (word >> 9) & 0x7F, (word >> 16) & 0xFFFF


def descriptor(address: int, nbytes: int, kind: int, kv: int, head: int, layer: int) -> np.ndarray:
    """One descriptor as four u32."""
    return np.array([address & 0xFFFFFFFF, address >> 32, nbytes, tag(kind, kv, head, layer)], np.uint32)


def block_name(block: int, word: int) -> str:
    """How a trap names the block of a descriptor: ``3 (layer 1 K head 0)``."""
    _, kv, head, layer = untag(word)
    return f"{block} (layer {layer} {'KV'[kv]} head {head})"
