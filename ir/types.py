"""Ranked tensor types with static shapes: ``tensor<1x128xf32>``, ``tensor<f32>`` for scalars."""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from mcpc.ir.dtypes import DType


@dataclass(frozen=True)
class TensorType:
    """A statically shaped tensor of one element type.  Every dim is a non-negative int."""

    shape: tuple[int, ...]
    dtype: DType

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if any(d < 0 for d in self.shape):
            raise ValueError(f"negative dimension in shape {self.shape}")

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.dtype.storage_bytes(self.numel)

    def with_dtype(self, dtype: DType) -> TensorType:
        return TensorType(self.shape, dtype)

    def with_shape(self, shape) -> TensorType:
        return TensorType(tuple(shape), self.dtype)

    def __str__(self) -> str:
        dims = "".join(f"{d}x" for d in self.shape)
        return f"tensor<{dims}{self.dtype.name}>"
