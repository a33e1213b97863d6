"""Lowering of ``mcp.matmul`` (batched, broadcast batch dims, ``trans_b``) following its ``tile``.

For each batch and each (i, j) output tile, one step per K tile (ascending K, as
``numerics.matmul_2d``): load A(i, k) and B(k, j) with 2-D strided DMA straight from the DRAM
layout into the step's input slot, then ``matmul`` with acc=0 on the first K tile and acc=1 after.
When the result is f32 the matmul accumulates straight into the output slot; otherwise it
accumulates into a persistent f32 buffer and a ``vun copy`` rounds the finished tile once into
the output slot.  The last K step stores the output tile.  Products are the interpreter's
``matmul_tile`` calls on the same tiles, so the result is bit-exact with it.  When B is one
matrix (``MatMulOp.folds_rows``) the rows of every batch of A form M, one "batch" whose row tiles
may span several: each B tile is loaded once per row tile, not once per batch.

With an *epilogue* (``fusion.FusionGroup``: elementwise ops consuming the product) the product
always accumulates in the f32 buffer; after the last K tile the kernel rounds it to the matmul's
``out`` dtype (``vun copy``, unless f32) and applies each epilogue op to the tile — ``vun`` for a
unary op, ``vbin`` with the other operand's tile loaded in the same step (a bias row, a residual
tile; broadcast dims read with stride 0), or ``vbini`` for a scalar constant exact in f32 —
ping-ponging between the accumulator and a work buffer, the last op writing the output slot,
which is stored to the chain's last value.  Each op reads its operands in their dtypes, computes
in f32 and rounds to its result dtype, as its own kernel does, so the bits are the unfused IR's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from mcpc.arch.dtypes import tile_bytes
from mcpc.backend.fusion import EpilogueOp
from mcpc.backend.lower_vector import broadcast_strides, scalar_immediate
from mcpc.backend.lowering import LoweringContext, register_lowering
from mcpc.backend.memory import align_up
from mcpc.backend.schedule import Kernel, Step
from mcpc.errors import PassError, UnsupportedError
from mcpc.ir.ops import MatMulOp


def batch_offsets(batch_shape: tuple[int, ...], out_batch: tuple[int, ...]) -> np.ndarray:
    """Flat batch index of an operand with ``batch_shape`` for each flat output batch index
    (numpy broadcasting: size-1 and missing leading dims repeat)."""
    own = np.arange(math.prod(batch_shape), dtype=np.int64).reshape(batch_shape)
    return np.broadcast_to(own, out_batch).reshape(-1)


def matmul_sram_bytes(tm: int, tn: int, tk: int, in_dtype: str, out_dtype: str, acc: bool,
                      slots: tuple[int, int], align: int) -> int:  # fmt: skip
    """SRAM of the kernel: input slots (A and B tiles), output slots, optional f32 accumulator
    (tiles sized by ``tile_bytes``: packed 4-bit rows take half a byte per element, rounded up)."""
    ins, outs = slots
    a_tile, b_tile = tile_bytes(in_dtype, tm, tk), tile_bytes(in_dtype, tk, tn)
    total = ins * (align_up(a_tile, align) + align_up(b_tile, align))
    total += outs * align_up(tile_bytes(out_dtype, tm, tn), align)
    return total + (align_up(tm * tn * 4, align) if acc else 0)


def _rows(op: MatMulOp) -> int:
    """M of the op's tiles: all rows of ``a`` when ``b`` is one matrix (``MatMulOp.folds_rows``),
    else the rows of one batch."""
    at = op.operands[0].type
    return math.prod(at.shape[:-1]) if op.folds_rows() else at.shape[-2]


def _tile_tm_tn(op: MatMulOp) -> tuple[int, int]:
    m, n = _rows(op), op.result.type.shape[-1]
    tile = list(op.attrs["tile"]) or [0, 0, 0]
    return min(tile[0] or m, m), min(tile[1] or n, n)


def _other_shape(e: EpilogueOp, tm: int, tn: int, out_shape: tuple[int, ...],
                 folded: bool = False) -> tuple[int, int, list[int]]:  # fmt: skip
    """Rows and columns of the tile of ``e.other`` read for a ``tm`` x ``tn`` output tile, and its
    element strides over ``out_shape`` (0 along broadcast dims).  With ``folded`` rows (the
    output's batch dims are part of the tile's rows) a tile has one row only when ``e.other`` is
    broadcast along every row dim."""
    st = broadcast_strides(e.other.type.shape, out_shape)
    rows_vary = any(st[:-1]) if folded else bool(st[-2])
    return (tm if rows_vary else 1), (tn if st[-1] else 1), st


def epilogue_sram_bytes(op: MatMulOp, epilogue: Sequence[EpilogueOp], slots: tuple[int, int], align: int,
                        loaded: Sequence[bool] | None = None) -> int:  # fmt: skip
    """SRAM of the kernel of ``op`` with ``epilogue`` (no epilogue: ``matmul_sram_bytes``): the
    A/B input slots plus each loaded other operand's tile per input slot (``loaded[i]``; default
    every binary op loads), output slots of the chain's last dtype, the f32 accumulator, and a
    work buffer of f32 size when the chain needs a second buffer."""
    at, ct = op.operands[0].type, op.result.type
    tm, tn = _tile_tm_tn(op)
    tk = min((list(op.attrs["tile"]) or [0, 0, 0])[2] or at.shape[-1], at.shape[-1])
    es = at.dtype.name
    if not epilogue:
        return matmul_sram_bytes(tm, tn, tk, es, ct.dtype.name, ct.dtype.name != "f32", slots, align)
    fs = epilogue[-1].op.result.type.dtype.name
    total = matmul_sram_bytes(tm, tn, tk, es, fs, True, slots, align)
    for i, e in enumerate(epilogue):
        if e.other is not None and (loaded is None or loaded[i]):
            r, c, _ = _other_shape(e, tm, tn, ct.shape, op.folds_rows())
            total += slots[0] * align_up(tile_bytes(e.other.type.dtype.name, r, c), align)
    if ct.dtype.name != "f32" or len(epilogue) > 1:
        total += align_up(tm * tn * 4, align)
    return total


@register_lowering(MatMulOp)
def lower_matmul(op: MatMulOp, ctx: LoweringContext) -> Kernel:
    """One kernel computing the whole (batched) product; see the module docstring."""
    return matmul_kernel(op, ctx)


def matmul_kernel(op: MatMulOp, ctx: LoweringContext, epilogue: Sequence[EpilogueOp] = ()) -> Kernel:
    """The kernel of ``op`` with ``epilogue`` applied to each finished output tile (see module doc).

    Assumes the epilogue is a ``fusion.plan_fusion`` chain of ``op`` (same shape as the product,
    other operands in DRAM before the kernel runs).  The kernel stores only the chain's last value;
    its instructions carry the debug record of the op they compute (``Kernel.instr_debug``).
    Raises PassError when the tile does not fit ``ctx.sram_budget``.
    """
    a_val, b_val = op.operands
    final = epilogue[-1].op.result if epilogue else op.result
    a_addr, at = ctx.dram(a_val)
    b_addr, bt = ctx.dram(b_val)
    c_addr, ct = ctx.dram(final)
    mt = op.result.type  # the product (same shape as the chain's values)
    trans_b = bool(op.attrs["trans_b"])
    k, n = at.shape[-1], ct.shape[-1]
    folded = op.folds_rows()
    # one weight matrix: the rows of every batch of a (dense, a's batch is the result's) form M,
    # so each B tile is loaded once per (i, j, k) tile of all rows, not once per batch
    m, out_batch = (math.prod(at.shape[:-1]), ()) if folded else (at.shape[-2], ct.shape[:-2])
    if k == 0:
        raise UnsupportedError(f"{op.describe()}: a matmul with an empty contraction (K = 0) is not lowered")
    if m == 0 or n == 0 or math.prod(out_batch) == 0:
        return Kernel([], ctx.in_slots, ctx.out_slots)
    tile = list(op.attrs["tile"]) or [0, 0, 0]
    tm, tn, tk = (t or d for t, d in zip(tile, (m, n, k), strict=True))
    tm, tn, tk = min(tm, m), min(tn, n), min(tk, k)
    in_dt, out_dt = at.dtype.name, mt.dtype.name
    es, os_ = at.dtype.bits // 8, ct.dtype.bits // 8
    imms = [scalar_immediate(ctx, e.other) if e.other is not None else None for e in epilogue]
    loaded = [e.other is not None and imm is None for e, imm in zip(epilogue, imms, strict=True)]
    direct = out_dt == "f32" and not epilogue  # accumulate straight into the output slot
    slots = (ctx.in_slots, ctx.out_slots)
    need = epilogue_sram_bytes(op, epilogue, slots, ctx.align, loaded)
    if need > ctx.sram_budget:
        if not op.attrs["tile"] or ctx.sram_budget < ctx.target.sram.size_bytes:
            # untiled (the tile-matmul pass did not run), or a region smaller than the SRAM is tried
            budget = ctx.sram_budget
            hint = "; run the tile-matmul pass" if not op.attrs["tile"] else ""
            raise PassError(
                f"matmul tile [{tm}, {tn}, {tk}] needs {need} bytes of SRAM, the budget is {budget}{hint}"
            )
        raise ctx.does_not_fit(op, f"the matmul tile [{tm}, {tn}, {tk}] with its epilogue", need)
    n_steps = math.prod(out_batch) * -(-m // tm) * -(-n // tn) * -(-k // tk)
    slots = ctx.stream_in_slots(
        n_steps, m, lambda s: epilogue_sram_bytes(op, epilogue, (s, ctx.out_slots), ctx.align, loaded)
    )
    arena = ctx.arena()
    a_ring = arena.ring(slots, tm * tk * es, "A tile")
    b_ring = arena.ring(slots, tk * tn * es, "B tile")
    other_rings = {}
    for i, e in enumerate(epilogue):
        if loaded[i]:
            r_, c_, _ = _other_shape(e, tm, tn, mt.shape, folded)
            other_rings[i] = arena.ring(slots, r_ * c_ * e.other.type.dtype.bits // 8, f"epilogue {i} tile")
    o_ring = arena.ring(ctx.out_slots, tm * tn * os_, "output tile")
    acc_buf = None if direct else arena.alloc(tm * tn * 4, "f32 accumulator")
    work = (
        arena.alloc(tm * tn * 4, "epilogue work tile")
        if epilogue and (out_dt != "f32" or len(epilogue) > 1)
        else None
    )
    a_off = batch_offsets(() if folded else at.shape[:-2], out_batch) * (m * k)
    b_off = batch_offsets(() if folded else bt.shape[:-2], out_batch) * (n * k)
    em = ctx.emitter
    epi = _Epilogue(ctx, op, epilogue, imms, other_rings, acc_buf, work) if epilogue else None

    def dma(mnemonic: str, dram: int, sram: int, rows: int, row_bytes: int, dram_stride: int, reg: int = 0):
        # SRAM tiles are dense: rows follow each other
        return em.emit(mnemonic, dram=dram, sram=sram, rows=rows, row_bytes=row_bytes,
                       dram_stride=dram_stride, sram_stride=row_bytes, rows_reg=reg)  # fmt: skip

    def rows_reg(i0: int) -> int:
        """The run-time row count of the row tile at i0 (token rows of a prefill, row_extent.py):
        one register for A's rows and the result's, else 0 (the capacity)."""
        if len(a_off) != 1:
            return 0
        reg = ctx.rows_reg(a_val, i0, k)
        return reg if reg and ctx.rows_reg(final, i0, n) == reg else 0

    steps: list[Step] = []
    r = g = 0
    for bi in range(len(a_off)):
        a_base, b_base = a_addr + int(a_off[bi]) * es, b_addr + int(b_off[bi]) * es
        c_base = c_addr + bi * m * n * os_
        for i0, j0 in ((i0, j0) for i0 in range(0, m, tm) for j0 in range(0, n, tn)):
            mm, nn = min(tm, m - i0), min(tn, n - j0)
            o_slot = o_ring.addr(g)
            c_buf = o_slot if direct else acc_buf
            reg = rows_reg(i0)
            for k0 in range(0, k, tk):
                kk = min(tk, k - k0)
                sa, sb = a_ring.addr(r), b_ring.addr(r)
                loads = [dma("load", a_base + (i0 * k + k0) * es, sa, mm, kk * es, k * es, reg)]
                if trans_b:  # B is n x k: rows j0.., columns k0..
                    loads.append(dma("load", b_base + (j0 * k + k0) * es, sb, nn, kk * es, k * es))
                else:
                    loads.append(dma("load", b_base + (k0 * n + j0) * es, sb, kk, nn * es, n * es))
                mmul = em.emit("matmul", a=sa, b=sb, c=c_buf, m=mm, n=nn, k=kk, a_stride=kk,
                               b_stride=kk if trans_b else nn, c_stride=nn, in_dtype=in_dt,
                               acc=int(k0 > 0), trans_b=int(trans_b), m_reg=reg)  # fmt: skip
                step = Step(loads, [mmul])
                if k0 + kk >= k:
                    if epi is not None:
                        loads += epi.loads(r, bi, i0, j0, mm, nn, reg)
                        step.computes += epi.computes(r, o_slot, mm, nn, reg)
                    elif not direct:  # one rounding of the finished f32 tile
                        step.computes.append(em.emit("vun", func="copy", in_dtype="f32", out_dtype=out_dt,
                                                     dst=o_slot, src=acc_buf, rows=mm, cols=nn,
                                                     dst_stride=nn, src_stride=nn, rows_reg=reg))  # fmt: skip
                    step.stores.append(
                        dma("store", c_base + (i0 * n + j0) * os_, o_slot, mm, nn * os_, n * os_, reg)
                    )
                    g += 1
                r += 1
                steps.append(step)
    kernel = ctx.kernel(steps, arena, slots)
    if epi is not None:
        kernel.instr_debug = epi.debug
    return kernel


def _runs(i0: int, mm: int, m: int) -> list[int]:
    """First folded row of each run of rows ``i0 .. i0 + mm - 1`` lying in one batch of ``m`` rows."""
    return [i0, *range((i0 // m + 1) * m, i0 + mm, m)]


class _Epilogue:
    """Builds the epilogue of one fused matmul kernel: per output tile, the loads of the other
    operands' tiles and the compute chain (see the module doc)."""

    def __init__(self, ctx: LoweringContext, op: MatMulOp, epilogue: Sequence[EpilogueOp], imms: list,
                 rings: dict, acc: int, work: int | None) -> None:  # fmt: skip
        self.ctx, self.op, self.epilogue, self.imms, self.rings = ctx, op, list(epilogue), imms, rings
        self.acc, self.work = acc, work
        shape = op.result.type.shape
        self.batch_shape = shape[:-2]
        self.folded = op.folds_rows()  # tile rows run over all batches (``MatMulOp.folds_rows``)
        self.m = shape[-2]  # rows of one batch
        self.strides = {i: _other_shape(epilogue[i], 1, 1, shape)[2] for i in rings}
        self.rows_vary = {i: _other_shape(epilogue[i], 2, 1, shape, self.folded)[0] > 1 for i in rings}
        self.debug: dict[int, dict] = {}

    def loads(self, r: int, bi: int, i0: int, j0: int, mm: int, nn: int, reg: int = 0) -> list:
        """Loads of the other operands' tiles for output tile (batch ``bi``, rows i0.., cols j0..)
        into input slot ``r``; a tile of the output's rows reads the run-time count ``reg``."""
        out = []
        for i, ring in self.rings.items():
            e, st = self.epilogue[i], self.strides[i]
            addr, t = self.ctx.dram(e.other)
            esz = t.dtype.bits // 8
            sr, sc = st[-2], st[-1]
            row_bytes = (nn if sc else 1) * esz
            # (batch index, first row in it, rows, SRAM row) of each run of tile rows in one batch
            if not self.folded:
                segs = [(bi, i0, mm if sr else 1, 0)]
            elif not self.rows_vary[i]:
                segs = [(0, 0, 1, 0)]
            else:
                segs = [(q // self.m, q % self.m, min(self.m - q % self.m, i0 + mm - q), q - i0)
                        for q in _runs(i0, mm, self.m)]  # fmt: skip
            for b, row0, rows, srow in segs:
                idx = np.unravel_index(b, self.batch_shape) if self.batch_shape else ()
                off = sum(int(a) * s for a, s in zip(idx, st[:-2], strict=True)) + row0 * sr + j0 * sc
                with self.ctx.emitter.node(e.op) as dctx:
                    instr = self.ctx.emitter.emit(
                        "load", dram=addr + off * esz, sram=ring.addr(r) + srow * row_bytes, rows=rows,
                        row_bytes=row_bytes, dram_stride=sr * esz if sr or rows > 1 else row_bytes,
                        sram_stride=row_bytes, rows_reg=reg if (len(segs), srow, rows) == (1, 0, mm) else 0,
                    )  # fmt: skip
                self.debug[id(instr)] = dict(dctx)
                out.append(instr)
        return out

    def computes(self, r: int, o_slot: int, mm: int, nn: int, reg: int = 0) -> list:
        """Round the finished f32 tile to the product's dtype, then apply every epilogue op; the
        last writes ``o_slot`` (``reg``: the tile's run-time row count)."""
        em, out = self.ctx.emitter, []
        shape = dict(rows=mm, cols=nn, dst_stride=nn, rows_reg=reg)
        cur = self.acc
        mt = self.op.result.type.dtype.name
        if mt != "f32":
            out.append(em.emit("vun", func="copy", in_dtype="f32", out_dtype=mt, dst=self.work, src=self.acc,
                               src_stride=nn, **shape))  # fmt: skip
            cur = self.work
        for i, e in enumerate(self.epilogue):
            dst = o_slot if i == len(self.epilogue) - 1 else (self.work if cur == self.acc else self.acc)
            in_dt = e.op.operands[0].type.dtype.name
            common = dict(
                func=e.func, in_dtype=in_dt, out_dtype=e.op.result.type.dtype.name, dst=dst, **shape
            )
            with em.node(e.op) as dctx:
                if e.other is None:
                    instr = em.emit("vun", src=cur, src_stride=nn, **common)
                elif self.imms[i] is not None:
                    instr = em.emit(
                        "vbini", src0=cur, s0_stride=nn, imm=self.imms[i], rev=e.chain_index, **common
                    )
                else:
                    st = self.strides[i]
                    vary = self.rows_vary[i] if self.folded else st[-2]
                    other = dict(addr=self.rings[i].addr(r), stride=(nn if st[-1] else 1) if vary else 0,
                                 bcast=0 if st[-1] else 1)  # fmt: skip
                    chain = dict(addr=cur, stride=nn, bcast=0)
                    x, y = (chain, other) if e.chain_index == 0 else (other, chain)
                    instr = em.emit(
                        "vbin", src0=x["addr"], s0_stride=x["stride"], s0_bcast=x["bcast"],
                        src1=y["addr"], s1_stride=y["stride"], s1_bcast=y["bcast"], **common,
                    )  # fmt: skip
            self.debug[id(instr)] = dict(dctx)
            out.append(instr)
            cur = dst
        return out
