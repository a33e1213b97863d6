"""The element types of the toolchain — one table, read by the IR, the ONNX importer, the backend,
the ISA encoder, the ``.mcpb`` descriptors and the simulator.

Each row names a type once: its IR/ISA/target name, storage width in bits, numpy (ml_dtypes) type,
ONNX ``TensorProto.DataType`` enum, ISA dtype code, and whether it is packed.  ``i64`` exists only at
a model's I/O boundary (token ids, masks); ``i1`` is a boolean stored one byte per element.

Sub-byte types (``i4``, ``u4``) are stored packed two per byte, element ``2j`` in the low nibble
and ``2j+1`` in the high nibble, over the flat row-major element order — exactly as ONNX packs
INT4/UINT4 — in DRAM, in ``.mcpb`` constants and in SRAM tiles (``pack_nibbles``/``unpack_nibbles``;
an odd count leaves the last high nibble 0).  A tile row starts on a byte boundary only when its
first element index is even, which is why the simulator refuses odd element strides for them.

This module is part of ``mcpc.arch``: it must not import the compiler or onnx (the ONNX enums are
the stable integers of onnx.proto).
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np


@dataclass(frozen=True)
class DType:
    """One element type: its name, numpy dtype, storage width in bits, kind, ONNX enum and ISA code."""

    name: str
    np_dtype: np.dtype
    bits: int
    is_float: bool
    is_signed: bool
    onnx: int  # onnx.TensorProto.DataType
    code: int  # the ISA's dtype field (append only: codes are never reused)

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"DType({self.name})"

    @property
    def is_int(self) -> bool:
        return not self.is_float and self.name != "i1"

    @property
    def packed(self) -> bool:
        """Stored two per byte (sub-byte width)."""
        return self.bits < 8

    @property
    def elem_bytes(self) -> float:
        """Bytes per element: 0.5 for packed types."""
        return self.bits / 8

    def storage_bytes(self, count: int) -> int:
        """Bytes needed to store ``count`` elements (sub-byte types packed two per byte)."""
        return (int(count) * self.bits + 7) // 8

    def range(self) -> tuple[float, float]:
        """Smallest and largest finite value (the saturation bounds of a quantizing conversion)."""
        if self.is_float:
            fi = ml_dtypes.finfo(self.np_dtype)
            return float(fi.min), float(fi.max)
        if self.name == "i1":
            return 0, 1
        ii = ml_dtypes.iinfo(self.np_dtype)
        return int(ii.min), int(ii.max)


def _d(name: str, npd, bits: int, is_float: bool, is_signed: bool, onnx: int, code: int) -> DType:
    return DType(name, np.dtype(npd), bits, is_float, is_signed, onnx, code)


#            name        numpy                    bits  float  signed onnx code
F32 = _d("f32", np.float32, 32, True, True, 1, 0)
F16 = _d("f16", np.float16, 16, True, True, 10, 1)
BF16 = _d("bf16", ml_dtypes.bfloat16, 16, True, True, 16, 2)
F8E4M3FN = _d("f8e4m3fn", ml_dtypes.float8_e4m3fn, 8, True, True, 17, 8)
I64 = _d("i64", np.int64, 64, False, True, 7, 10)
I32 = _d("i32", np.int32, 32, False, True, 6, 3)
I8 = _d("i8", np.int8, 8, False, True, 3, 4)
U8 = _d("u8", np.uint8, 8, False, False, 2, 5)
I4 = _d("i4", ml_dtypes.int4, 4, False, True, 22, 6)
U4 = _d("u4", ml_dtypes.uint4, 4, False, False, 21, 7)
I1 = _d("i1", np.bool_, 8, False, False, 9, 9)

DTYPES: dict[str, DType] = {d.name: d for d in (F32, F16, BF16, F8E4M3FN, I64, I32, I8, U8, I4, U4, I1)}
DTYPE_NAMES: tuple[str, ...] = tuple(DTYPES)
BY_NUMPY: dict[np.dtype, DType] = {d.np_dtype: d for d in DTYPES.values()}
BY_ONNX: dict[int, DType] = {d.onnx: d for d in DTYPES.values()}
BY_CODE: dict[int, DType] = {d.code: d for d in DTYPES.values()}
NUMPY_DTYPES: dict[str, np.dtype] = {d.name: d.np_dtype for d in DTYPES.values()}
FLOAT_DTYPES = frozenset(d.name for d in DTYPES.values() if d.is_float)
PACKED = frozenset(d.name for d in DTYPES.values() if d.packed)
# Output types of a quantizing conversion (ONNX QuantizeLinear's y).
QUANTIZED_DTYPES = frozenset({"i8", "u8", "i4", "u4", "f8e4m3fn"})

if len(BY_ONNX) != len(DTYPES) or len(BY_CODE) != len(DTYPES) or len(BY_NUMPY) != len(DTYPES):
    raise AssertionError("dtype table: ONNX enums, ISA codes and numpy types must be unique")


def dtype_from_name(name: str) -> DType:
    """The DType called ``name``; raises ValueError listing the valid names."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r} (expected one of {', '.join(DTYPES)})") from None


def dtype_from_numpy(np_dtype) -> DType:
    """The DType whose numpy dtype is ``np_dtype``; ValueError when the table has none."""
    try:
        return BY_NUMPY[np.dtype(np_dtype)]
    except KeyError:
        raise ValueError(f"numpy dtype {np.dtype(np_dtype)} has no MCP element type") from None


def nbytes(dtype: str, count: int) -> int:
    """Bytes ``count`` elements of the dtype called ``dtype`` occupy (packed types two per byte)."""
    return DTYPES[dtype].storage_bytes(count)


# -- sub-byte packing -----------------------------------------------------------------------------
def pack_nibbles(values: np.ndarray, keep_last_high: np.ndarray | None = None) -> np.ndarray:
    """uint8 bytes of the 4-bit ``values`` along the last axis, element 2j in the low nibble.

    An odd count pads the last byte's high nibble with 0, or with the high nibble of
    ``keep_last_high`` (the byte's current value, so a write never clobbers a neighbour).
    """
    nib = (np.asarray(values).astype(np.int8) & 0xF).astype(np.uint8)
    if nib.shape[-1] % 2:
        pad = np.zeros(nib.shape[:-1] + (1,), np.uint8) if keep_last_high is None else keep_last_high >> 4
        nib = np.concatenate([nib, pad], axis=-1)
    return nib[..., 0::2] | (nib[..., 1::2] << 4)


def unpack_nibbles(raw: np.ndarray, dtype: str, count: int) -> np.ndarray:
    """``count`` 4-bit elements of ``dtype`` (``i4``/``u4``) from the uint8 bytes ``raw`` (last axis)."""
    raw = np.asarray(raw, dtype=np.uint8)
    nib = np.stack([raw & 0xF, raw >> 4], axis=-1).reshape(*raw.shape[:-1], -1)[..., :count]
    if dtype == "i4":
        nib = (nib.astype(np.int8) ^ 8) - 8  # sign-extend the nibble
    return nib.astype(NUMPY_DTYPES[dtype])


def tile_bytes(dtype: str, rows: int, cols: int) -> int:
    """Bytes of a ``rows`` x ``cols`` tile whose rows each start on a byte boundary (a packed row of
    an odd length ends in a half-used byte): what SRAM slots and DMA row lengths are sized by."""
    return int(rows) * DTYPES[dtype].storage_bytes(cols)


def to_storage(arr: np.ndarray) -> bytes:
    """The bytes a tensor is stored as: row-major, little-endian, packed two per byte when sub-byte."""
    dt = dtype_from_numpy(arr.dtype)
    flat = np.ascontiguousarray(arr).reshape(-1)
    return pack_nibbles(flat).tobytes() if dt.packed else flat.tobytes()


def from_storage(raw: bytes | np.ndarray, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """The tensor of ``dtype`` and ``shape`` stored in ``raw`` (inverse of ``to_storage``)."""
    dt = DTYPES[dtype]
    count = int(np.prod(shape, dtype=np.int64))
    buf = np.frombuffer(raw, dtype=np.uint8) if isinstance(raw, (bytes, bytearray)) else np.asarray(raw)
    need = dt.storage_bytes(count)
    if buf.size < need:
        raise ValueError(f"{need} bytes needed for {dtype}{list(shape)}, got {buf.size}")
    if dt.packed:
        return unpack_nibbles(buf[:need], dtype, count).reshape(shape)
    return np.frombuffer(buf[:need].tobytes(), dtype=dt.np_dtype, count=count).reshape(shape)
