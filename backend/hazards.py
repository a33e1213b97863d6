"""Verification of an instruction stream's dependency tokens (tests and debugging).

``replay_tokens`` replays the wait/signal bits (deadlock and balance check); ``check_hazards``
verifies that every pair of instructions on different engines that touch the same SRAM or DRAM
bytes, scalar register or the QParam group (one of them writing) is ordered by the tokens, i.e.
that the decoupled engines compute what the sequential reading of the stream computes.
``footprint`` is the memory an instruction touches (from its ISA spec); the scheduler uses it
too, so that what it orders and what is checked agree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from mcpc.arch.isa import ENGINES, N_REGS, Instr
from mcpc.arch.numerics import scalar_alu


def _what(mem: int, lo: int, hi: int) -> str:
    return f"r{lo}" if MEMORIES[mem] == "reg" else "group" if MEMORIES[mem] == "qparam" else "bytes"


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


# Memories of a footprint.  "reg" are the scalar registers (lo = register number), "qparam" the
# QParam group; both are state the engines share, ordered by tokens like SRAM and DRAM bytes.
MEMORIES = ("sram", "dram", "reg", "qparam")
# Indexed DMA: its DRAM side is a table whose rows the indices (data) pick.
INDEXED = frozenset({"gather", "scatter", "kvdecomp"})
# A DRAM access offset by a register whose value is not known statically may touch any byte.
DRAM_ANY = (0, 1 << 62)


def _span(base: int, rows: int, cols: float, stride: float, size: float) -> tuple[int, int]:
    """Byte interval covering a strided (rows, cols) operand (conservative: includes row gaps)."""
    if rows <= 0 or cols <= 0:
        return (base, base)
    return (base, base + math.ceil(((rows - 1) * stride + cols) * size))


def footprint(
    instr: Instr,
    regs: Sequence[int | None] | None = None,
    regions: Sequence[tuple[int, int]] | None = None,
) -> list[tuple[str, int, int, bool]]:
    """Memory touched by ``instr``: ``(memory, lo, hi, is_write)`` with memory one of ``MEMORIES``.

    Read from the instruction's spec (``InstrSpec.access``).  Strided operands are covered by one
    interval from the first to the last byte; a run-time row count is covered by its encoded
    maximum.  A DRAM address offset by register r uses ``regs[r]`` when it is known (not None);
    otherwise the access covers the whole of the DRAM region of ``regions`` (``(lo, hi)`` byte
    ranges whose register-offset accesses are known to stay inside them: the persistent
    buffers, ``ir/state.py`` proves it) that holds its base address, else all of DRAM.  So a
    register-offset access conflicts with every access to its region, and nothing outside it.
    Likewise the table of a ``gather`` or ``scatter`` that lies in a region of ``regions`` (a
    paged KV cache) covers the whole region.
    Raises ScheduleError for a mnemonic without an
    access description, so that the race check cannot pass by silently ignoring an access.
    """
    spec = instr.spec
    if spec.access is None:
        raise ScheduleError(f"{instr.op}: no memory footprint is modelled for this instruction")
    out = []
    for mem, base, rows, cols, stride, size, write, reg in spec.access(instr.fields):
        if mem in ("reg", "qparam"):
            out.append((mem, base, base + 1, write))
            continue
        lo, hi = _span(base, rows, cols, stride, size)
        if mem == "dram" and instr.op in INDEXED and not reg:
            # the rows an index picks are data: a table in a persistent buffer counts as all of it
            home = next((r for r in regions or () if r[0] <= lo < r[1]), None)
            lo, hi = home if home is not None and hi > lo else (lo, hi)
        if reg:
            value = None if regs is None else regs[reg]
            if value is None:
                home = next((r for r in regions or () if r[0] <= lo < r[1]), DRAM_ANY)
                lo, hi = home if hi > lo else (0, 0)
            else:
                lo, hi = lo + value, hi + value
        out.append((mem, lo, hi, write))
    return out


def register_values(instrs: Sequence[Instr], initial: Sequence[int | None] | None = None) -> list[list]:
    """The scalar registers as each instruction of the sequential stream sees them (before it runs).

    ``initial`` gives r0..r15 at entry (None = unknown, e.g. set by the host); default all 0, as a
    run starts.  ``setr`` makes a register known; ``salu`` computes it when its inputs are known.
    """
    regs: list[int | None] = list(initial) if initial is not None else [0] * N_REGS
    regs[0] = 0
    out = []
    for instr in instrs:
        out.append(list(regs))
        f = instr.fields
        if instr.op == "setr":
            regs[f["reg"]] = f["value"]
        elif instr.op == "salu":
            a, b = regs[f["rs1"]], regs[f["rs2"]]
            regs[f["rd"]] = None if a is None or b is None else scalar_alu(f["func"], a, b + f["simm"])
        elif instr.spec.access is not None:
            for acc in instr.spec.access(f):
                if acc[0] == "reg" and acc[6]:  # a register written by a rule not known here
                    regs[acc[1]] = None
    return out


def _nbytes(dtype: str, count: int) -> int:
    return -(-count // 2) if dtype in ("i4", "u4") else count * {"f32": 4, "f16": 2, "bf16": 2}.get(dtype, 1)


def qparam_reads(instrs: Sequence[Instr]) -> dict[int, list[tuple[str, int, int, bool]]]:
    """The SRAM the quantized instructions read through the QParam pointers (scale and zero-point
    tiles), resolved with the group the last ``setq`` before each one set: footprints their specs
    cannot state (the pointers are run-time state), by instruction index."""
    group: dict = {"scale_ptr": 0, "zp_ptr": 0, "group_size": 0}
    out: dict[int, list[tuple[str, int, int, bool]]] = {}
    for i, instr in enumerate(instrs):
        f = instr.fields
        if instr.op == "setq":
            group = f
            continue
        g, sp, zp = group["group_size"], group["scale_ptr"], group["zp_ptr"]
        if instr.op in ("matmul_w4a16", "vdequant"):
            rows, cols = (f["n"], f["k"]) if instr.op == "matmul_w4a16" else (f["rows"], f["cols"])
            k = f["k"] if instr.op == "matmul_w4a16" else f["cols"]
            groups = -(-k // g) if g else 1
            shape = (rows, groups) if instr.op == "vdequant" or f["trans_b"] else (groups, rows)
            codes = f["w_dtype"] if instr.op == "matmul_w4a16" else f["in_dtype"]
            reads = [("sram", sp, sp + shape[0] * _nbytes(f["s_dtype"], shape[1]), False)]
            if zp:
                reads.append(("sram", zp, zp + shape[0] * _nbytes(codes, shape[1]), False))
        elif instr.op in ("vmmul.q4f8", "matmul_i8"):
            reads = [("sram", sp, sp + 4 * f["n"], False)] if sp else []
            if zp:
                reads.append(("sram", zp, zp + 1, False))
        else:
            continue
        out[i] = reads
    return out


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
