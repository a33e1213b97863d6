"""The byte format of one stored KV block, with its CRC-8 (docs/kv-cache.md is the reference).

A block is one KV head's rows (up to 64 tokens, one row of ``cols`` = head_dim values each) of
one layer's K or V.  Little-endian throughout::

    u8   version << 4 | kind        version 1; kind 0 f16, 1 f32, 2 bf16, 3 int8 (INT8_Asymmetric)
    u8   rows                       1..64 tokens
    u16  cols                       head_dim
    int8 only: rows x f16 scale, then rows x u8 zero point
    per column tile t (columns 64t .. min(64t+64, cols)): one tile (mcpc.kv.sparse)
    u8   CRC-8 of every byte before it (mcpc.kv.crc)

``decode_block`` checks the CRC before it reads anything else: a block whose CRC fails, or whose
bytes do not parse, raises ``KVBlockCorrupt`` naming the block — its data is never returned.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from mcpc.errors import SimTrap
from mcpc.kv import sparse
from mcpc.kv.crc import crc8

VERSION = 1
KINDS = {0: "f16", 1: "f32", 2: "bf16", 3: "int8"}
KIND_CODES = {name: code for code, name in KINDS.items()}
STORAGE_DTYPES = {
    "f16": np.dtype(np.float16),
    "f32": np.dtype(np.float32),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "int8": np.dtype(np.uint8),
}
HEADER_BYTES = 4
MAX_ROWS = 64


class KVBlockCorrupt(SimTrap):
    """A stored KV block failed its CRC-8 (or does not parse): named by ``block``; never used.
    The simulator reports it as a fault (a trap, exit 5)."""

    def __init__(self, block: str, reason: str):
        super().__init__(f"KV block {block}: {reason}; the block is corrupt and its data was not used")
        self.block = block
        self.reason = reason


@dataclass(frozen=True)
class DecodedBlock:
    """A parsed block: ``values`` [rows, cols] in the storage dtype of ``kind`` (u8 codes for
    int8; dropped positions hold the value that reads back as 0), ``mask`` the stored positions
    (all of a dense tile), ``scale``/``zero_point`` per row for int8 (else None), ``tiles`` the
    format of each column tile (``dense``, ``bitmap``, ``coords``)."""

    kind: str
    values: np.ndarray
    mask: np.ndarray
    scale: np.ndarray | None
    zero_point: np.ndarray | None
    tiles: tuple[str, ...]


def tile_columns(cols: int) -> list[tuple[int, int]]:
    """The column ranges of a block's tiles: 64 head-dim columns each, the last one shorter."""
    return [(c, min(c + sparse.TILE, cols)) for c in range(0, cols, sparse.TILE)]


def encode_block(
    kind: str,
    values: np.ndarray,
    mask: np.ndarray | None = None,
    scale: np.ndarray | None = None,
    zero_point: np.ndarray | None = None,
) -> tuple[bytes, tuple[str, ...]]:
    """Encode ``values`` [rows, cols] (already in ``kind``'s storage dtype; u8 codes for int8, with
    ``scale`` f16 [rows] and ``zero_point`` u8 [rows]) keeping the ``mask`` positions (None: all).
    Returns the block bytes (CRC-8 last) and each tile's format name."""
    if kind not in KIND_CODES:
        raise ValueError(f"unknown KV block kind {kind!r} (expected one of {', '.join(KIND_CODES)})")
    values = np.asarray(values)
    if values.ndim != 2 or not 1 <= values.shape[0] <= MAX_ROWS or not 1 <= values.shape[1] < 1 << 16:
        raise ValueError(f"a KV block is [1..{MAX_ROWS} rows, 1..65535 cols], got shape {values.shape}")
    if values.dtype != STORAGE_DTYPES[kind]:
        raise ValueError(f"{kind} block values must be {STORAGE_DTYPES[kind]}, got {values.dtype}")
    rows, cols = values.shape
    mask = np.ones(values.shape, bool) if mask is None else np.asarray(mask, bool)
    out = bytearray([VERSION << 4 | KIND_CODES[kind], rows]) + cols.to_bytes(2, "little")
    if kind == "int8":
        if scale is None or zero_point is None:
            raise ValueError("an int8 block needs its per-row scale and zero point")
        out += np.asarray(scale, np.float16).astype("<f2").tobytes()
        out += np.asarray(zero_point, np.uint8).tobytes()
    formats = []
    for c0, c1 in tile_columns(cols):
        tile = sparse.encode_tile(values[:, c0:c1], mask[:, c0:c1])
        formats.append(sparse.FORMAT_NAMES[tile[0]])
        out += tile
    out.append(crc8(out))
    return bytes(out), tuple(formats)


def decode_block(data: bytes | bytearray | memoryview, block: str = "?") -> DecodedBlock:
    """Parse a block after checking its CRC-8; ``block`` names it in the error (e.g.
    ``layer 3 K head 1 block 7``).  Raises KVBlockCorrupt on a CRC mismatch or bad bytes."""
    buf = memoryview(bytes(data))
    if len(buf) < HEADER_BYTES + 1:
        raise KVBlockCorrupt(block, f"{len(buf)} bytes is shorter than a block header and its CRC")
    stored, computed = buf[-1], crc8(buf[:-1])
    if stored != computed:
        raise KVBlockCorrupt(block, f"CRC-8 mismatch (stored 0x{stored:02x}, computed 0x{computed:02x})")
    body = buf[:-1]
    version, code = body[0] >> 4, body[0] & 0x0F
    if version != VERSION or code not in KINDS:
        raise KVBlockCorrupt(block, f"unknown block version {version} / kind {code}")
    kind, rows, cols = KINDS[code], body[1], int.from_bytes(body[2:4], "little")
    if not 1 <= rows <= MAX_ROWS or cols == 0:
        raise KVBlockCorrupt(block, f"bad block shape {rows}x{cols}")
    pos = HEADER_BYTES
    scale = zero_point = None
    if kind == "int8":
        if pos + 3 * rows > len(body):
            raise KVBlockCorrupt(block, "the scales run past the end of the block")
        scale = np.frombuffer(body[pos : pos + 2 * rows], "<f2").astype(np.float16)
        zero_point = np.frombuffer(body[pos + 2 * rows : pos + 3 * rows], np.uint8).copy()
        pos += 3 * rows
    dtype = STORAGE_DTYPES[kind]
    values = np.empty((rows, cols), dtype)
    mask = np.empty((rows, cols), bool)
    formats = []
    for c0, c1 in tile_columns(cols):
        try:
            v, m, fmt, pos = sparse.decode_tile(body, pos, rows, c1 - c0, dtype)
        except sparse.TileFormatError as exc:
            raise KVBlockCorrupt(block, f"tile at columns {c0}..{c1 - 1}: {exc}") from None
        if kind == "int8":
            v = np.where(m, v, zero_point[:, None]).astype(np.uint8)
        values[:, c0:c1], mask[:, c0:c1] = v, m
        formats.append(sparse.FORMAT_NAMES[fmt])
    if pos != len(body):
        raise KVBlockCorrupt(block, f"{len(body) - pos} bytes after the last tile")
    return DecodedBlock(kind, values, mask, scale, zero_point, tuple(formats))
