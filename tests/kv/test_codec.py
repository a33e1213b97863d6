"""The KV block format: CRC-8, tile formats, exact round trips, corruption always caught, sizes."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mcpc.errors import EXIT_SIM_TRAP
from mcpc.kv import KVBlockCorrupt, crc8, decode_block, encode_block
from mcpc.kv.codec import STORAGE_DTYPES
from mcpc.kv.sparse import BITMAP, COORDS, DENSE, tile_format


def test_crc8_is_crc8_smbus():
    assert crc8(b"123456789") == 0xF4  # the catalogue's check value of CRC-8/SMBUS (poly 0x07)
    assert crc8(b"") == 0
    assert crc8(b"6789", crc8(b"12345")) == 0xF4  # fed in pieces


def _crc8_bytewise(data: bytes, crc: int = 0) -> int:
    for byte in data:  # the textbook shift register, bit by bit
        crc ^= byte
        for _ in range(8):
            crc = ((crc << 1) ^ 0x07) & 0xFF if crc & 0x80 else (crc << 1) & 0xFF
    return crc


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=3000), st.integers(0, 255))
def test_crc8_folding_equals_the_shift_register(data, start):
    assert crc8(data, start) == _crc8_bytewise(data, start)


def test_tile_format_thresholds():
    assert tile_format(4096, 4096, 2) == DENSE
    assert tile_format(4096, 512, 2) == BITMAP  # density exactly 1/8
    assert tile_format(4096, 511, 2) == COORDS
    assert tile_format(4096, 3840, 1) == DENSE  # int8: bitmap + 15/16 of the values >= dense
    assert tile_format(4096, 3583, 1) == BITMAP
    assert tile_format(4096, 0, 4) == COORDS


@st.composite
def blocks(draw):
    kind = draw(st.sampled_from(["f16", "f32", "bf16", "int8"]))
    rows = draw(st.integers(1, 64))
    cols = draw(st.sampled_from([1, 7, 16, 64, 80, 128]))
    dtype = STORAGE_DTYPES[kind]
    if kind == "int8":
        values = draw(hnp.arrays(np.uint8, (rows, cols)))
    else:
        raw = draw(hnp.arrays(np.float32, (rows, cols), elements=st.floats(width=32)))
        with np.errstate(over="ignore"):
            values = raw.astype(dtype)
    density = draw(st.sampled_from([0.0, 0.01, 0.1, 0.124, 0.125, 0.3, 0.9, 1.0]))
    seed = draw(st.integers(0, 2**16))
    mask = np.random.default_rng(seed).random((rows, cols)) < density
    zero = np.zeros((), dtype)
    scale = zp = None
    if kind == "int8":
        scale = draw(hnp.arrays(np.float16, rows, elements=st.floats(0.0009765625, 8.0, width=16)))
        zp = draw(hnp.arrays(np.uint8, rows))
        values = np.where(mask, values, zp[:, None]).astype(np.uint8)
    else:
        values = np.where(mask, values, zero).astype(dtype)
    return kind, values, mask, scale, zp


@settings(max_examples=150, deadline=None)
@given(blocks())
def test_encode_decode_round_trip_is_exact(case):
    kind, values, mask, scale, zp = case
    data, tiles = encode_block(kind, values, mask, scale, zp)
    d = decode_block(data, "b")
    assert d.kind == kind and d.tiles == tiles
    assert d.values.dtype == values.dtype
    assert d.values.tobytes() == values.tobytes()  # bit-exact, -0.0 and NaN payloads included
    assert (d.mask | ~mask).all()  # every kept value is stored (a dense tile stores all)
    if kind == "int8":
        assert d.scale.tobytes() == scale.tobytes() and (d.zero_point == zp).all()
    assert crc8(data) == 0  # a message followed by its CRC has CRC 0 (no final XOR)


@settings(max_examples=60, deadline=None)
@given(blocks(), st.data())
def test_every_single_bit_flip_is_caught(case, data):
    kind, values, mask, scale, zp = case
    block, _ = encode_block(kind, values, mask, scale, zp)
    bit = data.draw(st.integers(0, 8 * len(block) - 1))
    bad = bytearray(block)
    bad[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(KVBlockCorrupt) as info:
        decode_block(bytes(bad), "layer 3 K head 1 block 7")
    assert info.value.block == "layer 3 K head 1 block 7"
    assert "layer 3 K head 1 block 7" in info.value.message and "not used" in info.value.message
    assert info.value.exit_code == EXIT_SIM_TRAP


def test_every_bit_of_one_block_exhaustively():
    rng = np.random.default_rng(1)
    values = rng.standard_normal((64, 64)).astype(np.float16)
    mask = rng.random((64, 64)) < 0.05
    block, tiles = encode_block("f16", np.where(mask, values, 0).astype(np.float16), mask)
    assert tiles == ("coords",)
    for bit in range(8 * len(block)):
        bad = bytearray(block)
        bad[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(KVBlockCorrupt, match="CRC-8 mismatch"):
            decode_block(bytes(bad), "b")


def test_truncated_or_malformed_blocks_are_corrupt():
    block, _ = encode_block("f32", np.ones((4, 8), np.float32))
    for cut in (0, 1, 4, len(block) - 1):
        with pytest.raises(KVBlockCorrupt):
            decode_block(block[:cut], "b")
    # a body that parses badly but carries a matching CRC is still refused
    body = bytearray(block[:-1])
    body[0] = 0x1F  # unknown kind
    with pytest.raises(KVBlockCorrupt, match="unknown block version 1 / kind 15"):
        decode_block(bytes(body) + bytes([crc8(body)]), "b")
    extra = block[:-1] + b"\x00"
    with pytest.raises(KVBlockCorrupt, match="1 bytes after the last tile"):
        decode_block(extra + bytes([crc8(extra)]), "b")


def test_block_sizes_follow_the_format():
    rng = np.random.default_rng(2)
    v = rng.standard_normal((64, 64)).astype(np.float16)
    dense, _ = encode_block("f16", v)
    assert len(dense) == 4 + 1 + 64 * 64 * 2 + 1
    mask = np.zeros((64, 64), bool)
    mask[:, :20] = True  # density 0.3125: bitmap
    bitmap, tiles = encode_block("f16", np.where(mask, v, 0).astype(np.float16), mask)
    assert tiles == ("bitmap",) and len(bitmap) == 4 + 1 + 512 + 2 * int(mask.sum()) + 1
    mask = np.zeros((64, 64), bool)
    mask[::8, ::8] = True  # 64 values, every gap 7 or 456: coordinates in 1 or 2 varint bytes
    coords, tiles = encode_block("f16", np.where(mask, v, 0).astype(np.float16), mask)
    idx = np.flatnonzero(mask)
    deltas = np.diff(idx, prepend=-1) - 1
    varint_bytes = int(sum(1 if d < 128 else 2 for d in deltas))
    assert tiles == ("coords",) and len(coords) == 4 + 1 + 2 + varint_bytes + 2 * 64 + 1
    codes = rng.integers(0, 256, (10, 128)).astype(np.uint8)
    q, tiles = encode_block("int8", codes, None, np.ones(10, np.float16), np.zeros(10, np.uint8))
    assert tiles == ("dense", "dense") and len(q) == 4 + 10 * 3 + 2 * (1 + 10 * 64) + 1


def test_encode_refuses_what_it_cannot_store():
    with pytest.raises(ValueError, match="rows"):
        encode_block("f16", np.zeros((65, 8), np.float16))
    with pytest.raises(ValueError, match="must be float16"):
        encode_block("f16", np.zeros((4, 8), np.float32))
    with pytest.raises(ValueError, match="scale and zero point"):
        encode_block("int8", np.zeros((4, 8), np.uint8))
