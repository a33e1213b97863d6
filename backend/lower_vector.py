"""Lowering of elementwise ops (binary, comparison, unary, cast, select) onto the vector unit.

Broadcasting: every operand is addressed over the output's index space with element strides (0
along broadcast dims).  Dims that are contiguous for the output and every operand at once are
merged (``coalesce_joint``); the last merged dim is the tile's *columns* — each operand is either
full along it (stride 1) or broadcast (stride 0: one element per row, the instruction's ``bcast``
bit) — the one before it the *rows* (an operand's row stride, 0 repeating row 0), and any dims
left over are an outer loop.  So ``x[B, S, H] + bias[H]`` is one row-tiled kernel, and a general
broadcast like ``a[4, 1, 8] * b[1, 5, 1]`` is a loop of 2-D tiles.

Each tile is one step: load every operand's part into its input slot, one instruction (two for
select) into the output slot, store.  Tiles are whole rows when a row fits (rows as many as the
SRAM budget allows with ``in_slots``/``out_slots`` buffers), else chunks of one row.

A scalar ``mcp.constant`` operand of a binary op becomes the ``imm`` of ``vbini`` when its value is
exact in f32 (the simulator converts the immediate to the operand dtype exactly as the interpreter
reads the constant), saving its load.  Arithmetic is ``numerics.binary/unary/cast/select`` on each
tile, elementwise, so the results are bit-exact with the interpreter.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from mcpc.backend.lower_shape import (
    MIN_STEPS,
    OVERLAP_BYTES,
    U20,
    U24,
    Dim,
    coalesce_joint,
    contiguous_strides,
    dma_nd,
    elem_bytes,
    fit_count,
)
from mcpc.backend.lowering import LoweringContext, register_lowering
from mcpc.backend.memory import align_up
from mcpc.backend.schedule import Kernel, Step
from mcpc.ir import ops


@dataclass(frozen=True)
class VecArg:
    """A vector-instruction operand in SRAM: address, row stride (elements), column broadcast bit."""

    addr: int
    stride: int
    bcast: int = 0


def broadcast_strides(shape: tuple[int, ...], out_shape: tuple[int, ...]) -> list[int]:
    """Element strides of a dense tensor of ``shape`` read over ``out_shape`` (numpy broadcasting)."""
    pad = len(out_shape) - len(shape)
    own = contiguous_strides(shape)
    return [0] * pad + [0 if n == 1 else s for n, s in zip(shape, own, strict=True)]


def scalar_immediate(ctx: LoweringContext, value) -> float | None:
    """The f32 immediate standing for ``value`` when it is a one-element constant exact in f32."""
    arr = ctx.constant(value)
    if arr is None or arr.size != 1 or value.type.dtype.bits % 8:
        return None
    x = arr.reshape(-1)[0]
    if value.type.dtype.is_float:
        f = float(np.asarray(x, dtype=np.float32))
        return None if math.isnan(f) else f  # a NaN constant keeps its load (no NaN payload games)
    as_int = int(x)
    f = float(np.float32(as_int))
    return f if f == as_int else None


def elementwise_kernel(op, ctx: LoweringContext, operands, build, imms=None) -> list[Kernel]:
    """The tiled kernel of an elementwise op.

    ``operands`` are the op's IR values in the order ``build`` expects; ``imms`` (same length,
    optional) holds an f32 immediate in place of an operand that is not loaded.  ``build(args, dst,
    rows, cols)`` returns the compute instructions of one tile, ``args[i]`` a ``VecArg`` (or the
    immediate), ``dst`` the output tile (contiguous, ``cols`` elements per row).
    Assumes dense row-major DRAM tensors broadcastable to the result.  Guarantees every tile fits
    ``ctx.sram_budget`` with the context's slot counts (PassError naming the op otherwise).
    """
    out, ot = ctx.dram(op.result)
    if ot.numel == 0:
        return []
    imms = list(imms or [None] * len(operands))
    osz = elem_bytes(ot, op)
    loaded = [i for i, v in enumerate(operands) if imms[i] is None]
    esz = {i: elem_bytes(operands[i].type, op) for i in loaded}
    addr = {i: ctx.dram(operands[i])[0] for i in loaded}
    vecs = [broadcast_strides(operands[i].type.shape, ot.shape) for i in loaded]
    sizes, strides = coalesce_joint(ot.shape, [*vecs, contiguous_strides(ot.shape)])
    if len(sizes) == 1:
        sizes, strides = [1, *sizes], [[0, *s] for s in strides]
    st = dict(zip(loaded, strides[:-1], strict=True))
    ost = strides[-1]
    rows, cols = sizes[-2], sizes[-1]
    per = ctx.extent.per_token(op.result) if ctx.extent is not None else 0
    if per and len(sizes) == 2 and rows == 1 and cols % per == 0 and cols > per:
        # one contiguous run: rows of one token each, so a prefill's rows in use can be counted
        rows, cols, sizes = cols // per, per, [cols // per, per]
        st = {i: [s[-1] * per, s[-1]] for i, s in st.items()}
        ost = [per, 1]

    def tile_bytes(i: int, r: int, c: int) -> int:
        sr, sc = st[i][-2], st[i][-1]
        return (r if sr else 1) * (c if sc else 1) * esz[i]

    def need(r: int, c: int) -> int:
        ins = sum(align_up(max(tile_bytes(i, r, c), 1), ctx.align) for i in loaded)
        return ctx.in_slots * ins + ctx.out_slots * align_up(r * c * osz, ctx.align)

    def fits(r: int, c: int) -> bool:
        return need(r, c) <= ctx.sram_budget

    widest = max([osz, *esz.values()])
    tc = min(cols, U20, U24 // widest)
    tr = fit_count(lambda r: fits(r, tc), min(rows, U20))
    if tr == 0:
        tr, tc = 1, fit_count(lambda c: fits(1, c), tc)
        if tc == 0:
            raise ctx.does_not_fit(op, "one element per operand", need(1, 1))
    n_outer = math.prod(sizes[:-2])
    tiles = n_outer * math.ceil(rows / tr) * math.ceil(cols / tc)
    if ot.numel * osz > OVERLAP_BYTES and tiles < MIN_STEPS:  # several steps so DMA overlaps compute
        if rows >= MIN_STEPS:
            tr = min(tr, math.ceil(rows / MIN_STEPS))
        else:
            tc = min(tc, math.ceil(cols / MIN_STEPS))
    arena = ctx.arena()
    rings = {i: arena.ring(ctx.in_slots, tile_bytes(i, tr, tc), f"operand {i}") for i in loaded}
    oring = arena.ring(ctx.out_slots, tr * tc * osz, "result tile")
    steps: list[Step] = []
    for outer in itertools.product(*(range(n) for n in sizes[:-2])):
        for r0 in range(0, rows, tr):
            # a prefill's token rows in use (backend/row_extent.py): the tile's run-time row count
            reg = ctx.rows_reg(op.result, r0, cols) if len(sizes) == 2 and ost[-2] == cols else 0
            for c0 in range(0, cols, tc):
                nr, nc, rank = min(tr, rows - r0), min(tc, cols - c0), len(steps)
                loads, args = [], list(imms)
                for i in loaded:
                    s = st[i]
                    sr, sc, e = s[-2], s[-1], esz[i]
                    base = (
                        addr[i] + (sum(a * b for a, b in zip(outer, s, strict=False)) + r0 * sr + c0 * sc) * e
                    )
                    ncol = nc if sc else 1
                    slot = rings[i].addr(rank)
                    dims = [Dim(nr if sr else 1, sr * e, ncol * e), Dim(ncol, sc * e, e)]
                    counted = rows_dma(ctx, "load", base, slot, nr, ncol * e, sr * e, reg) if sr else None
                    loads += counted or dma_nd(ctx, "load", base, slot, dims, e)
                    args[i] = VecArg(slot, ncol if sr else 0, 0 if sc else 1)
                dst = VecArg(oring.addr(rank), nc)
                obase = out + (sum(a * b for a, b in zip(outer, ost, strict=False)) + r0 * ost[-2] + c0) * osz
                store = rows_dma(ctx, "store", obase, dst.addr, nr, nc * osz, ost[-2] * osz, reg) or dma_nd(
                    ctx, "store", obase, dst.addr, [Dim(nr, ost[-2] * osz, nc * osz), Dim(nc, osz, osz)], osz
                )
                computes = with_rows_reg(build(args, dst, nr, nc), nr, reg)
                steps.append(Step(loads=loads, computes=computes, stores=store))
    return [ctx.kernel(steps, arena)]


def rows_dma(ctx: LoweringContext, mnemonic: str, dram: int, sram: int, rows: int, row_bytes: int,
             dram_stride: int, reg: int) -> list | None:  # fmt: skip
    """One ``load``/``store`` of ``rows`` rows of ``row_bytes`` (dense in SRAM) counted by
    register ``reg`` (a prefill's token rows in use), or None when ``reg`` is 0 or the fields do
    not fit: the caller then moves the capacity (``dma_nd``)."""
    if not reg or rows > U20 or row_bytes > U24 or not 0 < dram_stride <= (1 << 32) - 1:
        return None
    return [ctx.emitter.emit(mnemonic, dram=dram, sram=sram, rows=rows, row_bytes=row_bytes,
                             dram_stride=dram_stride, sram_stride=row_bytes, rows_reg=reg)]  # fmt: skip


def with_rows_reg(instrs: list, rows: int, reg: int) -> list:
    """``instrs`` (a tile's vector computes) with those over ``rows`` rows counted by ``reg``."""
    if not reg:
        return instrs
    return [i.replace(rows_reg=reg) if i.fields.get("rows") == rows and "rows_reg" in i.fields else i
            for i in instrs]  # fmt: skip


# -- ops -----------------------------------------------------------------------------------------
_BINARY = (
    ops.AddOp, ops.SubOp, ops.MulOp, ops.DivOp, ops.PowOp, ops.MaxOp, ops.MinOp, ops.ModOp, ops.FmodOp,
)  # fmt: skip
_COMPARE = (ops.EqualOp, ops.LessOp, ops.GreaterOp)
_UNARY = (
    ops.NegOp, ops.AbsOp, ops.ExpOp, ops.TanhOp, ops.ErfOp, ops.SqrtOp, ops.RsqrtOp,
    ops.ReciprocalOp, ops.ReluOp, ops.SigmoidOp, ops.GeluOp, ops.SinOp, ops.CosOp, ops.LogOp, ops.FloorOp,
    ops.RoundOp, ops.SiluOp,
)  # fmt: skip


@register_lowering(*_BINARY, *_COMPARE)
def lower_binary(op, ctx: LoweringContext) -> list[Kernel]:
    """``vbin`` per tile; ``vbini`` (``rev`` when the constant is the left operand) for a scalar
    constant operand exact in f32."""
    a, b = op.operands
    in_dtype, out_dtype = a.type.dtype.name, op.result.type.dtype.name
    imms = [None, scalar_immediate(ctx, b)]
    if imms[1] is None:
        imms[0] = scalar_immediate(ctx, a)
    emit = ctx.emitter.emit

    def build(args, dst: VecArg, rows: int, cols: int):
        common = dict(
            func=op.func, in_dtype=in_dtype, out_dtype=out_dtype, dst=dst.addr, rows=rows, cols=cols
        )
        common["dst_stride"] = dst.stride
        x, y = args
        if isinstance(y, float) or isinstance(x, float):
            src, imm, rev = (x, y, 0) if isinstance(y, float) else (y, x, 1)
            return [
                emit(
                    "vbini",
                    src0=src.addr,
                    s0_stride=src.stride,
                    s0_bcast=src.bcast,
                    imm=imm,
                    rev=rev,
                    **common,
                )
            ]
        return [
            emit(
                "vbin", src0=x.addr, s0_stride=x.stride, s0_bcast=x.bcast,
                src1=y.addr, s1_stride=y.stride, s1_bcast=y.bcast, **common,
            )
        ]  # fmt: skip

    return elementwise_kernel(op, ctx, [a, b], build, imms)


def _unary_kernel(op, ctx: LoweringContext, func: str) -> list[Kernel]:
    in_dtype, out_dtype = op.operands[0].type.dtype.name, op.result.type.dtype.name

    def build(args, dst: VecArg, rows: int, cols: int):
        (x,) = args
        return [
            ctx.emitter.emit(
                "vun", func=func, in_dtype=in_dtype, out_dtype=out_dtype, dst=dst.addr, src=x.addr,
                rows=rows, cols=cols, dst_stride=dst.stride, src_stride=x.stride, src_bcast=x.bcast,
            )
        ]  # fmt: skip

    return elementwise_kernel(op, ctx, [op.operands[0]], build)


@register_lowering(*_UNARY)
def lower_unary(op, ctx: LoweringContext) -> list[Kernel]:
    """``vun func`` per tile (the special functions run on the SFU)."""
    return _unary_kernel(op, ctx, op.func)


@register_lowering(ops.CastOp)
def lower_cast(op, ctx: LoweringContext) -> list[Kernel]:
    """``vun copy`` with a dtype change (numerics.cast: round half to even, truncation to ints)."""
    return _unary_kernel(op, ctx, "copy")


@register_lowering(ops.SelectOp)
def lower_select(op, ctx: LoweringContext) -> list[Kernel]:
    """``vun copy`` of the false branch into the result tile, then in-place ``vsel`` of the true
    branch where the condition holds (both exact copies)."""
    dtype = op.result.type.dtype.name
    emit = ctx.emitter.emit

    def build(args, dst: VecArg, rows: int, cols: int):
        cond, a, b = args
        shape = dict(rows=rows, cols=cols, dst=dst.addr, dst_stride=dst.stride)
        return [
            emit("vun", func="copy", in_dtype=dtype, out_dtype=dtype, src=b.addr, src_stride=b.stride,
                 src_bcast=b.bcast, **shape),
            emit("vsel", cond=cond.addr, cond_stride=cond.stride, cond_bcast=cond.bcast, src=a.addr,
                 src_stride=a.stride, src_bcast=a.bcast, dtype=dtype, **shape),
        ]  # fmt: skip

    return elementwise_kernel(op, ctx, list(op.operands), build)
