"""Memory planning: SRAM arenas for kernels, DRAM layout for constants, I/O and intermediates.

SRAM: each kernel gets a fresh ``SramArena`` over the target's scratchpad (kernels run one after
the other, see ``schedule``); buffers are bump-allocated at ``bank_bytes`` alignment and the
arena's peak is the kernel's planned SRAM use.  ``rows_that_fit`` picks the largest row tile
whose in/out slots (times 2 with double buffering) plus persistent buffers fit.

DRAM (``plan_dram``): constants packed into one CNST region (each aligned to 64 bytes), then the
function inputs, the outputs, and a scratch region where intermediates share space by liveness
(best-fit offsets over [defining op, last use] intervals).  Reshapes alias their operand.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from mcpc.errors import PassError


def align_up(n: int, align: int) -> int:
    """``n`` rounded up to a multiple of ``align`` (>= 1)."""
    return -(-n // align) * align


@dataclass
class SlotRing:
    """``slots`` equal buffers of ``nbytes``; the r-th user (by load or store rank) gets ``addr(r)``."""

    base: int
    nbytes: int
    stride: int
    slots: int

    def addr(self, rank: int) -> int:
        return self.base + (rank % self.slots) * self.stride


@dataclass
class SramArena:
    """A bump allocator over ``size`` bytes of SRAM at ``align``-byte granularity.

    Guarantees: allocations never overlap and all lie in [0, size); ``peak`` is the end of the
    highest allocation.  An allocation that does not fit raises PassError naming ``what``.
    """

    size: int
    align: int = 64
    top: int = 0
    peak: int = 0
    names: list[tuple[str, int, int]] = field(default_factory=list)

    def alloc(self, nbytes: int, what: str = "buffer") -> int:
        """Reserve ``nbytes`` (rounded up to the alignment); return its SRAM byte address."""
        nbytes = align_up(max(int(nbytes), 1), self.align)
        if self.top + nbytes > self.size:
            raise PassError(
                f"SRAM plan: {what} needs {nbytes} bytes but only {self.size - self.top} of "
                f"{self.size} are free (in use: {self._describe()})"
            )
        addr = self.top
        self.top += nbytes
        self.peak = max(self.peak, self.top)
        self.names.append((what, addr, nbytes))
        return addr

    def ring(self, slots: int, nbytes: int, what: str = "slot") -> SlotRing:
        """``slots`` consecutive buffers of ``nbytes`` each (one allocation)."""
        stride = align_up(max(int(nbytes), 1), self.align)
        base = self.alloc(stride * slots, f"{what} x{slots}")
        return SlotRing(base, nbytes, stride, slots)

    def _describe(self) -> str:
        return ", ".join(f"{n} {b}B" for n, _, b in self.names) or "nothing"


def rows_that_fit(
    budget: int,
    align: int,
    in_slots: int,
    out_slots: int,
    in_row_bytes: Sequence[int],
    out_row_bytes: Sequence[int],
    persistent: int = 0,
    max_rows: int | None = None,
) -> int:
    """The largest row count ``t`` (<= max_rows) such that every per-row buffer of ``t`` rows,
    ``in_slots`` times for inputs and ``out_slots`` times for outputs, each aligned, plus
    ``persistent`` bytes fits in ``budget``.  Returns 0 when not even one row fits."""

    def need(t: int) -> int:
        ins = sum(align_up(max(t * b, 1), align) for b in in_row_bytes)
        outs = sum(align_up(max(t * b, 1), align) for b in out_row_bytes)
        return in_slots * ins + out_slots * outs + align_up(persistent, align)

    hi = max_rows if max_rows is not None else budget
    if hi <= 0 or need(1) > budget:
        return 0
    lo = 1
    while lo < hi:  # invariant: need(lo) fits
        mid = (lo + hi + 1) // 2
        if need(mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo
