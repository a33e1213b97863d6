"""Checks of a module's program state: declarations, and offsets proven inside their buffers.

``verify_state`` (run by ``Module.verify`` for a module with state) checks that every host
register and global is well declared, that every ``mcp.host_reg`` / ``mcp.global_load`` /
``mcp.global_store`` names a declared one with matching types, and — by interval arithmetic over
the declared register ranges — that every offset keeps its access inside the global for every
value the host may set.  The backend relies on that proof: a register-offset DMA it emits never
leaves its buffer, so one run cannot corrupt the constants or another buffer.
"""

from __future__ import annotations

import numpy as np

from mcpc.arch.numerics import scalar_alu
from mcpc.errors import VerifyError
from mcpc.ir.core import Function, Module, Value
from mcpc.ir.ops_core import ConstantOp
from mcpc.ir.ops_kv import KVStoreOp, PagedAttentionOp
from mcpc.ir.ops_state import SCALAR, GlobalLoadOp, GlobalStoreOp, HostRegOp, ScalarOp

S32 = (-(1 << 31), (1 << 31) - 1)


def verify_state(module: Module) -> None:
    """VerifyError naming the declaration or op (and function) that breaks a rule above."""
    for reg in module.host_regs.values():
        if not (S32[0] <= reg.min <= reg.max <= S32[1]):
            raise VerifyError(
                f"host_reg @{reg.name}: range [{reg.min}, {reg.max}] must be non-empty and within s32"
            )
    for g in module.globals.values():
        t = g.type
        if t.rank < 1 or t.shape[0] < 1:
            raise VerifyError(f"global @{g.name}: type {t} needs rank >= 1 and at least one row")
        if t.dtype.name == "i64":
            raise VerifyError(f"global @{g.name}: i64 lives only at the I/O boundary; use i32")
        row = t.with_shape(t.shape[1:])
        if row.nbytes * t.shape[0] != t.nbytes:
            raise VerifyError(f"global @{g.name}: a row of {t} does not fill whole bytes")
    for fn in module.functions.values():
        scalar_ranges(module, fn)


def scalar_ranges(module: Module, fn: Function) -> dict[int, tuple[int, int]]:
    """The range ``[lo, hi]`` of every scalar offset value of ``fn`` (keyed by ``id(value)``),
    checking the state ops of ``fn`` on the way (VerifyError)."""
    ranges: dict[int, tuple[int, int]] = {}
    where = f"func @{fn.name}"
    for op in fn.ops:
        if isinstance(op, ConstantOp) and op.result.type == SCALAR:
            v = int(np.asarray(op.value).reshape(()))
            ranges[id(op.result)] = (v, v)
        elif isinstance(op, HostRegOp):
            reg = module.host_regs.get(op.attrs["name"])
            if reg is None:
                raise VerifyError(
                    f"{where}: {op.describe()}: no host register @{op.attrs['name']} is declared "
                    f"(declared: {', '.join('@' + n for n in module.host_regs) or 'none'})"
                )
            ranges[id(op.result)] = (reg.min, reg.max)
        elif isinstance(op, ScalarOp):
            ins = [_range(ranges, v, op, where) for v in op.operands]
            imm = int(op.attrs["imm"])
            a = ins[0]
            b = (ins[1][0] + imm, ins[1][1] + imm) if len(ins) == 2 else (imm, imm)
            corners = [_exact(op.attrs["func"], x, y) for x in a for y in b]
            lo, hi = min(corners), max(corners)
            if lo < S32[0] or hi > S32[1] or b[0] < S32[0] or b[1] > S32[1]:
                raise VerifyError(
                    f"{where}: {op.describe()}: {op.attrs['func']} of ranges {list(a)} and {list(b)} "
                    "can leave s32 (the salu would wrap): narrow the host register ranges"
                )
            ranges[id(op.result)] = (lo, hi)
        elif isinstance(op, (GlobalLoadOp, GlobalStoreOp)):
            _check_access(module, op, ranges, where)
        elif isinstance(op, KVStoreOp):
            _, heads, _, d = op.operands[0].type.shape
            _cache_global(module, op, "global", heads, 1, d, op.operands[0].type.dtype, where)
        elif isinstance(op, PagedAttentionOp):
            _check_paged_attention(module, op, ranges, where)
    return ranges


def _global(module: Module, op, name: str, where: str):
    g = module.globals.get(name)
    if g is None:
        raise VerifyError(
            f"{where}: {op.describe()}: no global @{name} is declared "
            f"(declared: {', '.join('@' + n for n in module.globals) or 'none'})"
        )
    return g


def _cache_global(module: Module, op, attr: str, heads: int, block: int, d: int, dtype, where: str):
    """The KV cache global named by ``op.attrs[attr]``: [heads · P, d] with P a multiple of ``block``
    (VerifyError otherwise); ``dtype`` None accepts any float dtype."""
    name = op.attrs[attr]
    t = _global(module, op, name, where).type
    ok = t.rank == 2 and t.shape[1] == d and t.shape[0] % (heads * block) == 0
    ok = ok and (t.dtype == dtype if dtype is not None else t.dtype.is_float)
    if not ok:
        raise VerifyError(
            f"{where}: {op.describe()}: global @{name} : {t} is not a KV cache of {heads} head(s) x "
            f"a multiple of {block} row(s) x {d} {dtype.name if dtype is not None else 'float'}"
        )
    return t


def _check_paged_attention(module: Module, op, ranges: dict, where: str) -> None:
    kv, block = int(op.attrs["kv_heads"]), int(op.attrs["block_size"])
    d = op.operands[0].type.shape[3]
    kt = _cache_global(module, op, "k_global", kv, block, d, None, where)
    vt = _cache_global(module, op, "v_global", kv, block, d, None, where)
    if kt != vt:
        raise VerifyError(f"{where}: {op.describe()}: K cache {kt} and V cache {vt} differ")
    lo, hi = _range(ranges, op.operands[4], op, where)
    g = op.operands[1].type.shape[0]
    heat = op.attrs.get("heat_global")
    if heat:
        t = module.globals[heat].type if heat in module.globals else None
        hq, row = op.operands[0].type.shape[1], int(op.attrs["heat_row"])
        if (
            t is None
            or t.dtype.name != "f32"
            or t.rank != 2
            or t.shape[1] != hq
            or not (0 <= row and row + g * block <= t.shape[0])
        ):
            raise VerifyError(
                f"{where}: {op.describe()}: heat global @{heat} ({t if t is not None else 'not declared'}) "
                f"must be f32 [rows, {hq}] with rows {row}..{row + g * block} for the {g} blocks' positions"
            )
    if lo < 0 or hi > g:
        raise VerifyError(
            f"{where}: {op.describe()}: the block count in [{lo}, {hi}] can leave [0, {g}] (the block "
            "ids given): bound the host register's range"
        )


def _exact(func: str, a: int, b: int) -> int:
    """``func(a, b)`` without wrapping (the interval bounds; wrapping is refused separately)."""
    if func in ("add", "sub", "mul"):
        return {"add": a + b, "sub": a - b, "mul": a * b}[func]
    return scalar_alu(func, a, b)


def _range(ranges: dict, v: Value, op, where: str) -> tuple[int, int]:
    r = ranges.get(id(v))
    if r is None:
        raise VerifyError(
            f"{where}: {op.describe()}: a scalar offset must come from mcp.host_reg, mcp.scalar or a "
            "rank-0 i32 mcp.constant (so that its range is known at compile time)"
        )
    return r


def _check_access(module: Module, op, ranges: dict, where: str) -> None:
    name = op.attrs["global"]
    g = _global(module, op, name, where)
    t = op.results[0].type if isinstance(op, GlobalLoadOp) else op.operands[0].type
    what = "result" if isinstance(op, GlobalLoadOp) else "stored value"
    gt = g.type
    if t.dtype != gt.dtype or t.shape[1:] != gt.shape[1:] or t.rank != gt.rank or t.shape[0] > gt.shape[0]:
        raise VerifyError(
            f"{where}: {op.describe()}: {what} {t} is not a row block of global @{name} : {gt} "
            f"(expected tensor<Nx{'x'.join(map(str, gt.shape[1:]))}{'x' if gt.rank > 1 else ''}"
            f"{gt.dtype.name}> with N <= {gt.shape[0]})"
        )
    offset = op.operands[-1]
    lo, hi = _range(ranges, offset, op, where)
    rows = t.shape[0]
    if lo < 0 or hi + rows > gt.shape[0]:
        raise VerifyError(
            f"{where}: {op.describe()}: offset in [{lo}, {hi}] with {rows} row(s) can reach outside "
            f"global @{name} (rows 0..{gt.shape[0] - 1}): bound the host register ranges so that "
            f"0 <= offset <= {gt.shape[0] - rows}"
        )
