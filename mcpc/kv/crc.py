"""CRC-8 of the compressed KV blocks: polynomial x^8 + x^2 + x + 1 (0x07), initial value 0, no
reflection, no final XOR — the CRC-8/SMBUS of the CRC catalogue (the ATM HEC polynomial), whose
check value (the CRC of the ASCII bytes ``123456789``) is 0xF4.

Any CRC whose polynomial has more than one term detects every single-bit error, and this one
every burst of up to 8 bits, whatever the block length; that is what a block's trailing byte
guarantees (two distant flipped bits may cancel).
"""

from __future__ import annotations

import numpy as np

POLY = 0x07


def _table() -> np.ndarray:
    out = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = ((crc << 1) ^ POLY) & 0xFF if crc & 0x80 else (crc << 1) & 0xFF
        out.append(crc)
    return np.array(out, np.uint8)


# With initial value 0 and no final XOR the CRC is linear over GF(2) and leading zero bytes leave it
# unchanged, so crc(A || B) = SHIFT[k][crc(A)] ^ crc(B) for |B| = 2^k bytes, SHIFT[k] being the
# table applied 2^k times (appending a zero byte maps a CRC c to TABLE[c]).  That folds a message
# padded in front to a power of two in log2(length) vectorized steps instead of one per byte.
_TABLE = _table()
_SHIFT = [_TABLE]
for _ in range(40):
    _SHIFT.append(_SHIFT[-1][_SHIFT[-1]])


def crc8(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """CRC-8/SMBUS of ``data`` (continuing from ``crc`` when data is fed in pieces)."""
    msg = np.frombuffer(bytes(data), np.uint8)
    n = msg.size
    if n == 0:
        return crc
    size = 1 << (n - 1).bit_length()
    c = np.zeros(size, np.uint8)
    c[size - n :] = _TABLE[msg]
    c[size - n] = _TABLE[msg[0] ^ crc]  # the running CRC enters with the first byte
    level = 0
    while c.size > 1:
        c = _SHIFT[level][c[0::2]] ^ c[1::2]
        level += 1
    return int(c[0])
