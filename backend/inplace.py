"""Operands read and results written in place in the resident area, instead of through a slot.

``residency.forward`` turns a load of a value kept in SRAM into a ``vun copy`` from its resident
buffer into the step's input slot (*copy-in*), and a store of such a value into a ``vun copy`` from
the output slot into its buffer (*copy-out*).  Each copy is one more link of the kernel chain's
dependency path: a decode step's vector chain paid copy-in, compute, copy-out (three vector
latencies) per op.  ``fold_copies`` removes them where the compute can address the buffer itself:

* **copy-in**: every compute of the step that reads the slot bytes the copy wrote reads the same
  bytes in the resident buffer instead (its address and row stride are rewritten); the copy goes.
* **copy-out** (its store left out): every compute of the output group (the steps since the
  previous step with an output slot) that writes or reads the slot bytes the copy read writes or
  reads them in the resident buffer instead; the copy goes.

A copy maps the rows of its slot side to the rows of its buffer side, so an operand is
rewritten only when each of its rows lies inside one row of the copy (or both sides are
contiguous) and its row stride is a multiple of the copy's, and only when the rewritten
instruction encodes.  A copy is kept when anything else touches its slot bytes in a way the
rewrite cannot follow: a compute of an unknown operand layout, a compute writing bytes a
copy-in filled, a DMA reading or writing them in the step, a ``setq`` pointer into them, a
compute reading them before the group wrote them (copy-out), a later step reading them before
writing them, or a step that would be left empty (its slot rank must stay).

What it assumes: the slot contract of ``schedule`` (a step's input slot is read by its own
computes; an output slot by its group), and that a resident buffer is written only by its
value's producer at its first position and not reused before the value's last use
(``plan_residents``), so a consumer reading the buffer when it computes reads what the copy-in
would have copied.  What it guarantees: the same values are computed (every rewritten access
reads or writes the bytes the copy would have carried), with fewer EX instructions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from mcpc.backend.hazards import footprint
from mcpc.errors import PassError

# SRAM operand fields of each compute, in the order of its spec's SRAM accesses (``InstrSpec.access``).
_ELEMENTWISE = {
    "vun": (("src", "src_stride"), ("dst", "dst_stride")),
    "vbin": (("src0", "s0_stride"), ("src1", "s1_stride"), ("dst", "dst_stride")),
    "vbini": (("src0", "s0_stride"), ("dst", "dst_stride")),
    "vred": (("src", "src_stride"), ("dst", None)),
    "vdequant": (("src", "src_stride"), ("dst", "dst_stride")),
    "transpose": (("src", "src_stride"), ("dst", "dst_stride")),
    "vtopk": (("src", "src_stride"), ("dst", "dst_stride"), ("idx", "idx_stride")),
    "vsel": (("cond", "cond_stride"), ("src", "src_stride"), ("dst", "dst_stride"), ("dst", "dst_stride")),
}
_MATMULS = ("matmul", "matmul_w4a16", "vmmul.q4f8", "matmul_i8")
# (field, stride field, lo, hi, rows, width bytes, stride bytes, is_write)
Operand = tuple[str, str | None, int, int, int, int, int, bool]


def _fields(instr: Any) -> dict[str, Any]:
    """Every field of ``instr``, the ones it was built without at their defaults."""
    return {**instr.spec.defaults(), **instr.fields}


def operands(instr: Any) -> list[Operand] | None:
    """The SRAM operands of an EX instruction with the fields that place them, or None when this
    module does not know which fields address its SRAM (such an instruction is never rewritten)."""
    f = _fields(instr)
    if instr.op in _MATMULS:
        names = [("a", "a_stride"), ("b", "b_stride")] + [("c", "c_stride")] * (2 if f["acc"] else 1)
    else:
        names = _ELEMENTWISE.get(instr.op)
        if names is None:
            return None
    sram = [a for a in instr.spec.access(f) if a[0] == "sram"]
    if len(sram) != len(names):
        return None
    out = []
    for (field, stride), (_, base, rows, width, step, size, write, _reg) in zip(names, sram, strict=True):
        width, step = width * size, step * size
        if base != f[field] or width != int(width) or step != int(step):
            return None  # packed 4-bit rows, or an access this table does not describe
        hi = base + (max(rows, 1) - 1) * int(step) + int(width) if rows > 0 and width > 0 else base
        out.append((field, stride, base, hi, rows, int(width), int(step), write))
    return out


class CopyMap:
    """The byte map of one ``vun copy``: ``rows`` rows of ``row_bytes`` at ``slot + i·slot_stride``
    (the slot side) are the rows at ``home + i·home_stride`` (the resident side)."""

    def __init__(self, slot: int, slot_stride: int, home: int, home_stride: int, rows: int, row_bytes: int):
        self.slot, self.slot_stride, self.home, self.home_stride = slot, slot_stride, home, home_stride
        self.rows, self.row_bytes = rows, row_bytes
        self.contiguous = rows == 1 or (slot_stride == row_bytes and home_stride == row_bytes)
        self.lo = slot
        self.hi = slot + (rows - 1) * slot_stride + row_bytes

    @classmethod
    def of_copy(cls, instr: Any, slot_is_dst: bool) -> CopyMap:
        f = _fields(instr)
        e = 4 if f["in_dtype"] == "i32" else 1
        src, dst = (f["src"], f["src_stride"] * e), (f["dst"], f["dst_stride"] * e)
        slot, home = (dst, src) if slot_is_dst else (src, dst)
        return cls(slot[0], slot[1], home[0], home[1], f["rows"], f["cols"] * e)

    def home_span(self) -> tuple[int, int]:
        return self.home, self.home + (self.rows - 1) * self.home_stride + self.row_bytes

    def touches(self, lo: int, hi: int) -> bool:
        return lo < self.hi and self.lo < hi

    def map(self, base: int, rows: int, width: int, step: int) -> tuple[int, int] | None:
        """The resident address and row stride (bytes) of an operand reading or writing slot
        bytes, or None when some of its bytes are not bytes of the copy."""
        off = base - self.slot
        if off < 0:
            return None
        extent = (max(rows, 1) - 1) * step + width
        if self.contiguous:  # one run of bytes on both sides: a constant shift
            return (self.home + off, step) if off + extent <= self.rows * self.row_bytes else None
        i, c = divmod(off, self.slot_stride)
        if c + width > self.row_bytes:
            return None
        if rows <= 1 or step == 0:
            return (self.home + i * self.home_stride + c, step) if i < self.rows else None
        d, r = divmod(step, self.slot_stride)
        if r or i + (rows - 1) * d >= self.rows:
            return None
        return self.home + i * self.home_stride + c, d * self.home_stride


def _rewritten(instr: Any, cmap: CopyMap, allow_write: bool, emit: Callable) -> tuple[Any, bool, bool] | None:
    """``instr`` with its operands on the copy's slot bytes moved to the resident side, whether it
    reads them and whether it writes them; None when it cannot be rewritten (or, with
    ``allow_write`` false, writes them).  An instruction not touching them comes back unchanged."""
    ops = operands(instr)
    if ops is None:  # unknown layout: fine as long as it does not touch the bytes (setq: see the doc)
        return None if _touches_any(instr, cmap) else (instr, False, False)
    fields = _fields(instr)
    changes: dict[str, int] = {}
    reads = writes = False
    for field, stride, lo, hi, rows, width, step, write in ops:
        if not cmap.touches(lo, hi):
            continue
        if write and not allow_write:
            return None
        got = cmap.map(lo, rows, width, step)
        if got is None:
            return None
        addr, new_step = got
        new = {field: addr}
        if stride is not None and fields[stride]:
            elem = step / fields[stride]
            if new_step % elem:
                return None
            new[stride] = int(new_step // elem)
        for k, v in new.items():
            if changes.get(k, v) != v:
                return None  # one field placing two operands the map moves differently
        changes.update(new)
        reads, writes = reads or not write, writes or write
    if not changes:
        return instr, False, False
    try:
        return emit(instr.op, **{**fields, **changes}), reads, writes
    except PassError:
        return None


def _dma_touch(instr: Any, cmap: CopyMap) -> bool:
    return _touches_any(instr, cmap)


def _setq_points_into(steps: list, cmap: CopyMap) -> bool:
    setqs = [_fields(x) for s in steps for x in s.computes if x.op == "setq"]
    ptrs = [f[p] for f in setqs for p in ("scale_ptr", "zp_ptr")]
    return any(p and cmap.lo <= p < cmap.hi for p in ptrs)


def _later_reads_first(steps: list, t: int, cmap: CopyMap) -> bool:
    """Whether some step after ``t`` reads the slot bytes before anything writes them (it would
    read what the copy left there)."""
    for s in steps[t + 1 :]:
        if any(_dma_touch(x, cmap) for x in s.loads):
            return False
        for x in s.computes:
            ops = operands(x)
            touching = [o for o in ops or () if cmap.touches(o[2], o[3])]
            if ops is None and _touches_any(x, cmap):
                return True
            if any(not o[7] for o in touching):
                return True
            if touching:
                return False
        if any(_dma_touch(x, cmap) for x in s.stores):
            return True
    return False


def _writes_home(instr: Any, cmap: CopyMap) -> bool:
    lo0, hi0 = cmap.home_span()
    return any(m == "sram" and w and lo < hi0 and lo0 < hi for m, lo, hi, w in footprint(instr))


def _touches_any(instr: Any, cmap: CopyMap, home: bool = False) -> bool:
    lo0, hi0 = cmap.home_span() if home else (cmap.lo, cmap.hi)
    return any(m == "sram" and lo < hi0 and lo0 < hi for m, lo, hi, _ in footprint(instr))


def fold_copies(steps: list, copy_in: list, copy_out: list, emitter: Any, debug: Mapping) -> dict:
    """Fold the copies of ``steps`` (a kernel's steps after ``residency.forward``'s rewrite; their
    compute lists are edited in place) that are in ``copy_in`` (resident buffer -> input slot)
    and ``copy_out`` (output slot -> resident buffer, store left out); see the module doc.
    ``debug`` maps ``id`` of an instruction to its DBUG record; returns the records of the
    rewritten instructions, keyed by their new ids."""
    new_debug: dict[int, dict] = {}
    emit = emitter.emit
    held: list = []  # every replaced instruction stays alive meanwhile, so that no id is reused

    def record(old: Any, new: Any) -> None:
        if new is old:
            return
        held.append(old)
        rec = new_debug.get(id(old), debug.get(id(old)))
        if rec is not None:
            new_debug[id(new)] = rec

    ins, outs = {id(x): x for x in copy_in}, {id(x): x for x in copy_out}  # (held: ids stay unique)
    for t, step in enumerate(steps):  # copy-in first: a copy-out may then read the buffer itself
        for copy in [x for x in step.computes if ins.get(id(x)) is x]:
            _fold_in(steps, t, copy, emit, record)
    for t, step in enumerate(steps):
        for copy in [x for x in step.computes if outs.get(id(x)) is x]:
            _fold_out(steps, t, copy, emit, record)
    live = {id(x) for s in steps for x in (*s.loads, *s.computes, *s.stores)}
    return {k: v for k, v in new_debug.items() if k in live}


def _fold_in(steps: list, t: int, copy: Any, emit: Callable, record: Callable) -> None:
    step = steps[t]
    cmap = CopyMap.of_copy(copy, slot_is_dst=True)
    p = next(i for i, x in enumerate(step.computes) if x is copy)
    if _setq_points_into(steps, cmap) or any(_dma_touch(x, cmap) for x in step.stores):
        return
    new = list(step.computes)
    for i in range(p + 1, len(new)):
        if _writes_home(new[i], cmap):
            return  # the buffer changes before the step's computes would read it
        got = _rewritten(new[i], cmap, False, emit)
        if got is None:
            return
        new[i] = got[0]
    if _later_reads_first(steps, t, cmap) or not (step.loads or step.stores or len(new) > 1):
        return
    for old, x in zip(step.computes, new, strict=True):
        record(old, x)
    step.computes = new[:p] + new[p + 1 :]


def _fold_out(steps: list, t: int, copy: Any, emit: Callable, record: Callable) -> None:
    step = steps[t]
    cmap = CopyMap.of_copy(copy, slot_is_dst=False)
    p = next(i for i, x in enumerate(step.computes) if x is copy)
    if _setq_points_into(steps, cmap) or any(_dma_touch(x, cmap) for x in step.stores):
        return
    g0 = next((i + 1 for i in range(t - 1, -1, -1) if steps[i].uses_out_slot), 0)
    for x in step.computes[p + 1 :]:
        ops = operands(x)
        if ops is None and _touches_any(x, cmap) or any(cmap.touches(o[2], o[3]) for o in ops or ()):
            return
    edits: dict[tuple[int, int], Any] = {}
    written = False
    for s in range(g0, t + 1):
        if any(_dma_touch(x, cmap) for x in steps[s].loads):
            return
        computes = steps[s].computes[:p] if s == t else steps[s].computes
        for i, x in enumerate(computes):
            if _touches_any(x, cmap, home=True):
                return  # the buffer is in use before the copy would have written it
            got = _rewritten(x, cmap, True, emit)
            if got is None or (got[1] and not written):
                return  # not movable, or it reads the slot before the group wrote it
            written = written or got[2]
            if got[0] is not x:
                edits[(s, i)] = got[0]
        if s < t and any(_dma_touch(x, cmap) for x in steps[s].stores):
            return
    if not written or _later_reads_first(steps, t, cmap):
        return
    if not (step.loads or step.stores or len(step.computes) > 1):
        return
    for (s, i), x in edits.items():
        record(steps[s].computes[i], x)
        steps[s].computes[i] = x
    step.computes = [x for x in step.computes if x is not copy]
