"""The dependency-token discipline of the three queues (LD, EX, ST), in one place.

A lowering describes a kernel as a list of ``Step``s; ``schedule`` turns kernels into one
instruction stream whose wait/signal bits make the decoupled engines compute exactly what the
sequential reading of the stream (step after step: loads, computes, stores) computes, while the
load of step i+1 overlaps the compute of step i (double buffering).

Contract for lowerings (the scheduler relies on it, ``check_hazards`` verifies it in tests):

* SRAM input slots.  The r-th step that has loads writes input slot ``r % in_slots``.  The data
  of an input slot is read only by the computes of its step (or, in a *copy step* — loads and
  stores but no computes — by its stores).  Data that must outlive its step (an accumulator, a
  normalisation scale) lives in a persistent buffer outside the slots.
* SRAM output slots.  The g-th step that has stores reads output slot ``g % out_slots``.  The
  computes writing that slot are those of its *group*: the steps after the previous store step
  up to and including this one (a matmul accumulating over K tiles straight into its output slot
  spans several steps).
* If a kernel has stores, its last step has stores (nothing may run after the result leaves).

Token rules (per kernel; r = load rank, g = store rank of the step):

* loads: first waits the engine that released input slot r - in_slots (EX, or ST for a copy
  step) when r >= in_slots; last signals EX.
* computes (an EX ``nop`` stands in when a step with loads or stores has none): first waits LD
  iff the step has loads, waits ST iff it is the first compute of group g and g >= out_slots;
  last signals LD iff it releases an input slot that a later step reuses, signals ST iff the step
  has stores.
* stores: first waits EX; last signals EX iff store step g + out_slots exists, and signals LD
  iff it is a copy step releasing a reused input slot.
* kernel boundary: the last store of a kernel (its last compute if it has no stores) signals LD
  and the first load of the next kernel waits for it (and the first compute of a next kernel
  that starts without loads waits ST too), so loads never read DRAM before the producer's
  stores land and never overwrite SRAM a previous kernel still reads.  Hence the
  loads of kernel k+1 cannot start before the last store of kernel k: prefetch across kernels is
  future work.

Tokens are counting semaphores per ordered engine pair and each engine runs in program order, so
the j-th wait on a pair is matched with the j-th signal on it; every token pushed is popped.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mcpc.arch.isa import DTYPE_BYTES, ENGINES, EX, LD, ST, Instr

_NOP = Instr("nop", {})


@dataclass
class Step:
    """One step of a kernel: DMA-in, compute, DMA-out.  Instructions carry no token bits yet."""

    loads: list[Instr] = field(default_factory=list)
    computes: list[Instr] = field(default_factory=list)
    stores: list[Instr] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.loads or self.computes or self.stores)


@dataclass
class Kernel:
    """The steps of one IR op's lowering and its SRAM slot counts (2 = double buffering, 1 = off).

    ``debug`` is the DBUG record of every instruction of the kernel (set by the compile driver
    from the op being lowered when the lowering leaves it None).  ``sram_bytes`` is the kernel's
    planned SRAM footprint (its arena peak), reported in the memory map.
    """

    steps: list[Step]
    in_slots: int = 2
    out_slots: int = 2
    debug: dict | None = None
    sram_bytes: int = 0

    def __post_init__(self) -> None:
        if self.in_slots < 1 or self.out_slots < 1:
            raise ValueError(f"kernel slots must be >= 1, got in={self.in_slots} out={self.out_slots}")
        for i, step in enumerate(self.steps):
            for what, instrs, engine in (("loads", step.loads, LD), ("computes", step.computes, EX),
                                         ("stores", step.stores, ST)):  # fmt: skip
                for instr in instrs:
                    if instr.engine != engine:
                        name = ENGINES[engine]
                        raise ValueError(f"step {i}: {instr.op} is not a {name} instruction ({what})")
        live = [s for s in self.steps if s]
        if any(s.stores for s in live) and not live[-1].stores:
            raise ValueError("a kernel with stores must end with a step that stores")


def schedule(kernels: Iterable[Kernel]) -> list[Instr]:
    """The instruction stream of ``kernels`` in order, with wait/signal bits (see module doc)."""
    return schedule_with_debug(kernels)[0]


def schedule_with_debug(kernels: Iterable[Kernel]) -> tuple[list[Instr], list[dict | None]]:
    """Like ``schedule``, plus each instruction's debug record (its kernel's ``debug``)."""
    out: list[Instr] = []
    dbg: list[dict | None] = []
    prev_end: int | None = None  # index in ``out`` of the instruction that ends the previous kernel
    for kernel in kernels:
        prev_end = _schedule_kernel(kernel, out, dbg, prev_end)
    return out, dbg


def _schedule_kernel(kernel: Kernel, out: list[Instr], dbg: list, prev_end: int | None) -> int | None:
    """Append ``kernel``; return the index of its last store (or, without stores, its last
    compute), which the next kernel's first load (and first compute) wait for."""
    steps = [s for s in kernel.steps if s]
    if not steps:
        return prev_end
    n_load = sum(1 for s in steps if s.loads)
    n_store = sum(1 for s in steps if s.stores)
    # Who releases each input slot: the step's computes, or its stores for a copy step.
    release = [ST if (s.stores and not s.computes) else EX for s in steps if s.loads]
    end_engine = out[prev_end].engine if prev_end is not None else None
    boundary_ld = end_engine is not None and n_load > 0
    boundary_ex = end_engine == ST and not steps[0].loads  # an EX end is already in EX order
    if boundary_ld:
        out[prev_end] = _bits(out[prev_end], signal=1 << LD)
    if boundary_ex:
        out[prev_end] = _bits(out[prev_end], signal=1 << EX)
    r = g = 0
    group_open = True  # the next compute is the first of its output group
    first_load = True
    last_ex = None
    for step in steps:
        loads = list(step.loads)
        ex = list(step.computes) or ([_NOP] if (step.loads or step.stores) else [])
        stores = list(step.stores)
        if loads:
            wait = 1 << release[r - kernel.in_slots] if r >= kernel.in_slots else 0
            if first_load and boundary_ld:
                wait |= 1 << end_engine
            first_load = False
            loads[0] = _bits(loads[0], wait=wait)
            loads[-1] = _bits(loads[-1], signal=1 << EX)
        reused = bool(loads) and r + kernel.in_slots < n_load
        if ex:
            wait = (1 << LD) if loads else 0
            if group_open and g >= kernel.out_slots:
                wait |= 1 << ST
            if boundary_ex:
                wait |= 1 << ST
                boundary_ex = False
            group_open = False
            signal = (1 << LD) if (reused and release[r] == EX) else 0
            signal |= (1 << ST) if stores else 0
            ex[0] = _bits(ex[0], wait=wait)
            ex[-1] = _bits(ex[-1], signal=signal)
        if stores:
            signal = (1 << EX) if g + kernel.out_slots < n_store else 0
            signal |= (1 << LD) if (reused and release[r] == ST) else 0
            stores[0] = _bits(stores[0], wait=1 << EX)
            stores[-1] = _bits(stores[-1], signal=signal)
            g += 1
            group_open = True
        if loads:
            r += 1
        for instr in (*loads, *ex, *stores):
            out.append(instr)
            dbg.append(kernel.debug)
        if ex:
            last_ex = len(out) - 1 - len(stores)
    return len(out) - 1 if n_store else last_ex


def _bits(instr: Instr, wait: int = 0, signal: int = 0) -> Instr:
    if not (wait or signal):
        return instr
    if instr.wait & wait or instr.signal & signal:
        raise AssertionError(f"{instr.op}: two tokens on one engine pair in one instruction")
    return instr.replace(wait=instr.wait | wait, signal=instr.signal | signal)


# -- verification ----------------------------------------------------------------------------------
class ScheduleError(AssertionError):
    """A schedule deadlocks, leaves tokens unbalanced, or lets two engines race on memory."""


def replay_tokens(instrs: Sequence[Instr]) -> list[tuple[int, int, int]]:
    """Replay the token bits of a stream (issue = completion, any order the tokens allow).

    Returns, per instruction, its vector clock: for each engine e, how many instructions of e
    happen before it or are it.  Raises ScheduleError on a deadlock or when a semaphore does not
    end at 0 (a token pushed and never popped).
    """
    queues: list[list[int]] = [[], [], []]
    for i, instr in enumerate(instrs):
        queues[instr.engine].append(i)
    heads = [0, 0, 0]
    # pending[(src, dst)]: vector clocks of pushed, not yet popped tokens (FIFO).
    pending: dict[tuple[int, int], list] = {(a, b): [] for a in range(3) for b in range(3)}
    clocks: list[tuple[int, int, int]] = [(0, 0, 0)] * len(instrs)
    last = [(0, 0, 0)] * 3
    progress = True
    while progress:
        progress = False
        for e in range(3):
            while heads[e] < len(queues[e]):
                i = queues[e][heads[e]]
                instr = instrs[i]
                srcs = [s for s in range(3) if instr.wait >> s & 1]
                if any(not pending[(s, e)] for s in srcs):
                    break
                vc = list(last[e])
                for s in srcs:
                    vc = [max(a, b) for a, b in zip(vc, pending[(s, e)].pop(0), strict=True)]
                heads[e] += 1
                vc[e] = heads[e]
                clocks[i] = last[e] = (vc[0], vc[1], vc[2])
                for d in range(3):
                    if instr.signal >> d & 1:
                        pending[(e, d)].append(clocks[i])
                progress = True
    stuck = [queues[e][heads[e]] for e in range(3) if heads[e] < len(queues[e])]
    if stuck:
        names = ", ".join(f"#{i} {instrs[i].op} ({ENGINES[instrs[i].engine]})" for i in stuck)
        raise ScheduleError(f"token deadlock: blocked queue heads {names}")
    left = {f"{ENGINES[a]}->{ENGINES[b]}": len(v) for (a, b), v in pending.items() if v}
    if left:
        raise ScheduleError(f"unbalanced tokens left at the end: {left}")
    return clocks


def _span(base: int, rows: int, cols: float, stride: float, size: float) -> tuple[int, int]:
    """Byte interval covering a strided (rows, cols) operand (conservative: includes row gaps)."""
    if rows <= 0 or cols <= 0:
        return (base, base)
    return (base, base + math.ceil(((rows - 1) * stride + cols) * size))


def _sram(base: int, rows: int, cols: float, stride: float, size: float, write: bool = False) -> tuple:
    return ("sram", *_span(base, rows, cols, stride, size), write)


def footprint(instr: Instr) -> list[tuple[str, int, int, bool]]:
    """Memory touched by ``instr``: ``(memory, lo, hi, is_write)`` with memory "sram" or "dram".

    Strided operands are covered by one interval from the first to the last byte.  DMA
    addresses assume ``dram_reg`` = 0 (the backend does not use registers yet).
    """
    f, op = instr.fields, instr.op
    if op in ("load", "store"):
        dram = ("dram", *_span(f["dram"], f["rows"], f["row_bytes"], f["dram_stride"], 1), op == "store")
        return [_sram(f["sram"], f["rows"], f["row_bytes"], f["sram_stride"], 1, op == "load"), dram]
    if op == "gather":
        table = ("dram", *_span(f["dram"], max(f["limit"], 1), f["row_bytes"], f["dram_stride"], 1), False)
        idx = _sram(f["sram_idx"], 1, f["count"], 0, 4)
        return [idx, table, _sram(f["sram"], f["count"], f["row_bytes"], f["sram_stride"], 1, True)]
    if op == "matmul":
        s = DTYPE_BYTES[f["in_dtype"]]
        bk, bn = (f["n"], f["k"]) if f["trans_b"] else (f["k"], f["n"])
        reads = [_sram(f["a"], f["m"], f["k"], f["a_stride"], s), _sram(f["b"], bk, bn, f["b_stride"], s)]
        if f["acc"]:
            reads.append(_sram(f["c"], f["m"], f["n"], f["c_stride"], 4))
        return [*reads, _sram(f["c"], f["m"], f["n"], f["c_stride"], 4, True)]
    if op in ("vbin", "vbini", "vun", "vred", "vsel", "transpose"):
        return _vector_footprint(instr)
    return []


def _vector_footprint(instr: Instr) -> list[tuple[str, int, int, bool]]:
    f, op = instr.fields, instr.op
    rows, cols = f["rows"], f["cols"]
    if op == "transpose":
        s = f["elem_bytes"]
        src = _sram(f["src"], rows, cols, f["src_stride"], s)
        return [src, _sram(f["dst"], cols, rows, f["dst_stride"], s, True)]
    if op == "vsel":
        s = DTYPE_BYTES[f["dtype"]]
        return [
            _sram(f["cond"], rows, 1 if f["cond_bcast"] else cols, f["cond_stride"], 1),
            _sram(f["src"], rows, 1 if f["src_bcast"] else cols, f["src_stride"], s),
            _sram(f["dst"], rows, cols, f["dst_stride"], s),
            _sram(f["dst"], rows, cols, f["dst_stride"], s, True),
        ]
    si, so = DTYPE_BYTES[f["in_dtype"]], DTYPE_BYTES[f["out_dtype"]]
    if op == "vred":
        return [_sram(f["src"], rows, cols, f["src_stride"], si), _sram(f["dst"], 1, rows, 0, so, True)]
    if op == "vun":
        srcs = [("src", "src_stride", "src_bcast")]
    elif op == "vbin":
        srcs = [("src0", "s0_stride", "s0_bcast"), ("src1", "s1_stride", "s1_bcast")]
    else:
        srcs = [("src0", "s0_stride", "s0_bcast")]
    out = [_sram(f[a], rows, 1 if f[bc] else cols, f[st], si) for a, st, bc in srcs]
    return [*out, _sram(f["dst"], rows, cols, f["dst_stride"], so, True)]


def check_hazards(instrs: Sequence[Instr], extra: dict[int, list] | None = None) -> None:
    """Raise ScheduleError unless the token bits order every cross-engine memory conflict.

    Two instructions on different engines conflict when their footprints overlap in the same
    memory and at least one writes; the one earlier in the stream must happen before the later
    one through the tokens (which is what makes the decoupled machine compute the same as the
    sequential stream).  Also checks token balance and deadlock freedom (``replay_tokens``).
    ``extra`` adds footprints by instruction index (for tests).  O(n^2) worst case: tests only.
    """
    clocks = replay_tokens(instrs)
    pos = [0] * len(instrs)
    counts = [0, 0, 0]
    for i, instr in enumerate(instrs):
        counts[instr.engine] += 1
        pos[i] = counts[instr.engine]
    rows: list[tuple[int, int, int, int, bool]] = []  # (instr, memory, lo, hi, write)
    for i, instr in enumerate(instrs):
        for mem, lo, hi, w in footprint(instr) + list((extra or {}).get(i, [])):
            if hi > lo:
                rows.append((i, 0 if mem == "sram" else 1, lo, hi, w))
    if not rows:
        return
    arr = np.array([(i, m, lo, hi, int(w)) for i, m, lo, hi, w in rows], dtype=np.int64)
    engine = np.array([instrs[i].engine for i in arr[:, 0]])
    for j in range(len(arr)):
        i, mem, lo, hi, w = (int(x) for x in arr[j])
        prior = arr[:j]
        hit = (prior[:, 0] < i) & (prior[:, 1] == mem) & (prior[:, 2] < hi) & (prior[:, 3] > lo)
        hit &= (engine[:j] != instrs[i].engine) & ((prior[:, 4] == 1) | (w == 1))
        for a in np.unique(prior[hit, 0]):
            a = int(a)
            if clocks[i][instrs[a].engine] < pos[a]:
                raise ScheduleError(
                    f"race: #{a} {instrs[a].op} ({ENGINES[instrs[a].engine]}) and #{i} {instrs[i].op} "
                    f"({ENGINES[instrs[i].engine]}) touch the same {('sram', 'dram')[mem]} bytes "
                    "without a token ordering them"
                )


def stream_summary(instrs: Sequence[Instr]) -> dict[str, Any]:
    """Counts per engine and per mnemonic (for compile reports)."""
    per_engine = {e: 0 for e in ENGINES}
    per_op: dict[str, int] = {}
    for instr in instrs:
        per_engine[ENGINES[instr.engine]] += 1
        per_op[instr.op] = per_op.get(instr.op, 0) + 1
    return {"per_engine": per_engine, "per_mnemonic": dict(sorted(per_op.items()))}
