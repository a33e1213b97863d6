"""Lowering of ``mcp.matmul_w4a16`` (a matmul whose weight is quantized codes) following its ``tile``.

The rows of ``a`` (every leading dim) form M.  For each (i, j) output tile, one step per K tile
(ascending K, as ``numerics.matmul_2d``): load the A tile, the codes tile (packed bytes for 4-bit:
what crosses DRAM), the scale tile and — unless every zero point is 0 — the zero-point tile into
the step's input slot, then ``setq`` (the tile's scale and zero-point pointers and the group size)
and ``matmul_w4a16`` with acc=0 on the first K tile and acc=1 after.  An f32 result accumulates in
the output slot; otherwise in an f32 buffer rounded once by ``vun copy``.  The last K step stores
the output tile.  Every product is ``numerics.matmul_wq_tile`` on the interpreter's tile, so the
result is bit-exact with it.

Layout (``fuse-dequantize-matmul`` guarantees it): codes [K, N] (or [N, K] with ``trans_b``)
whose stored rows hold an even number of 4-bit codes; scales and zero points
[ceil(K/G), N] (or [N, ceil(K/G)]); tk a multiple of 2G or all of K (``tile-matmul``).
"""

from __future__ import annotations

import numpy as np

from mcpc.arch.dtypes import nbytes, tile_bytes
from mcpc.backend.lowering import LoweringContext, register_lowering
from mcpc.backend.memory import align_up
from mcpc.backend.schedule import Kernel, Step
from mcpc.errors import PassError, UnsupportedError
from mcpc.ir.ops import DequantizeOp, MatMulQAOp, MatMulW4A16Op
from mcpc.ir.ops_qmatmul import rows_dequantize


def qmatmul_sram_bytes(op: MatMulW4A16Op, slots: tuple[int, int], align: int, with_zp: bool) -> int:
    """SRAM of the kernel: A, codes, scale (and zero-point) tiles per input slot, output slots,
    and the f32 accumulator when the result is not f32."""
    a, codes, scale = (v.type for v in op.operands[:3])
    tm, tn, tk = _tile(op)
    w, s = codes.dtype.name, scale.dtype.name
    groups = _groups(tk, int(op.attrs["group_size"]))
    ins = align_up(tile_bytes(a.dtype.name, tm, tk), align) + align_up(tile_bytes(w, tk, tn), align)
    ins += align_up(tile_bytes(s, groups, tn), align)
    if with_zp:
        ins += align_up(_zp_tile_bytes(w, groups, tn, bool(op.attrs["trans_b"])), align)
    out = op.result.type.dtype.name
    total = slots[0] * ins + slots[1] * align_up(tile_bytes(out, tm, tn), align)
    return total + (align_up(tm * tn * 4, align) if out != "f32" else 0)


def _groups(kk: int, group: int) -> int:
    return -(-kk // group) if group else 1


def _zp_tile_bytes(w: str, groups: int, nn: int, trans_b: bool) -> int:
    # dense rows, each starting on a byte: [groups, nn] or [nn, groups]
    return tile_bytes(w, nn, groups) if trans_b else tile_bytes(w, groups, nn)


def _tile(op: MatMulW4A16Op | MatMulQAOp) -> tuple[int, int, int]:
    a = op.operands[0].type
    m, k, n = 1, a.shape[-1], op.result.type.shape[-1]
    for d in a.shape[:-1]:
        m *= d
    tile = list(op.attrs["tile"]) or [0, 0, 0]
    return tuple(min(t or d, d) for t, d in zip(tile, (m, n, k), strict=True))  # type: ignore[return-value]


@register_lowering(MatMulW4A16Op)
def lower_matmul_w4a16(op: MatMulW4A16Op, ctx: LoweringContext) -> Kernel:
    """One kernel computing the product; see the module docstring."""
    a_val, c_val, s_val, z_val = op.operands
    a_addr, at = ctx.dram(a_val)
    w_addr, wt = ctx.dram(c_val)
    s_addr, st = ctx.dram(s_val)
    out_addr, ot = ctx.dram(op.result)
    zp = ctx.constant(z_val)
    if zp is None:
        raise UnsupportedError(f"{op.describe()}: the zero points must be a constant")
    with_zp = bool(zp.any())
    z_addr = ctx.dram(z_val)[0] if with_zp else 0
    trans_b, group = bool(op.attrs["trans_b"]), int(op.attrs["group_size"])
    k, n = at.shape[-1], ot.shape[-1]
    m = at.numel // k if k else 0
    if k == 0:
        raise UnsupportedError(f"{op.describe()}: a matmul with an empty contraction (K = 0) is not lowered")
    if m == 0 or n == 0:
        return Kernel([], ctx.in_slots, ctx.out_slots)
    tm, tn, tk = _tile(op)
    a_dt, w_dt, s_dt, out_dt = at.dtype.name, wt.dtype.name, st.dtype.name, ot.dtype.name
    need = qmatmul_sram_bytes(op, (ctx.in_slots, ctx.out_slots), ctx.align, with_zp)
    if need > ctx.sram_budget:
        if not op.attrs["tile"] or ctx.sram_budget < ctx.target.sram.size_bytes:
            hint = "; run the tile-matmul pass" if not op.attrs["tile"] else ""
            raise PassError(
                f"matmul_w4a16 tile [{tm}, {tn}, {tk}] needs {need} bytes of SRAM, the budget is "
                f"{ctx.sram_budget}{hint}"
            )
        raise ctx.does_not_fit(op, f"the matmul_w4a16 tile [{tm}, {tn}, {tk}]", need)
    groups_t = _groups(tk, group)
    n_steps = -(-m // tm) * -(-n // tn) * -(-k // tk)
    slots = ctx.stream_in_slots(
        n_steps, m, lambda s: qmatmul_sram_bytes(op, (s, ctx.out_slots), ctx.align, with_zp)
    )
    arena = ctx.arena()
    a_ring = arena.ring(slots, tile_bytes(a_dt, tm, tk), "A tile")
    w_ring = arena.ring(slots, tile_bytes(w_dt, tk, tn), "codes tile")
    s_ring = arena.ring(slots, tile_bytes(s_dt, groups_t, tn), "scale tile")
    z_ring = (
        arena.ring(slots, _zp_tile_bytes(w_dt, groups_t, tn, trans_b), "zero-point tile") if with_zp else None
    )
    o_ring = arena.ring(ctx.out_slots, tile_bytes(out_dt, tm, tn), "output tile")
    direct = out_dt == "f32"
    acc_buf = None if direct else arena.alloc(tm * tn * 4, "f32 accumulator")
    ab, ob = at.dtype.bits // 8, ot.dtype.bits // 8
    groups_all = _groups(k, group)
    em = ctx.emitter

    def dma(mnemonic: str, dram: int, sram: int, rows: int, row_bytes: int, dram_stride: int, reg: int = 0):
        return em.emit(mnemonic, dram=dram, sram=sram, rows=rows, row_bytes=row_bytes,
                       dram_stride=dram_stride, sram_stride=row_bytes, rows_reg=reg)  # fmt: skip

    def rows_reg(i0: int) -> int:
        """The run-time row count of the row tile at i0 (a prefill's token rows, row_extent.py)."""
        reg = ctx.rows_reg(a_val, i0, k)
        return reg if reg and ctx.rows_reg(op.result, i0, n) == reg else 0

    def qtile(base: int, dtype: str, rows_total_cols: int, r0: int, c0: int, rows: int, cols: int, sram: int):
        """Load rows r0.. and columns c0.. of a dense [*, rows_total_cols] matrix of ``dtype``."""
        row_bytes, stride = nbytes(dtype, cols), nbytes(dtype, rows_total_cols)
        return dma("load", base + r0 * stride + nbytes(dtype, c0), sram, rows, row_bytes, stride)

    steps: list[Step] = []
    r = g = 0
    for i0 in range(0, m, tm):
        for j0 in range(0, n, tn):
            mm, nn = min(tm, m - i0), min(tn, n - j0)
            o_slot = o_ring.addr(g)
            c_buf = o_slot if direct else acc_buf
            reg = rows_reg(i0)
            for k0 in range(0, k, tk):
                kk = min(tk, k - k0)
                g0, gg = (k0 // group, _groups(kk, group)) if group else (0, 1)
                sa, sw, ss = a_ring.addr(r), w_ring.addr(r), s_ring.addr(r)
                sz = z_ring.addr(r) if z_ring is not None else 0
                loads = [dma("load", a_addr + (i0 * k + k0) * ab, sa, mm, kk * ab, k * ab, reg)]
                if trans_b:  # codes [N, K]: rows j0.., columns k0..; qparams [N, groups]
                    loads.append(qtile(w_addr, w_dt, k, j0, k0, nn, kk, sw))
                    loads.append(qtile(s_addr, s_dt, groups_all, j0, g0, nn, gg, ss))
                    if with_zp:
                        loads.append(qtile(z_addr, w_dt, groups_all, j0, g0, nn, gg, sz))
                else:  # codes [K, N]: rows k0.., columns j0..; qparams [groups, N]
                    loads.append(qtile(w_addr, w_dt, n, k0, j0, kk, nn, sw))
                    loads.append(qtile(s_addr, s_dt, n, g0, j0, gg, nn, ss))
                    if with_zp:
                        loads.append(qtile(z_addr, w_dt, n, g0, j0, gg, nn, sz))
                computes = [
                    em.emit("setq", scale_ptr=ss, zp_ptr=sz, group_size=group),
                    em.emit("matmul_w4a16", a=sa, b=sw, c=c_buf, m=mm, n=nn, k=kk, a_stride=kk,
                            b_stride=kk if trans_b else nn, c_stride=nn, in_dtype=a_dt, w_dtype=w_dt,
                            s_dtype=s_dt, acc=int(k0 > 0), trans_b=int(trans_b), m_reg=reg),
                ]  # fmt: skip
                step = Step(loads, computes)
                if k0 + kk >= k:
                    if not direct:
                        step.computes.append(em.emit("vun", func="copy", in_dtype="f32", out_dtype=out_dt,
                                                     dst=o_slot, src=acc_buf, rows=mm, cols=nn,
                                                     dst_stride=nn, src_stride=nn, rows_reg=reg))  # fmt: skip
                    step.stores.append(
                        dma("store", out_addr + (i0 * n + j0) * ob, o_slot, mm, nn * ob, n * ob, reg)
                    )
                    g += 1
                r += 1
                steps.append(step)
    return ctx.kernel(steps, arena, slots)


@register_lowering(DequantizeOp)
def lower_dequantize(op: DequantizeOp, ctx: LoweringContext) -> Kernel:
    """A dequantize of codes blocked along their last axis (``ops_qmatmul.rows_dequantize``): per
    tile of rows, load the codes, the scales and (when it is not a constant of zeros) the zero
    points, ``setq`` their SRAM addresses, ``vdequant``, store.  Other dequantizes were written as
    elementwise ops by ``expand-quantize``; one reaching here is refused naming its node."""
    if not rows_dequantize(op):
        raise UnsupportedError(
            f"backend: {op.describe()} is not blocked along its last axis over integer codes; run "
            "expand-quantize before the backend"
        )
    x_val, s_val, z_val = op.operands
    x_addr, xt = ctx.dram(x_val)
    s_addr, st = ctx.dram(s_val)
    out_addr, ot = ctx.dram(op.result)
    zconst = ctx.constant(z_val)
    with_zp = zconst is None or bool(zconst.any())
    cols = xt.shape[-1]
    rows = xt.numel // cols if cols else 0
    if rows == 0 or cols == 0:
        return Kernel([], ctx.in_slots, ctx.out_slots)
    block = int(op.attrs["block_size"])
    groups = -(-cols // block)
    group = block if groups > 1 else 0
    x_dt, s_dt, out_dt = xt.dtype.name, st.dtype.name, ot.dtype.name
    per_row_in = [nbytes(x_dt, cols), nbytes(s_dt, groups)] + ([nbytes(x_dt, groups)] if with_zp else [])
    per_row_out = [nbytes(out_dt, cols)]
    cap = ((1 << 24) - 1) // max(*per_row_in, *per_row_out)  # one load/store per operand: u24 row_bytes
    tr = ctx.rows_that_fit(per_row_in, per_row_out, max_rows=max(1, min(rows, cap)))
    if tr == 0:
        raise ctx.does_not_fit(
            op, "one row of codes, scales and result", ctx.row_bytes_needed(per_row_in, per_row_out)
        )
    z_addr = ctx.dram(z_val)[0] if with_zp else 0
    arena = ctx.arena()
    rings = [
        arena.ring(ctx.in_slots, tr * b, what)
        for b, what in zip(per_row_in, ("codes", "scales", "zero points"), strict=False)
    ]
    o_ring = arena.ring(ctx.out_slots, tr * per_row_out[0], "result rows")
    em = ctx.emitter
    steps: list[Step] = []
    for i, r0 in enumerate(range(0, rows, tr)):
        n = min(tr, rows - r0)
        srcs = [(x_addr, per_row_in[0]), (s_addr, per_row_in[1])] + (
            [(z_addr, per_row_in[2])] if with_zp else []
        )
        loads = [
            em.emit("load", dram=base + r0 * rb, sram=ring.addr(i), rows=1, row_bytes=n * rb)
            for (base, rb), ring in zip(srcs, rings, strict=False)
        ]
        zp_ptr = rings[2].addr(i) if with_zp else 0
        computes = [
            em.emit("setq", scale_ptr=rings[1].addr(i), zp_ptr=zp_ptr, group_size=group),
            em.emit("vdequant", in_dtype=x_dt, out_dtype=out_dt, s_dtype=s_dt, dst=o_ring.addr(i),
                    src=rings[0].addr(i), rows=n, cols=cols, dst_stride=cols, src_stride=cols),
        ]  # fmt: skip
        ob = per_row_out[0]
        stores = [em.emit("store", dram=out_addr + r0 * ob, sram=o_ring.addr(i), rows=1, row_bytes=n * ob)]
        steps.append(Step(loads, computes, stores))
    return ctx.kernel(steps, arena)


@register_lowering(MatMulQAOp)
def lower_matmul_qa(op: MatMulQAOp, ctx: LoweringContext) -> Kernel:
    """``mcp.matmul_qa`` as ``matmul_w4a16``'s kernel shape: per step the A tile, the codes tile,
    the fused scales of the tile's columns (unless one scale serves all: then ``scale_w``) and the
    activation zero point (unless 0) are loaded; ``setq`` then ``vmmul.q4f8`` (int4 × fp8) or
    ``matmul_i8``; the f32 accumulator is rounded once to the result dtype and stored."""
    a_val, c_val, s_val, z_val = op.operands
    a_addr, at = ctx.dram(a_val)
    w_addr, wt = ctx.dram(c_val)
    s_addr, st = ctx.dram(s_val)
    out_addr, ot = ctx.dram(op.result)
    za = ctx.constant(z_val)
    scales = ctx.constant(s_val)
    if za is None or scales is None:
        raise UnsupportedError(f"{op.describe()}: the fused scales and the zero point must be constants")
    with_zp, per_column = bool(np.asarray(za).astype(np.int64).any()), st.shape[0] > 1
    z_addr = ctx.dram(z_val)[0]
    trans_b = bool(op.attrs["trans_b"])
    k, n = at.shape[-1], ot.shape[-1]
    m = at.numel // k if k else 0
    if k == 0:
        raise UnsupportedError(f"{op.describe()}: a matmul with an empty contraction (K = 0) is not lowered")
    if m == 0 or n == 0:
        return Kernel([], ctx.in_slots, ctx.out_slots)
    tm, tn, tk = _tile(op)
    a_dt, w_dt, q_dt, out_dt = at.dtype.name, wt.dtype.name, z_val.type.dtype.name, ot.dtype.name
    mnemonic = "vmmul.q4f8" if (q_dt, w_dt) == ("i4", "f8e4m3fn") else "matmul_i8"
    if mnemonic == "matmul_i8" and (q_dt not in ("i8", "u8") or w_dt not in ("i8", "i4")):
        raise UnsupportedError(
            f"{op.describe()}: {q_dt} activations x {w_dt} weights have no instruction (vmmul.q4f8 is "
            "int4 x fp8, matmul_i8 is int8/uint8 x int8/int4)"
        )
    arena = ctx.arena()
    a_ring = arena.ring(ctx.in_slots, tile_bytes(a_dt, tm, tk), "A tile")
    w_ring = arena.ring(ctx.in_slots, tile_bytes(w_dt, tk, tn), "codes tile")
    s_ring = arena.ring(ctx.in_slots, tn * 4, "fused scales") if per_column else None
    z_ring = arena.ring(ctx.in_slots, 1, "activation zero point") if with_zp else None
    o_ring = arena.ring(ctx.out_slots, tile_bytes(out_dt, tm, tn), "output tile")
    direct = out_dt == "f32"
    acc_buf = None if direct else arena.alloc(tm * tn * 4, "f32 accumulator")
    if arena.peak > ctx.sram_budget:
        raise ctx.does_not_fit(op, f"the {mnemonic} tile [{tm}, {tn}, {tk}]", arena.peak)
    ab, ob = at.dtype.bits // 8, ot.dtype.bits // 8
    em = ctx.emitter

    def load(dram: int, sram: int, rows: int, row_bytes: int, dram_stride: int):
        return em.emit("load", dram=dram, sram=sram, rows=rows, row_bytes=row_bytes, dram_stride=dram_stride,
                       sram_stride=row_bytes)  # fmt: skip

    scale_w = float(np.asarray(scales, np.float32).reshape(-1)[0])
    steps: list[Step] = []
    r = g = 0
    for i0 in range(0, m, tm):
        for j0 in range(0, n, tn):
            mm, nn = min(tm, m - i0), min(tn, n - j0)
            o_slot = o_ring.addr(g)
            c_buf = o_slot if direct else acc_buf
            for k0 in range(0, k, tk):
                kk = min(tk, k - k0)
                sa, sw = a_ring.addr(r), w_ring.addr(r)
                loads = [load(a_addr + (i0 * k + k0) * ab, sa, mm, kk * ab, k * ab)]
                if trans_b:
                    loads.append(
                        load(w_addr + nbytes(w_dt, j0 * k + k0), sw, nn, nbytes(w_dt, kk), nbytes(w_dt, k))
                    )
                else:
                    loads.append(
                        load(w_addr + nbytes(w_dt, k0 * n + j0), sw, kk, nbytes(w_dt, nn), nbytes(w_dt, n))
                    )
                if s_ring is not None:
                    loads.append(load(s_addr + j0 * 4, s_ring.addr(r), 1, nn * 4, nn * 4))
                if z_ring is not None:
                    loads.append(load(z_addr, z_ring.addr(r), 1, 1, 1))
                computes = [
                    em.emit("setq", scale_a=float(op.attrs["scale_a"]), scale_w=scale_w, scale_o=1.0,
                            zp_ptr=z_ring.addr(r) if z_ring is not None else 0,
                            scale_ptr=s_ring.addr(r) if s_ring is not None else 0),
                    em.emit(mnemonic, a=sa, b=sw, c=c_buf, m=mm, n=nn, k=kk, a_stride=kk,
                            b_stride=kk if trans_b else nn, c_stride=nn, in_dtype=a_dt, q_dtype=q_dt,
                            w_dtype=w_dt, acc=int(k0 > 0), trans_b=int(trans_b)),
                ]  # fmt: skip
                step = Step(loads, computes)
                if k0 + kk >= k:
                    if not direct:
                        step.computes.append(em.emit("vun", func="copy", in_dtype="f32", out_dtype=out_dt,
                                                     dst=o_slot, src=acc_buf, rows=mm, cols=nn,
                                                     dst_stride=nn, src_stride=nn))  # fmt: skip
                    step.stores.append(
                        em.emit("store", dram=out_addr + (i0 * n + j0) * ob, sram=o_slot, rows=mm,
                                row_bytes=nn * ob, dram_stride=n * ob, sram_stride=nn * ob)
                    )  # fmt: skip
                    g += 1
                r += 1
                steps.append(step)
    return ctx.kernel(steps, arena)
