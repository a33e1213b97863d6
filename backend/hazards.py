"""Verification of an instruction stream's dependency tokens (tests and debugging).

``replay_tokens`` replays the wait/signal bits (deadlock and balance check); ``check_hazards``
verifies that every pair of instructions on different engines that touch the same SRAM or DRAM
bytes, scalar register or the QParam group (one of them writing) is ordered by the tokens, i.e.
that the decoupled engines compute what the sequential reading of the stream computes.
``footprint`` (``arch/footprint.py``) is the memory an instruction touches (from its ISA spec);
the scheduler uses it too, so that what it orders and what is checked agree.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mcpc.arch.footprint import (  # noqa: F401 - re-exported: the scheduler and tests import them here
    DRAM_ANY,
    INDEXED,
    MEMORIES,
    ScheduleError,
    footprint,
    qparam_reads,
    register_values,
)
from mcpc.arch.isa import ENGINES, Instr


def _what(mem: int, lo: int, hi: int) -> str:
    return f"r{lo}" if MEMORIES[mem] == "reg" else "group" if MEMORIES[mem] == "qparam" else "bytes"


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


def check_hazards(
    instrs: Sequence[Instr],
    extra: dict[int, list] | None = None,
    regs: Sequence[int | None] | None = None,
    regions: Sequence[tuple[int, int]] | None = None,
) -> None:
    """Raise ScheduleError unless the token bits order every cross-engine memory conflict.

    Two instructions on different engines conflict when their footprints overlap in the same
    memory and at least one writes; the one earlier in the stream must happen before the later
    one through the tokens (which is what makes the decoupled machine compute the same as the
    sequential stream).  Also checks token balance and deadlock freedom (``replay_tokens``).
    Scalar registers and the QParam group are shared state too: a ``setr`` on EX and a ``load``
    reading that register on LD must be ordered like a store and a load of the same bytes.  A
    register-offset DRAM address is resolved with the register's value in the sequential stream
    (``register_values``; ``regs`` gives the values at entry, None = unknown, default all 0).
    An access offset by a register whose value is unknown there covers its region of ``regions``
    (see ``footprint``), else all of DRAM.  ``extra`` adds footprints by instruction index (tests);
    the scale and zero-point tiles the quantized instructions read through the QParam pointers are
    added (``qparam_reads``).  O(n^2) worst case: tests only.
    """
    clocks = replay_tokens(instrs)
    pos = [0] * len(instrs)
    counts = [0, 0, 0]
    for i, instr in enumerate(instrs):
        counts[instr.engine] += 1
        pos[i] = counts[instr.engine]
    rows: list[tuple[int, int, int, int, bool]] = []  # (instr, memory, lo, hi, write)
    values = register_values(instrs, regs)
    indirect = qparam_reads(instrs)
    for i, instr in enumerate(instrs):
        added = list((extra or {}).get(i, [])) + indirect.get(i, [])
        for mem, lo, hi, w in footprint(instr, values[i], regions) + added:
            if hi > lo:
                rows.append((i, MEMORIES.index(mem), lo, hi, w))
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
                    f"({ENGINES[instrs[i].engine]}) touch the same {MEMORIES[mem]} {_what(mem, lo, hi)} "
                    "without a token ordering them"
                )
