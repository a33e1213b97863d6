"""Lowering of ``mcp.matmul`` (batched, broadcast batch dims, ``trans_b``) following its ``tile``.

For each batch and each (i, j) output tile, one step per K tile (ascending K, as
``numerics.matmul_2d``): load A(i, k) and B(k, j) with 2-D strided DMA straight from the DRAM
layout into the step's input slot, then ``matmul`` with acc=0 on the first K tile and acc=1 after.
When the result is f32 the matmul accumulates straight into the output slot; otherwise it
accumulates into a persistent f32 buffer and a ``vun copy`` rounds the finished tile once into
the output slot.  The last K step stores the output tile.  Products are the interpreter's
``matmul_tile`` calls on the same tiles, so the result is bit-exact with it.
"""

from __future__ import annotations

import math

import numpy as np

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


def matmul_sram_bytes(tm: int, tn: int, tk: int, es: int, os_: int, acc: bool, slots: tuple[int, int],
                      align: int) -> int:  # fmt: skip
    """SRAM of the kernel: input slots (A and B tiles), output slots, optional f32 accumulator."""
    ins, outs = slots
    total = ins * (align_up(tm * tk * es, align) + align_up(tk * tn * es, align))
    total += outs * align_up(tm * tn * os_, align)
    return total + (align_up(tm * tn * 4, align) if acc else 0)


@register_lowering(MatMulOp)
def lower_matmul(op: MatMulOp, ctx: LoweringContext) -> Kernel:
    """One kernel computing the whole (batched) product; see the module docstring."""
    a_val, b_val = op.operands
    a_addr, at = ctx.dram(a_val)
    b_addr, bt = ctx.dram(b_val)
    c_addr, ct = ctx.dram(op.result)
    trans_b = bool(op.attrs["trans_b"])
    m, k = at.shape[-2:]
    n = ct.shape[-1]
    out_batch = ct.shape[:-2]
    if k == 0:
        raise UnsupportedError(f"{op.describe()}: a matmul with an empty contraction (K = 0) is not lowered")
    if m == 0 or n == 0 or math.prod(out_batch) == 0:
        return Kernel([], ctx.in_slots, ctx.out_slots)
    tile = list(op.attrs["tile"]) or [0, 0, 0]
    tm, tn, tk = (t or d for t, d in zip(tile, (m, n, k), strict=True))
    tm, tn, tk = min(tm, m), min(tn, n), min(tk, k)
    in_dt, out_dt = at.dtype.name, ct.dtype.name
    es, os_ = at.dtype.bits // 8, ct.dtype.bits // 8
    direct = out_dt == "f32"  # accumulate straight into the output slot
    need = matmul_sram_bytes(tm, tn, tk, es, os_, not direct, (ctx.in_slots, ctx.out_slots), ctx.align)
    if need > ctx.sram_budget:
        hint = "; run the tile-matmul pass" if not op.attrs["tile"] else ""
        budget = ctx.sram_budget
        raise PassError(
            f"matmul tile [{tm}, {tn}, {tk}] needs {need} bytes of SRAM, the budget is {budget}{hint}"
        )
    arena = ctx.arena()
    a_ring = arena.ring(ctx.in_slots, tm * tk * es, "A tile")
    b_ring = arena.ring(ctx.in_slots, tk * tn * es, "B tile")
    o_ring = arena.ring(ctx.out_slots, tm * tn * os_, "output tile")
    acc_buf = None if direct else arena.alloc(tm * tn * 4, "f32 accumulator")
    a_off = batch_offsets(at.shape[:-2], out_batch) * (m * k)
    b_off = batch_offsets(bt.shape[:-2], out_batch) * (n * k)
    em = ctx.emitter

    def dma(mnemonic: str, dram: int, sram: int, rows: int, row_bytes: int, dram_stride: int):
        # SRAM tiles are dense: rows follow each other
        return em.emit(mnemonic, dram=dram, sram=sram, rows=rows, row_bytes=row_bytes,
                       dram_stride=dram_stride, sram_stride=row_bytes)  # fmt: skip

    steps: list[Step] = []
    r = g = 0
    for bi in range(len(a_off)):
        a_base, b_base = a_addr + int(a_off[bi]) * es, b_addr + int(b_off[bi]) * es
        c_base = c_addr + bi * m * n * os_
        for i0, j0 in ((i0, j0) for i0 in range(0, m, tm) for j0 in range(0, n, tn)):
            mm, nn = min(tm, m - i0), min(tn, n - j0)
            o_slot = o_ring.addr(g)
            c_buf = o_slot if direct else acc_buf
            for k0 in range(0, k, tk):
                kk = min(tk, k - k0)
                sa, sb = a_ring.addr(r), b_ring.addr(r)
                r += 1
                loads = [dma("load", a_base + (i0 * k + k0) * es, sa, mm, kk * es, k * es)]
                if trans_b:  # B is n x k: rows j0.., columns k0..
                    loads.append(dma("load", b_base + (j0 * k + k0) * es, sb, nn, kk * es, k * es))
                else:
                    loads.append(dma("load", b_base + (k0 * n + j0) * es, sb, kk, nn * es, n * es))
                mmul = em.emit("matmul", a=sa, b=sb, c=c_buf, m=mm, n=nn, k=kk, a_stride=kk,
                               b_stride=kk if trans_b else nn, c_stride=nn, in_dtype=in_dt,
                               acc=int(k0 > 0), trans_b=int(trans_b))  # fmt: skip
                step = Step(loads, [mmul])
                if k0 + kk >= k:
                    if not direct:  # one rounding of the finished f32 tile
                        step.computes.append(em.emit("vun", func="copy", in_dtype="f32", out_dtype=out_dt,
                                                     dst=o_slot, src=acc_buf, rows=mm, cols=nn,
                                                     dst_stride=nn, src_stride=nn))  # fmt: skip
                    step.stores.append(
                        dma("store", c_base + (i0 * n + j0) * os_, o_slot, mm, nn * os_, n * os_)
                    )
                    g += 1
                steps.append(step)
    return ctx.kernel(steps, arena)
