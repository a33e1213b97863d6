"""Verification of an instruction stream's dependency tokens (tests and debugging).

``replay_tokens`` replays the wait/signal bits (deadlock and balance check); ``check_hazards``
verifies that every pair of instructions on different engines that touch the same SRAM or DRAM
bytes (one of them writing) is ordered by the tokens, i.e. that the decoupled engines compute
what the sequential reading of the stream computes.  ``footprint`` is the memory an instruction
touches; the scheduler uses it too, so that what it orders and what is checked agree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from mcpc.arch.isa import DTYPE_BYTES, ENGINES, Instr

# Instructions that touch no memory (their footprint is empty by definition, not by omission).
NO_MEMORY = frozenset({"nop", "halt"})


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

    Strided operands are covered by one interval from the first to the last byte.  Raises
    ScheduleError for an instruction whose memory it cannot describe (a DMA offset by a scalar
    register, ``setr``, or a mnemonic it does not know), so that the race check cannot pass by
    silently ignoring an access.
    """
    f, op = instr.fields, instr.op
    if op in NO_MEMORY:
        return []
    if f.get("dram_reg", 0):
        raise ScheduleError(f"{op}: a DRAM address offset by register r{f['dram_reg']} is not modelled")
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
    raise ScheduleError(f"{op}: no memory footprint is modelled for this instruction")


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
