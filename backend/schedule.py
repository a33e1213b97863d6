"""The dependency-token discipline of the three queues (LD, EX, ST), in one place.

A lowering describes a kernel as a list of ``Step``s; ``schedule`` turns kernels into one
instruction stream whose wait/signal bits make the decoupled engines compute exactly what the
sequential reading of the stream (step after step: loads, computes, stores) computes, while the
load of step i+1 overlaps the compute of step i (double buffering) and, across kernels, loads
that depend on nothing still pending start before the previous kernel ends (prefetch).

Contract for lowerings (the scheduler relies on it, ``check_hazards`` verifies it in tests):

* SRAM input slots.  The r-th step that has loads writes input slot ``r % in_slots``.  The data
  of an input slot is read only by the computes of its step (or, in a *copy step* — loads and
  stores but no computes — by its stores).  Data that must outlive its step (an accumulator, a
  normalisation scale) lives in a persistent buffer outside the slots.  The loads of one step
  may run in any order (the scheduler moves loads that wait for nothing first).
* SRAM output slots.  The g-th step that has stores reads output slot ``g % out_slots``.  The
  computes writing that slot are those of its *group*: the steps after the previous store step
  up to and including this one (a matmul accumulating over K tiles straight into its output slot
  spans several steps).
* If a kernel has stores, its last step has stores (nothing may run after the result leaves).
* Scalar registers: only a *register kernel* (``Kernel(sets_registers=True)``: computes only,
  ``setr``/``salu``) writes them, and a kernel reads one only through a DMA's ``dram_reg`` (a
  gather's or scatter's ``count_reg``, a ``vattn``'s ``kv_reg``)
  written by a register kernel scheduled before it and never written again in the stream (the
  compile driver emits one such kernel first in each entry).  A register kernel counts as
  touching all of SRAM, so the first load after it waits for its end (below); every later
  instruction follows that load or the EX queue.  ``Kernel`` refuses anything else.

Token rules inside a kernel (r = load rank, g = store rank of the step):

* loads: first waits the engine that released input slot r - in_slots (EX, or ST for a copy
  step) when r >= in_slots; last signals EX.
* computes (an EX ``nop`` stands in when a step with loads or stores has none): first waits LD
  iff the step has loads, waits ST iff it is the first compute of group g and g >= out_slots;
  last signals LD iff it releases an input slot that a later step reuses, signals ST iff the step
  has stores.
* stores: first waits EX; last signals EX iff store step g + out_slots exists, and signals LD
  iff it is a copy step releasing a reused input slot.

Across kernels.  The *end* of kernel k is its last store (its last compute if it stores
nothing); it happens after every instruction of kernels 0..k (the store queue is in order, the
last store waits for the last compute, every load is waited for by a compute of its kernel).
The scheduler tracks ``known``: the latest kernel whose end the load queue has already waited
for.  A load of kernel j waits for the end of kernel k (k signals LD, the load pops it) when k
is the latest kernel after ``known`` such that

* the load reads DRAM bytes a store of k writes (read after write), or
* the load is the first of kernel j and the SRAM spans of j and k overlap (every instruction of
  j happens after its first load, so j then never touches SRAM that k still uses), or
* the load is the first of a *barrier* kernel j and k = j - 1.

A kernel is a barrier when prefetch is off, when its first step has no loads or when it stores
nothing; a barrier kernel whose first step has no loads also makes its first compute wait for
the previous end (ST -> EX).  Everything else is ordered by the in-order queues: a kernel's
computes follow the previous kernels' computes, hence their loads; its stores follow theirs.  A
kernel's loads never read DRAM before the producer's stores land and never overwrite SRAM an
earlier kernel still uses; the compile driver gives consecutive kernels disjoint SRAM regions
so that the loads of kernel k+1 that read weights or long-finished results run during kernel k.

Tokens are counting semaphores per ordered engine pair and each engine runs in program order, so
the j-th wait on a pair is matched with the j-th signal on it.  Only ends that some load waits
for signal, ``known`` only grows, and a load that pops an intra-kernel release token learns that
the earlier kernels have ended (an ST release: all of them; an EX release: those ending in a
compute), so the boundary tokens interleave with the intra-kernel ones in FIFO order; every
token pushed is popped.

Early compute (``early_compute=True``, with prefetch: intermediates kept in SRAM,
``backend/residency.py``).  No kernel is a barrier.  A step whose loads became on-chip copies
keeps its input-slot rank (``Step.slot_in``: its slot is filled on EX, so only a later step that
loads into it needs a release token), and likewise for left-out stores (``Step.slot_out``: a
group's computes wait ST only when the step g - out_slots really stored).  A kernel's SRAM is a
list of intervals; conflicts between two kernels count only where one of them touches the
bytes with a load or store (EX against EX is ordered by the in-order EX queue).  A kernel whose
first step has no loads has its first compute wait (ST -> EX) for the latest pending kernel
ending in a store that conflicts with it (``ex_need``; ``ex_known`` tracks what EX has learnt,
also from intra-kernel ST releases, keeping the ST -> EX tokens in FIFO order).  The end of a
kernel ending in a compute implies only the kernels EX knew to have ended (``_End.implies``):
a load waiting for such an end also waits for the latest conflicting store end it does not
cover, and ``ex_floor`` records which compute ends the load queue has learnt of.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mcpc.arch.isa import ENGINES, EX, LD, ST, Instr
from mcpc.backend.hazards import ScheduleError, check_hazards, footprint, replay_tokens

__all__ = [
    "Kernel", "ScheduleError", "Step", "check_hazards", "footprint", "replay_tokens", "schedule",
    "schedule_with_debug", "stream_summary",
]  # fmt: skip

_NOP = Instr("nop", {})
# Fields naming a scalar register (a write for setr/salu, a read otherwise).
_REGISTER_FIELDS = ("reg", "rd", "rs1", "rs2", "dram_reg", "rows_reg", "count_reg", "m_reg", "kv_reg")
# The register fields a kernel's instruction may read (registers the register kernel wrote before
# it, or host registers, which nothing in the stream writes): DMA offsets and counts, and vattn's
# rows in use (the EX queue runs it after the register kernel) and the rows of the store of its heat
# table (which waits for the vattn).
_REGISTER_READS = {
    "load": ("dram_reg", "rows_reg"), "store": ("dram_reg", "rows_reg"), "gather": ("dram_reg", "count_reg"),
    "scatter": ("dram_reg", "count_reg"), "vattn": ("kv_reg",), "kvdecomp": ("count_reg",),
    # a prefill's token rows in use (backend/row_extent.py): EX runs them after the register kernel
    "matmul": ("m_reg",), "matmul_w4a16": ("m_reg",), "vun": ("rows_reg",), "vbin": ("rows_reg",),
    "vbini": ("rows_reg",), "vred": ("rows_reg",), "vsel": ("rows_reg",),
}  # fmt: skip


@dataclass
class Step:
    """One step of a kernel: DMA-in, compute, DMA-out.  Instructions carry no token bits yet."""

    loads: list[Instr] = field(default_factory=list)
    computes: list[Instr] = field(default_factory=list)
    stores: list[Instr] = field(default_factory=list)
    # The step owns an input slot although it has no loads: its data was moved in by its computes
    # (a load forwarded from SRAM, ``backend/residency.py``); it keeps its rank among the slot steps.
    slot_in: bool = False
    # Likewise for an output slot whose stores were left out (the value stays in SRAM only).
    slot_out: bool = False

    def __bool__(self) -> bool:
        return bool(self.loads or self.computes or self.stores)

    @property
    def uses_slot(self) -> bool:
        """Whether the step has an input-slot rank (it loads, or its slot is filled on EX)."""
        return bool(self.loads) or self.slot_in

    @property
    def uses_out_slot(self) -> bool:
        """Whether the step has an output-slot rank (it stores, or its stores were left out)."""
        return bool(self.stores) or self.slot_out


@dataclass
class Kernel:
    """The steps of one IR op's lowering and its SRAM slot counts (2 = double buffering, 1 = off).

    ``debug`` is the DBUG record of every instruction of the kernel (set by the compile driver
    from the op being lowered when the lowering leaves it None); ``instr_debug`` overrides it
    for single instructions, keyed by ``id`` of the Instr as the lowering built it (a fused
    epilogue's instructions are attributed to the op they compute).  ``sram_bytes`` is the kernel's
    planned SRAM footprint (its arena peak) from address ``sram_base``, reported in the memory
    map (the scheduler reads the SRAM a kernel really touches from its instructions).
    """

    steps: list[Step]
    in_slots: int = 2
    out_slots: int = 2
    debug: dict | None = None
    sram_bytes: int = 0
    sram_base: int = 0
    instr_debug: dict[int, dict] | None = None
    sets_registers: bool = False

    def __post_init__(self) -> None:
        if self.in_slots < 1 or self.out_slots < 1:
            raise ValueError(f"kernel slots must be >= 1, got in={self.in_slots} out={self.out_slots}")
        if self.sets_registers:
            for i, step in enumerate(self.steps):
                if step.loads or step.stores or any(x.op not in ("setr", "salu") for x in step.computes):
                    raise ValueError(f"step {i}: a register kernel holds setr/salu computes only")
            return
        for i, step in enumerate(self.steps):
            for what, instrs, engine in (("loads", step.loads, LD), ("computes", step.computes, EX),
                                         ("stores", step.stores, ST)):  # fmt: skip
                for instr in instrs:
                    if instr.engine != engine:
                        name = ENGINES[engine]
                        raise ValueError(f"step {i}: {instr.op} is not a {name} instruction ({what})")
                    ok = _REGISTER_READS.get(instr.op, ())
                    regs = [n for n in _REGISTER_FIELDS if instr.fields.get(n) and n not in ok]
                    if regs:
                        raise ValueError(
                            f"step {i}: {instr.op} uses scalar registers ({', '.join(regs)}), which the "
                            "scheduler's token rules do not order"
                        )
        live = [s for s in self.steps if s]
        if any(s.stores for s in live) and not live[-1].stores:
            raise ValueError("a kernel with stores must end with a step that stores")


def schedule(kernels: Iterable[Kernel], prefetch: bool = True, early_compute: bool = False) -> list[Instr]:
    """The instruction stream of ``kernels`` in order, with wait/signal bits (see module doc).

    ``prefetch=False`` makes every kernel a barrier: its first load waits for the previous end.
    ``early_compute=True`` (with prefetch) lets a storing kernel whose first step has no loads
    start without waiting for the previous kernel's end: its first compute waits only for the
    latest pending kernel whose SRAM it touches (module doc).
    """
    return schedule_with_debug(kernels, prefetch, early_compute=early_compute)[0]


def schedule_with_debug(
    kernels: Iterable[Kernel],
    prefetch: bool = True,
    regions: Sequence[tuple[int, int]] = (),
    early_compute: bool = False,
) -> tuple[list[Instr], list[dict | None]]:
    """Like ``schedule``, plus each instruction's debug record (its kernel's ``debug``).

    ``regions``: DRAM ranges a register-offset access whose base lies in one never leaves (the
    persistent buffers); such an access is ordered against its region only (``footprint``),
    any other register-offset access against all of DRAM."""
    out: list[Instr] = []
    dbg: list[dict | None] = []
    ends = _Ends(prefetch, early_compute, regions=tuple(regions))
    for kernel in kernels:
        _schedule_kernel(kernel, out, dbg, ends)
    return out, dbg


@dataclass
class _End:
    """A scheduled kernel as the kernels after it see it."""

    at: int  # stream index of its end instruction (last store, else last compute)
    sram: list[tuple[int, int]]  # sorted disjoint SRAM intervals its instructions touch
    dma_sram: list[tuple[int, int]]  # the part of them its loads and stores touch
    write_lo: list[int]  # sorted disjoint DRAM intervals its stores write
    write_hi: list[int]
    storeless: bool
    implies: int  # every kernel <= implies has ended when this end has happened

    def writes_into(self, lo: int, hi: int) -> bool:
        i = bisect.bisect_right(self.write_hi, lo)
        return i < len(self.write_lo) and self.write_lo[i] < hi


@dataclass
class _Ends:
    """The ends of the kernels scheduled so far and what the load queue knows about them."""

    prefetch: bool
    early_compute: bool = False
    ends: list[_End] = field(default_factory=list)
    regions: tuple[tuple[int, int], ...] = ()
    known: int = -1  # every kernel <= known has ended before the current load issues
    ex_known: int = -1  # every kernel <= ex_known has ended before the current compute issues
    ex_floor: int = -1  # every kernel <= ex_floor ending in a compute has ended (load queue's view)
    popped: set = field(default_factory=set)  # kernels whose end a load waited for

    def released(self, j: int, engine: int) -> None:
        """A load of kernel j pops an intra-kernel release token pushed by ``engine``."""
        if engine == ST:  # a store of j: after every store and compute of kernels < j
            self.known = max(self.known, j - 1)
        else:  # a compute of j: after the ends of the earlier kernels that end in a compute
            for k in range(j - 1, self.known, -1):
                if self.ends[k].storeless:
                    self.known = max(self.known, self.ends[k].implies)
                    break
            self.ex_floor = max(self.ex_floor, j - 1)

    def need(self, load: Instr, j: int, span: tuple[list, list] | None, barrier: bool) -> list[int]:
        """The pending kernels whose ends ``load`` (of kernel j) must wait for: the latest one it
        conflicts with, and when that one ends in a compute whose end does not imply the earlier
        kernels' (``_End.implies``), also the latest conflicting kernel ending in a store that
        it does not cover (at most one end per engine pair).

        ``span`` is kernel j's SRAM spans when ``load`` is its first load, else None."""
        if barrier:
            return [j - 1] if j - 1 > self.known else []
        reads = _dram_reads(load, self.regions)
        out: list[int] = []
        for k in range(j - 1, self.known, -1):
            end = self.ends[k]
            if k in self.popped or (end.storeless and k <= self.ex_floor):
                continue  # the load queue knows it has ended
            if out and (end.storeless or k <= self.ends[out[0]].implies):
                continue  # covered by the compute end already chosen
            hit = span is not None and self._overlaps(end, span)
            if hit or any(end.writes_into(lo, hi) for lo, hi in reads):
                out.append(k)
                if not end.storeless or end.implies >= k - 1 or len(out) == 2:
                    break
        return out

    def _overlaps(self, end: _End, span: tuple[list, list]) -> bool:
        """Whether a pending kernel and kernel j (``span``: all its SRAM, its DMA's SRAM) touch
        the same SRAM.  With ``early_compute`` a conflict between two EX instructions does not
        count: the EX engine runs in order (the scoreboard holds the data dependencies)."""
        if not self.early_compute:
            return _overlap(end.sram, span[0])
        return _overlap(end.dma_sram, span[0]) or _overlap(end.sram, span[1])

    def ex_need(self, span: tuple[list, list], j: int) -> int:
        """The latest pending kernel ending in a store whose SRAM overlaps ``span`` (kernel j's),
        or -1: what kernel j's first compute must wait for when its first step has no loads.
        (A kernel ending in a compute has ended before any later compute issues.)"""
        for k in range(j - 1, self.ex_known, -1):
            end = self.ends[k]
            if not end.storeless and _overlap(end.dma_sram, span[0]):
                return k
        return -1

    def ex_pop(self, k: int, out: list[Instr]) -> int:
        """Make kernel k's end (a store) signal EX; return the wait bit the popping compute carries."""
        at = self.ends[k].at
        out[at] = _bits(out[at], signal=1 << EX)
        self.ex_known = k
        return 1 << out[at].engine

    def pop(self, k: int, out: list[Instr]) -> int:
        """Make kernel k's end signal LD; return the wait bit the popping load carries."""
        at = self.ends[k].at
        out[at] = _bits(out[at], signal=1 << LD)
        self.known = max(self.known, self.ends[k].implies)
        self.popped.add(k)
        if self.ends[k].storeless:  # EX->LD tokens stay in order: no earlier compute end after it
            self.ex_floor = max(self.ex_floor, k)
        return 1 << out[at].engine


def _dram_reads(instr: Instr, regions: Sequence[tuple[int, int]] = ()) -> list[tuple[int, int]]:
    return [
        (lo, hi) for mem, lo, hi, w in footprint(instr, None, regions) if mem == "dram" and not w and hi > lo
    ]


def _sram_span(steps: list[Step], dma_only: bool = False) -> list[tuple[int, int]]:
    """The SRAM a kernel touches (``dma_only``: its loads and stores), as sorted disjoint
    intervals (a kernel reading a buffer kept in SRAM far from its slots does not claim the bytes
    in between)."""
    spans = sorted(
        (a, b)
        for s in steps
        for instr in ((*s.loads, *s.stores) if dma_only else (*s.loads, *s.computes, *s.stores))
        for mem, a, b, _ in footprint(instr)
        if mem == "sram" and b > a
    )
    out: list[tuple[int, int]] = []
    for a, b in spans:
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _overlap(x: list[tuple[int, int]], y: list[tuple[int, int]]) -> bool:
    """Whether two sorted lists of disjoint intervals intersect."""
    i = k = 0
    while i < len(x) and k < len(y):
        if x[i][0] < y[k][1] and y[k][0] < x[i][1]:
            return True
        if x[i][1] <= y[k][1]:
            i += 1
        else:
            k += 1
    return False


def _merged_writes(steps: list[Step], regions: Sequence[tuple[int, int]] = ()) -> tuple[list[int], list[int]]:
    spans = sorted(
        (a, b)
        for s in steps
        for i in s.stores
        for mem, a, b, w in footprint(i, None, regions)
        if mem == "dram" and w and b > a
    )
    los: list[int] = []
    his: list[int] = []
    for a, b in spans:
        if his and a <= his[-1]:
            his[-1] = max(his[-1], b)
        else:
            los.append(a)
            his.append(b)
    return los, his


def _conflict(a: Instr, b: Instr, regions: Sequence[tuple[int, int]] = ()) -> bool:
    """Whether the two instructions touch the same bytes of one memory, one of them writing."""
    fb = footprint(b, None, regions)
    return any(
        ma == mb and lo < hj and lj < hi and (wa or wb)
        for ma, lo, hi, wa in footprint(a, None, regions)
        for mb, lj, hj, wb in fb
    )


def _free_loads_first(step: Step, ends: _Ends, j: int) -> Step:
    """``step`` with the loads that wait for no pending kernel moved before those that do
    (stable), unless a moved load touches memory a load it would overtake also touches."""
    if len(step.loads) < 2:
        return step
    waits = [bool(ends.need(x, j, None, False)) for x in step.loads]
    order = [x for x, w in zip(step.loads, waits, strict=True) if not w]
    order += [x for x, w in zip(step.loads, waits, strict=True) if w]
    for n, x in enumerate(step.loads):
        if not waits[n]:
            if any(
                _conflict(x, y, ends.regions) for y, w in zip(step.loads[:n], waits[:n], strict=True) if w
            ):
                return step
    return Step(order, step.computes, step.stores)


def _schedule_kernel(kernel: Kernel, out: list[Instr], dbg: list, ends: _Ends) -> None:
    """Append ``kernel`` (token bits per the module doc) and record its end in ``ends``."""
    steps = [s for s in kernel.steps if s]
    if not steps:
        return
    j = len(ends.ends)
    slot_steps = [s for s in steps if s.uses_slot]
    out_steps = [s for s in steps if s.uses_out_slot]
    n_load, n_out = len(slot_steps), len(out_steps)
    n_store = sum(1 for s in steps if s.stores)
    early = ends.early_compute and not steps[0].loads
    if ends.early_compute:  # any kernel may start before the previous one ends (see ex_need)
        barrier = not ends.prefetch
    else:
        barrier = not (ends.prefetch and steps[0].loads and n_store)
    if not barrier:
        steps = [_free_loads_first(s, ends, j) for s in steps]
    span = (_sram_span(steps), _sram_span(steps, dma_only=True))
    if kernel.sets_registers:  # counts as touching all of SRAM: the next load waits for its end
        span = ([(0, 1 << 62)], [(0, 1 << 62)])
    # Who releases each input slot: the step's computes, or its stores for a copy step.
    release = [ST if (s.stores and not s.computes) else EX for s in slot_steps]
    prev = ends.ends[-1].at if ends.ends else None
    boundary_ex = barrier and prev is not None and out[prev].engine == ST and not steps[0].loads
    boundary_ex = boundary_ex and ends.ex_known < j - 1
    if boundary_ex:  # an EX end is already in EX order
        out[prev] = _bits(out[prev], signal=1 << EX)
    early_wait = 0
    if not barrier and early:  # first compute before any load: wait for overlapping pending kernels
        k = ends.ex_need(span, j)
        if k >= 0:
            early_wait = ends.ex_pop(k, out)
    r = g = 0
    group_open = True  # the next compute is the first of its output group
    first_load = True
    last_ex = None
    for step in steps:
        loads = list(step.loads)
        ex = list(step.computes) or ([_NOP] if (step.loads or step.stores) else [])
        stores = list(step.stores)
        built = (*loads, *ex, *stores)  # before token bits replace them (instr_debug keys)
        if loads:
            if r >= kernel.in_slots:
                loads[0] = _bits(loads[0], wait=1 << release[r - kernel.in_slots])
                ends.released(j, release[r - kernel.in_slots])
            for n, instr in enumerate(loads):
                need = ends.need(instr, j, span if first_load else None, barrier and first_load)
                first_load = False
                for k in need:
                    loads[n] = _bits(loads[n], wait=ends.pop(k, out))
            loads[-1] = _bits(loads[-1], signal=1 << EX)
        # the slot is reused by a later step that loads into it (a slot filled on EX needs no token)
        reused = (
            step.uses_slot and r + kernel.in_slots < n_load and bool(slot_steps[r + kernel.in_slots].loads)
        )
        if ex:
            wait = (1 << LD) if loads else 0
            if group_open and g >= kernel.out_slots and out_steps[g - kernel.out_slots].stores:
                wait |= 1 << ST
                ends.ex_known = max(ends.ex_known, j - 1)
            if boundary_ex:
                wait |= 1 << ST
                boundary_ex = False
                ends.ex_known = max(ends.ex_known, j - 1)
            if early_wait:
                wait |= early_wait
                early_wait = 0
            group_open = False
            signal = (1 << LD) if (reused and release[r] == EX) else 0
            signal |= (1 << ST) if stores else 0
            ex[0] = _bits(ex[0], wait=wait)
            ex[-1] = _bits(ex[-1], signal=signal)
        if stores:
            signal = (1 << EX) if g + kernel.out_slots < n_out else 0
            signal |= (1 << LD) if (reused and release[r] == ST) else 0
            stores[0] = _bits(stores[0], wait=1 << EX)
            stores[-1] = _bits(stores[-1], signal=signal)
        if step.uses_out_slot:
            g += 1
            group_open = True
        if step.uses_slot:
            r += 1
        own = kernel.instr_debug or {}
        for instr, orig in zip((*loads, *ex, *stores), built, strict=True):
            out.append(instr)
            dbg.append(own.get(id(orig), kernel.debug))
        if ex:
            last_ex = len(out) - 1 - len(stores)
    at = len(out) - 1 if n_store else last_ex
    implies = j
    if not n_store and not barrier:  # its end only says that EX got this far
        implies = ends.ex_known
        while implies + 1 < j and ends.ends[implies + 1].storeless:
            implies += 1
        implies = j if implies + 1 == j else implies
    writes = _merged_writes(steps, ends.regions)
    ends.ends.append(_End(at, span[0], span[1], *writes, storeless=not n_store, implies=implies))


def _bits(instr: Instr, wait: int = 0, signal: int = 0) -> Instr:
    if not (wait or signal):
        return instr
    if instr.wait & wait or instr.signal & signal:
        raise AssertionError(f"{instr.op}: two tokens on one engine pair in one instruction")
    return instr.replace(wait=instr.wait | wait, signal=instr.signal | signal)


def stream_summary(instrs: Sequence[Instr]) -> dict[str, Any]:
    """Counts per engine and per mnemonic (for compile reports)."""
    per_engine = {e: 0 for e in ENGINES}
    per_op: dict[str, int] = {}
    for instr in instrs:
        per_engine[ENGINES[instr.engine]] += 1
        per_op[instr.op] = per_op.get(instr.op, 0) + 1
    return {"per_engine": per_engine, "per_mnemonic": dict(sorted(per_op.items()))}
