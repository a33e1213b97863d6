"""The dependency-chain latency of a run: the longest path through its true dependencies, each
instruction contributing only its fixed latency (docs/timing.md, "The dependency chain").

An edge i -> j (i before j in the entry's stream) exists when the two touch the same bytes of one
memory and at least one of them writes: read after write, write after read, write after write —
on SRAM, DRAM, the scalar registers and the QParam group, exactly the accesses the hazard model
orders (``arch.footprint.footprint``, plus the scale and zero-point tiles the quantized matmuls
read through the QParam pointers).  A register-offset DRAM access whose register the host sets
covers its persistent region, a ``gather``'s or ``scatter``'s table the whole of it.  The weight of
instruction j is its ``tail`` (the DRAM latency of a DMA, the stream or pipeline latency of a
matmul, the vector pipeline's latency; 0 for scalar instructions), never its busy time.  A read of
data i wrote adds j's latency; an edge that only orders (write after write, write after read, an
accumulating matmul adding to the partial sums i wrote, which the array forwards) makes j complete
no earlier than i:

    chain(j) = max(tail(j) + max(chain(i) for i -RAW-> j), max(chain(i) for the other i -> j))
    chain latency = max_j chain(j)

So the chain never exceeds the cycles of the run under the timing model.  It is what a machine
with unlimited engines and bandwidth would still take: the roofline covers throughput, the chain
latency covers what cannot overlap.  Computed once per entry and set of tails (a run-time extent
can change a tail), by a sweep over coordinate-compressed byte ranges.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mcpc.arch.footprint import MEMORIES, ScheduleError, footprint, qparam_reads, register_values
from mcpc.arch.isa import N_REGS
from mcpc.errors import InputError

_MEM = {name: k for k, name in enumerate(MEMORIES)}
_ACCUMULATING = ("matmul", "matmul_w4a16", "vmmul.q4f8", "matmul_i8")
_ORDER = 2  # an access kind beside read (0) and write (1): a read that only orders


def stream_accesses(instrs: list, regions: list[tuple[int, int]], host_regs: set[int] | None = None) -> list:
    """Per instruction, its accesses ``(memory index, lo, hi, kind)``, kind 0 read, 1 write, 2 a read
    that only orders (an accumulating matmul's partial sums) (None: a word that did
    not decode, or an instruction without a footprint: it has no edges).  Registers the host sets
    (``host_regs``) are unknown values: an access offset by one covers its region."""
    initial: list[int | None] = [0] * N_REGS
    for r in host_regs or ():
        initial[r] = None
    live = [i for i in instrs if i is not None]
    values = iter(register_values(live, initial))
    indirect = qparam_reads(live)
    out: list = []
    k = 0
    for ins in instrs:
        if ins is None:
            out.append(None)
            continue
        regs = next(values)
        try:
            acc = footprint(ins, regs, regions) + indirect.get(k, [])
        except ScheduleError:
            acc = None
        k += 1
        if acc is None:
            out.append(None)
            continue
        rows = [(_MEM[m], lo, hi, int(w)) for m, lo, hi, w in acc if hi > lo]
        if ins.op in _ACCUMULATING and ins.fields.get("acc"):  # its read of C: the partial sums
            writes = {r[:3] for r in rows if r[3]}
            rows = [(m, lo, hi, _ORDER if (not w and (m, lo, hi) in writes) else w) for m, lo, hi, w in rows]
        out.append(rows)
    return out


class _Sweep:
    """The static part of the sweep: accesses as index ranges into compressed coordinates."""

    def __init__(self, accesses: list):
        points: list[set] = [set() for _ in MEMORIES]
        for acc in accesses:
            for m, lo, hi, _ in acc or ():
                points[m].update((lo, hi))
        self.coords = [np.array(sorted(p), dtype=np.int64) for p in points]
        self.ranges: list[tuple] = []
        for acc in accesses:
            rows = []
            for m, lo, hi, w in acc or ():
                c = self.coords[m]
                a, b = int(np.searchsorted(c, lo)), int(np.searchsorted(c, hi))
                if b > a:
                    rows.append((m, a, b, w))
            self.ranges.append(tuple(rows))
        self.cache: dict[bytes, int] = {}

    def longest(self, tails: np.ndarray) -> int:
        key = tails.tobytes()
        got = self.cache.get(key)
        if got is not None:
            return got
        last_w = [np.zeros(max(len(c) - 1, 0), dtype=np.int64) for c in self.coords]
        last_r = [np.zeros(max(len(c) - 1, 0), dtype=np.int64) for c in self.coords]
        best = 0
        for idx, rows in enumerate(self.ranges):
            raw = order = 0
            for m, a, b, w in rows:
                v = int(last_w[m][a:b].max())
                if w == 1:
                    order = max(order, v, int(last_r[m][a:b].max()))
                elif w == _ORDER:
                    order = max(order, v)
                else:
                    raw = max(raw, v)
            end = max(raw + int(tails[idx]), order)
            for m, a, b, w in rows:
                if w == 1:
                    last_w[m][a:b] = end
                    last_r[m][a:b] = end
                else:
                    seg = last_r[m][a:b]
                    np.maximum(seg, end, out=seg)
            best = max(best, end)
        self.cache[key] = best
        return best


def chain_latency(program: Any, order: range, cache: dict | None = None) -> int:
    """The dependency-chain latency (cycles) of running ``order`` of a LoadedProgram with its
    current tails (``record_extents`` sets those of run-time extents).  ``cache`` keeps the static
    sweep per entry."""
    sweep = None if cache is None else cache.get(order.start)
    if sweep is None:
        instrs = []
        for idx in order:
            try:
                instrs.append(program.instr(idx))
            except InputError:  # traps if executed: no memory access, no edge
                instrs.append(None)
        regions = [
            (int(r["dram"]), int(r["dram"]) + int(r["bytes"]))
            for r in program.memory_map.get("regions") or []
            if r.get("kind") == "persistent" and r.get("bytes")
        ]
        host = {int(h["reg"]) for h in program.program.host_registers}
        sweep = _Sweep(stream_accesses(instrs, regions, host))
        if cache is not None:
            cache[order.start] = sweep
    return sweep.longest(np.asarray(program.tail[order.start : order.stop], dtype=np.int64))
