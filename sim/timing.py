"""Timing: the cycle cost of each instruction and the event loop over the three engine queues.

The model (docs/simulator.md, "How cycles are counted", is the definition):

* Instructions of an entry are dispatched in program order into three in-order queues (LD, EX,
  ST) by their engine; dispatch stops after the first ``halt``.
* At each step, among the queue heads whose awaited tokens are all available, the one with the
  earliest issue time issues (ties: LD, EX, ST).  issue = max(engine free, push time of each
  awaited token, and for DMA the DRAM channel free time).  It executes functionally at that
  moment, so a missing dependency token shows up as wrong data, as on hardware.
* Tokens are counting semaphores per ordered engine pair holding their push times (FIFO); a
  token is pushed when the signalling instruction completes.
* DMA (load, store, gather): transfer = ceil(bytes / dram_bytes_per_cycle); the channel and the
  engine are busy for the transfer; completion = issue + transfer + dram_latency_cycles.
* Every live ISA spec names its cost function here (``InstrSpec.cost``); ``COSTS`` maps each
  mnemonic to it, resolved at import.  An instruction whose row count comes from a register is
  costed for the rows it actually processes, when it executes (``execute.compile_extent``).
* matmul: ceil(m/rows)·ceil(n/cols)·k·(rows·cols)/macs_per_cycle[in_dtype] (rounded up) +
  pipeline_latency.  Vector ops: ceil(elements / lanes[in_dtype]) + latency (special functions
  use sfu_lanes; vsel uses its dtype, transpose the unsigned type of its element size).
  vtopk: topk_k passes over the row (a selection network), each costing a vector pass.
  setr, salu, setq, nop, halt: 1 cycle.  Compute instructions occupy their engine until completion.
* Cycles of the run = the latest completion.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, NamedTuple

from mcpc.arch.isa import ENGINES, SFU_FUNCS, Instr, resolve

from .decode import Decoded
from .machine import Fault, Machine

_TRANSPOSE_LANES = {1: "i8", 2: "f16", 4: "f32", 8: "i64"}
DMA_OPS = frozenset({"load", "store", "gather"})


class Cost(NamedTuple):
    """Static cost of one instruction: engine-busy cycles, extra cycles until completion, traffic."""

    busy: int
    tail: int
    macs: int
    dram_read: int
    dram_write: int


def instr_cost(i: Instr | Decoded, target: Any) -> Cost:
    """Cycles and traffic of one instruction on ``target`` (see the module docstring)."""
    return COSTS[i.op](i, target)


def dma_cost(i: Instr | Decoded, target: Any) -> Cost:
    op = i.op
    nbytes = (i.count if op == "gather" else i.rows) * i.row_bytes
    transfer = math.ceil(nbytes / target.dram_bytes_per_cycle)
    rd, wr = (0, nbytes) if op == "store" else (nbytes, 0)
    return Cost(transfer, target.dram_latency_cycles, 0, rd, wr)


def matmul_cost(i: Instr | Decoded, target: Any) -> Cost:
    mac = target.mac
    rate = mac.macs_per_cycle.get(i.in_dtype)
    if rate is None:  # traps when executed (execute.compile_instr); cost is irrelevant
        return Cost(1, 0, 0, 0, 0)
    tiles = math.ceil(i.m / mac.array_rows) * math.ceil(i.n / mac.array_cols)
    cycles = math.ceil(tiles * i.k * mac.array_rows * mac.array_cols / rate)
    return Cost(cycles + mac.pipeline_latency, 0, i.m * i.n * i.k, 0, 0)


def _vector_lanes(i: Instr | Decoded, target: Any) -> int:
    op = i.op
    if op == "vun" and i.func in SFU_FUNCS:
        return target.vector.sfu_lanes
    if op in ("vsel", "vtopk"):
        return target.vector_lanes_for(i.dtype)
    if op == "transpose":
        return target.vector_lanes_for(_TRANSPOSE_LANES.get(i.elem_bytes, "i8"))
    return target.vector_lanes_for(i.in_dtype)


def vector_cost(i: Instr | Decoded, target: Any) -> Cost:
    lanes = _vector_lanes(i, target)
    return Cost(math.ceil(i.rows * i.cols / lanes) + target.vector.latency, 0, 0, 0, 0)


def topk_cost(i: Instr | Decoded, target: Any) -> Cost:
    lanes = _vector_lanes(i, target)
    passes = max(i.topk_k, 1)
    return Cost(passes * math.ceil(i.rows * i.cols / lanes) + target.vector.latency, 0, 0, 0, 0)


def scalar_cost(i: Instr | Decoded, target: Any) -> Cost:
    return Cost(1, 0, 0, 0, 0)


# Every live mnemonic -> the cost function its spec names (RuntimeError at import if one is missing).
COSTS = resolve("cost", globals())


class Deadlock(Exception):
    """No queue head can issue although some queues are not empty; ``blocked`` are instruction indices."""

    def __init__(self, blocked: list[tuple[int, list[int]]]):
        super().__init__("deadlock")
        self.blocked = blocked  # (instruction index, engines it waits on without a token)


class Faulted(Exception):
    """An instruction trapped; ``index`` is its position in the program, ``message`` the reason."""

    def __init__(self, index: int, message: str):
        super().__init__(message)
        self.index, self.message = index, message


# Record layout (tuples are the fastest thing to unpack in the loop):
#   (engine, waits, signals, handler, args, busy, tail, is_dma)
REC_ENGINE, REC_WAITS, REC_SIGNALS, REC_FN, REC_ARGS, REC_BUSY, REC_TAIL, REC_DMA = range(8)
_ILLEGAL_PY = (ValueError, TypeError, ArithmeticError, IndexError)


def simulate(recs: list[tuple], order: range, machine: Machine) -> tuple[list, list, list, dict]:
    """Run instructions ``order`` (global indices into ``recs``) through the three queues.

    Returns ``(issue, done, stall, tokens_left)``: per-instruction issue and completion cycle
    (lists indexed by position in ``order``), per-engine stall cycles, and the tokens still
    pending at the end (``{"EX->LD": 1}``; empty when the program balances them, as it should).
    Raises Faulted or Deadlock.
    """
    base = order.start
    queues: list[list[int]] = [[], [], []]
    for idx in order:
        queues[recs[idx][REC_ENGINE]].append(idx)
    n = len(order)
    issue = [0] * n
    done = [0] * n
    free = [0, 0, 0]
    stall = [0, 0, 0]
    pos = [0, 0, 0]
    lens = [len(q) for q in queues]
    tokens = [[deque(), deque(), deque()] for _ in range(3)]  # tokens[src][dst]: push times
    chan = 0  # DRAM channel free time
    engines = (0, 1, 2)
    while True:
        best = -1
        best_t = 0
        for e in engines:
            p = pos[e]
            if p == lens[e]:
                continue
            r = recs[queues[e][p]]
            t = free[e]
            for src in r[1]:
                q = tokens[src][e]
                if not q:
                    break
                if q[0] > t:
                    t = q[0]
            else:
                if r[7] and chan > t:
                    t = chan
                if best < 0 or t < best_t:
                    best, best_t = e, t
        if best < 0:
            if pos != lens:
                raise Deadlock(_blocked(recs, queues, pos, lens, tokens))
            left = {
                f"{ENGINES[a]}->{ENGINES[b]}": len(tokens[a][b])
                for a in range(3)
                for b in range(3)
                if tokens[a][b]
            }
            return issue, done, stall, left
        e = best
        idx = queues[e][pos[e]]
        r = recs[idx]
        for src in r[1]:
            tokens[src][e].popleft()
        try:
            r[3](machine, r[4])
        except Fault as exc:
            raise Faulted(idx, str(exc)) from None
        except _ILLEGAL_PY as exc:  # a field combination the kernels reject (e.g. int ** negative)
            raise Faulted(idx, f"illegal operation: {exc}") from None
        stall[e] += best_t - free[e]
        busy, tail = r[5], r[6]
        if busy < 0:  # a run-time extent: the cost of what it actually did (execute.compile_extent)
            busy, tail = r[4][-1][0][:2]
        end = best_t + busy
        free[e] = end
        if r[7]:
            chan = end
        end += tail
        issue[idx - base] = best_t
        done[idx - base] = end
        for dst in r[2]:
            tokens[e][dst].append(end)
        pos[e] += 1


def _blocked(recs, queues, pos, lens, tokens) -> list[tuple[int, list[int]]]:
    out = []
    for e in range(3):
        if pos[e] < lens[e]:
            idx = queues[e][pos[e]]
            out.append((idx, [src for src in recs[idx][1] if not tokens[src][e]]))
    return out
