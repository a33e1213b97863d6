"""CRC-8 of the compressed KV blocks: polynomial x^8 + x^2 + x + 1 (0x07), initial value 0, no
reflection, no final XOR — the CRC-8/SMBUS of the CRC catalogue (the ATM HEC polynomial), whose
check value (the CRC of the ASCII bytes ``123456789``) is 0xF4.

Any CRC whose polynomial has more than one term detects every single-bit error, and this one
every burst of up to 8 bits, whatever the block length; that is what a block's trailing byte
guarantees (two distant flipped bits may cancel).
"""

from __future__ import annotations

POLY = 0x07


def _table() -> bytes:
    out = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = ((crc << 1) ^ POLY) & 0xFF if crc & 0x80 else (crc << 1) & 0xFF
        out.append(crc)
    return bytes(out)


_TABLE = _table()


def crc8(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """CRC-8/SMBUS of ``data`` (continuing from ``crc`` when data is fed in pieces)."""
    table = _TABLE
    for byte in bytes(data):
        crc = table[crc ^ byte]
    return crc
