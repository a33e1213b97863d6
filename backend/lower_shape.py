"""Lowering of the data-movement ops: transpose, concat, slice, broadcast, gather (reshape aliases).

Every shape op is exact (no arithmetic).  The building block is ``dma_nd``: it moves an n-D
strided view between DRAM and a contiguous SRAM tile with as few 2-D ``load``/``store``
instructions as the strides allow (adjacent dims that are contiguous in both memories are merged;
the largest dim with non-negative strides becomes the DMA's row dim; every other dim is a loop).
Negative DRAM strides (negative-step slices) and zero strides (broadcasts) are therefore handled
by per-row or per-element DMAs: correct first, fast where the layout allows.

A copy kernel tiles the output's logical index space (outer loop dims, one chunked dim, full
inner dims) so that each tile fits an input slot; each step loads the tile and stores it straight
from the input slot (a *copy step*, see ``schedule``).  A transpose that moves the innermost dim
instead loads 2-D tiles of the (new innermost, old innermost) plane and flips them with the
``transpose`` instruction.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from mcpc.arch.isa import Instr
from mcpc.backend.lowering import LoweringContext, register_lowering
from mcpc.backend.schedule import Kernel, Step
from mcpc.errors import UnsupportedError
from mcpc.ir import ops

U20 = (1 << 20) - 1  # rows / cols / element strides of vector instructions, DMA rows
U24 = (1 << 24) - 1  # DMA row_bytes and sram_stride
U32 = (1 << 32) - 1  # DMA dram_stride
# Keep at least this many steps for big tensors so DMA-in, compute and DMA-out overlap.
MIN_STEPS = 4
OVERLAP_BYTES = 1 << 20


@dataclass(frozen=True)
class Dim:
    """One dim of a strided view: ``size`` indices, byte strides in DRAM (any sign) and SRAM (>= 0)."""

    size: int
    dram: int
    sram: int


def coalesce(dims: Sequence[Dim]) -> list[Dim]:
    """Drop size-1 dims and merge neighbours that are contiguous in both memories (same bytes moved)."""
    out: list[Dim] = []
    for d in dims:
        if d.size == 1:
            continue
        if out and out[-1].dram == d.dram * d.size and out[-1].sram == d.sram * d.size:
            prev = out.pop()
            d = Dim(prev.size * d.size, d.dram, d.sram)
        out.append(d)
    return out


def dma_nd(
    ctx: LoweringContext, mnemonic: str, dram: int, sram: int, dims: Sequence[Dim], esz: int
) -> list[Instr]:
    """``load``/``store`` instructions moving the view ``dims`` (elements of ``esz`` bytes) between
    DRAM at ``dram`` and SRAM at ``sram``.

    Assumes every address the view reaches is valid (DRAM addresses >= 0).  Guarantees the
    instructions together move exactly the view's elements, each field within its encoding width.
    """
    full = coalesce([*dims, Dim(esz, 1, 1)])  # bytes of one element are contiguous everywhere
    inner = full.pop() if full and full[-1].dram == 1 and full[-1].sram == 1 else Dim(1, 1, 1)
    ok = [i for i, d in enumerate(full) if 0 <= d.dram <= U32 and 0 <= d.sram <= U24]
    row = max(ok, key=lambda i: (full[i].size, i)) if ok else None
    loops = [d for i, d in enumerate(full) if i != row]
    rdim = full[row] if row is not None else Dim(1, 0, 0)
    out: list[Instr] = []
    for idx in itertools.product(*(range(d.size) for d in loops)):
        d0 = dram + sum(i * d.dram for i, d in zip(idx, loops, strict=True))
        s0 = sram + sum(i * d.sram for i, d in zip(idx, loops, strict=True))
        for r0 in range(0, rdim.size, U20):  # encoding limits: chunk rows and row bytes
            rows = min(U20, rdim.size - r0)
            for b0 in range(0, inner.size, U24):
                out.append(
                    ctx.emitter.emit(
                        mnemonic,
                        dram=d0 + r0 * rdim.dram + b0,
                        sram=s0 + r0 * rdim.sram + b0,
                        rows=rows,
                        row_bytes=min(U24, inner.size - b0),
                        dram_stride=rdim.dram if rows > 1 else 0,
                        sram_stride=rdim.sram if rows > 1 else 0,
                    )
                )
    return out


def contiguous_strides(shape: Sequence[int]) -> list[int]:
    """Row-major element strides of a dense tensor."""
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return strides[::-1]


def elem_bytes(t, op) -> int:
    """Storage bytes per element of tensor type ``t``; ops on sub-byte types are not lowered yet."""
    if t.dtype.bits % 8:
        raise UnsupportedError(
            f"backend: {op.describe()}: {t.dtype.name} tensors are stored packed two per byte; this "
            "op has no lowering for them yet (4-bit data can be stored, passed through and reshaped)"
        )
    return t.dtype.bits // 8


def fit_count(need, hi: int) -> int:
    """Largest ``n`` in [1, hi] with ``need(n)`` true (``need`` monotone); 0 if ``need(1)`` fails."""
    if hi < 1 or not need(1):
        return 0
    lo = 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if need(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def overlap_cap(count: int, total_bytes: int) -> int:
    """Upper bound on a tile's length along a dim of ``count`` so a big tensor takes several steps."""
    if total_bytes <= OVERLAP_BYTES:
        return count
    return max(1, math.ceil(count / MIN_STEPS))


def split_tiles(sizes: Sequence[int], max_elems: int) -> tuple[int, int]:
    """Where to cut ``sizes`` into (outer loop dims, one chunked dim ``t``, full inner dims):
    returns ``(t, chunk)`` with ``chunk * prod(sizes[t+1:]) <= max_elems`` (max_elems >= 1)."""
    inner = 1
    for t in range(len(sizes) - 1, -1, -1):
        if inner * sizes[t] > max_elems:
            return t, max(1, max_elems // inner)
        inner *= sizes[t]
    return 0, sizes[0] if sizes else 1


def iter_tiles(sizes: Sequence[int], t: int, chunk: int) -> Iterator[tuple[list[int], int]]:
    """Per tile: the start index of every dim (the chunked dim at its chunk start, inner dims 0)
    and the chunk length."""
    inner_zero = [0] * (len(sizes) - t - 1)
    for outer in itertools.product(*(range(n) for n in sizes[:t])):
        for c0 in range(0, sizes[t], chunk):
            yield [*outer, c0, *inner_zero], min(chunk, sizes[t] - c0)


@dataclass
class CopyPart:
    """Copy a view of logical ``shape`` from DRAM ``src`` (element strides ``src_strides``) to DRAM
    ``dst`` (element strides ``dst_strides``)."""

    shape: list[int]
    src: int
    src_strides: list[int]
    dst: int
    dst_strides: list[int]


def copy_kernel(ctx: LoweringContext, op, parts: Sequence[CopyPart], esz: int) -> list[Kernel]:
    """One kernel of copy steps (load a tile into an input slot, store it from there) for all parts."""
    jobs = []
    for p in parts:
        dims = coalesce_joint(p.shape, [p.src_strides, p.dst_strides])
        if dims is not None:
            jobs.append((p, *dims))
    if not jobs:
        return []
    total = sum(math.prod(s) for _, s, _ in jobs) * esz
    biggest = max(math.prod(s) for _, s, _ in jobs)
    cap = min(overlap_cap(biggest, total), U20 * U24)
    tile = ctx.rows_that_fit([esz], [], max_rows=cap)
    if tile == 0:
        raise ctx.does_not_fit(op, "a copy tile of one element", ctx.row_bytes_needed([esz], []))
    arena = ctx.arena()
    ring = arena.ring(ctx.in_slots, min(tile, biggest) * esz, "copy tile")
    steps, rank = [], 0
    for p, sizes, (ss, ds) in jobs:
        t, chunk = split_tiles(sizes, tile)
        for start, n in iter_tiles(sizes, t, chunk):
            tsizes = [n, *sizes[t + 1 :]]
            sstr = [s * esz for s in contiguous_strides(tsizes)]
            src = p.src + sum(i * s for i, s in zip(start, ss, strict=True)) * esz
            dst = p.dst + sum(i * s for i, s in zip(start, ds, strict=True)) * esz
            slot = ring.addr(rank)
            load = [Dim(m, s * esz, q) for m, s, q in zip(tsizes, ss[t:], sstr, strict=True)]
            store = [Dim(m, s * esz, q) for m, s, q in zip(tsizes, ds[t:], sstr, strict=True)]
            steps.append(
                Step(
                    loads=dma_nd(ctx, "load", src, slot, load, esz),
                    stores=dma_nd(ctx, "store", dst, slot, store, esz),
                )
            )
            rank += 1
    return [ctx.kernel(steps, arena)]


def coalesce_joint(shape: Sequence[int], strides: Sequence[Sequence[int]]):
    """Merge dims of a logical ``shape`` traversed with several stride vectors at once.

    Returns ``(sizes, [strides per vector])`` with at least one dim, or None for an empty view.
    Dims merge when contiguous for every vector; size-1 dims disappear.
    """
    if any(n == 0 for n in shape):
        return None
    sizes: list[int] = []
    out: list[list[int]] = [[] for _ in strides]
    for d, n in enumerate(shape):
        if n == 1:
            continue
        if sizes and all(o[-1] == s[d] * n for o, s in zip(out, strides, strict=True)):
            sizes[-1] *= n
            for o, s in zip(out, strides, strict=True):
                o[-1] = s[d]
            continue
        sizes.append(n)
        for o, s in zip(out, strides, strict=True):
            o.append(s[d])
    if not sizes:
        return [1], [[0] for _ in strides]
    return sizes, out


# -- ops -----------------------------------------------------------------------------------------
@register_lowering(ops.ConcatOp)
def lower_concat(op, ctx: LoweringContext) -> list[Kernel]:
    """Each operand is copied into its slab of the output (one kernel, copy steps)."""
    out, ot = ctx.dram(op.result)
    esz = elem_bytes(ot, op)
    axis = op.attrs["axis"] % ot.rank
    ostr = contiguous_strides(ot.shape)
    parts, offset = [], 0
    for v in op.operands:
        addr, t = ctx.dram(v)
        parts.append(
            CopyPart(list(t.shape), addr, contiguous_strides(t.shape), out + offset * ostr[axis] * esz, ostr)
        )
        offset += t.shape[axis]
    return copy_kernel(ctx, op, parts, esz)


@register_lowering(ops.SliceOp)
def lower_slice(op, ctx: LoweringContext) -> list[Kernel]:
    """A strided view of the operand (negative steps give negative DRAM strides) copied out."""
    src, xt = ctx.dram(op.operands[0])
    out, ot = ctx.dram(op.result)
    esz = elem_bytes(ot, op)
    xs = contiguous_strides(xt.shape)
    starts, steps = op.attrs["starts"], op.attrs["steps"]
    base = src + sum(int(s) * x for s, x in zip(starts, xs, strict=True)) * esz
    strides = [x * int(st) for x, st in zip(xs, steps, strict=True)]
    part = CopyPart(list(ot.shape), base, strides, out, contiguous_strides(ot.shape))
    return copy_kernel(ctx, op, [part], esz)


@register_lowering(ops.BroadcastOp)
def lower_broadcast(op, ctx: LoweringContext) -> list[Kernel]:
    """The operand read with stride 0 along broadcast dims (DMA repeats the rows/elements)."""
    src, xt = ctx.dram(op.operands[0])
    out, ot = ctx.dram(op.result)
    esz = elem_bytes(ot, op)
    pad = ot.rank - xt.rank
    xs = contiguous_strides(xt.shape)
    strides = [0] * pad + [0 if n == 1 else s for n, s in zip(xt.shape, xs, strict=True)]
    part = CopyPart(list(ot.shape), src, strides, out, contiguous_strides(ot.shape))
    return copy_kernel(ctx, op, [part], esz)


@register_lowering(ops.TransposeOp)
def lower_transpose(op, ctx: LoweringContext) -> list[Kernel]:
    """DMA-only when the innermost dim stays innermost, else 2-D tiles through ``transpose``."""
    src, xt = ctx.dram(op.operands[0])
    out, ot = ctx.dram(op.result)
    esz = elem_bytes(ot, op)
    xs = contiguous_strides(xt.shape)
    sstr = [xs[p] for p in op.attrs["perm"]]
    dstr = contiguous_strides(ot.shape)
    joint = coalesce_joint(ot.shape, [sstr, dstr])
    if joint is None:
        return []
    sizes, (ss, ds) = joint
    if ss[-1] == 1 or len(sizes) == 1:
        return copy_kernel(ctx, op, [CopyPart(sizes, src, ss, out, ds)], esz)
    return _transpose_tiles(op, ctx, sizes, ss, ds, src, out, esz)


def _transpose_tiles(op, ctx, sizes, ss, ds, src, out, esz) -> list[Kernel]:
    # p: the output's innermost dim (strided in the source); q: the source's contiguous dim.
    p, q = len(sizes) - 1, ss.index(1)
    big_p, big_q = min(sizes[p], U20), min(sizes[q], U20)
    tq = big_q
    tp = ctx.rows_that_fit([tq * esz], [tq * esz], max_rows=big_p)
    if tp < min(big_p, 64):  # whole source rows leave too thin a tile: use square tiles instead
        side = max(1, math.isqrt(ctx.sram_budget // (esz * (ctx.in_slots + ctx.out_slots))) - ctx.align)
        tq = min(big_q, side)
        tp = ctx.rows_that_fit([tq * esz], [tq * esz], max_rows=big_p)
    if tp == 0:
        need = ctx.row_bytes_needed([tq * esz], [tq * esz])
        raise ctx.does_not_fit(op, f"a transpose tile of one row of {tq} elements", need)
    tp = min(tp, overlap_cap(sizes[p], math.prod(sizes) * esz))
    arena = ctx.arena()
    ring_in = arena.ring(ctx.in_slots, tp * tq * esz, "transpose in")
    ring_out = arena.ring(ctx.out_slots, tp * tq * esz, "transpose out")
    others = [d for d in range(len(sizes)) if d not in (p, q)]
    steps = []
    for idx in itertools.product(*(range(sizes[d]) for d in others)):
        s0 = src + sum(i * ss[d] for i, d in zip(idx, others, strict=True)) * esz
        d0 = out + sum(i * ds[d] for i, d in zip(idx, others, strict=True)) * esz
        for p0 in range(0, sizes[p], tp):
            for q0 in range(0, sizes[q], tq):
                np_, nq = min(tp, sizes[p] - p0), min(tq, sizes[q] - q0)
                a_in, a_out = ring_in.addr(len(steps)), ring_out.addr(len(steps))
                src_dims = [Dim(np_, ss[p] * esz, nq * esz), Dim(nq, esz, esz)]
                dst_dims = [Dim(nq, ds[q] * esz, np_ * esz), Dim(np_, esz, esz)]
                flip = ctx.emitter.emit(
                    "transpose",
                    dst=a_out,
                    src=a_in,
                    rows=np_,
                    cols=nq,
                    elem_bytes=esz,
                    src_stride=nq,
                    dst_stride=np_,
                )
                steps.append(
                    Step(
                        loads=dma_nd(ctx, "load", s0 + (p0 * ss[p] + q0) * esz, a_in, src_dims, esz),
                        computes=[flip],
                        stores=dma_nd(ctx, "store", d0 + (q0 * ds[q] + p0) * esz, a_out, dst_dims, esz),
                    )
                )
    return [ctx.kernel(steps, arena)]


@register_lowering(ops.GatherOp)
def lower_gather(op, ctx: LoweringContext) -> list[Kernel]:
    """Indices are normalised once into a persistent i32 buffer, then ``gather`` DMAs move rows.

    Phase 1 (per chunk of indices): load, convert to i32 (``vun copy``), add the axis length where
    negative (``vbini lt``/``vbini add``/``vsel``).  ``in_slots - 1`` empty loads then order the
    gathers (LD) after the last normalisation (EX) through the input-slot tokens.  Phase 2: for
    every index of the dims before ``axis`` and every chunk of indices (and of the row bytes when
    a row is huge), a ``gather`` into an input slot and a store of it (copy steps).  An index
    outside [-n, n) traps in the ``gather`` (``limit``), as the interpreter raises.  An i64 index
    outside the i32 range wraps when converted (documented limitation).
    """
    data, idx = op.operands
    dp, dt = ctx.dram(data)
    ip, it = ctx.dram(idx)
    out, ot = ctx.dram(op.result)
    axis = op.attrs["axis"] % dt.rank
    pre, n, post = math.prod(dt.shape[:axis]), dt.shape[axis], math.prod(dt.shape[axis + 1 :])
    if dt.dtype.packed and post % 2 == 0:  # 4-bit rows of whole bytes: gathered as bytes
        esz = 1
        post //= 2
    else:
        esz = elem_bytes(dt, op)
    count = it.numel
    if ot.numel == 0:
        return []
    if n > 1 << 24:
        raise UnsupportedError(
            f"backend: {op.describe()}: gather axis of {n} rows exceeds the f32-exact index range"
        )
    isz = it.dtype.bits // 8
    arena = ctx.arena()
    norm = arena.alloc(count * 4, "normalised indices")
    chunk = min(count, U20, 1 << 16)
    raw = arena.ring(ctx.in_slots, chunk * isz, "raw indices")
    cond = arena.alloc(chunk, "negative index mask")
    tmp = arena.alloc(chunk * 4, "wrapped indices")
    steps = []
    for c0 in range(0, count, chunk):
        m, slot, dst = min(chunk, count - c0), raw.addr(len(steps)), norm + c0 * 4
        emit = ctx.emitter.emit
        v = dict(rows=1, cols=m)
        computes = [
            emit("vun", func="copy", in_dtype=it.dtype.name, out_dtype="i32", dst=dst, src=slot, **v),
            emit("vbini", func="lt", in_dtype="i32", out_dtype="i1", dst=cond, src0=dst, imm=0.0, **v),
            emit("vbini", func="add", in_dtype="i32", out_dtype="i32", dst=tmp, src0=dst, imm=float(n), **v),
            emit("vsel", cond=cond, src=tmp, dst=dst, dtype="i32", **v),
        ]
        loads = [emit("load", dram=ip + c0 * isz, sram=slot, rows=1, row_bytes=m * isz)]
        steps.append(Step(loads=loads, computes=computes))
    for _ in range(ctx.in_slots - 1):  # an empty load per extra slot: the EX -> LD barrier
        steps.append(Step(loads=[ctx.emitter.emit("load", sram=raw.base)]))
    row = post * esz
    slot_bytes = (ctx.sram_budget - arena.peak) // ctx.in_slots // ctx.align * ctx.align
    if slot_bytes <= 0:
        need = arena.peak + ctx.in_slots * ctx.align
        raise ctx.does_not_fit(op, "the gather's indices and one slot of gathered bytes", need)
    tc = min(row, slot_bytes, U24)  # bytes of each row per gather (a DMA may split rows anywhere)
    ti = max(1, min(count, U20, slot_bytes // tc, overlap_cap(count, count * row)))
    ring = arena.ring(ctx.in_slots, ti * tc, "gathered rows")
    rank = len(steps)
    for p in range(pre):
        table = dp + p * n * row
        for i0 in range(0, count, ti):
            k = min(ti, count - i0)
            for b0 in range(0, row, tc):
                nb, slot = min(tc, row - b0), ring.addr(rank)
                g = ctx.emitter.emit(
                    "gather", dram=table + b0, sram_idx=norm + i0 * 4, count=k, row_bytes=nb,
                    dram_stride=row, sram=slot, sram_stride=nb, limit=n,
                )  # fmt: skip
                dst = out + ((p * count + i0) * post) * esz + b0
                st = ctx.emitter.emit(
                    "store", dram=dst, sram=slot, rows=k, row_bytes=nb, dram_stride=row, sram_stride=nb
                )
                steps.append(Step(loads=[g], stores=[st]))
                rank += 1
    return [ctx.kernel(steps, arena)]
