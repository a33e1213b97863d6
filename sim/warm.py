"""The records of a warm functional run (``fastpath``'s plans): large elementwise instructions split
into parts computed on worker threads, and loads and stores whose views are made once.

*Split instructions.* ``vbin``, ``vbini`` and ``vun`` compute every element of their destination
from the elements at the same position of their sources (a broadcast operand: its one row or one
value per row), each on its own, so running the handler on the first rows and, at the same time,
on the remaining rows (columns, for a single row) writes the very bytes one call writes. numpy's
loops and scipy's special functions release the GIL, so the parts run in parallel: the f64 special
functions (``erf`` of GELU, ``exp`` of softmax) and the f16 <-> f32 conversions, which numpy runs
on one core, use the cores that BLAS uses for the matmuls.

A part never reads what another part writes: every source either shares no byte with the
destination or is exactly the destination (same address, strides and element size: in place);
other aliasing keeps the instruction whole.  4-bit packed operands keep it whole too.  The parts
run in the caller's numpy error state (``contextvars``); a ``Fault`` of a part is raised by the
caller.  Only the records of ``fastpath``'s plans are split (warm functional runs); the timing of
an instruction is its record's, which this does not touch.  ``PARTS`` is 1 (nothing is split)
unless ``MCPC_SIM_PARTS`` asks for more (at most the CPUs this process may run on, and 4): since
f16 conversions, erf and exp run in ``mcpc._kernels`` (arch/kernels.py), splitting costs more than
it gains where numpy's BLAS is multithreaded — OpenBLAS's worker threads keep spinning on the
other cores between products, so a part handed to another thread waits for a core.  Measured on
2 cores (best of 7 warm runs, separate processes, three rounds): MiniLM-L3 b8 s128 fp32 182-193 ms
unsplit against 193-197 ms in two parts, fp16 183-191 against 200-219 ms, b1 fp32 25.6 against
35.0 ms.

*Bound loads and stores.*  A load or store whose DRAM address takes no register offset copies
between the same two views of the machine's DRAM and SRAM in every run: they are made on its first
run on a machine (by the handler itself, which checks the address) and kept, and later runs on the
same machine do one assignment (about 1 us instead of 3-7 us of view building per DMA).
"""

from __future__ import annotations

import contextvars
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from . import execute as ex
from . import numeric
from .machine import dram_rows, view

_U8 = np.dtype(np.uint8)
MIN_ELEMENTS = 1 << 17  # below this a part costs about what handing it to a thread costs
_ELEMENTWISE = {ex._vbin: (1, 2, 3), ex._vbini: (1, 4), ex._vun: (1, 2)}  # operand positions; dst last


def _workers() -> int:
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    try:
        asked = int(os.environ.get("MCPC_SIM_PARTS", "1"))
    except ValueError:
        asked = 1
    return max(1, min(asked, cpus, 4))


PARTS = _workers()
_pool: ThreadPoolExecutor | None = None


def _forget_pool() -> None:
    global _pool
    _pool = None  # a forked child has none of the parent's threads: it makes its own pool


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def _split(m: Any, a: tuple) -> None:
    """Run ``fn`` on each part's arguments: the first here, the others on the pool."""
    global _pool
    fn, parts = a
    if _pool is None:
        _pool = ThreadPoolExecutor(max(len(parts) - 1, 1), thread_name_prefix="mcpc-sim")
    ctx = contextvars.copy_context()
    futures = [_pool.submit(ctx.run, fn, m, p) for p in parts[1:]]
    try:
        fn(m, parts[0])
    finally:
        errors = [f.exception() for f in futures]
    for exc in errors:
        if exc is not None:
            raise exc


ex._TIMING_TWINS[_split] = ex.NOP  # a timing-only run computes no values


def _extent(d: tuple) -> tuple[int, int]:
    addr, rows, cols, row_step, col_step, dt, _ = d
    if rows <= 0 or cols <= 0:
        return addr, addr
    return addr, addr + (rows - 1) * row_step + (cols - 1) * col_step + dt.itemsize


def _separable(dst: tuple, sources: list[tuple]) -> bool:
    lo, hi = _extent(dst)
    for s in sources:
        if s[6] is not None:
            return False
        if s[0] == dst[0] and s[3:5] == dst[3:5] and s[5].itemsize == dst[5].itemsize and s[1:3] == dst[1:3]:
            continue  # in place: element i read and written by the same part only
        slo, shi = _extent(s)
        if slo < hi and lo < shi:
            return False
    return True


def _part(d: tuple, lo: int, n: int, by_rows: bool) -> tuple:
    """Rows (or, for a single row, columns) [lo, lo + n) of operand ``d``; a broadcast operand
    (stride 0 along the split) is the same for every part."""
    addr, rows, cols, row_step, col_step, dt, packed = d
    if by_rows:
        return (addr + lo * row_step, n, cols, row_step, col_step, dt, packed)
    return (addr + lo * col_step, rows, n, row_step, col_step, dt, packed)


def split(fn: Any, args: tuple) -> tuple[Any, tuple] | None:
    """``(handler, args)`` running the elementwise instruction ``fn(args)`` in ``PARTS`` parts, or
    None when it is small, not elementwise, or its operands alias (module docstring)."""
    pos = _ELEMENTWISE.get(fn)
    if pos is None or PARTS < 2:
        return None
    dst = args[pos[-1]]
    rows, cols = dst[1], dst[2]
    if rows * cols < MIN_ELEMENTS or dst[6] is not None:
        return None
    if not _separable(dst, [args[i] for i in pos[:-1]]):
        return None
    by_rows = rows >= PARTS
    n = rows if by_rows else cols
    if not by_rows and rows != 1:
        return None
    bounds = [n * k // PARTS for k in range(PARTS + 1)]
    parts = []
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        a = list(args)
        for i in pos:
            a[i] = _part(args[i], lo, hi - lo, by_rows)
        parts.append(tuple(a))
    return _split, (fn, tuple(parts))


def split_records(recs: list, order: range) -> list:
    """``recs`` with the large elementwise records of ``order`` split (their numeric guard kept)."""
    out = list(recs)
    for idx in order:
        r = recs[idx]
        fn, args = numeric.unwrap(r[3], r[4])
        s = split(fn, args)
        if s is not None:
            out[idx] = r[:3] + numeric.rewrap(r[3], r[4], *s) + r[5:]
    return out


# -- loads and stores at fixed addresses, their views made once ------------------------------------
def _bound_dma(m: Any, a: tuple) -> None:
    """A load or store whose DRAM address needs no register: its two views, made on the first run
    on a machine, copied by one assignment on every later run on that machine."""
    fn, args, cell = a
    c = cell[0]
    if c is None or c[0] is not m.dram or c[1] is not m.sram or m.regs[args[1]]:
        fn(m, args)  # the handler itself (it checks the address, and faults like it)
        if m.regs[args[1]]:
            return
        dram, _, rows, row_bytes, dram_stride, sram, sram_stride = args
        ext = view(m.sram, sram, rows, row_bytes, sram_stride, 1, _U8)
        side = dram_rows(m, dram, rows, row_bytes, dram_stride)
        cell[0] = (m.dram, m.sram, ext, side) if fn is ex.LOAD else (m.dram, m.sram, side, ext)
        return
    c[2][...] = c[3]


ex._TIMING_TWINS[_bound_dma] = ex.NOP


def bind_dma(recs: list, order: range) -> list:
    """``recs`` with every load and store of ``order`` made a ``_bound_dma``."""
    out = list(recs)
    for idx in order:
        r = recs[idx]
        if r[3] is ex.LOAD or r[3] is ex.STORE:
            out[idx] = r[:3] + (_bound_dma, (r[3], r[4], [None])) + r[5:]
    return out
