"""The one entry point from K/V values to stored KV blocks and back.

``store_kv_block`` takes one layer's block of K or V (every KV head's rows of one 64-token block),
applies the sparsity policy and the quantization of ``KvSettings``, and returns one
``StoredBlock`` per head: the encoded bytes (``mcpc.kv.codec``, CRC-8 last) and what they hold.
``load_kv_block`` turns a stored block back into values of the activation dtype, checking the CRC
(``KVBlockCorrupt`` naming the block when it fails).  The compiler, the simulator and the KV
manager call these two; the timing model charges ``StoredBlock.nbytes``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from mcpc.arch import numerics
from mcpc.errors import InternalError
from mcpc.kv import policies
from mcpc.kv.codec import HEADER_BYTES, MAX_ROWS, STORAGE_DTYPES, decode_block, encode_block
from mcpc.kv.quant import DEFAULT_TOL, QuantRows, dequantize_rows, passes_check, quantize_rows, relative_error
from mcpc.kv.sparse import BITMAP, DENSE, TILE, tile_format

KV_QUANT = ("fp16", "int8")
DEFAULT_RATIO = 0.7  # the seed's sparsity_ratio, when a policy is set without one
DEFAULT_RECENT = 16
DEFAULT_MIN_WINDOW = 64
FLOAT_KINDS = {np.dtype(v): k for k, v in STORAGE_DTYPES.items() if k != "int8"}


@dataclass(frozen=True)
class KvSettings:
    """What the KV cache stores.  ``quant``: ``fp16`` (FP16_Retain: unquantized, in the activation
    dtype) or ``int8`` (INT8_Asymmetric, a block failing ``quant_tol`` kept unquantized);
    ``policy`` and ``sparsity_ratio`` (dropped fraction; ``per_layer`` maps a layer index to its
    own ratio); ``recent_window`` for ``heavy_hitter``; the dynamic window (``dynamic_window``,
    ``min_window``) changes which positions a query attends, not what a block stores."""

    quant: str = "fp16"
    quant_tol: float = DEFAULT_TOL
    policy: str = "none"
    sparsity_ratio: float = 0.0
    per_layer: Mapping[int, float] = field(default_factory=dict)
    recent_window: int = DEFAULT_RECENT
    dynamic_window: bool = False
    min_window: int = DEFAULT_MIN_WINDOW

    def __post_init__(self):
        if self.quant not in KV_QUANT:
            raise ValueError(f"quant: expected one of {', '.join(KV_QUANT)}, got {self.quant!r}")
        if self.policy not in policies.POLICIES:
            raise ValueError(f"policy: expected one of {', '.join(policies.POLICIES)}, got {self.policy!r}")
        for r in (self.sparsity_ratio, *self.per_layer.values()):
            policies.keep_count(1, r)  # raises for a ratio outside [0, 1)
        if not self.quant_tol > 0 or self.recent_window < 0 or self.min_window < 1:
            raise ValueError(
                f"quant_tol must be > 0 (got {self.quant_tol}), recent_window >= 0 (got "
                f"{self.recent_window}), min_window >= 1 (got {self.min_window})"
            )

    def ratio(self, layer: int) -> float:
        """The dropped fraction of ``layer`` (0 without a policy)."""
        if self.policy == "none":
            return 0.0
        return float(self.per_layer.get(layer, self.sparsity_ratio))

    def to_json(self) -> dict:
        """The settings as JSON-ready data (the .mcpb META ``decoder.kv_quant`` of a decoder build
        that compresses its KV cache); ``from_json`` reads it back."""
        return {
            "quant": self.quant,
            "quant_tol": self.quant_tol,
            "policy": self.policy,
            "sparsity_ratio": self.sparsity_ratio,
            "per_layer": {str(k): v for k, v in sorted(self.per_layer.items())},
            "recent_window": self.recent_window,
            "dynamic_window": self.dynamic_window,
            "min_window": self.min_window,
        }

    @classmethod
    def from_json(cls, data: Mapping) -> KvSettings:
        """Settings from ``to_json``'s data (ValueError for unknown keys or values)."""
        data = dict(data)
        data["per_layer"] = {int(k): float(v) for k, v in data.get("per_layer", {}).items()}
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown KV settings {sorted(unknown)}")
        return cls(**data)

    @property
    def needs_attention(self) -> bool:
        """Whether the host needs the model's attention heat: an attention-driven policy that drops
        something (``heavy_hitter``, ``topk_entropy``) or the dynamic window."""
        drops = self.sparsity_ratio > 0 or any(r > 0 for r in self.per_layer.values())
        return self.dynamic_window or (self.policy in ("heavy_hitter", "topk_entropy") and drops)

    @property
    def compresses(self) -> bool:
        """Whether blocks are stored other than dense in the activation dtype."""
        return self.quant == "int8" or (
            self.policy != "none" and (self.sparsity_ratio > 0 or any(r > 0 for r in self.per_layer.values()))
        )


@dataclass(frozen=True)
class AttentionStats:
    """What the attention-driven policies need about one layer block.  ``head_entropy`` [kv_heads]
    (``topk_entropy``; ``policies.attention_entropy``); ``heat`` [kv_heads, rows] the heat of
    the block's positions (``heavy_hitter``; on the served path ``policies.relative_heat``: the
    attention accumulated over the steps relative to a uniform head's); ``first_position`` the
    sequence position of the block's first row and ``seq_len`` the
    sequence's current length (``heavy_hitter``'s recent window)."""

    head_entropy: np.ndarray | None = None
    heat: np.ndarray | None = None
    first_position: int = 0
    seq_len: int | None = None


@dataclass(frozen=True)
class StoredBlock:
    """One head's stored block.  ``data`` the encoded bytes (CRC-8 last); ``kind`` the value
    format (``int8``, or the activation dtype ``f16``/``f32``/``bf16``); ``fp16_retained`` True when
    int8 was asked and the block failed the error check (FP16_Retain); ``quant_error`` the
    measured ``max|dequant(quant(x)) - x| / max|x|`` when int8 was asked (else None); ``kept``
    values stored of ``rows x cols``; ``tiles`` each column tile's format."""

    data: bytes
    kind: str
    fp16_retained: bool
    quant_error: float | None
    rows: int
    cols: int
    kept: int
    tiles: tuple[str, ...]

    @property
    def nbytes(self) -> int:
        """Bytes the block occupies in NPU memory (header, scales, bitmap/coordinates, CRC)."""
        return len(self.data)

    @property
    def density(self) -> float:
        """Kept values / all values of the block."""
        return self.kept / (self.rows * self.cols)


def _mask(x: np.ndarray, settings: KvSettings, layer: int, stats: AttentionStats | None) -> np.ndarray:
    ratio = settings.ratio(layer)
    if ratio == 0.0:
        return np.ones(x.shape, bool)
    if settings.policy == "topk_magnitude":
        return policies.topk_magnitude(x, ratio)
    if settings.policy == "topk_entropy":
        if stats is None or stats.head_entropy is None:
            raise InternalError(f"layer {layer}: the topk_entropy policy needs the heads' attention entropy")
        return policies.topk_entropy(x, ratio, stats.head_entropy)
    if stats is None or stats.heat is None or stats.seq_len is None:
        raise InternalError(f"layer {layer}: the heavy_hitter policy needs the positions' heat and seq_len")
    return policies.heavy_hitter(
        x, ratio, stats.heat, stats.first_position, stats.seq_len, settings.recent_window
    )


def store_kv_block(
    block: np.ndarray, settings: KvSettings, layer: int, stats: AttentionStats | None = None
) -> list[StoredBlock]:
    """Store one layer's block of K or V: ``block`` [kv_heads, rows (1..64), head_dim] in the
    activation dtype (f16, f32 or bf16).  Returns one StoredBlock per head, in head order."""
    block = np.asarray(block)
    if block.ndim != 3 or not 1 <= block.shape[1] <= MAX_ROWS or block.shape[2] < 1:
        raise InternalError(
            f"a KV layer block is [kv_heads, 1..{MAX_ROWS} rows, head_dim], got shape {block.shape}"
        )
    act = FLOAT_KINDS.get(block.dtype)
    if act is None:
        raise InternalError(f"KV values must be f16, f32 or bf16, got {block.dtype}")
    mask = _mask(block, settings, layer, stats)
    out = []
    for h in range(block.shape[0]):
        x, keep = block[h], mask[h]
        kept = int(keep.sum())
        if settings.quant == "int8":
            q = quantize_rows(x, keep)
            error = relative_error(x, dequantize_rows(q, act), keep)
            if passes_check(error, settings.quant_tol):
                data, tiles = encode_block("int8", q.codes, keep, q.scale, q.zero_point)
                out.append(StoredBlock(data, "int8", False, error, *x.shape, kept, tiles))
                continue
        else:
            error = None
        values = np.where(keep, x, np.zeros((), x.dtype)).astype(x.dtype)
        data, tiles = encode_block(act, values, keep)
        out.append(StoredBlock(data, act, settings.quant == "int8", error, *x.shape, kept, tiles))
    return out


def nominal_block_bytes(
    settings: KvSettings, layer: int, kv_heads: int, rows: int, head_dim: int, act: str
) -> list[int]:
    """Bytes of each head's stored block (as ``store_kv_block`` returns them) when the sizes cannot
    be measured — a timing-only run has no values: what ``store_kv_block`` produces when int8
    passes its check, ``topk_entropy`` splits evenly, a ``heavy_hitter`` block holds no recent
    token, and the values of a coordinate-coded tile lie evenly spaced.  Exact for dense and bitmap
    tiles under those assumptions; a coordinate tile may differ by min(kept, elements / 128) bytes
    (a delta of 128 or more takes a second varint byte)."""
    if act not in FLOAT_KINDS.values():
        raise InternalError(f"KV values are f16, f32 or bf16, not {act!r}")
    kind = "int8" if settings.quant == "int8" else act
    value_bytes = STORAGE_DTYPES[kind].itemsize
    ratio = settings.ratio(layer)
    widths = [min(TILE, head_dim - c) for c in range(0, head_dim, TILE)]
    sizes = np.array([rows * w for w in widths])
    if settings.policy == "heavy_hitter" and ratio > 0:
        kept = [[policies.keep_count(rows, ratio) * w for w in widths]] * kv_heads
    elif settings.policy == "topk_entropy" and ratio > 0:
        budget = policies.keep_count(kv_heads * rows * head_dim, ratio)
        per_head = policies.apportion(budget, np.ones(kv_heads), np.full(kv_heads, rows * head_dim))
        kept = [policies.apportion(int(k), sizes, sizes).tolist() for k in per_head]
    else:
        kept = [[policies.keep_count(int(n), ratio) for n in sizes]] * kv_heads
    out = []
    for head in kept:
        total = HEADER_BYTES + 1 + (3 * rows if kind == "int8" else 0)
        for n, k in zip(sizes.tolist(), head, strict=True):
            fmt = tile_format(n, k, value_bytes)
            total += 1 + k * value_bytes
            if fmt == DENSE:
                total += (n - k) * value_bytes
            elif fmt == BITMAP:
                total += (n + 7) // 8
            else:
                total += 2 + (k if k == 0 or n // k <= 128 else 2 * k)
        out.append(total)
    return out


def load_kv_block(stored: StoredBlock | bytes, out: str | None = None, block: str = "?") -> np.ndarray:
    """The values [rows, head_dim] a stored block holds, dropped positions 0, in ``out`` (default:
    the block's own float kind; int8 blocks default to f32).  Checks the CRC-8 first: raises
    ``KVBlockCorrupt`` naming ``block`` when the bytes are corrupt."""
    if out is not None and out not in FLOAT_KINDS.values():
        raise InternalError(f"KV values are read as f16, f32 or bf16, not {out!r}")
    data = stored.data if isinstance(stored, StoredBlock) else stored
    d = decode_block(data, block)
    if d.kind == "int8":
        values = dequantize_rows(QuantRows(d.values, d.scale, d.zero_point), out or "f32")
        return np.where(d.mask, values, np.zeros((), values.dtype))
    if out is None or out == d.kind:
        return d.values
    return numerics.cast(d.values, out)
