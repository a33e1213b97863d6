"""Element types of the MCP IR and their numpy representations (from ml_dtypes).

Names are the shared vocabulary of the toolchain: the same strings appear in IR text, the ISA,
``.mcpb`` tensor descriptors and target files.  ``i64`` exists only at a model's I/O boundary
(token ids, masks); ``i1`` is a boolean stored one byte per element.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np


@dataclass(frozen=True)
class DType:
    """One element type: its IR name, numpy dtype, storage width in bits and its kind."""

    name: str
    np_dtype: np.dtype
    bits: int
    is_float: bool
    is_signed: bool

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"DType({self.name})"

    @property
    def is_int(self) -> bool:
        return not self.is_float and self.name != "i1"

    def storage_bytes(self, count: int) -> int:
        """Bytes needed to store ``count`` elements (sub-byte types packed two per byte)."""
        return (count * self.bits + 7) // 8


def _d(name: str, npd, bits: int, is_float: bool, is_signed: bool) -> DType:
    return DType(name, np.dtype(npd), bits, is_float, is_signed)


F32 = _d("f32", np.float32, 32, True, True)
F16 = _d("f16", np.float16, 16, True, True)
BF16 = _d("bf16", ml_dtypes.bfloat16, 16, True, True)
F8E4M3FN = _d("f8e4m3fn", ml_dtypes.float8_e4m3fn, 8, True, True)
I64 = _d("i64", np.int64, 64, False, True)
I32 = _d("i32", np.int32, 32, False, True)
I8 = _d("i8", np.int8, 8, False, True)
U8 = _d("u8", np.uint8, 8, False, False)
I4 = _d("i4", ml_dtypes.int4, 4, False, True)
U4 = _d("u4", ml_dtypes.uint4, 4, False, False)
I1 = _d("i1", np.bool_, 8, False, False)

DTYPES: dict[str, DType] = {d.name: d for d in (F32, F16, BF16, F8E4M3FN, I64, I32, I8, U8, I4, U4, I1)}
_BY_NUMPY = {d.np_dtype: d for d in DTYPES.values()}


def dtype_from_name(name: str) -> DType:
    """The DType called ``name``; KeyError-free: raises ValueError listing the valid names."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r} (expected one of {', '.join(DTYPES)})") from None


def dtype_from_numpy(np_dtype) -> DType:
    """The DType whose numpy dtype is ``np_dtype``; ValueError when the IR has none."""
    try:
        return _BY_NUMPY[np.dtype(np_dtype)]
    except KeyError:
        raise ValueError(f"numpy dtype {np.dtype(np_dtype)} has no MCP IR element type") from None
