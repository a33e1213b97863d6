"""KV-cache compression: INT8_Asymmetric quantization, sparsity policies, the compressed block
format with its CRC-8, and the entry point the compiler, the simulator and the KV manager share
(``store_kv_block`` / ``load_kv_block``).  numpy only; docs/kv-cache.md describes the formats."""

from mcpc.kv.codec import KVBlockCorrupt, decode_block, encode_block
from mcpc.kv.crc import crc8
from mcpc.kv.policies import (
    POLICIES,
    attention_entropy,
    attention_heat,
    dynamic_window_left,
    heat_entropy,
    keep_count,
    relative_heat,
)
from mcpc.kv.store import (
    AttentionStats,
    KvSettings,
    StoredBlock,
    load_kv_block,
    nominal_block_bytes,
    store_kv_block,
)

__all__ = [
    "POLICIES",
    "AttentionStats",
    "KVBlockCorrupt",
    "KvSettings",
    "StoredBlock",
    "attention_entropy",
    "attention_heat",
    "crc8",
    "decode_block",
    "dynamic_window_left",
    "heat_entropy",
    "encode_block",
    "keep_count",
    "load_kv_block",
    "nominal_block_bytes",
    "relative_heat",
    "store_kv_block",
]
