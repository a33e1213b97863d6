"""Lowering of program state: host registers, scalar arithmetic, global load/store at a run-time offset.

Registers.  The module's host registers take r1, r2, … in declaration order (the program's HREG
section names them, so the host sets them by name).  In each function, every other scalar the
state ops need gets a register of its own, written once by the function's *register kernel* —
the first kernel of the entry (``Kernel(sets_registers=True)``, see ``schedule``): ``salu`` for
``mcp.scalar`` (the instruction's exact semantics), ``setr`` for a constant offset, and one
``salu mul`` per distinct (offset, row size) of the global accesses turning the row offset into
a byte offset (the K and V stores of every layer at one position share one), and one ``salu mul``
per block count of ``mcp.paged_attention`` giving the K/V rows in use (its ``vattn``'s ``kv_reg``;
the gathers read the block count's register itself as ``count_reg``, ``backend/lower_kv.py``).  No register is
written twice in an entry, so a DMA reading one needs only to follow the register kernel.
Registers are not reused: an entry needing more than r15 is refused (UnsupportedError).

Global access.  ``mcp.global_load`` / ``mcp.global_store`` are copy kernels (``copy_kernel``)
between the global's rows and the value's DRAM bytes whose global-side DMAs carry ``dram_reg``
= the byte-offset register.  The verifier proved ``0 <= offset`` and ``offset + rows <= the
global's rows`` for every register value the declarations allow (``ir/state.py``), so such a DMA
stays inside its persistent region; the scheduler and ``check_hazards`` still treat a
register-offset access as touching all of DRAM (conservative: it is ordered after every earlier
store and before every later access).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from mcpc.arch.isa import N_REGS
from mcpc.backend.emitter import debug_context
from mcpc.backend.lower_shape import CopyPart, contiguous_strides, copy_kernel, elem_bytes
from mcpc.backend.lowering import LoweringContext, register_lowering
from mcpc.backend.schedule import Kernel, Step
from mcpc.errors import UnsupportedError
from mcpc.ir import ops
from mcpc.ir.ops_state import SCALAR


def host_register_numbers(module: Any) -> dict[str, int]:
    """Host register name -> register number (r1, r2, … in declaration order)."""
    regs = getattr(module, "host_regs", {})
    if len(regs) > N_REGS - 1:
        raise UnsupportedError(
            f"module @{module.name} declares {len(regs)} host registers; at most {N_REGS - 1}"
        )
    return {name: i + 1 for i, name in enumerate(regs)}


def host_register_records(module: Any) -> list[dict]:
    """The HREG section: one ``{name, reg, min, max, entries}`` per declared host register."""
    numbers = host_register_numbers(module)
    out = []
    for name, decl in getattr(module, "host_regs", {}).items():
        readers = [
            fn.name
            for fn in module.functions.values()
            if any(isinstance(op, ops.HostRegOp) and op.attrs["name"] == name for op in fn.ops)
            or (fn.attrs.get("row_extent") or {}).get("reg") == name
        ]
        out.append({"name": name, "reg": numbers[name], "min": decl.min, "max": decl.max, "entries": readers})
    return out


def register_kernel(module: Any, fn: Any, ctx: LoweringContext) -> Kernel | None:
    """The register kernel of ``fn`` (None when it needs none); fills ``ctx.registers`` with the
    register of every scalar value and the byte-offset register of every global access."""
    numbers = host_register_numbers(module)
    free = iter(range(len(numbers) + 1, N_REGS))
    em = ctx.emitter
    computes: list = []
    debug: dict[int, dict] = {}
    reg_of: dict[Any, int] = {}
    byte_offset: dict[tuple[int, int], int] = {}  # (offset register, row bytes) -> its register
    kv_rows: dict[tuple[int, int], int] = {}  # (block count register, block size) -> rows register

    def take(op: Any) -> int:
        r = next(free, None)
        if r is None:
            raise UnsupportedError(
                f"backend: func @{fn.name} needs more than {N_REGS - 1} scalar registers for its host "
                f"registers, offsets and scalar arithmetic (at {op.describe()})"
            )
        return r

    def emit(op: Any, mnemonic: str, **fields: Any) -> None:
        with em.node(op):
            instr = em.emit(mnemonic, **fields)
        computes.append(instr)
        debug[id(instr)] = debug_context(op)

    def register(v: Any, user: Any) -> int:
        """The register holding scalar ``v`` (a constant gets one, set by ``setr``, on first use)."""
        if v in reg_of:
            return reg_of[v]
        value = ctx.constant(v)
        if value is None or v.type != SCALAR:  # the verifier rules this out
            raise UnsupportedError(f"backend: {user.describe()}: scalar operand without a register")
        r = reg_of[v] = take(user)
        emit(user, "setr", reg=r, value=int(np.asarray(value).reshape(())))
        return r

    uses = fn.uses()
    for op in fn.ops:
        if isinstance(op, (ops.HostRegOp, ops.ScalarOp)):
            for user in uses.get(op.result, []):
                offset = (
                    isinstance(user, (ops.GlobalLoadOp, ops.GlobalStoreOp, ops.PagedAttentionOp))
                    and user.operands[-1] is op.result
                )
                if not (isinstance(user, ops.ScalarOp) or offset):
                    raise UnsupportedError(
                        f"backend: {user.describe()} in func @{fn.name} uses the scalar of "
                        f"{op.describe()}: host registers and mcp.scalar results live in scalar "
                        "registers, which only mcp.scalar and the offsets of mcp.global_load / "
                        "mcp.global_store read in this version"
                    )
        if isinstance(op, ops.HostRegOp):
            reg_of[op.result] = numbers[op.attrs["name"]]
        elif isinstance(op, ops.ScalarOp):
            a = register(op.operands[0], op)
            b = register(op.operands[1], op) if len(op.operands) == 2 else 0
            r = reg_of[op.result] = take(op)
            emit(op, "salu", func=op.attrs["func"], rd=r, rs1=a, rs2=b, simm=int(op.attrs["imm"]))
        elif isinstance(op, (ops.GlobalLoadOp, ops.GlobalStoreOp)):
            g = module.globals[op.attrs["global"]]
            row_bytes = g.type.nbytes // g.type.shape[0]
            if g.type.nbytes >= 1 << 31:
                raise UnsupportedError(
                    f"backend: {op.describe()}: global @{g.name} of {g.type.nbytes} bytes: register "
                    "offsets are s32, so a global must stay below 2 GiB"
                )
            rs1 = register(op.operands[-1], op)
            r = byte_offset.get((rs1, row_bytes))
            if r is None:  # accesses at one offset with one row size share it (every layer's KV)
                r = byte_offset[(rs1, row_bytes)] = take(op)
                emit(op, "salu", func="mul", rd=r, rs1=rs1, rs2=0, simm=row_bytes)
            ctx.registers[op] = r
        elif isinstance(op, ops.PagedAttentionOp):
            blocks = register(op.operands[-1], op)
            block = int(op.attrs["block_size"])
            r = kv_rows.get((blocks, block))
            if r is None:  # the K/V rows in use (vattn's kv_reg): one per block count, shared by layers
                r = kv_rows[(blocks, block)] = take(op)
                emit(op, "salu", func="mul", rd=r, rs1=blocks, rs2=0, simm=block)
            ctx.registers[op] = (blocks, r)
    ctx.free_registers = list(free)
    if not computes:
        return None
    return Kernel(
        [Step(computes=computes)], ctx.in_slots, ctx.out_slots, instr_debug=debug, sets_registers=True,
        debug=dict(debug_context(None)),
    )  # fmt: skip


def _with_register(kernels: list[Kernel], reg: int, side: str) -> list[Kernel]:
    """``kernels`` with every ``side`` ("load" or "store") DMA offset by register ``reg``."""
    out = []
    for k in kernels:
        steps = []
        for s in k.steps:
            loads = [i.replace(dram_reg=reg) for i in s.loads] if side == "load" else s.loads
            stores = [i.replace(dram_reg=reg) for i in s.stores] if side == "store" else s.stores
            steps.append(Step(loads, s.computes, stores))
        out.append(dataclasses.replace(k, steps=steps))
    return out


def _global_part(op: Any, ctx: LoweringContext, value: Any, to_global: bool) -> tuple[CopyPart, int]:
    base = ctx.globals[op.attrs["global"]]
    addr, t = ctx.dram(value)
    strides = contiguous_strides(t.shape)
    if to_global:
        return CopyPart(list(t.shape), addr, strides, base, strides), elem_bytes(t, op)
    return CopyPart(list(t.shape), base, strides, addr, strides), elem_bytes(t, op)


@register_lowering(ops.GlobalLoadOp)
def lower_global_load(op: Any, ctx: LoweringContext) -> list[Kernel]:
    """Rows of the global at the register offset copied to the result's DRAM bytes."""
    part, esz = _global_part(op, ctx, op.result, to_global=False)
    return _with_register(copy_kernel(ctx, op, [part], esz), ctx.registers[op], "load")


@register_lowering(ops.GlobalStoreOp)
def lower_global_store(op: Any, ctx: LoweringContext) -> list[Kernel]:
    """The value's DRAM bytes copied over the global's rows at the register offset."""
    part, esz = _global_part(op, ctx, op.operands[0], to_global=True)
    return _with_register(copy_kernel(ctx, op, [part], esz), ctx.registers[op], "store")
