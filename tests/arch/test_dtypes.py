"""The one dtype table and the 4-bit packing shared by compiler and simulator."""

import ml_dtypes
import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcpc.arch import dtypes as dt
from mcpc.arch.isa import DTYPE_BYTES, DTYPE_CODES
from mcpc.arch.numerics import NUMPY_DTYPES
from mcpc.ir import dtypes as ir_dtypes


def test_table_matches_onnx_enums_and_numpy():
    for d in dt.DTYPES.values():
        assert onnx.helper.tensor_dtype_to_np_dtype(d.onnx) == (
            np.dtype(np.bool_) if d.name == "i1" else d.np_dtype
        ), d
        assert NUMPY_DTYPES[d.name] == d.np_dtype
        assert DTYPE_CODES[d.name] == d.code
        assert DTYPE_BYTES[d.name] * 8 == d.bits
    assert onnx.TensorProto.INT4 == dt.I4.onnx and onnx.TensorProto.FLOAT8E4M3FN == dt.F8E4M3FN.onnx


def test_ir_reexports_the_same_objects():
    assert ir_dtypes.I4 is dt.I4 and ir_dtypes.DTYPES is dt.DTYPES


def test_saturation_ranges():
    assert dt.I4.range() == (-8, 7) and dt.U4.range() == (0, 15)
    assert dt.F8E4M3FN.range() == (-448.0, 448.0)
    assert dt.U8.range() == (0, 255)


@pytest.mark.parametrize("count, expected", [(0, 0), (1, 1), (2, 1), (7, 4), (8, 4)])
def test_packed_storage_bytes(count, expected):
    assert dt.I4.storage_bytes(count) == expected == dt.nbytes("u4", count)
    assert dt.I8.storage_bytes(count) == count


def test_low_nibble_first_as_onnx_packs_int4():
    vals = np.array([1, -2, 7], dtype=ml_dtypes.int4)
    raw = dt.pack_nibbles(vals)
    assert raw.tolist() == [0xE1, 0x07]
    proto = onnx.numpy_helper.from_array(vals)  # onnx's own packer
    assert proto.raw_data == raw.tobytes()
    assert np.array_equal(dt.from_storage(proto.raw_data, "i4", (3,)), vals)


@settings(max_examples=60, deadline=None)
@given(
    dtype=st.sampled_from(["i4", "u4"]),
    rows=st.integers(1, 5),
    cols=st.integers(1, 9),
    data=st.data(),
)
def test_pack_unpack_round_trip_rows(dtype, rows, cols, data):
    lo, hi = dt.DTYPES[dtype].range()
    flat = data.draw(st.lists(st.integers(lo, hi), min_size=rows * cols, max_size=rows * cols))
    arr = np.array(flat, dtype=np.int64).reshape(rows, cols).astype(dt.NUMPY_DTYPES[dtype])
    # whole-tensor storage: flat row-major order, odd totals pad one high nibble with 0
    raw = dt.to_storage(arr)
    assert len(raw) == (rows * cols + 1) // 2
    if (rows * cols) % 2:
        assert raw[-1] >> 4 == 0
    assert np.array_equal(dt.from_storage(raw, dtype, (rows, cols)), arr)
    # per-row packing (each row starts on a byte): row length rounds up to whole bytes
    per_row = dt.pack_nibbles(arr)
    assert per_row.shape == (rows, (cols + 1) // 2)
    assert np.array_equal(dt.unpack_nibbles(per_row, dtype, cols), arr)
    # an odd-length write keeps the neighbour's high nibble
    old = np.full((rows, (cols + 1) // 2), 0xA5, np.uint8)
    kept = dt.pack_nibbles(arr, old[:, -1:])
    if cols % 2:
        assert np.all(kept[:, -1] >> 4 == 0xA)
    assert np.array_equal(dt.unpack_nibbles(kept, dtype, cols), arr)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(["f32", "f16", "bf16", "f8e4m3fn", "i32", "i8", "u8", "i1"]), st.integers(0, 7))
def test_storage_round_trip_byte_types(name, n):
    arr = np.arange(n).astype(dt.NUMPY_DTYPES[name])
    raw = dt.to_storage(arr)
    assert len(raw) == dt.DTYPES[name].storage_bytes(n)
    assert np.array_equal(dt.from_storage(raw, name, (n,)), arr)


def test_tile_bytes_round_each_packed_row_up():
    assert dt.tile_bytes("i4", 3, 5) == 9 and dt.tile_bytes("u4", 2, 4) == 4
    assert dt.tile_bytes("f16", 3, 5) == 30


def test_matmul_slot_sizes_count_packed_weights_at_half_a_byte():
    from mcpc.passes.tile_matmul import slot_bytes

    # (A 64x64 + B 64x64) x 2 slots + 2 f32 output slots (4096 elements x 4 bytes)
    assert slot_bytes(64, 64, 64, "i4", "f32", 64) == 2 * (2048 + 2048) + 2 * 16384
    assert slot_bytes(64, 64, 64, "i8", "f32", 64) == 2 * (4096 + 4096) + 2 * 16384
    # a 3-column packed row takes 2 bytes: A is 64 rows x 2 bytes, B 3 x 2 bytes (aligned to 64)
    assert slot_bytes(64, 3, 3, "u4", "f32", 64) == 2 * (128 + 64) + 2 * 768
