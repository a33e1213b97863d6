"""Lowering of the paged KV cache ops (``ir/ops_kv.py``): ``scatter`` of new K/V rows to their slots,
``gather`` of a sequence's blocks and ``vattn`` over them.

``mcp.kv_store new, slot {global}`` — one copy step: the slots (i32, one per token row) and, per KV
head h, head h's B·S new rows are loaded into buffers of their own, and one ``scatter`` per head
writes row i to row ``slot[i]`` of head h's part of the global (``limit`` = the rows of that part,
so a bad slot traps before a byte is written).  No buffer is reused, so the heads' scatters do not
wait for each other, and the new rows (the K/V projections' results, kept in SRAM) are copied on
chip rather than stored and loaded back (``backend/residency.py``).  When the heads' rows exceed an
eighth of the scratchpad, one copy step per head loads them through the kernel's input slots.

``mcp.paged_attention q, gather, start, length, nblocks`` — the block ids and the window table
(starts, then lengths: ``vattn``'s layout) are loaded once; then per KV head kh one step:
``gather`` the K blocks and ``gather`` the V blocks of head kh (one gathered row = one block of
one head, ``block_size · D`` elements; ``count`` = the capacity, the length of ``gather``;
``count_reg`` = the register of ``nblocks``), load the query rows of the heads of kh's group
(head after head, each head's B·S rows), one ``vattn`` over them (``share`` = the group: the
heads share the window table), and store the rows back head by head.  The ``vattn`` traps a
window reaching past ``r[nblocks] · block_size`` rows (its ``kv_reg``: a register the entry's
register kernel sets to that product), so rows of blocks not gathered in this call are never read.

With ``heat_global`` (a decoder build whose KV policy reads the attention) each ``vattn`` sets its
``heat`` bit: it also writes, after its result rows, a [capacity, group] f32 table of each query
head's summed attention per gathered position, and one more ``store`` (its row count the register
of the K/V rows in use) writes the group's columns of the layer's rows of the heat global.

Work per call follows the context in use: the gathers move ``r[nblocks]`` blocks (a run-time
extent), ``vattn`` is costed from the window lengths it reads.  SRAM holds the gathered K and V of
the whole capacity (double-buffered across KV heads); a build whose capacity does not fit is
refused (``KVCacheDoesNotFit``, an UnsupportedError naming the op and the sizes).
"""

from __future__ import annotations

from typing import Any

from mcpc.arch.isa import vattn_heat_offset
from mcpc.backend.lower_shape import U20, U24, elem_bytes
from mcpc.backend.lowering import LoweringContext, register_lowering
from mcpc.backend.schedule import Kernel, Step
from mcpc.errors import PassError, UnsupportedError
from mcpc.ir import ops
from mcpc.kv.pool import DESC, DESC_BYTES, desc_column

# kv_store's heads get a buffer each in one copy step while their rows take at most this fraction
# (1 / ONE_STEP_SHARE) of the scratchpad; beyond, one copy step per head through the input slots.
ONE_STEP_SHARE = 8


class KVCacheDoesNotFit(UnsupportedError, PassError):
    """The SRAM a paged-KV lowering needs exceeds its region: a PassError, so the compile driver
    tries the next, larger region, and an UnsupportedError (exit 4) once none is left."""


def _fits(ctx: LoweringContext, op: Any, need: int, what: str) -> None:
    if need > ctx.sram_budget:
        raise KVCacheDoesNotFit(
            f"backend: {op.describe()}: {what} need {need} bytes of SRAM, more than the "
            f"{ctx.sram_budget} bytes available to it on target {ctx.target.name} "
            f"({ctx.target.sram.size_bytes} bytes of SRAM): build for a smaller --max-seq or "
            "--max-batch, or a target with more SRAM (--set sram.size_bytes=...)"
        )


def _field(op: Any, name: str, value: int, limit: int, what: str) -> None:
    if value > limit:
        raise UnsupportedError(
            f"backend: {op.describe()}: {what} = {value} exceeds the {name} field's range (max {limit})"
        )


@register_lowering(ops.KVStoreOp)
def lower_kv_store(op: Any, ctx: LoweringContext) -> list[Kernel]:
    """Slots and every head's new rows loaded in one copy step, one ``scatter`` per head (or, for
    rows too many for that, one copy step per head through the input slots)."""
    new, slot = op.operands
    na, nt = ctx.dram(new)
    sa, _ = ctx.dram(slot)
    b, h, s, d = nt.shape
    rows = b * s
    if rows == 0 or d == 0 or h == 0:
        return []
    esz = elem_bytes(nt, op)
    gbase = ctx.globals[op.attrs["global"]]
    per_head = ctx.global_types[op.attrs["global"]].shape[0] // h
    row = d * esz
    _field(op, "count", rows, U20, "the new rows per head (batch x seq)")
    _field(op, "limit", per_head, U24, "the cache rows per head")
    _field(op, "row_bytes", s * row, U24, "the bytes of one sequence's new rows")
    emit = ctx.emitter.emit
    # a prefill's token rows in use (backend/row_extent.py): the rows of the call's leading tokens
    reg = ctx.rows_reg(slot, 0, 1)

    def head_copy(head: int, at: int) -> tuple[Any, Any]:  # head's new rows into ``at``, scattered
        if reg and b == 1:  # one sequence: its rows in use, one DMA row each
            load = emit("load", dram=na + head * s * row, sram=at, rows=s, row_bytes=row, dram_stride=row,
                        sram_stride=row, rows_reg=reg)  # fmt: skip
        else:
            load = emit("load", dram=na + head * s * row, sram=at, rows=b, row_bytes=s * row,
                        dram_stride=h * s * row, sram_stride=s * row)  # fmt: skip
        scatter = emit("scatter", dram=gbase + head * per_head * row, sram_idx=idx, count=rows,
                       row_bytes=row, dram_stride=row, sram=at, sram_stride=row, limit=per_head,
                       count_reg=reg)  # fmt: skip
        return load, scatter

    need = 4 * rows + h * rows * row + 2 * ctx.align
    if need <= ctx.target.sram.size_bytes // ONE_STEP_SHARE:  # one copy step, a buffer per head
        _fits(ctx, op, need, f"the {rows} slots and the {h} heads' {rows} new rows of {row} bytes")
        arena = ctx.arena()
        idx = arena.alloc(4 * rows, "cache slots")
        buf = arena.alloc(h * rows * row, "new rows")
        copies = [head_copy(head, buf + head * rows * row) for head in range(h)]
        loads = [emit("load", dram=sa, sram=idx, rows=1, row_bytes=4 * rows), *(c[0] for c in copies)]
        return [ctx.kernel([Step(loads=loads, stores=[c[1] for c in copies])], arena)]
    # many heads' rows against a small scratchpad: one copy step per head through the input slots
    need = 4 * rows + ctx.in_slots * rows * row + 2 * ctx.in_slots * ctx.align
    _fits(ctx, op, need, f"the {rows} slots and {ctx.in_slots} buffer(s) of {rows} new rows of {row} bytes")
    arena = ctx.arena()
    idx = arena.alloc(4 * rows, "cache slots")
    ring = arena.ring(ctx.in_slots, rows * row, "new rows")
    steps = [Step(loads=[emit("load", dram=sa, sram=idx, rows=1, row_bytes=4 * rows)])]
    for head in range(h):
        load, scatter = head_copy(head, ring.addr(len(steps)))
        steps.append(Step(loads=[load], stores=[scatter]))
    return [ctx.kernel(steps, arena)]


def _kvdecomp_loads(
    op: Any, ctx: LoweringContext, kh: int, ids: int, kv_buf: int, cap: int, reg: int
) -> list[Any]:
    """A build storing its cache compressed (module global ``kv_desc``, ``mcpc.kv.pool``): one
    ``kvdecomp`` for K and one for V of KV head ``kh`` in place of the two ``gather``s, reading each
    gathered block through its descriptor (the layer from the K global's name ``kv_k_<i>``)."""
    d, bs = op.operands[0].type.shape[3], int(op.attrs["block_size"])
    kt = ctx.global_types[op.attrs["k_global"]]
    kv, kvb = int(op.attrs["kv_heads"]), elem_bytes(kt, op)
    per_head = kt.shape[0] // kv
    blocks, block_bytes = per_head // bs, bs * d * kvb
    try:
        layer = int(str(op.attrs["k_global"]).rsplit("_", 1)[1])
    except (IndexError, ValueError):
        raise UnsupportedError(
            f"backend: {op.describe()}: a compressed KV cache needs the layer in the K global's name "
            f"(kv_k_<layer>), not @{op.attrs['k_global']}"
        ) from None
    _field(op, "limit", blocks, U24, "the cache blocks per head")
    out = []
    for part, name in enumerate((op.attrs["k_global"], op.attrs["v_global"])):
        column = desc_column(layer, part, kh, kv, blocks - 1)
        out.append(ctx.emitter.emit(
            "kvdecomp", dram=ctx.globals[name] + kh * per_head * d * kvb,
            desc=ctx.globals[DESC] + DESC_BYTES * column,
            sram_idx=ids, sram=kv_buf + part * cap * d * kvb, count=op.operands[1].type.shape[0],
            row_bytes=block_bytes, limit=blocks, head_dim=d, kv_dtype=kt.dtype.name, count_reg=reg,
        ))  # fmt: skip
    return out


@register_lowering(ops.PagedAttentionOp)
def lower_paged_attention(op: Any, ctx: LoweringContext) -> list[Kernel]:
    """Block ids and windows loaded once; per KV head: gather K and V, load Q, ``vattn``, store."""
    q, gather, start, length, _ = op.operands
    qa, qt = ctx.dram(q)
    ga, gt = ctx.dram(gather)
    st_a, _ = ctx.dram(start)
    ln_a, _ = ctx.dram(length)
    out, _ = ctx.dram(op.result)
    b, hq, s, d = qt.shape
    kv, bs = int(op.attrs["kv_heads"]), int(op.attrs["block_size"])
    group, rows, cap_blocks = hq // kv, b * s, gt.shape[0]
    if rows == 0 or d == 0 or hq == 0:
        return []
    k_name, v_name = op.attrs["k_global"], op.attrs["v_global"]
    kt, vt = ctx.global_types[k_name], ctx.global_types[v_name]
    if kt.dtype != vt.dtype:
        raise UnsupportedError(
            f"backend: {op.describe()}: K (@{k_name}: {kt.dtype.name}) and V (@{v_name}: {vt.dtype.name}) "
            "must share one dtype (vattn reads both as kv_dtype)"
        )
    qb, kvb = elem_bytes(qt, op), elem_bytes(kt, op)
    per_head = kt.shape[0] // kv
    cap = cap_blocks * bs  # gathered K/V rows at full capacity
    block_bytes = bs * d * kvb
    reg_blocks, reg_rows = ctx.registers[op]
    for name, value, limit, what in (
        ("count", cap_blocks, U20, "the block table's length"),
        ("limit", per_head // bs, U24, "the cache blocks per head"),
        ("row_bytes", block_bytes, U24, "the bytes of one block of one head"),
        ("kv_rows", cap, U20, "the gathered rows at capacity"),
        ("rows", group * rows, U20, "the query rows of one KV head"),
        ("head_dim", d, (1 << 16) - 1, "the head dim"),
        ("share", group, 255, "the query heads per KV head"),
        ("row_bytes", s * d * qb, U24, "the bytes of one sequence's query rows of one head"),
    ):
        _field(op, name, value, limit, what)
    kv_bytes = 2 * cap * d * kvb
    q_bytes = group * rows * d * qb
    heat = _heat(op, ctx, group * rows, d, qt.dtype.name, group)
    o_bytes = q_bytes if heat is None else heat[0] + cap * group * 4
    need = 4 * cap_blocks + 8 * rows + ctx.in_slots * (kv_bytes + q_bytes) + ctx.out_slots * o_bytes
    need += (2 + 2 * ctx.in_slots + ctx.out_slots) * ctx.align
    _fits(ctx, op, need, f"the gathered K and V of {cap_blocks} blocks of {bs} x {d} {kt.dtype.name} "
          f"({kv_bytes} bytes a KV head, x{ctx.in_slots} buffers) and {group * rows} query rows")  # fmt: skip
    arena = ctx.arena()
    ids = arena.alloc(4 * cap_blocks, "block ids")
    win = arena.alloc(8 * rows, "window table")
    kv_ring = arena.ring(ctx.in_slots, kv_bytes, "gathered K and V")
    q_ring = arena.ring(ctx.in_slots, q_bytes, "query rows")
    o_ring = arena.ring(ctx.out_slots, o_bytes, "attention rows" + ("" if heat is None else " and heat"))
    emit = ctx.emitter.emit
    head_rows = s * d * qb  # one sequence's rows of one head, contiguous in [B, Hq, S, D]
    steps = [Step(loads=[
        emit("load", dram=ga, sram=ids, rows=1, row_bytes=4 * cap_blocks),
        emit("load", dram=st_a, sram=win, rows=1, row_bytes=4 * rows),
        emit("load", dram=ln_a, sram=win + 4 * rows, rows=1, row_bytes=4 * rows),
    ])]  # fmt: skip
    for kh in range(kv):
        rank, kv_buf = len(steps), kv_ring.addr(len(steps))
        q_buf, o_buf = q_ring.addr(rank), o_ring.addr(kh)
        if DESC in ctx.globals:  # the cache is stored compressed: blocks read through their descriptors
            loads = _kvdecomp_loads(op, ctx, kh, ids, kv_buf, cap, reg_blocks)
        else:
            loads = [
                emit("gather", dram=ctx.globals[name] + kh * per_head * d * kvb, sram_idx=ids,
                     count=cap_blocks, row_bytes=block_bytes, dram_stride=block_bytes,
                     sram=kv_buf + part * cap * d * kvb, sram_stride=block_bytes, limit=per_head // bs,
                     count_reg=reg_blocks)
                for part, name in enumerate((k_name, v_name))
            ]  # fmt: skip
        loads += [
            emit("load", dram=qa + (kh * group + g) * head_rows, sram=q_buf + g * rows * d * qb, rows=b,
                 row_bytes=head_rows, dram_stride=hq * head_rows, sram_stride=head_rows)
            for g in range(group)
        ]  # fmt: skip
        attn = emit(
            "vattn", in_dtype=qt.dtype.name, kv_dtype=kt.dtype.name, dst=o_buf, src=q_buf, kv=kv_buf, win=win,
            rows=group * rows, head_dim=d, kv_rows=cap, share=group, kv_reg=reg_rows,
            scale=float(op.attrs["scale"]), heat=int(heat is not None),
        )  # fmt: skip
        stores = [
            emit("store", dram=out + (kh * group + g) * head_rows, sram=o_buf + g * rows * d * qb, rows=b,
                 row_bytes=head_rows, dram_stride=hq * head_rows, sram_stride=head_rows)
            for g in range(group)
        ]  # fmt: skip
        if heat is not None:
            stores.append(_store_heat(ctx, heat[1], kh, group, hq, cap, o_buf + heat[0], reg_rows))
        steps.append(Step(loads=loads, computes=[attn], stores=stores))
    return [ctx.kernel(steps, arena)]


def _heat(op: Any, ctx: LoweringContext, q_rows: int, d: int, q_dtype: str, group: int):
    """(offset of the heat table from a vattn's dst, DRAM byte address of this layer's heat rows)
    when the op writes its attention heat (``heat_global``), else None."""
    name = op.attrs.get("heat_global")
    if not name:
        return None
    _field(op, "row_bytes", group * 4, U24, "the heat bytes of one position for one KV head's group")
    row = int(op.attrs["heat_row"]) * ctx.global_types[name].shape[1] * 4
    return vattn_heat_offset(q_rows, d, q_dtype), ctx.globals[name] + row


def _store_heat(ctx: LoweringContext, base: int, kh: int, group: int, hq: int, cap: int, sram: int,
                reg_rows: int) -> Any:  # fmt: skip
    """Store KV head ``kh``'s heat table (cap x group f32, the rows in use: ``rows_reg``) into its
    group's columns of the heat global's rows [cap, hq]."""
    return ctx.emitter.emit("store", dram=base + kh * group * 4, sram=sram, rows=cap, row_bytes=group * 4,
                            dram_stride=hq * 4, sram_stride=group * 4, rows_reg=reg_rows)  # fmt: skip
