"""The simulated machine's state: DRAM, SRAM and the scalar registers, with typed strided views.

Assumptions: SRAM addresses in instructions are static, so their bounds are checked once when the
program is loaded (``sram_extent``); DRAM addresses may add a scalar register, so DMA checks them
at execution time (``dram_rows``).  Every operand is a 2-D (rows, cols) numpy view over the byte
arrays, built with explicit byte strides: a row stride of 0 repeats row 0, a column step of 0
repeats one element per row.  ``i4``/``u4`` are packed two per byte, element 2j in the low nibble
(docs/isa.md): their operands are unpacked on read and packed on write (``read``/``write``),
every other dtype is a zero-copy numpy view.
"""

from __future__ import annotations

import numpy as np

# Packing of 4-bit types is defined once, with the dtype table.
from mcpc.arch.dtypes import PACKED, nbytes  # noqa: F401
from mcpc.arch.dtypes import pack_nibbles as pack4  # noqa: F401
from mcpc.arch.dtypes import unpack_nibbles as unpack4  # noqa: F401
from mcpc.arch.isa import N_REGS  # noqa: F401  (the register count, re-exported)


class Fault(Exception):
    """A trap raised while executing one instruction; the executor adds address, mnemonic and node."""


def sram_extent(addr: int, rows: int, cols: int, row_step: int, col_step: int, size: int) -> int:
    """One past the last byte an operand touches (``addr`` when it is empty).

    ``row_step``/``col_step`` are byte strides, ``size`` the element size in bytes.
    """
    if rows <= 0 or cols <= 0:
        return addr
    return addr + (rows - 1) * row_step + (cols - 1) * col_step + size


class Machine:
    """Memories and registers of one run.  Created zeroed; the loader fills DRAM before the run.

    ``dram`` and ``sram`` are flat uint8 arrays; ``regs`` is a list of 16 Python ints (r0 stays 0);
    ``qparams`` is the QParam group ``(scale_a, scale_w, scale_o, zp_ptr, scale_ptr, group_size)``
    that ``setq`` sets; ``numeric`` collects ``(instruction index, NaNs produced, overflows)`` in
    run order (sim.numeric).
    """

    __slots__ = ("dram", "sram", "regs", "dram_size", "qparams", "numeric")

    def __init__(self, dram_size: int, sram_size: int):
        # np.zeros is calloc-backed: a large, mostly untouched DRAM costs no physical memory.
        self.dram = np.zeros(dram_size, dtype=np.uint8)
        self.sram = np.zeros(sram_size, dtype=np.uint8)
        self.regs = [0] * N_REGS
        self.dram_size = dram_size
        self.qparams = (0.0, 0.0, 0.0, 0, 0, 0)
        self.numeric: list[tuple[int, int, int]] = []


def view(buf: np.ndarray, addr: int, rows: int, cols: int, row_step: int, col_step: int, dt: np.dtype):
    """A writable (rows, cols) view of ``buf`` at byte ``addr`` with byte strides (bounds pre-checked)."""
    return np.ndarray((rows, cols), dtype=dt, buffer=buf, offset=addr, strides=(row_step, col_step))


def dram_check(m: Machine, addr: int, rows: int, row_bytes: int, stride: int) -> None:
    """Fault if any byte of the (rows, row_bytes) DRAM block at ``addr`` lies outside DRAM."""
    hi = addr + (rows - 1) * stride + row_bytes if rows > 0 and row_bytes > 0 else addr
    if addr < 0 or hi > m.dram_size:
        raise Fault(
            f"DRAM address out of range: bytes [{addr:#x}, {hi:#x}) outside DRAM [0, {m.dram_size:#x})"
        )


def dram_rows(m: Machine, addr: int, rows: int, row_bytes: int, stride: int) -> np.ndarray:
    """A (rows, row_bytes) uint8 view of DRAM; Fault if any byte lies outside DRAM."""
    dram_check(m, addr, rows, row_bytes, stride)
    return np.ndarray(
        (rows, row_bytes), dtype=np.uint8, buffer=m.dram, offset=max(addr, 0), strides=(stride, 1)
    )
