"""Lowering of softmax, layer_norm and reduce_{sum,mean,max}: whole-row kernels on the vector unit.

The interpreter defines these ops on ``x`` with the reduced axes moved last (kept axes first, in
order, then the reduced axes in ascending order), as a (rows, C) array, and runs a fixed sequence
of ``numerics`` steps on whole rows.  The lowering computes exactly those steps on row tiles:

* softmax: ``vred max`` -> ``vbin sub`` -> ``vun exp`` -> ``vred sum`` -> ``vbin div``;
* layer_norm: sum, div C, sub, mul, sum, div C, add eps, rsqrt, mul, mul scale, add bias;
* reduce_sum / reduce_max: one ``vred``; reduce_mean: ``vred sum`` to f32, ``vbini div count``.

Intermediates are f32 scratch buffers; f16/bf16 inputs are first widened by ``vun copy`` (exact),
because a vector instruction has one ``in_dtype`` for both sources.  Rows are never split, so
every reduction sums exactly the interpreter's row (numerics.row_reduce on whole rows).

Layout (``RowLayout``): the dims of ``x`` are merged into alternating kept (K) / reduced (R)
blocks.  Tiles run over the last K block; the other K blocks are an outer loop.  When the last
block is R (``axis = -1``, layer norm, trailing reductions) a tile is ``tj`` rows of C elements
gathered by DMA.  When the last block is K (e.g. softmax over axis 1 of [B, S, H]) the tile is
loaded as C x tj and flipped with ``transpose`` (and flipped back before the store for softmax).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from mcpc.backend.lower_shape import MIN_STEPS, OVERLAP_BYTES, U20, Dim, dma_nd, elem_bytes, fit_count
from mcpc.backend.lower_vector import rows_dma, with_rows_reg
from mcpc.backend.lowering import LoweringContext, register_lowering
from mcpc.backend.memory import align_up
from mcpc.backend.schedule import Kernel, Step
from mcpc.errors import UnsupportedError
from mcpc.ir import ops
from mcpc.ir.ops_nn import normalize_axes


@dataclass
class RowLayout:
    """``x`` as rows of ``C`` reduced elements: outer K loop, tiled last K block, R blocks."""

    outer: list[tuple[int, int]]  # (size, element stride) of the K blocks before the tiled one
    nk: int  # size of the tiled K block
    sk: int  # its element stride
    rblocks: list[tuple[int, int]]  # (size, element stride) of the R blocks, in x order
    transposed: bool  # the tiled K block is x's innermost: tiles load as C x tj

    @property
    def c(self) -> int:
        return math.prod(n for n, _ in self.rblocks)

    @classmethod
    def of(cls, shape: tuple[int, ...], axes: list[int]) -> RowLayout:
        stride, blocks = 1, []  # (is_reduced, size, stride), built innermost first
        for d in range(len(shape) - 1, -1, -1):
            n, red = shape[d], d in axes
            if n != 1:
                if blocks and blocks[-1][0] == red:
                    blocks[-1] = (red, blocks[-1][1] * n, blocks[-1][2])
                else:
                    blocks.append((red, n, stride))
            stride *= n
        blocks.reverse()
        kept = [(n, s) for red, n, s in blocks if not red]
        rblocks = [(n, s) for red, n, s in blocks if red]
        transposed = bool(blocks) and not blocks[-1][0]
        nk, sk = kept.pop() if kept else (1, 0)
        return cls(kept, nk, sk, rblocks, transposed)

    def view(self, nj: int, esz: int) -> list[Dim]:
        """DMA dims of one tile of ``nj`` rows, SRAM row-major [nj, C] (or [C, nj] transposed)."""
        later, out = 1, []
        for n, s in reversed(self.rblocks):
            out.append(Dim(n, s * esz, later * (nj if self.transposed else 1) * esz))
            later *= n
        out.reverse()
        if self.transposed:
            return [*out, Dim(nj, self.sk * esz, esz)]
        return [Dim(nj, self.sk * esz, self.c * esz), *out]


@dataclass
class Tile:
    """What a row body computes on: ``nj`` rows of ``c`` elements of ``x`` at ``src`` (contiguous
    rows, x's dtype) into ``dst`` (rows of ``c`` values, or ``nj`` values for reductions), with
    EX-only scratch buffers by name."""

    src: int
    dst: int
    nj: int
    c: int
    scratch: dict[str, int]


ROW, ONE = "row", "one"  # scratch sizes: one f32 per reduced element of a row, or one per row


def row_kernel(op, ctx: LoweringContext, axes, per_row: bool, scratch: dict[str, str], body, params=()):
    """The kernel of a whole-row op on ``op.operands[0]``.

    ``per_row``: the result has x's layout (softmax, layer_norm) instead of one value per row.
    ``scratch``: f32 scratch buffers by name, ``ROW`` (C values per row) or ``ONE`` (one per row).
    ``params``: values of C elements loaded once (and widened to f32) before the tiles; their SRAM
    addresses are passed to ``body(tile, params)``, which returns the compute instructions of one
    tile.  Guarantees every buffer fits ``ctx.sram_budget`` (PassError naming the op otherwise).
    """
    x = op.operands[0]
    xp, xt = ctx.dram(x)
    out, ot = ctx.dram(op.result)
    if ot.numel == 0:
        return []
    esz, osz = elem_bytes(xt, op), elem_bytes(ot, op)
    lay = RowLayout.of(xt.shape, axes)
    c = lay.c
    if c > U20:
        raise UnsupportedError(
            f"backend: {op.describe()}: rows of {c} elements exceed the vector unit's {U20}"
        )
    a = ctx.align
    scratch_row = {k: 4 * (c if v == ROW else 1) for k, v in scratch.items()}
    per_param = align_up(c * 4, a) + align_up(c * max(1, esz), a)

    def need(j: int) -> int:
        ins = ctx.in_slots * align_up(j * c * esz, a)
        outs = ctx.out_slots * align_up(j * (c if per_row else 1) * osz, a)
        extra = sum(align_up(j * b, a) for b in scratch_row.values()) + len(params) * per_param
        if lay.transposed:
            extra += align_up(j * c * esz, a) + (align_up(j * c * osz, a) if per_row else 0)
        return ins + outs + extra

    tj = fit_count(lambda j: need(j) <= ctx.sram_budget, min(lay.nk, U20))
    if tj == 0:
        raise ctx.does_not_fit(op, f"one row of {c} elements (with its scratch buffers)", need(1))
    n_outer = math.prod(n for n, _ in lay.outer)
    if xt.nbytes > OVERLAP_BYTES and n_outer * math.ceil(lay.nk / tj) < MIN_STEPS:
        tj = min(tj, math.ceil(lay.nk / MIN_STEPS))
    arena = ctx.arena()
    emit = ctx.emitter.emit
    steps: list[Step] = []
    pbufs = []
    if params:  # one prologue step: load the row parameters once, widen them to f32
        loads, computes = [], []
        for v in params:
            pe = elem_bytes(v.type, op)
            raw = arena.alloc(c * pe, "row parameter")
            loads.append(emit("load", dram=ctx.dram(v)[0], sram=raw, rows=1, row_bytes=c * pe))
            if v.type.dtype.name == "f32":
                pbufs.append(raw)
                continue
            wide = arena.alloc(c * 4, "row parameter (f32)")
            computes.append(
                emit(
                    "vun",
                    func="copy",
                    in_dtype=v.type.dtype.name,
                    out_dtype="f32",
                    dst=wide,
                    src=raw,
                    rows=1,
                    cols=c,
                )
            )
            pbufs.append(wide)
        steps.append(Step(loads=loads, computes=computes))
    xin = arena.ring(ctx.in_slots, tj * c * esz, "row tile")
    yout = arena.ring(ctx.out_slots, tj * (c if per_row else 1) * osz, "result tile")
    bufs = {k: arena.alloc(tj * b, k) for k, b in scratch_row.items()}
    xt_buf = arena.alloc(tj * c * esz, "transposed rows") if lay.transposed else None
    yt_buf = arena.alloc(tj * c * osz, "transposed result") if lay.transposed and per_row else None
    rank = len(steps)
    for idx in itertools.product(*(range(n) for n, _ in lay.outer)):
        off = sum(i * s for i, (_, s) in zip(idx, lay.outer, strict=True))
        flat = 0
        for i, (n, _) in zip(idx, lay.outer, strict=True):
            flat = flat * n + i
        for j0 in range(0, lay.nk, tj):
            nj, slot, dst = min(tj, lay.nk - j0), xin.addr(rank), yout.addr(rank)
            reg = _rows_reg(op, ctx, lay, j0, per_row)
            xbase = xp + (off + j0 * lay.sk) * esz
            loads = rows_dma(ctx, "load", xbase, slot, nj, c * esz, lay.sk * esz, reg) or dma_nd(
                ctx, "load", xbase, slot, lay.view(nj, esz), esz
            )
            computes = []
            src = slot
            if lay.transposed:
                computes.append(_flip(ctx, xt_buf, slot, c, nj, esz))
                src = xt_buf
            tile = Tile(src, yt_buf if yt_buf is not None else dst, nj, c, bufs)
            computes += with_rows_reg(body(tile, pbufs), nj, reg)
            if per_row:
                if yt_buf is not None:
                    computes.append(_flip(ctx, dst, yt_buf, nj, c, osz))
                obase = out + (off + j0 * lay.sk) * osz
                stores = rows_dma(ctx, "store", obase, dst, nj, c * osz, lay.sk * osz, reg) or dma_nd(
                    ctx, "store", obase, dst, lay.view(nj, osz), osz
                )
            else:
                base = out + (flat * lay.nk + j0) * osz
                stores = rows_dma(ctx, "store", base, dst, nj, osz, osz, reg) or [
                    emit("store", dram=base, sram=dst, rows=1, row_bytes=nj * osz)
                ]
            steps.append(Step(loads=loads, computes=computes, stores=stores))
            rank += 1
    return [ctx.kernel(steps, arena)]


def _rows_reg(op, ctx: LoweringContext, lay: RowLayout, j0: int, per_row: bool) -> int:
    """The run-time row count of the tile of rows j0.. (a prefill's token rows in use,
    ``backend/row_extent.py``): when the rows are x's leading, untransposed, dense rows, one
    register for x's rows and the result's; else 0 (the capacity)."""
    if ctx.extent is None or lay.transposed or lay.outer or lay.sk != lay.c:
        return 0
    reg = ctx.rows_reg(op.operands[0], j0, lay.c)
    return reg if reg and ctx.rows_reg(op.result, j0, lay.c if per_row else 1) == reg else 0


def _flip(ctx, dst: int, src: int, rows: int, cols: int, esz: int):
    """``transpose`` of a contiguous rows x cols tile into a contiguous cols x rows one."""
    return ctx.emitter.emit(
        "transpose", dst=dst, src=src, rows=rows, cols=cols, elem_bytes=esz, src_stride=cols, dst_stride=rows
    )


class _RowOps:
    """Shorthands for one tile's vector instructions: ``full`` over rows x C, ``col`` over the
    tile's one-value-per-row vectors (C = row stride of every full operand)."""

    def __init__(self, ctx: LoweringContext, t: Tile):
        self.emit, self.t = ctx.emitter.emit, t

    def full(self, mnemonic: str, **kw):
        t = self.t
        strides = {"vred": ("src_stride",), "vun": ("dst_stride", "src_stride")}.get(
            mnemonic, ("dst_stride", "s0_stride")
        )
        kw = {**{k: t.c for k in strides}, "in_dtype": "f32", "out_dtype": "f32", **kw}
        return self.emit(mnemonic, rows=t.nj, cols=t.c, **kw)

    def col(self, mnemonic: str, **kw):
        kw = {"in_dtype": "f32", "out_dtype": "f32", "dst_stride": 1, **kw}
        kw.setdefault("src_stride" if mnemonic == "vun" else "s0_stride", 1)
        return self.emit(mnemonic, rows=self.t.nj, cols=1, **kw)

    def widen(self, dtype: str, wide: int) -> tuple[list, int]:
        """The tile as f32: itself, or an exact ``vun copy`` into ``wide``."""
        if dtype == "f32":
            return [], self.t.src
        return [self.full("vun", func="copy", in_dtype=dtype, dst=wide, src=self.t.src)], wide


BCAST = {"s1_stride": 1, "s1_bcast": 1}  # src1 holds one value per row
ROW_PARAM = {"s1_stride": 0}  # src1 is one row repeated (scale, bias)


@register_lowering(ops.SoftmaxOp, ops.LogSoftmaxOp)
def lower_softmax(op, ctx: LoweringContext) -> list[Kernel]:
    """max, sub, exp, sum, div on whole rows along ``axis`` (interpreter's ``_softmax``);
    log_softmax keeps ``x - max`` and ends with log of the sum, sub instead of the div."""
    log = isinstance(op, ops.LogSoftmaxOp)
    xd, od = op.operands[0].type.dtype.name, op.result.type.dtype.name
    axis = op.attrs["axis"] % op.operands[0].type.rank

    def body(t: Tile, _params):
        r = _RowOps(ctx, t)
        w, m, s = t.scratch["w"], t.scratch["m"], t.scratch["s"]
        first = [r.full("vred", func="max", in_dtype=xd, dst=m, src=t.src)]
        widen, x32 = r.widen(xd, w)
        head = [*first, *widen, r.full("vbin", func="sub", dst=w, src0=x32, src1=m, **BCAST)]
        if log:  # d = x - max stays in w, exp(d) goes to scratch e
            e = t.scratch["e"]
            return head + [
                r.full("vun", func="exp", dst=e, src=w),
                r.full("vred", func="sum", dst=s, src=e),
                r.col("vun", func="log", dst=s, src=s),
                r.full("vbin", func="sub", out_dtype=od, dst=t.dst, src0=w, src1=s, **BCAST),
            ]
        return head + [
            r.full("vun", func="exp", dst=w, src=w),
            r.full("vred", func="sum", dst=s, src=w),
            r.full("vbin", func="div", out_dtype=od, dst=t.dst, src0=w, src1=s, **BCAST),
        ]

    scratch = {"w": ROW, "m": ONE, "s": ONE, **({"e": ROW} if log else {})}
    return row_kernel(op, ctx, [axis], True, scratch, body)


@register_lowering(ops.LayerNormOp)
def lower_layer_norm(op, ctx: LoweringContext) -> list[Kernel]:
    """The interpreter's 11 f32 steps per row; scale and bias loaded once and widened to f32."""
    x, scale, bias = op.operands
    xd, od = x.type.dtype.name, op.result.type.dtype.name
    axis = op.attrs["axis"] % x.type.rank
    eps = float(op.attrs["epsilon"])

    def body(t: Tile, params):
        r = _RowOps(ctx, t)
        sc, bi = params
        w, u, mean, var = (t.scratch[k] for k in ("w", "t", "mean", "var"))
        widen, x32 = r.widen(xd, w)
        return widen + [
            r.full("vred", func="sum", dst=mean, src=x32),
            r.col("vbini", func="div", dst=mean, src0=mean, imm=float(t.c)),
            r.full("vbin", func="sub", dst=w, src0=x32, src1=mean, **BCAST),
            r.full("vbin", func="mul", dst=u, src0=w, src1=w, s1_stride=t.c),
            r.full("vred", func="sum", dst=var, src=u),
            r.col("vbini", func="div", dst=var, src0=var, imm=float(t.c)),
            r.col("vbini", func="add", dst=var, src0=var, imm=eps),
            r.col("vun", func="rsqrt", dst=var, src=var),
            r.full("vbin", func="mul", dst=u, src0=w, src1=var, **BCAST),
            r.full("vbin", func="mul", dst=u, src0=u, src1=sc, **ROW_PARAM),
            r.full("vbin", func="add", out_dtype=od, dst=t.dst, src0=u, src1=bi, **ROW_PARAM),
        ]

    axes = list(range(axis, x.type.rank))
    scratch = {"w": ROW, "t": ROW, "mean": ONE, "var": ONE}
    return row_kernel(op, ctx, axes, True, scratch, body, params=(scale, bias))


@register_lowering(ops.ReduceSumOp, ops.ReduceMaxOp, ops.ReduceMeanOp, ops.ArgMaxOp)
def lower_reduce(op, ctx: LoweringContext) -> list[Kernel]:
    """One ``vred`` per tile (reduce_mean: f32 sum then ``vbini div count``; argmax: ``vred
    argmax`` over whole rows, so the index is the row's)."""
    x = op.operands[0]
    xd, od = x.type.dtype.name, op.result.type.dtype.name
    axes = normalize_axes(op.attrs["axes"], x.type.rank)
    count = math.prod(x.type.shape[a] for a in axes)
    if count == 0 and op.result.type.numel:
        raise UnsupportedError(f"backend: {op.describe()}: a reduction over zero elements is not lowered")
    mean = isinstance(op, ops.ReduceMeanOp)

    def body(t: Tile, _params):
        r = _RowOps(ctx, t)
        if not mean:
            return [r.full("vred", func=op.func, in_dtype=xd, out_dtype=od, dst=t.dst, src=t.src)]
        s = t.scratch["s"]
        return [
            r.full("vred", func="sum", in_dtype=xd, dst=s, src=t.src),
            r.col("vbini", func="div", out_dtype=od, dst=t.dst, src0=s, imm=float(count)),
        ]

    return row_kernel(op, ctx, axes, False, {"s": ONE} if mean else {}, body)


@register_lowering(ops.TopKOp)
def lower_topk(op, ctx: LoweringContext) -> list[Kernel]:
    """One ``vtopk`` per tile of whole rows, then ``vun copy`` of its i32 indices to i64.

    Lowered when ``axis`` is the innermost dim of ``x`` that is not 1 (the rows of ``k`` results
    then lie in x's row order); another axis would need the rows transposed in and out, which is
    refused (UnsupportedError naming the node) rather than computed wrongly."""
    x = op.operands[0]
    xp, xt = ctx.dram(x)
    (vp, vt), (ip, _) = ctx.dram(op.results[0]), ctx.dram(op.results[1])
    if vt.numel == 0:
        return []
    axis = op.attrs["axis"] % xt.rank
    if any(d != 1 for d in xt.shape[axis + 1 :]):
        raise UnsupportedError(
            f"backend: {op.describe()}: top-k along axis {axis} of {xt} is not lowered (vtopk works "
            "on rows: only along the innermost dim of size > 1)"
        )
    xd = xt.dtype.name
    if xd in ("i64", "u64"):
        raise UnsupportedError(
            f"backend: {op.describe()}: top-k of {xd} values (the NPU has no 64-bit compare)"
        )
    c, k = xt.shape[axis], op.attrs["k"]
    if c > U20 or k > 0xFFFF:
        raise UnsupportedError(
            f"backend: {op.describe()}: rows of {c} elements or k = {k} exceed vtopk's fields (cols "
            f"<= {U20}, topk_k <= 65535)"
        )
    rows = xt.numel // c
    esz, isz = elem_bytes(xt, op), 8
    a = ctx.align

    def need(j: int) -> int:
        ins = ctx.in_slots * align_up(j * c * esz, a)
        outs = ctx.out_slots * (align_up(j * k * esz, a) + align_up(j * k * isz, a))
        return ins + outs + align_up(j * k * 4, a)

    tj = fit_count(lambda j: need(j) <= ctx.sram_budget, min(rows, U20))
    if tj == 0:
        raise ctx.does_not_fit(op, f"one row of {c} elements with its {k} values and indices", need(1))
    if xt.nbytes > OVERLAP_BYTES and math.ceil(rows / tj) < MIN_STEPS:
        tj = min(tj, math.ceil(rows / MIN_STEPS))
    arena = ctx.arena()
    emit = ctx.emitter.emit
    xin = arena.ring(ctx.in_slots, tj * c * esz, "row tile")
    vout = arena.ring(ctx.out_slots, tj * k * esz, "top-k values")
    iout = arena.ring(ctx.out_slots, tj * k * isz, "top-k indices (i64)")
    idx32 = arena.alloc(tj * k * 4, "top-k indices (i32)")
    steps: list[Step] = []
    for rank, r0 in enumerate(range(0, rows, tj)):
        nj = min(tj, rows - r0)
        src, vals, idx = xin.addr(rank), vout.addr(rank), iout.addr(rank)
        loads = dma_nd(ctx, "load", xp + r0 * c * esz, src, [Dim(nj * c, esz, esz)], esz)
        computes = [
            emit("vtopk", dtype=xd, dst=vals, idx=idx32, src=src, rows=nj, cols=c, topk_k=k,
                 src_stride=c, dst_stride=k, idx_stride=k, largest=int(op.attrs["largest"])),
            emit("vun", func="copy", in_dtype="i32", out_dtype="i64", dst=idx, src=idx32, rows=nj,
                 cols=k, dst_stride=k, src_stride=k),
        ]  # fmt: skip
        stores = dma_nd(ctx, "store", vp + r0 * k * esz, vals, [Dim(nj * k, esz, esz)], esz)
        stores += dma_nd(ctx, "store", ip + r0 * k * isz, idx, [Dim(nj * k, isz, isz)], isz)
        steps.append(Step(loads=loads, computes=computes, stores=stores))
    return [ctx.kernel(steps, arena)]
