"""Functional runs without per-run rebuilds: one machine per loaded program, restored between runs,
and constant matmul operands prepared (widened to f32, made contiguous) once per loaded program.

Everything but the values is static: the order in which an entry's instructions execute (costs
are static), the DRAM addresses of its DMAs (registers are written only by ``setr`` immediates
and ``salu``; a run with host registers set, or a ``Session``, uses only the plan's records,
and a register-offset load never counts as a constant load) and the SRAM operands of every
instruction are the same in every run.  On an entry's second run
``plan`` replays that order once without values, tracking for every SRAM byte the ``load`` of
constant bytes that wrote it (-1 when anything else did), and derives:

* the DRAM byte ranges the entry's stores can write: before the next run they are restored to
  their initial content (zeros, or the constants), with the input regions the run wrote, and
  SRAM below the entry's peak is zeroed — so each run still starts from the documented state
  (constants, inputs, zeros) without building a fresh DRAM image and copying every constant;
* for each matmul operand made only of bytes that constant loads wrote (not of a matmul whose row
  count comes from a register, whose operands differ with the count): every run sees the same
  bytes there, so its prepared tile (``numerics.tile_operand``) is computed on first use and kept
  in a slot — shared by every matmul reading the same operand written by one same load.  It is
  the very array ``matmul_tile`` would build, so the bits do not change.  Once every slot is
  filled, constant loads whose bytes nothing but slots reads are skipped (their cost stays).

When every cost of the entry is static (no ``vattn``, no run-time extent), the schedule — the
order the event loop executes the instructions in, their issue and completion cycles, the stalls
and the tokens left — is the same in every run: the first run on the plan records it and later
runs (``run``) execute the handlers in that order without the event loop, with the recorded times.

``plan`` returns None — the run then builds a fresh machine as before (always correct, slower) —
for an instruction whose handler the analysis does not know, a store that can reach a constant
region, an input region overlapping a constant region, or a trap during the replay.  A loaded
program runs one entry at a time (runs share its machine).
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

import numpy as np

from . import execute as ex
from . import numeric, warm
from .machine import Fault, Machine, dram_check, nbytes
from .timing import _ILLEGAL_PY, Deadlock, Faulted, simulate

_I32 = np.dtype(np.int32)


class _Unsupported(Exception):
    """The replay met something it cannot account for: no plan."""


class Plan:
    """The functional records of one entry (``lean``: without the loads only slots read, valid once
    every slot is filled), the DRAM ranges its stores can write, its SRAM peak."""

    __slots__ = ("full", "lean", "slots", "dirty", "sram_hi", "ready", "static", "schedule", "seqs")

    def __init__(
        self, full: list, lean: list, slots: list, dirty: list[tuple[int, int]], sram_hi: int, static: bool
    ):
        self.full, self.lean, self.slots, self.dirty, self.sram_hi = full, lean, slots, dirty, sram_hi
        self.ready = False
        self.static = static  # every cost is known before the run: the schedule can be recorded
        self.schedule: tuple | None = None  # (executed, issue, done, stall, tokens_left, last issue)
        self.seqs: dict[int, list] = {}  # id(records) -> [(idx, handler, args)] in executed order

    @property
    def recs(self) -> list[tuple]:
        if not self.ready:
            self.ready = all(s[0] is not None for s in self.slots)
        return self.lean if self.ready else self.full


class State:
    """Per loaded program: the machine, what the last run changed, plans per entry, operand slots."""

    def __init__(self, program: Any):
        places = sorted(program.const_places)
        self.places = places
        self.starts = [p[0] for p in places]
        self.consts = np.frombuffer(program.program.constants, dtype=np.uint8)
        self.machine: Machine | None = None
        self.dirty: list[tuple[int, int]] = []
        self.sram_hi = 0
        self.plans: dict[str, Plan | None] = {}
        self.seen: set[str] = set()
        self.slots: dict[tuple, list] = {}

    def overlaps_const(self, lo: int, hi: int) -> bool:
        i = max(bisect_right(self.starts, lo) - 1, 0)
        for dram, _, length in self.places[i:]:
            if dram >= hi:
                break
            if dram + length > lo and length > 0:
                return True
        return False

    def in_const(self, lo: int, hi: int) -> bool:
        """Whether DRAM bytes [lo, hi) all lie in one constant region."""
        i = bisect_right(self.starts, lo) - 1
        if i < 0:
            return False
        dram, _, length = self.places[i]
        return lo >= dram and hi <= dram + length

    def restore(self, lo: int, hi: int) -> None:
        """DRAM bytes [lo, hi) back to their initial content: zeros and the constants."""
        dram = self.machine.dram
        dram[lo:hi] = 0
        i = max(bisect_right(self.starts, lo) - 1, 0)
        for start, offset, length in self.places[i:]:
            if start >= hi:
                break
            a, b = max(lo, start), min(hi, start + length)
            if a < b:
                dram[a:b] = self.consts[offset + a - start : offset + b - start]


def state(program: Any) -> State:
    if program._fast is None:
        program._fast = State(program)
    return program._fast


def machine_for_run(program: Any, plan: Plan) -> Machine:
    """The program's machine in the initial state of a run of ``plan``'s entry (inputs not yet
    written: the caller writes them and reports their ranges with ``wrote``)."""
    st = state(program)
    m = st.machine
    if m is None:
        m = st.machine = Machine(program.dram_size, program.target.sram.size_bytes)
        for dram, offset, length in st.places:
            m.dram[dram : dram + length] = st.consts[offset : offset + length]
    else:
        for lo, hi in _merge(st.dirty):
            st.restore(lo, hi)
        m.sram[: st.sram_hi] = 0
        m.regs[:] = [0] * len(m.regs)
        m.qparams = Machine(0, 0).qparams  # the QParam group as a fresh machine has it
    # what this run may change, recorded before it starts (a trap leaves a subset of it written)
    st.dirty = list(plan.dirty)
    st.sram_hi = max(plan.sram_hi, 0)
    return m


def wrote(program: Any, lo: int, hi: int) -> None:
    state(program).dirty.append((lo, hi))


def plan(program: Any, entry: str, order: range, input_ranges: list[tuple[int, int]]) -> Plan | None:
    """The entry's plan, or None: on the entry's first run (which runs on a fresh machine as
    before), and when the analysis cannot account for the program (module docstring).  The plan
    is computed on the second run and kept."""
    st = state(program)
    if entry not in st.seen:  # a program run once (mcpc sim run) pays nothing for the analysis
        st.seen.add(entry)
        return None
    if entry not in st.plans:
        try:
            if any(st.overlaps_const(lo, hi) for lo, hi in input_ranges):
                raise _Unsupported
            st.plans[entry] = _replay(program, st, order)
        except (_Unsupported, Faulted, Deadlock):
            st.plans[entry] = None
    return st.plans[entry]


def run(plan: Plan, recs: list, order: range, m: Machine, max_cycles: int | None) -> tuple:
    """``simulate(recs, order, m, max_cycles)`` for a run of ``plan``'s entry: the event loop on the
    first run (recording the schedule when every cost is static), then the recorded schedule —
    the same handlers in the same order, the same cycles, the same Faulted on a trap."""
    sched = plan.schedule
    if sched is None or (max_cycles is not None and sched[5] > max_cycles):
        executed: list[int] | None = [] if plan.static and sched is None else None
        issue, done, stall, left = simulate(recs, order, m, max_cycles, executed)
        if executed is not None and len(executed) == len(order):
            plan.schedule = (executed, issue, done, stall, left, max(issue, default=0))
        return issue, done, stall, left
    seq = plan.seqs.get(id(recs))
    if seq is None:
        seq = plan.seqs[id(recs)] = [(idx, recs[idx][3], recs[idx][4]) for idx in sched[0]]
    for idx, fn, args in seq:
        try:
            fn(m, args)
        except Fault as exc:
            raise Faulted(idx, str(exc)) from None
        except _ILLEGAL_PY as exc:
            raise Faulted(idx, f"illegal operation: {exc}") from None
    _, issue, done, stall, left, _ = sched
    return list(issue), list(done), list(stall), dict(left)


def _merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for lo, hi in sorted(r for r in ranges if r[1] > r[0]):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi) for lo, hi in out]


def _bytes_of(wid: np.ndarray, d: tuple) -> np.ndarray:
    """The entries of ``wid`` (one per SRAM byte) under operand descriptor ``d``."""
    addr, rows, cols, row_step, col_step, dt, packed = d
    e = wid.itemsize
    if packed is not None:
        per_row = cols if col_step else 1
        shape, strides = (rows, nbytes(packed, per_row)), (row_step * e, e)
    else:
        shape, strides = (rows, cols, dt.itemsize), (row_step * e, col_step * e, e)
    return np.ndarray(shape, dtype=wid.dtype, buffer=wid, offset=addr * e, strides=strides)


def _key(wid: np.ndarray, src: np.ndarray, d: tuple, role: tuple, idx: int) -> tuple | None:
    """The slot key of operand ``d`` of matmul ``idx``, or None when some byte is not constant.

    Operands whose bytes are the constant DRAM bytes at an affine run of addresses share one key
    (and one prepared tile) whichever loads brought them in: a weight loaded again for every row
    tile is prepared once."""
    if d[6] is not None:
        return None  # packed 4-bit operands are unpacked per use; not cached
    v = _bytes_of(wid, d)
    if v.size == 0:
        return None
    lo, hi = int(v.min()), int(v.max())
    if lo < 0:
        return None
    a = _bytes_of(src, d)  # the DRAM address each byte was loaded from
    rows, cols, size = a.shape
    first = int(a[0, 0, 0])
    dr = int(a[1, 0, 0]) - first if rows > 1 else 0
    dc = int(a[0, 1, 0]) - first if cols > 1 else 0
    affine = first + dr * np.arange(rows)[:, None, None] + dc * np.arange(cols)[None, :, None]
    if np.array_equal(a, affine + np.arange(size)):
        return ("dram", first, dr, dc, rows, cols, d[5].str, *role)
    # one load wrote every byte: the same bytes for every matmul reading this operand after it
    return (lo, *d[:5], d[5].str, *role) if lo == hi else ("at", idx, *role)


_QPARAM_READERS = frozenset({ex.MATMUL_W4A16, ex.VDEQUANT, ex.QA})


def _qparam_ranges(m: Machine, fn: Any, a: tuple) -> list[tuple[int, int]]:
    """SRAM byte ranges [lo, hi) of the scale and zero-point tiles a quantized instruction reads
    through the current QParam group (the shapes ``execute`` reads them with); scale first."""
    _, _, _, zp_ptr, scale_ptr, group = m.qparams
    if fn is ex.QA:
        B, trans_b, q_dtype = a[1], a[3], a[5]
        n = B[1] if trans_b else B[2]
        out = [(scale_ptr, scale_ptr + nbytes("f32", n))] if scale_ptr else []
        return out + ([(zp_ptr, zp_ptr + nbytes(q_dtype, 1))] if zp_ptr else [])
    if fn is ex.VDEQUANT:
        S, z_dtype, s_dtype = a[0], a[2], a[4]
        rows, k = S[1], S[2]
    else:  # matmul_w4a16: codes B (n x k when trans_b)
        B, trans_b, z_dtype, s_dtype = a[1], a[3], a[6], a[7]
        rows, k = (B[1], B[2]) if trans_b else (B[2], B[1])
    groups = -(-k // group) if group else 1
    if fn is ex.MATMUL_W4A16 and not trans_b:  # (groups, n)
        rows, groups = groups, rows
    out = [(scale_ptr, scale_ptr + rows * nbytes(s_dtype, groups))]
    return out + ([(zp_ptr, zp_ptr + rows * nbytes(z_dtype, groups))] if zp_ptr else [])


def _range_key(wid: np.ndarray, src: np.ndarray, lo: int, hi: int, idx: int) -> tuple | None:
    """The key of the SRAM bytes [lo, hi) read by instruction ``idx``, or None when some byte is
    not constant: their DRAM addresses when contiguous, else the one load that wrote them all, else
    the instruction (every byte constant: the same bytes in every run)."""
    w = wid[lo:hi]
    if w.size == 0:
        return ("empty",)
    if int(w.min()) < 0:
        return None
    a = src[lo:hi]
    if np.array_equal(a, a[0] + np.arange(a.size)):
        return ("dram", int(a[0]), a.size)
    return ("ld", int(w[0]), lo, hi) if int(w.min()) == int(w.max()) else ("at", idx, lo, hi)


def _w4a16_key(wid: np.ndarray, src: np.ndarray, a: tuple, tiles: list, idx: int, group: int) -> tuple | None:
    """The key of a matmul_w4a16's dequantized weight (its codes, scales and zero points, all
    constant, and how they are read), or None when it cannot be kept across runs."""
    A, B, C, trans_b, acc, a_dtype, w_dtype, s_dtype = a
    v = _bytes_of(wid, B)
    if v.size == 0 or int(v.min()) < 0:
        return None
    s = _bytes_of(src, B).reshape(B[1], -1)  # per row of codes: the DRAM address of each byte
    rows, nb = s.shape
    first = int(s[0, 0])
    dr = int(s[1, 0]) - first if rows > 1 else 0
    if np.array_equal(s, first + dr * np.arange(rows)[:, None] + np.arange(nb)):
        kb = ("dram", first, dr)
    elif int(v.min()) == int(v.max()):
        kb = ("ld", int(v.min()), B[0], B[3])
    else:
        kb = ("at", idx)
    qs = [_range_key(wid, src, lo, hi, idx) for lo, hi in tiles]
    if any(q is None for q in qs):
        return None
    return ("w4a16", kb, *B[1:3], B[4], B[6], *qs, len(qs), group, bool(trans_b), a_dtype, w_dtype, s_dtype)


def _replay(program: Any, st: State, order: range) -> Plan:
    n = len(order)
    peak = int(program.sram_hi[order.start : order.stop].max()) if n else 0
    wid = np.full(max(peak, 1), -1, dtype=_I32)
    src = np.full(max(peak, 1), -1, dtype=np.int64)  # per SRAM byte: its constant DRAM address
    stores: list[tuple[int, int]] = []
    keys: dict[int, tuple] = {}
    w4_keys: dict[int, tuple] = {}  # matmul_w4a16 -> key of its dequantized weight
    const_loads: set[int] = set()
    needed: set[int] = set()  # constant loads whose bytes something other than a slot reads

    def read(v: np.ndarray) -> None:
        if v.size and int(v.max()) >= 0:
            needed.update(np.unique(v[v >= 0]).tolist())

    def step(m: Machine, x: tuple) -> None:
        idx, fn, a = x
        extent = fn is ex.EXTENT
        if extent:  # a run-time count: analysed at its capacity, which covers every count
            _, cap, variants, make, _ = a
            v = variants.get(cap) or variants.setdefault(cap, make(cap))
            fn, a = numeric.unwrap(v[0], v[1])
        if fn is ex.SETR or fn is ex.TRAP or fn is ex._salu or fn is ex.SETQ:  # registers, QParams
            fn(m, a)
        elif fn is ex.NOP:
            pass
        elif fn is ex.LOAD or fn is ex.STORE:
            dram, reg, rows, row_bytes, dram_stride, sram, sram_stride = a
            lo = dram + m.regs[reg]
            dram_check(m, lo, rows, row_bytes, dram_stride)
            hi = lo + (rows - 1) * dram_stride + row_bytes
            sram_side = np.ndarray((rows, row_bytes), _I32, wid, sram * 4, (sram_stride * 4, 4))
            if fn is ex.STORE:
                if st.overlaps_const(lo, hi):
                    raise _Unsupported
                stores.append((lo, hi))
                read(sram_side)
            elif st.in_const(lo, hi) and not reg:  # a register offset may read elsewhere next run
                sram_side[...] = idx
                addr = lo + dram_stride * np.arange(rows)[:, None] + np.arange(row_bytes)
                np.ndarray((rows, row_bytes), np.int64, src, sram * 8, (sram_stride * 8, 8))[...] = addr
                const_loads.add(idx)
            else:
                sram_side[...] = -1
        elif fn is ex.GATHER:
            _, idx_addr, count, row_bytes, _, sram, sram_stride = a[:7]
            read(np.ndarray((count, 4), _I32, wid, idx_addr * 4, (16, 4)))
            np.ndarray((count, row_bytes), _I32, wid, sram * 4, (sram_stride * 4, 4))[...] = -1
        elif fn is ex.SCATTER:  # a store to any row of its table
            dram, idx_addr, count, row_bytes, dram_stride, sram, sram_stride, limit, reg = a
            lo = dram + m.regs[reg]
            hi = lo + (limit - 1) * dram_stride + row_bytes
            dram_check(m, lo, limit, row_bytes, dram_stride)
            if st.overlaps_const(lo, hi):
                raise _Unsupported
            stores.append((lo, hi))
            read(np.ndarray((count, 4), _I32, wid, idx_addr * 4, (16, 4)))
            read(np.ndarray((count, row_bytes), _I32, wid, sram * 4, (sram_stride * 4, 4)))
        elif fn is ex.KVDECOMP:  # reads its block ids (and DRAM), writes its rows
            _, idx_addr, count, row_bytes, sram = a[:5]
            read(np.ndarray((count, 4), _I32, wid, idx_addr * 4, (16, 4)))
            np.ndarray((count, row_bytes), _I32, wid, sram * 4, (row_bytes * 4, 4))[...] = -1
        elif fn is ex.VATTN:  # reads q, K, V and the window table, writes its rows (and its heat)
            (Q, K, V, W, D, H) = a[0]
            for d in (Q, K, V, W):
                read(_bytes_of(wid, d))
            for d in (D,) if H is None else (D, H):
                _bytes_of(wid, d)[...] = -1
        elif fn is ex.VTOPK:  # two destinations: the values and their indices
            read(_bytes_of(wid, a[0]))
            _bytes_of(wid, a[1])[...] = -1
            _bytes_of(wid, a[2])[...] = -1
        else:
            d, sources = ex.DESTINATION.get(fn), ex.SOURCES.get(fn)
            if d is None or sources is None:
                raise _Unsupported  # a handler this analysis does not know
            if fn is ex.MATMUL:
                A, B, C, trans_b, acc = a
                f64 = ex.matmul_in_f64(A[5], B[5], A[2])
                # an extent's record holds (register, capacity, variants), not operands: no slots
                ka = None if extent else _key(wid, src, A, ("A", False, f64), idx)
                kb = None if extent else _key(wid, src, B, ("B", trans_b, f64), idx)
                if ka is not None or kb is not None:
                    keys[idx] = (ka, kb)
                sources = [k for k, key in ((0, ka), (1, kb)) if key is None] + ([2] if acc else [])
            elif fn in _QPARAM_READERS:  # the scale and zero-point tiles its QParam pointers name
                tiles = _qparam_ranges(m, fn, a)
                if any(hi > wid.size for _, hi in tiles):
                    raise _Unsupported  # outside the SRAM this analysis tracks
                wkey = _w4a16_key(wid, src, a, tiles, idx, m.qparams[5]) if fn is ex.MATMUL_W4A16 else None
                if wkey is not None and not extent:
                    w4_keys[idx] = wkey
                    sources = [0] + ([2] if a[4] else [])  # A (and C when accumulating): not B
                else:
                    for lo, hi in tiles:
                        read(wid[lo:hi])
            for k in sources:
                read(_bytes_of(wid, a[k]))
            _bytes_of(wid, a[d])[...] = -1

    recs = program.recs
    replay = list(recs)
    for idx in order:
        r = recs[idx]
        # a cost known only at execution (busy -1) is read from the handler's arguments: static here
        replay[idx] = r[:3] + (step, (idx, *numeric.unwrap(r[3], r[4])), max(r[5], 1)) + r[6:]
    try:
        simulate(replay, order, Machine(program.dram_size, 0))
    except Fault:  # pragma: no cover - simulate turns faults into Faulted
        raise _Unsupported from None
    out = list(recs)
    slots = []
    for idx, (ka, kb) in keys.items():
        slot_a = st.slots.setdefault(ka, [None]) if ka is not None else None
        slot_b = st.slots.setdefault(kb, [None]) if kb is not None else None
        slots += [s for s in (slot_a, slot_b) if s is not None]
        fn, args = ex.cached_matmul(numeric.unwrap(recs[idx][3], recs[idx][4])[1], slot_a, slot_b)
        out[idx] = recs[idx][:3] + numeric.rewrap(recs[idx][3], recs[idx][4], fn, args) + recs[idx][5:]
    for idx, key in w4_keys.items():
        slot = st.slots.setdefault(key, [None])
        slots.append(slot)
        fn, args = ex.cached_matmul_w4a16(numeric.unwrap(recs[idx][3], recs[idx][4])[1], slot)
        out[idx] = recs[idx][:3] + numeric.rewrap(recs[idx][3], recs[idx][4], fn, args) + recs[idx][5:]
    # large elementwise instructions on the worker threads; loads and stores with their views made once
    out = warm.bind_dma(warm.split_records(out, order), order)
    # once every slot holds its tile, a constant load whose bytes only slots read has no effect
    lean = list(out)
    for idx in const_loads - needed:
        lean[idx] = recs[idx][:3] + (ex.NOP, ()) + recs[idx][5:]
    static = all(recs[idx][5] >= 0 for idx in order)
    return Plan(out, lean, slots, _merge(stores), peak, static)
