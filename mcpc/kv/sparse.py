"""The storage formats of one tile of a KV block (``TILE`` tokens x up to ``TILE`` head-dim columns).

A tile holds the values a sparsity policy kept (``mask``); dropped values read back as 0.

* ``DENSE`` (0): every value, row-major.  Used when nothing is dropped, or when the bitmap and
  the kept values would take at least as many bytes (density >= 1 - 1/(8 x value bytes)).
* ``BITMAP`` (1), density >= 1/8: ``ceil(n/8)`` bytes of bitmap (bit i = element i of the tile
  in row-major order, least significant bit first), then the kept values in that order.
* ``COORDS`` (2), density < 1/8 (the sparse path): a u16 count, the count's coordinates delta-coded
  (the first element index itself, each later one minus its predecessor minus 1; each as an
  unsigned LEB128 varint: 7 bits a byte, low bits first, high bit set on all but the last byte),
  then the kept values in that order.

The density thresholds and the varint are the format; ``tile_format`` is the only chooser.
"""

from __future__ import annotations

import numpy as np

TILE = 64
DENSE, BITMAP, COORDS = 0, 1, 2
FORMAT_NAMES = {DENSE: "dense", BITMAP: "bitmap", COORDS: "coords"}
SPARSE_DENSITY = 0.125  # below it: delta-coded coordinates


class TileFormatError(ValueError):
    """Bytes that do not parse as a tile (the block decoder turns it into a corrupt-block error)."""


def tile_format(n: int, kept: int, value_bytes: int) -> int:
    """The format of a tile of ``n`` elements keeping ``kept`` values of ``value_bytes`` bytes."""
    if kept == n:
        return DENSE
    if kept < SPARSE_DENSITY * n:
        return COORDS
    if (n + 7) // 8 + kept * value_bytes >= n * value_bytes:
        return DENSE
    return BITMAP


def _varints(deltas: np.ndarray) -> bytes:
    out = bytearray()
    for d in deltas.tolist():
        while d >= 0x80:
            out.append((d & 0x7F) | 0x80)
            d >>= 7
        out.append(d)
    return bytes(out)


def _read_varints(buf: memoryview, pos: int, count: int) -> tuple[np.ndarray, int]:
    out = np.empty(count, np.int64)
    for i in range(count):
        value, shift = 0, 0
        while True:
            if pos >= len(buf):
                raise TileFormatError("coordinates run past the end of the block")
            byte = buf[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                break
            shift += 7
            if shift > 28:
                raise TileFormatError("a coordinate varint is longer than 4 bytes")
        out[i] = value
    return out, pos


def encode_tile(values: np.ndarray, mask: np.ndarray) -> bytes:
    """One tile: ``values`` [rows, w] in their storage dtype (little-endian bytes; dropped
    positions must already hold the value that reads back as 0), ``mask`` bool [rows, w]."""
    flat_mask = np.asarray(mask, bool).reshape(-1)
    flat = np.ascontiguousarray(values).reshape(-1)
    le = flat.dtype.newbyteorder("<")
    n, kept = flat.size, int(flat_mask.sum())
    fmt = tile_format(n, kept, flat.dtype.itemsize)
    if fmt == DENSE:
        return bytes([DENSE]) + flat.astype(le).tobytes()
    kept_values = flat[flat_mask].astype(le).tobytes()
    if fmt == BITMAP:
        bitmap = np.packbits(flat_mask, bitorder="little").tobytes()
        return bytes([BITMAP]) + bitmap + kept_values
    idx = np.flatnonzero(flat_mask)
    deltas = np.diff(idx, prepend=-1) - 1
    return bytes([COORDS]) + kept.to_bytes(2, "little") + _varints(deltas) + kept_values


def decode_tile(
    buf: memoryview, pos: int, rows: int, w: int, dtype: np.dtype
) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Parse the tile at ``buf[pos:]``: (values [rows, w] with dropped positions 0-filled in the
    storage dtype, mask, format, position after the tile).  Raises TileFormatError."""
    n = rows * w
    dtype = np.dtype(dtype).newbyteorder("<")
    size = dtype.itemsize
    if pos >= len(buf):
        raise TileFormatError("the block ends before a tile")
    fmt = buf[pos]
    pos += 1
    if fmt == DENSE:
        mask = np.ones(n, bool)
    elif fmt == BITMAP:
        nb = (n + 7) // 8
        if pos + nb > len(buf):
            raise TileFormatError("the bitmap runs past the end of the block")
        bits = np.frombuffer(buf[pos : pos + nb], np.uint8)
        mask = np.unpackbits(bits, count=n, bitorder="little").astype(bool)
        if np.unpackbits(bits, bitorder="little")[n:].any():
            raise TileFormatError("bitmap padding bits are set")
        pos += nb
    elif fmt == COORDS:
        if pos + 2 > len(buf):
            raise TileFormatError("the coordinate count runs past the end of the block")
        count = int.from_bytes(buf[pos : pos + 2], "little")
        deltas, pos = _read_varints(buf, pos + 2, count)
        idx = np.cumsum(deltas + 1) - 1
        if count and idx[-1] >= n:
            raise TileFormatError(f"a coordinate ({int(idx[-1])}) lies outside the {rows}x{w} tile")
        mask = np.zeros(n, bool)
        mask[idx] = True
    else:
        raise TileFormatError(f"unknown tile format {fmt}")
    kept = int(mask.sum())
    end = pos + kept * size
    if end > len(buf):
        raise TileFormatError("tile values run past the end of the block")
    kept_values = np.frombuffer(buf[pos:end], dtype)
    if fmt == DENSE:
        values = kept_values.copy()
    else:
        values = np.zeros(n, dtype)
        values[mask] = kept_values
    return values.reshape(rows, w), mask.reshape(rows, w), fmt, end
