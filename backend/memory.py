"""Memory planning: SRAM arenas for kernels, DRAM layout for constants, I/O and intermediates.

SRAM: each kernel gets a fresh ``SramArena`` over a region of the target's scratchpad (the whole
of it, or with cross-kernel prefetch a region the previous kernel does not use, see
``compile.py`` and ``schedule``); buffers are bump-allocated at ``bank_bytes`` alignment and the
arena's peak is the kernel's planned SRAM use.  ``rows_that_fit`` picks the largest row tile
whose in/out slots (times 2 with double buffering) plus persistent buffers fit.

DRAM (``plan_dram``): constants packed into one CNST region (each aligned to 64 bytes, each
distinct content once: ``constant_pool.ConstantPool``), then the function inputs, the outputs,
and a scratch region where intermediates share space by liveness (best-fit offsets over
[defining op, last use] intervals).  Reshapes alias their operand.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mcpc.backend.constant_pool import ConstantPool
from mcpc.errors import PassError
from mcpc.ir.ops import ConstantOp, ReshapeOp

# Ops whose result is a view of their operand's DRAM bytes: planned as aliases, lowered to nothing.
ALIAS_OPS = (ReshapeOp,)


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
    """A bump allocator over ``size`` bytes of SRAM starting at address ``base``, at
    ``align``-byte granularity (``base`` a multiple of ``align``).

    Guarantees: allocations never overlap and all lie in [base, base + size); ``peak`` is the
    number of bytes from ``base`` to the end of the highest allocation.  An allocation that does
    not fit raises PassError naming ``what``.
    """

    size: int
    align: int = 64
    base: int = 0
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
        addr = self.base + self.top
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


def rows_bytes(
    rows: int,
    align: int,
    in_slots: int,
    out_slots: int,
    in_row_bytes: Sequence[int],
    out_row_bytes: Sequence[int],
    persistent: int = 0,
) -> int:
    """SRAM bytes of ``rows`` rows of every per-row buffer (``in_slots``/``out_slots`` times each,
    aligned) plus ``persistent``: what ``rows_that_fit`` holds against its budget."""
    ins = sum(align_up(max(rows * b, 1), align) for b in in_row_bytes)
    outs = sum(align_up(max(rows * b, 1), align) for b in out_row_bytes)
    return in_slots * ins + out_slots * outs + align_up(persistent, align)


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
        return rows_bytes(t, align, in_slots, out_slots, in_row_bytes, out_row_bytes, persistent)

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


# -- DRAM --------------------------------------------------------------------------------------------
DRAM_ALIGN = 64


def assign_offsets(buffers: Sequence[tuple[int, int, int]], align: int = DRAM_ALIGN) -> tuple[list[int], int]:
    """Offsets for buffers ``(first, last, nbytes)`` live over op indices [first, last] (inclusive).

    Greedy best fit in order of ``first`` (ties: input order): a buffer takes the smallest free gap
    between buffers still live at its ``first`` that holds it, else goes on top.  Guarantees: two
    buffers whose intervals intersect never overlap in memory; offsets are multiples of ``align``.
    Returns (offsets in input order, total bytes).
    """
    order = sorted(range(len(buffers)), key=lambda i: (buffers[i][0], i))
    offsets = [0] * len(buffers)
    live: list[tuple[int, int, int]] = []  # (offset, size, last) sorted by offset
    total = 0
    for i in order:
        first, last, nbytes = buffers[i]
        size = align_up(max(int(nbytes), 1), align)
        live = [b for b in live if b[2] >= first]  # a buffer used by op `first` is still live there
        best, best_gap, cursor = None, None, 0
        for off, sz, _ in live:
            gap = off - cursor
            if gap >= size and (best_gap is None or gap < best_gap):
                best, best_gap = cursor, gap
            cursor = max(cursor, off + sz)
        offset = best if best is not None else cursor
        offsets[i] = offset
        live.append((offset, size, last))
        live.sort()
        total = max(total, offset + size)
    return offsets, total


@dataclass
class DramPlan:
    """Where every IR value lives in DRAM, and the CNST blob.

    ``placements`` maps each value (function args, op results, constants) to its byte address;
    ``constants`` maps constant values (and reshapes of them) to their arrays; ``cnst`` is the
    packed CNST section (placed at DRAM address 0); ``regions`` the MMAP regions; ``buffers``
    one record per planned buffer (for the compile report); ``size`` the DRAM bytes used;
    ``globals`` the address of each persistent buffer (the module's globals, ``kind: persistent``).
    """

    placements: dict = field(default_factory=dict)
    constants: dict = field(default_factory=dict)
    cnst: bytes = b""
    regions: list[dict] = field(default_factory=list)
    buffers: list[dict] = field(default_factory=list)
    size: int = 0
    globals: dict[str, int] = field(default_factory=dict)  # persistent buffer name -> DRAM address


def plan_dram(module: Any, positions: Mapping[Any, int] | None = None) -> DramPlan:
    """Plan DRAM for every function of ``module`` (a verified IR module).

    ``positions`` (optional) gives an op's place in the order of execution for liveness (default:
    its index in its function); the backend's epilogue fusion runs a group's ops at its head's
    index, so values they read stay live, and results they write start, there.

    Layout: the CNST blob at address 0 (each constant 64-byte aligned, module order; constants
    equal in dtype, shape and bytes, in any functions, share one copy), then per function (in
    module order): one region per input, one per output, then a scratch region where
    intermediates share space by liveness (``assign_offsets``); last, one ``persistent`` region
    per module global (not in CNST: zero at load).  ``mcp.reshape`` results alias
    their operand (no copy); an output that aliases an input or a constant is bound to its bytes.
    Every tensor is stored as ``mcpc.arch.dtypes.to_storage`` lays it out: row-major, sub-byte
    types packed two per byte, low nibble first (as ONNX packs int4), so a tensor of ``n`` 4-bit
    elements takes ``ceil(n / 2)`` bytes in the constants blob and in every region.
    """
    plan = DramPlan()
    pool = ConstantPool(DRAM_ALIGN)  # the program's, shared by every function
    for fn in module.functions.values():
        for op in fn.ops:
            if isinstance(op, ConstantOp):
                arr = np.ascontiguousarray(op.value)
                plan.placements[op.result] = pool.add(arr, f"{fn.name}:{op.loc or 'constant'}")
                plan.constants[op.result] = arr
    for entry in pool.entries:
        rec = _record(entry.users[0], "const", entry.offset, entry.size)
        if len(entry.users) > 1:
            rec["users"] = list(entry.users)
        plan.buffers.append(rec)
    blob = pool.blob()
    plan.cnst = blob
    if blob:
        plan.regions.append({"name": "constants", "kind": "const", "dram": 0, "bytes": len(blob)})
    cursor = len(blob)
    for fn in module.functions.values():
        cursor = _plan_function(fn, plan, cursor, positions or {})
    cursor = align_up(cursor, DRAM_ALIGN)
    for g in getattr(module, "globals", {}).values():  # persistent buffers, after everything else
        plan.globals[g.name] = cursor
        plan.regions.append(
            {"name": g.name, "kind": "persistent", "dram": cursor, "bytes": g.type.nbytes,
             "dtype": g.type.dtype.name, "shape": list(g.type.shape)}
        )  # fmt: skip
        plan.buffers.append(_record(g.name, "persistent", cursor, g.type.nbytes))
        cursor = align_up(cursor + g.type.nbytes, DRAM_ALIGN)
    plan.size = align_up(cursor, DRAM_ALIGN)
    return plan


def _plan_function(fn: Any, plan: DramPlan, cursor: int, positions: Mapping[Any, int]) -> int:
    root: dict = {}  # value -> the value owning its bytes
    for arg in fn.args:
        root[arg] = arg
        plan.placements[arg] = cursor
        plan.regions.append(
            {"name": f"{fn.name}:{arg.name}", "kind": "input", "dram": cursor, "bytes": arg.type.nbytes}
        )
        plan.buffers.append(_record(f"{fn.name}:{arg.name}", "input", cursor, arg.type.nbytes))
        cursor = align_up(cursor + arg.type.nbytes, DRAM_ALIGN)
    first: dict = {}
    last: dict = {}
    for idx, op in enumerate(fn.ops):
        idx = positions.get(op, idx)
        for v in op.operands:
            r = root.get(v, v)
            last[r] = max(last.get(r, idx), idx)
        if isinstance(op, ALIAS_OPS):
            src = op.operands[0]
            root[op.result] = root.get(src, src)
            if src in plan.constants:
                plan.constants[op.result] = plan.constants[src].reshape(op.result.type.shape)
            continue
        for r in op.results:
            root[r] = r
            if r not in plan.placements:  # constants are placed already
                first[r] = idx
    outputs = [root.get(v, v) for v in fn.outputs]
    for name, v in zip(fn.result_names, outputs, strict=True):
        if v in first and v not in plan.placements:
            plan.placements[v] = cursor
            plan.regions.append(
                {"name": f"{fn.name}:{name}", "kind": "output", "dram": cursor, "bytes": v.type.nbytes}
            )
            plan.buffers.append(_record(f"{fn.name}:{name}", "output", cursor, v.type.nbytes))
            cursor = align_up(cursor + v.type.nbytes, DRAM_ALIGN)
    scratch = [v for v in first if v not in plan.placements]
    offsets, total = assign_offsets([(first[v], last.get(v, first[v]), v.type.nbytes) for v in scratch])
    for v, off in zip(scratch, offsets, strict=True):
        plan.placements[v] = cursor + off
        owner = v.owner
        name = f"{fn.name}:{owner.loc or owner.name}#{v.index}"
        plan.buffers.append(
            _record(name, "scratch", cursor + off, v.type.nbytes, first[v], last.get(v, first[v]))
        )
    if total:
        plan.regions.append({"name": f"{fn.name}:scratch", "kind": "scratch", "dram": cursor, "bytes": total})
    cursor = align_up(cursor + total, DRAM_ALIGN)
    for v, r in root.items():  # aliases share their root's bytes
        if v is not r:
            plan.placements[v] = plan.placements[r]
    return cursor


def _record(
    name: str, kind: str, dram: int, nbytes: int, first: int | None = None, last: int | None = None
) -> dict:
    rec = {"name": name, "kind": kind, "dram": dram, "bytes": int(nbytes)}
    if first is not None:
        rec["live"] = [first, last]
    return rec
