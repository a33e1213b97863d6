"""Intermediates kept in SRAM across kernels: a consumer reads its producer's result on chip.

Every kernel reads its operands from DRAM and writes its result to DRAM, so a chain of kernels
pays a store and a load (two DRAM latencies) per link.  With ``keep_in_sram`` the compile driver
reserves a *resident area* at the bottom of the scratchpad and plans in it, by liveness over the
order of execution, the intermediates that fit (``plan_residents``); after lowering,
``forward`` rewrites the kernels:

* each store of a resident value keeps its DRAM write (write-through: the DRAM copy stays valid,
  so any reader left on DMA is still right) and gains an on-chip copy (``vun copy``, bit-exact:
  an integer copy of the raw bytes) of the same bytes into the value's resident buffer, after
  the step's computes;
* each load of a later kernel reading bytes of a resident value becomes a ``vun copy`` from the
  resident buffer into the same SRAM slot, before the step's computes: the consumer no longer
  waits for the producer's store to land nor for its own load's DRAM latency.

A step that loses all its loads keeps its input-slot rank (``Step.slot_in``), and the scheduler
(``early_compute``) lets such a kernel start as soon as the pending kernels whose SRAM it touches
have ended, instead of after the previous kernel's last store.  The resident buffers are touched
by EX only; the DRAM layout of a value is kept in its buffer, so a DMA's rows map to a copy's
rows (row strides in bytes become element strides of ``i32``, or ``u8`` when not a multiple of 4).

Not forwarded (left on DMA, still correct through write-through): a load only partly inside a
resident value, a load whose shape does not fit a ``vun``'s fields, ``gather`` reads, and steps
of a kernel mixing DMA copy steps with input-slot reuse (the token rules order a copy step's slot
through its stores).  A value whose producer cannot copy every store into its buffer is not kept.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

from mcpc.backend.inplace import fold_copies
from mcpc.backend.memory import ALIAS_OPS, assign_offsets
from mcpc.backend.schedule import Kernel, Step, footprint
from mcpc.ir.ops import ConstantOp

_U20 = (1 << 20) - 1


@dataclass
class Resident:
    """A value kept in SRAM: its resident buffer, its DRAM bytes and its live op positions."""

    sram: int
    dram: int
    nbytes: int
    first: int
    last: int
    output: bool = False  # a function output: its stores to DRAM stay
    forwarded: bool = False  # some load reads it on chip


@dataclass
class ResidentPlan:
    """The resident area ``[0, size)`` of the scratchpad and the values planned in it."""

    size: int = 0
    values: list[Resident] = field(default_factory=list)
    forwarded_loads: int = 0
    copied_stores: int = 0
    left_out_stores: int = 0


def plan_residents(fn: Any, placements: dict, positions: dict, align: int, reserve: int) -> ResidentPlan:
    """Plan the intermediates of ``fn`` that stay in SRAM within the first ``reserve`` bytes of
    the scratchpad.

    Candidates: results of ops (through reshape aliases; function outputs too: their stores stay,
    later kernels read the SRAM copy), in a byte-sized dtype, no larger than a quarter of
    ``reserve``.  Buffers share the area by liveness over op positions (``positions``: the order
    of execution, default the op index); a candidate whose best-fit offset would cross
    ``reserve`` is left in DRAM.  Guarantees: two values live at one
    position never share SRAM bytes; every buffer lies in ``[0, size)``, ``size <= reserve``.
    """
    root: dict = {a: a for a in fn.args}
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
            continue
        for r in op.results:
            root[r] = r
            if not isinstance(op, ConstantOp):
                first[r] = idx
    cap = reserve // 4
    cands = [
        v
        for v in first
        if v.type.dtype.bits % 8 == 0 and 0 < v.type.nbytes <= cap and v in placements and v in last
    ]
    if not cands or reserve <= 0:
        return ResidentPlan()
    offsets, _ = assign_offsets([(first[v], last[v], v.type.nbytes) for v in cands], align)
    kept = [
        (v, off) for v, off in zip(cands, offsets, strict=True) if off + _up(v.type.nbytes, align) <= reserve
    ]
    if not kept:
        return ResidentPlan()
    used = max(off + _up(v.type.nbytes, align) for v, off in kept)
    outputs = {root.get(v, v) for v in fn.outputs}
    values = [Resident(off, placements[v], v.type.nbytes, first[v], last[v], v in outputs) for v, off in kept]
    return ResidentPlan(size=used, values=values)


def _up(n: int, align: int) -> int:
    return -(-n // align) * align


def _copy_fields(
    rows: int, row_bytes: int, src: int, src_stride: int, dst: int, dst_stride: int, rows_reg: int = 0
) -> dict | None:
    """The ``vun copy`` moving ``rows`` rows of ``row_bytes`` (byte strides; a DMA's run-time row
    count ``rows_reg`` becomes the copy's), or None if no encodable copy does."""
    if rows <= 0 or row_bytes <= 0:
        return None
    if rows == 1:
        src_stride = dst_stride = 0
    e = 4 if all(x % 4 == 0 for x in (row_bytes, src_stride, dst_stride)) else 1
    cols, ss, ds = row_bytes // e, src_stride // e, dst_stride // e
    if max(rows, cols, ss, ds) > _U20:
        return None
    dt = "i32" if e == 4 else "u8"
    return dict(func="copy", in_dtype=dt, out_dtype=dt, src=src, dst=dst, rows=rows, cols=cols,
                src_stride=ss, dst_stride=ds, src_bcast=0, rows_reg=rows_reg)  # fmt: skip


class _Index:
    """Resident values by DRAM address, live at an op position."""

    def __init__(self, values: list[Resident]) -> None:
        self.values = sorted(values, key=lambda r: r.dram)
        self.los = [r.dram for r in self.values]

    def touching(self, lo: int, hi: int, pos: int) -> list[Resident]:
        """The values live at ``pos`` whose bytes meet [lo, hi)."""
        i = bisect.bisect_left(self.los, hi)
        return [r for r in self.values[:i] if r.first <= pos <= r.last and lo < r.dram + r.nbytes]

    def holding(self, lo: int, hi: int, pos: int) -> tuple[Resident | None, bool]:
        """The value live at ``pos`` whose bytes contain [lo, hi), and whether some live value's
        bytes only partly overlap it."""
        found, partial = None, False
        i = bisect.bisect_left(self.los, hi)
        for r in reversed(self.values[:i]):
            if not (r.first <= pos <= r.last) or r.dram + r.nbytes <= lo:
                continue
            if r.dram <= lo and hi <= r.dram + r.nbytes:
                found = r
            else:
                partial = True
        return found, partial


def _dma_range(instr: Any, regions: Any = ()) -> tuple[int, int]:
    """The DRAM bytes a load or store touches.  When a register offsets its address: the
    persistent buffer of ``regions`` its base lies in (such an access never leaves it), else all
    of DRAM, as when a register sets its row count; such a DMA is never turned into a copy, and a
    store of it that may touch a value kept in SRAM keeps that value in DRAM."""
    f = instr.fields
    if instr.op not in ("load", "store"):  # gather / scatter: the table (its region when persistent)
        spans = [(lo, hi) for mem, lo, hi, _ in footprint(instr, None, regions) if mem == "dram"]
        return spans[0] if spans else (0, 0)
    rows, rb, stride = f["rows"], f["row_bytes"], f["dram_stride"]
    if f.get("rows_reg") and not f.get("dram_reg") and not any(lo <= f["dram"] < hi for lo, hi in regions):
        # a run-time count of a scratch DMA (a prefill's token rows, backend/row_extent.py): at
        # most its ``rows``, the bytes of its capacity; its copies take the same count
        return (f["dram"], f["dram"] + max(rows - 1, 0) * stride + rb) if rows > 0 and rb > 0 else (0, 0)
    if f.get("rows_reg"):
        # at most ``rows`` rows: inside a persistent buffer (``vattn``'s heat), that buffer
        whole = (f["dram"], f["dram"] + max(rows - 1, 0) * stride + rb)
        if f.get("dram_reg") or not any(lo <= whole[0] and whole[1] <= hi for lo, hi in regions):
            return (0, 1 << 62)
        return next((lo, hi) for lo, hi in regions if lo <= whole[0] and whole[1] <= hi)
    if f.get("dram_reg"):
        return next(((lo, hi) for lo, hi in regions if lo <= f["dram"] < hi), (0, 1 << 62))
    if rows <= 0 or rb <= 0:
        return (f["dram"], f["dram"])
    return (f["dram"], f["dram"] + (rows - 1) * stride + rb)


def _step_rules(kernel: Kernel) -> dict[int, tuple[bool, bool]]:
    """Per step (by ``id``): whether its loads may become on-chip copies, and whether its stores
    may gain one.  The token rules release a DMA copy step's input slot (loads and stores, no
    computes) by its stores; a copy step that gains a compute is released by it instead, so it
    may change only if no later step reuses its slot, and a slot whose previous user was a copy
    step (read by ST) may not be filled on EX."""
    steps = [s for s in kernel.steps if s]
    slot_steps = [s for s in steps if s.uses_slot]
    rank = {id(s): r for r, s in enumerate(slot_steps)}
    n, slots = len(slot_steps), kernel.in_slots
    out = {}
    for s in steps:
        copy = bool(s.loads and s.stores and not s.computes)
        r = rank.get(id(s))
        if r is None:
            out[id(s)] = (False, True)
            continue
        reused = r + slots < n
        prev = slot_steps[r - slots] if r >= slots else None
        prev_copy = prev is not None and bool(prev.loads and prev.stores and not prev.computes)
        out[id(s)] = (not prev_copy and not (copy and reused), not (copy and reused))
    return out


def forward(
    kernels: list[Kernel],
    positions: list[int],
    plan: ResidentPlan,
    emitter: Any,
    regions: Any = (),
    in_place: bool = True,
) -> None:
    """Rewrite ``kernels`` (``positions[i]``: kernel i's op position) for the values of ``plan``
    (see the module doc; ``regions``: the persistent buffers' DRAM ranges, ``_dma_range``).
    Values whose stores cannot all be copied are dropped from the plan;
    the stores of a value that is not a function output and that no DMA reads any more are
    left out (its step keeps its output-slot rank, ``Step.slot_out``).  With ``in_place`` the
    copies are then folded into the computes that can address the resident buffers themselves
    (``inplace.fold_copies``)."""
    if not plan.values:
        return
    index = _Index(plan.values)
    dropped: set[int] = set()
    producer_end: dict[int, int] = {}  # id(resident) -> index of the last kernel storing it
    rules = [_step_rules(k) for k in kernels]
    for ki, (kernel, pos) in enumerate(zip(kernels, positions, strict=True)):
        for step in kernel.steps:
            ok = rules[ki].get(id(step), (False, False))[1]
            for st in step.stores:
                lo, hi = _dma_range(st, regions)
                if hi <= lo:
                    continue
                res, partial = index.holding(lo, hi, pos)
                for r in index.touching(lo, hi, pos):
                    f = st.fields
                    good = (
                        ok and r is res and not partial and pos == r.first
                        and (f["rows"] == 1 or f["dram_stride"] >= f["row_bytes"])
                        and _copy_fields(f["rows"], f["row_bytes"], 0, f["sram_stride"], 0,
                                         f["dram_stride"], f["rows_reg"]) is not None
                    )  # fmt: skip
                    if not good:
                        dropped.add(id(r))
                    producer_end[id(r)] = ki
    plan.values = [r for r in plan.values if id(r) not in dropped]
    index = _Index(plan.values)
    # Which loads read a resident value on chip; which values some DMA still reads from DRAM.
    copies: dict[int, dict] = {}  # id(load) -> the vun copy's fields
    read_from_dram: set[int] = set()
    for ki, (kernel, pos) in enumerate(zip(kernels, positions, strict=True)):
        for step in kernel.steps:
            ok = rules[ki].get(id(step), (False, False))[0]
            for ld in step.loads:
                fields = None
                if ld.op == "load":
                    lo, hi = _dma_range(ld, regions)
                    res, partial = index.holding(lo, hi, pos)
                    if ok and res is not None and not partial and producer_end.get(id(res), ki) < ki:
                        f = ld.fields
                        fields = _copy_fields(f["rows"], f["row_bytes"], res.sram + f["dram"] - res.dram,
                                              f["dram_stride"], f["sram"], f["sram_stride"],
                                              f["rows_reg"])  # fmt: skip
                    if fields is not None:
                        copies[id(ld)] = fields
                        res.forwarded = True
                        continue
                for mem, lo, hi, write in footprint(ld, None, regions):
                    if mem == "dram" and not write and hi > lo:
                        read_from_dram.update(id(r) for r in index.touching(lo, hi, pos))
    used = {id(r) for r in plan.values if r.forwarded}
    plan.values = [r for r in plan.values if id(r) in used]  # nothing reads the others on chip
    index = _Index(plan.values)
    keep_store = {id(r) for r in plan.values if r.output or id(r) in read_from_dram}
    for kernel, pos in zip(kernels, positions, strict=True):
        _rewrite(kernel, pos, index, copies, keep_store, plan, emitter, regions, in_place)


def _rewrite(kernel: Kernel, pos: int, index: _Index, copies: dict, keep_store: set, plan: ResidentPlan,
             emitter: Any, regions: Any, in_place: bool) -> None:  # fmt: skip
    """Apply the forwarded loads, store copies and left-out stores to one kernel (``copies``
    and the values of ``index`` were chosen under ``_step_rules``)."""
    own = kernel.instr_debug or {}
    new_debug: dict[int, dict] = {}
    copy_in: list = []  # the copies of forwarded loads
    copy_out: list = []  # the copies of stores left out
    steps = []
    for step in kernel.steps:
        loads, before, after, stores = [], [], [], []
        for ld in step.loads:
            if id(ld) not in copies:
                loads.append(ld)
                continue
            copy = emitter.emit("vun", **copies[id(ld)])
            before.append(copy)
            copy_in.append(copy)
            plan.forwarded_loads += 1
            if own.get(id(ld)) is not None:
                new_debug[id(copy)] = own[id(ld)]
        for st in step.stores:
            res, partial = index.holding(*_dma_range(st, regions), pos)
            if res is None or partial or pos != res.first:
                stores.append(st)
                continue
            f = st.fields
            fields = _copy_fields(f["rows"], f["row_bytes"], f["sram"], f["sram_stride"],
                                  res.sram + f["dram"] - res.dram, f["dram_stride"],
                                  f["rows_reg"])  # fmt: skip
            copy = emitter.emit("vun", **fields)
            after.append(copy)
            plan.copied_stores += 1
            if own.get(id(st)) is not None:
                new_debug[id(copy)] = own[id(st)]
            if id(res) in keep_store:
                stores.append(st)
            else:
                plan.left_out_stores += 1
                copy_out.append(copy)
        if not (before or after):
            steps.append(step)
            continue
        steps.append(
            Step(
                loads,
                [*before, *step.computes, *after],
                stores,
                slot_in=step.slot_in or (step.uses_slot and not loads),
                slot_out=step.slot_out or (step.uses_out_slot and not stores),
            )  # fmt: skip
        )
    live = [s for s in steps if s]
    if any(s.stores for s in live) and not live[-1].stores:
        # a kernel that stores must end with a store (its end): keep this kernel's stores
        steps = [
            Step(s.loads, s.computes, s.stores or orig.stores, slot_in=s.slot_in,
                 slot_out=s.slot_out and not orig.stores)
            for s, orig in zip(steps, kernel.steps, strict=True)
        ]  # fmt: skip
    if in_place:
        new_debug.update(fold_copies(steps, copy_in, copy_out, emitter, {**own, **new_debug}))
    kernel.steps = steps
    if new_debug:
        kernel.instr_debug = {**own, **new_debug}
