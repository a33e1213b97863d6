"""Functional semantics: one handler per mnemonic, computed with the shared numerics kernels.

Each live ISA spec names its compile function here (``InstrSpec.execute``, e.g. ``compile_vun``);
``COMPILERS`` maps every mnemonic to it and is resolved at import, so a spec without one fails
loudly.  ``compile_instr`` turns a decoded instruction into ``(handler, args, sram_hi)`` once, at load
time: operand descriptors are plain tuples ``(addr, rows, cols, row_step, col_step, np_dtype,
packed)``
so that executing an instruction only builds numpy views and calls one kernel.  Static faults
(an SRAM operand past the end of SRAM, an unsupported element size, a dtype with no MAC rate)
become a handler that raises ``Fault`` when, and only when, the instruction executes — like an
illegal word on hardware, it does no harm if it is never reached.

Every handler computes its result completely before writing the destination, so a destination
may alias a source.  The kernels are those of ``mcpc.arch.numerics`` applied to exactly the
instruction's tile, which makes the simulator bit-exact with the IR interpreter.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from mcpc.arch import kernels
from mcpc.arch.isa import ISA, Instr, resolve, vattn_heat_offset
from mcpc.arch.numerics import (
    NUMPY_DTYPES,
    attention_rows,
    binary,
    cast,
    dequantize_weight,
    matmul_in_f64,
    matmul_prepared,
    matmul_qa_tile,
    matmul_tile,
    matmul_wq_tile,
    row_reduce,
    scalar_alu,
    select,
    tile_operand,
    topk,
    unary,
)

from .decode import Decoded
from .machine import PACKED, Fault, Machine, dram_check, dram_rows, nbytes, pack4, sram_extent, unpack4, view

Handler = Callable[[Machine, tuple], None]
_U8 = np.dtype(np.uint8)
_I32 = np.dtype(np.int32)
_ELEM_DTYPES = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32), 8: np.dtype(np.uint64)}


# -- handlers (hot path: no dict lookups beyond the kernels' own) ---------------------------------
def _nop(m: Machine, a: tuple) -> None:
    pass


def _trap(m: Machine, a: tuple) -> None:
    raise Fault(a[0])


def _setr(m: Machine, a: tuple) -> None:
    m.regs[a[0]] = a[1]


def _salu(m: Machine, a: tuple) -> None:
    rd, func, rs1, rs2, imm = a
    r = m.regs
    r[rd] = scalar_alu(func, r[rs1], r[rs2] + imm)


def _setq(m: Machine, a: tuple) -> None:
    m.qparams = a[0]


def _load(m: Machine, a: tuple) -> None:
    dram, reg, rows, row_bytes, dram_stride, sram, sram_stride = a
    src = dram_rows(m, dram + m.regs[reg], rows, row_bytes, dram_stride)
    view(m.sram, sram, rows, row_bytes, sram_stride, 1, _U8)[...] = src


def _store(m: Machine, a: tuple) -> None:
    dram, reg, rows, row_bytes, dram_stride, sram, sram_stride = a
    dst = dram_rows(m, dram + m.regs[reg], rows, row_bytes, dram_stride)
    dst[...] = view(m.sram, sram, rows, row_bytes, sram_stride, 1, _U8)


def _gather(m: Machine, a: tuple) -> None:
    dram, idx_addr, count, row_bytes, dram_stride, sram, sram_stride, limit, reg = a
    dram += m.regs[reg]
    idx, hi = _indices(m, idx_addr, count, limit, "gather")
    rows = dram_rows(m, dram, hi + 1, row_bytes, dram_stride)[idx]
    view(m.sram, sram, count, row_bytes, sram_stride, 1, _U8)[...] = rows


def _indices(m: Machine, addr: int, count: int, limit: int, what: str) -> tuple[np.ndarray, int]:
    """The ``count`` i32 indices at SRAM ``addr`` (as i64) and the largest; Fault naming the first
    index outside [0, limit)."""
    idx = np.array(view(m.sram, addr, count, 1, 4, 4, _I32)[:, 0], dtype=np.int64)
    lo, hi = int(idx.min()), int(idx.max())
    if lo < 0 or hi >= limit:
        bad = lo if lo < 0 else hi
        pos = int(np.flatnonzero(idx == bad)[0])
        raise Fault(f"{what} index out of range: index[{pos}] = {bad} outside [0, {limit})")
    return idx, hi


def _scatter(m: Machine, a: tuple) -> None:
    dram, idx_addr, count, row_bytes, dram_stride, sram, sram_stride, limit, reg = a
    idx, hi = _indices(m, idx_addr, count, limit, "scatter")
    rows = dram_rows(m, dram + m.regs[reg], hi + 1, row_bytes, dram_stride)
    rows[idx] = view(m.sram, sram, count, row_bytes, sram_stride, 1, _U8)  # a repeated index: last wins


def _vattn(m: Machine, a: tuple) -> None:
    """Attention rows over K/V in SRAM; the window table is read first (its lengths set the cost).
    With a heat table (``H``), one kernel call per query head accumulates that head's column."""
    (Q, K, V, W, D, H), reg, cap, scale, share, dtype, cost, cell = a
    starts, lens = _windows(m, W, reg, cap)
    s = m.sram
    if H is None:
        cell[0] = cost(lens)
        out = attention_rows(_get(s, Q), _get(s, K), _get(s, V), np.tile(starts, share),
                             np.tile(lens, share), scale, dtype)  # fmt: skip
        _put(s, D, out)
        return
    n = _in_use(m, reg, cap)
    cell[0] = cost(lens, n)
    q, k, v, e = _get(s, Q), _get(s, K), _get(s, V), len(starts)
    heat = np.zeros((n, share), np.float32)
    out = np.concatenate([
        attention_rows(q[g * e : (g + 1) * e], k, v, starts, lens, scale, dtype, heat=heat[:, g])
        for g in range(share)
    ])  # fmt: skip
    _put(s, D, out)
    _get(s, H)[:n] = heat


def _kv_blocks(m: Machine, a: tuple) -> tuple[np.ndarray, np.ndarray]:
    """kvdecomp's block ids (checked against its limit) and their descriptors [C, 4] (u32)."""
    _, idx_addr, count, _, _, limit, reg, desc = a[:8]
    n = count if not reg else min(max(m.regs[reg], 0), count)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros((0, 4), np.uint32)
    idx, hi = _indices(m, idx_addr, n, limit, "kvdecomp")
    table = dram_rows(m, desc, hi + 1, 16, 16)[idx]
    return idx, np.ascontiguousarray(table).view("<u4").reshape(n, 4)


def _kvdecomp(m: Machine, a: tuple) -> None:
    """Blocks gathered by descriptor: plain ones copied, compressed ones CRC-checked and decoded.

    A compressed block's decoded row is kept in ``decoded`` (per instruction, keyed by the
    descriptor's address and size, so bounded by the pool slots it reads) beside a copy of the
    stored bytes it was decoded from: a later read whose stored bytes are equal to those uses the
    row (the same bytes decode, CRC included, to the same row); any other bytes — the slot
    rewritten, or corrupted — are CRC-checked and decoded again."""
    from mcpc.kv import KVBlockCorrupt, load_kv_block
    from mcpc.kv.pool import COMPRESSED, PLAIN, block_name

    dram, _, _, row_bytes, sram, _, _, _, d, dtype, decoded, cost, cell = a
    idx, desc = _kv_blocks(m, a)
    cell[0] = cost(row_bytes, d, desc)
    esize = NUMPY_DTYPES[dtype].itemsize
    out = np.zeros((idx.size, row_bytes), np.uint8)  # written to SRAM only once every block decoded
    for i, (b, (lo, hi, size, word)) in enumerate(zip(idx.tolist(), desc.tolist(), strict=True)):
        kind = word & 0xFF
        if kind == PLAIN:
            out[i] = dram_rows(m, dram + b * row_bytes, 1, row_bytes, row_bytes)[0]
            continue
        name = block_name(b, word)
        if kind != COMPRESSED:
            raise Fault(f"kvdecomp: KV block {name}: descriptor kind {kind} (0 plain and 1 compressed only)")
        addr = lo | hi << 32
        raw = dram_rows(m, addr, 1, size, size)[0].tobytes() if size else b""
        hit = decoded.get((addr, size))
        if hit is not None and hit[0] == raw:
            out[i, : hit[1].size] = hit[1]
            continue
        try:
            rows = load_kv_block(raw, dtype, name)
        except KVBlockCorrupt as exc:
            raise Fault(f"kvdecomp: {exc}") from None
        if rows.shape[1] != d or rows.shape[0] * d * esize > row_bytes:
            raise Fault(
                f"kvdecomp: KV block {name}: {rows.shape[0]} x {rows.shape[1]} values do not fit a row of "
                f"{row_bytes} bytes of head_dim {d}"
            )
        row = np.ascontiguousarray(rows, NUMPY_DTYPES[dtype]).view(_U8).reshape(-1)
        decoded[addr, size] = (raw, row)
        out[i, : row.size] = row
    if idx.size:
        view(m.sram, sram, idx.size, row_bytes, row_bytes, 1, _U8)[...] = out


def _kvdecomp_cost(m: Machine, a: tuple) -> None:
    """Timing-only twin of ``_kvdecomp``: the block ids and descriptors read, the cost recorded."""
    row_bytes, d, cost, cell = a[3], a[8], a[-2], a[-1]
    cell[0] = cost(row_bytes, d, _kv_blocks(m, a)[1])


def _kvcomp(m: Machine, a: tuple) -> None:
    """One layer's K or V of one KV block compressed into its pool slots (sim/kvcomp.py)."""
    from .kvcomp import execute as kvcomp

    fields, cost, cell = a
    cell[0] = cost(*kvcomp(m, fields))


def _kvcomp_cost(m: Machine, a: tuple) -> None:
    """Timing-only twin of ``_kvcomp``: no values, so the stored sizes are the nominal ones."""
    from .kvcomp import nominal

    fields, cost, cell = a
    cell[0] = cost(*nominal(fields))


def _vattn_cost(m: Machine, a: tuple) -> None:
    """Timing-only twin of ``_vattn``: the window table read and checked, its cost recorded."""
    (_, _, _, W, _, H), reg, cap, _, _, _, cost, cell = a
    lens = _windows(m, W, reg, cap)[1]
    cell[0] = cost(lens) if H is None else cost(lens, _in_use(m, reg, cap))


def _in_use(m: Machine, reg: int, cap: int) -> int:
    """The K/V rows in use: r[reg] clamped to [0, cap], or ``cap`` without a register."""
    return min(max(m.regs[reg], 0), cap) if reg else cap


def _windows(m: Machine, W: tuple, reg: int, cap: int) -> tuple[np.ndarray, np.ndarray]:
    table = np.array(_get(m.sram, W), dtype=np.int64)
    starts, lens = table[0], table[1]
    n = _in_use(m, reg, cap)
    bad = np.flatnonzero((starts < 0) | (lens < 0) | (starts + lens > n))
    if bad.size:
        e = int(bad[0])
        s0, ln = int(starts[e]), int(lens[e])
        raise Fault(f"vattn window {e} = [{s0}, {s0 + ln}) is outside the {n} K/V rows in use")
    return starts, lens


def _get(s: np.ndarray, d: tuple) -> np.ndarray:
    """The (rows, cols) value of operand ``d``: a view, or an unpacked copy for 4-bit dtypes."""
    if d[6] is None:
        return np.ndarray((d[1], d[2]), dtype=d[5], buffer=s, offset=d[0], strides=(d[3], d[4]))
    addr, rows, cols, row_step, col_step, _, name = d
    per_row = cols if col_step else 1
    raw = np.ndarray((rows, nbytes(name, per_row)), dtype=_U8, buffer=s, offset=addr, strides=(row_step, 1))
    vals = unpack4(raw, name, per_row)
    return vals if col_step else np.broadcast_to(vals, (rows, cols))


# Elementwise results between the floats numpy converts itself (f16, f32; round half to even) are
# written straight into the destination: numerics.binary's f32 arithmetic and numerics.cast's
# rounding, without temporaries (numpy handles a destination overlapping a source).
_F32 = np.dtype(np.float32)
_NATIVE_FLOAT = kernels.FLOATS  # f16 and f32: numpy converts between them itself, as do the kernels
_SPECIAL_KERNELS = {"erf": kernels.erf, "exp": kernels.exp}
_UFUNCS = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}


def _arg(s: np.ndarray, d: tuple) -> np.ndarray:
    """``_get`` for an elementwise operand: a broadcast operand as its one row (1, cols) or one
    column (rows, 1), which numpy broadcasts, so that widening it converts each value once."""
    if d[6] is None and (d[3] == 0 or d[4] == 0):
        shape = (1 if d[3] == 0 else d[1], 1 if d[4] == 0 else d[2])
        return np.ndarray(shape, dtype=d[5], buffer=s, offset=d[0], strides=(d[3], d[4]))
    return _get(s, d)


def _put(s: np.ndarray, d: tuple, value: np.ndarray) -> None:
    """Write ``value`` (broadcastable to the operand's shape) through operand ``d``."""
    if d[6] is None:
        np.ndarray((d[1], d[2]), dtype=d[5], buffer=s, offset=d[0], strides=(d[3], d[4]))[...] = value
        return
    addr, rows, cols, row_step, _, _, name = d
    raw = np.ndarray((rows, nbytes(name, cols)), dtype=_U8, buffer=s, offset=addr, strides=(row_step, 1))
    raw[...] = pack4(np.broadcast_to(value, (rows, cols)), raw[:, -1:] if cols % 2 else None)


def _matmul(m: Machine, a: tuple) -> None:
    A, B, C, trans_b, acc = a
    s = m.sram
    b = _get(s, B)
    part = matmul_tile(_get(s, A), b.T if trans_b else b)
    c = view(s, *C[:6])
    if acc:  # f32 accumulation, exactly numerics.matmul_2d's `c += part`
        np.add(c, part, out=c)
    else:
        c[...] = part


_SCRATCH = threading.local()  # per thread and product shape: one f32 array, reused


def _matmul_cached(m: Machine, a: tuple) -> None:
    """``_matmul`` whose operands may come from a slot shared across runs (``sim/fastpath.py``): a
    slot ``[value]`` is given only for an operand that holds the same constant bytes in every run,
    so its prepared (widened, contiguous) tile is computed once; ``value`` None = not yet."""
    A, B, C, trans_b, acc, in_f64, slot_a, slot_b = a
    s = m.sram
    wa = slot_a[0] if slot_a is not None else None
    if wa is None:
        wa = _prepared(tile_operand(_get(s, A), in_f64), slot_a, s)
    wb = slot_b[0] if slot_b is not None else None
    if wb is None:
        b = _get(s, B)
        wb = _prepared(tile_operand(b.T if trans_b else b, in_f64), slot_b, s)
    c = view(s, *C[:6])
    if not acc and not in_f64 and c.flags.c_contiguous:
        if not np.may_share_memory(c, wa) and not np.may_share_memory(c, wb):
            np.matmul(wa, wb, out=c)  # the same product, written in place of a copy of it
            return
    if acc and wa.dtype == _F32 and wb.dtype == _F32 and wa.ndim == 2 and wb.ndim == 2:
        # the product into a scratch array kept per shape and thread (no fresh megabytes per
        # tile: a long-lived process's allocator then keeps faulting pages in), then added
        scratch = _SCRATCH.__dict__
        shape = (wa.shape[0], wb.shape[1])
        part = scratch.get(shape)
        if part is None:
            if len(scratch) >= 64:  # a bounded set: shapes of the programs being run
                scratch.clear()
            part = scratch[shape] = np.empty(shape, np.float32)
        np.matmul(wa, wb, out=part)
        np.add(c, part, out=c)
        return
    part = matmul_prepared(wa, wb, in_f64)
    if acc:
        np.add(c, part, out=c)
    else:
        c[...] = part


def _qparam_tile(m: Machine, what: str, addr: int, rows: int, cols: int, dtype: str) -> np.ndarray:
    """The dense (rows, cols) tile of ``dtype`` at SRAM ``addr`` read through a QParam pointer
    (packed rows start on a byte); Fault when it leaves SRAM."""
    row_bytes = nbytes(dtype, cols)
    hi = addr + rows * row_bytes
    if hi > m.sram.size:
        raise Fault(f"SRAM overflow: {what} bytes [{addr:#x}, {hi:#x}) exceed SRAM of {m.sram.size:#x} bytes")
    raw = np.ndarray((rows, row_bytes), dtype=_U8, buffer=m.sram, offset=addr, strides=(row_bytes, 1))
    if dtype in PACKED:
        return unpack4(raw, dtype, cols)
    return raw.view(NUMPY_DTYPES[dtype]).reshape(rows, cols)


def _w4a16_qtiles(m: Machine, B: tuple, trans_b: int, w_dtype: str, s_dtype: str) -> tuple:
    """The scale and zero-point tiles (None: no zero point) and group of a matmul_w4a16 whose
    codes are operand ``B``, read through the current QParam group."""
    _, _, _, zp_ptr, scale_ptr, group = m.qparams
    n, k = (B[1], B[2]) if trans_b else (B[2], B[1])
    groups = -(-k // group) if group else 1
    shape = (n, groups) if trans_b else (groups, n)
    scale = _qparam_tile(m, "scale tile", scale_ptr, *shape, s_dtype)
    zp = _qparam_tile(m, "zero-point tile", zp_ptr, *shape, w_dtype) if zp_ptr else None
    return scale, zp, group


def _matmul_w4a16(m: Machine, a: tuple) -> None:
    A, B, C, trans_b, acc, a_dtype, w_dtype, s_dtype = a
    s = m.sram
    scale, zp, group = _w4a16_qtiles(m, B, trans_b, w_dtype, s_dtype)
    part = matmul_wq_tile(_get(s, A), _get(s, B), scale, zp, group, bool(trans_b), a_dtype)
    c = view(s, *C[:6])
    c[...] = (c + part) if acc else part


def _matmul_w4a16_cached(m: Machine, a: tuple) -> None:
    """``_matmul_w4a16`` whose dequantized weight comes from a slot shared across runs
    (``sim/fastpath.py``): given only when the codes, scales and zero points hold the same constant
    bytes in every run, so the weight ``matmul_wq_tile`` multiplies (dequantized to the activation
    dtype, transposed, prepared by ``tile_operand``) is computed once; the product is then exactly
    ``matmul_wq_tile``'s."""
    A, B, C, trans_b, acc, a_dtype, w_dtype, s_dtype, slot = a
    s = m.sram
    wb = slot[0]
    if wb is None:
        scale, zp, group = _w4a16_qtiles(m, B, trans_b, w_dtype, s_dtype)
        w = dequantize_weight(_get(s, B), scale, zp, group, bool(trans_b), a_dtype)
        wb = slot[0] = tile_operand(w.T if trans_b else w, False)
    part = matmul_prepared(tile_operand(_get(s, A), False), wb, False)
    c = view(s, *C[:6])
    c[...] = (c + part) if acc else part


def cached_matmul_w4a16(args: tuple, slot: list) -> tuple[Handler, tuple]:
    """``(handler, args)`` of a matmul_w4a16 (``args`` as ``compile_instr`` made them) whose
    dequantized weight is kept in ``slot``."""
    return _matmul_w4a16_cached, (*args, slot)


def _vdequant(m: Machine, a: tuple) -> None:
    S, D, in_dtype, out_dtype, s_dtype = a
    s = m.sram
    _, _, _, zp_ptr, scale_ptr, group = m.qparams
    rows, cols = S[1], S[2]
    groups = -(-cols // group) if group else 1
    scale = _qparam_tile(m, "scale tile", scale_ptr, rows, groups, s_dtype)
    zp = _qparam_tile(m, "zero-point tile", zp_ptr, rows, groups, in_dtype) if zp_ptr else None
    _put(s, D, dequantize_weight(_get(s, S), scale, zp, group, True, out_dtype))


def _qa(m: Machine, a: tuple) -> None:
    A, B, C, trans_b, acc, q_dtype = a
    s = m.sram
    scale_a, scale_w, scale_o, zp_ptr, scale_ptr, _ = m.qparams
    n = B[1] if trans_b else B[2]
    za = (
        _qparam_tile(m, "zero point", zp_ptr, 1, 1, q_dtype).reshape(())
        if zp_ptr
        else np.zeros((), NUMPY_DTYPES[q_dtype])
    )
    sw = (
        _qparam_tile(m, "scale tile", scale_ptr, 1, n, "f32").reshape(n) if scale_ptr else np.float32(scale_w)
    )
    with np.errstate(all="ignore"):
        scale = np.divide(np.asarray(sw, np.float32), np.float32(scale_o), dtype=np.float32)
    b = _get(s, B)
    part = matmul_qa_tile(_get(s, A), b.T if trans_b else b, scale_a, za, q_dtype, scale)
    c = view(s, *C[:6])
    c[...] = (c + part) if acc else part


def _prepared(w: np.ndarray, slot: list | None, s: np.ndarray) -> np.ndarray:
    if slot is not None:  # a copy when it is a view of SRAM (an f32 contiguous operand)
        slot[0] = w.copy() if np.may_share_memory(w, s) else w
    return w


def cached_matmul(args: tuple, slot_a: list | None, slot_b: list | None) -> tuple[Handler, tuple]:
    """``(handler, args)`` of a matmul (``args`` as ``compile_instr`` made them) with operand slots."""
    A, B, C, trans_b, acc = args
    return _matmul_cached, (A, B, C, trans_b, acc, matmul_in_f64(A[5], B[5], A[2]), slot_a, slot_b)


def _vbin(m: Machine, a: tuple) -> bool | None:
    """Returns True when it knows every value it wrote is finite (the numeric guard then skips
    its check), None otherwise."""
    func, S0, S1, D, out = a
    s = m.sram
    uf = _UFUNCS.get(func)
    if uf is not None and S0[5] in _NATIVE_FLOAT and D[5] in _NATIVE_FLOAT:
        x, y = _arg(s, S0), _arg(s, S1)
        dst = view(s, *D[:6])
        done = kernels.binary(func, dst, x, y)
        if done >= 0:
            return done == 1 or None
        if S0[5] != _F32:  # f16 operands widened whole: faster than a ufunc's buffered casts
            x, y = x.astype(_F32), y.astype(_F32)
        uf(x, y, out=dst, dtype=_F32, casting="unsafe")
        return None
    _put(s, D, binary(func, _arg(s, S0), _arg(s, S1), out))
    return None


def _vbini(m: Machine, a: tuple) -> bool | None:
    """Returns True when it knows every value it wrote is finite, None otherwise."""
    func, S0, imm, rev, D, out = a
    s = m.sram
    x = _arg(s, S0)
    uf = _UFUNCS.get(func)
    if uf is not None and S0[5] in _NATIVE_FLOAT and D[5] in _NATIVE_FLOAT:
        dst = view(s, *D[:6])
        done = kernels.binary(func, dst, x, None, float(imm), bool(rev))
        if done >= 0:
            return done == 1 or None
        if S0[5] == _F32:  # (f16 goes through a table)
            uf(*((imm, x) if rev else (x, imm)), out=dst, dtype=np.float32, casting="unsafe")
            return None
    _put(s, D, binary(func, imm, x, out) if rev else binary(func, x, imm, out))
    return None


def _vun(m: Machine, a: tuple) -> bool | None:
    """Returns True when it knows every value it wrote is finite, None otherwise."""
    func, S, D, out = a
    s = m.sram
    special = _SPECIAL_KERNELS.get(func)
    if special is not None and S[5] == _F32 and D[5] == _F32 and S[6] is None and D[6] is None:
        done = special(view(s, *D[:6]), _arg(s, S))  # scipy's / numpy's bits, mostly without them
        if done >= 0:
            return done == 1 or None
    if func == "copy" and S[6] is None and D[6] is None:
        if S[5] == D[5] or S[5] in _NATIVE_FLOAT and D[5] in _NATIVE_FLOAT:
            dst, x = view(s, *D[:6]), _arg(s, S)
            if S[5] != D[5]:  # f16 <-> f32: eight conversions at a time
                done = kernels.convert(dst, x)
                if done >= 0:
                    return done == 1 or None
            np.copyto(dst, x, casting="unsafe")
            return None
    _put(s, D, unary(func, _arg(s, S), out))
    return None


def _vred(m: Machine, a: tuple) -> None:
    func, S, D, out = a
    s = m.sram
    _put(s, D, row_reduce(func, _get(s, S), out)[None, :])  # D is one row of `rows` values


def _vtopk(m: Machine, a: tuple) -> None:
    S, D, I, k, largest, dtype = a
    s = m.sram
    vals, idx = topk(_get(s, S), k, largest, dtype)
    _put(s, D, vals)
    _put(s, I, idx)


def _vsel(m: Machine, a: tuple) -> None:
    Cd, S, D, dtype = a
    s = m.sram
    _put(s, D, select(_arg(s, Cd), _arg(s, S), _get(s, D), dtype))


def _fill0(m: Machine, a: tuple) -> None:
    view(m.sram, *a[0][:6])[...] = 0


def _transpose(m: Machine, a: tuple) -> None:
    S, D = a
    s = m.sram
    view(s, *D[:6])[...] = np.array(view(s, *S[:6]).T, copy=True)


def _dma_check(m: Machine, a: tuple) -> None:
    """Timing-only twin of load/store: the DRAM address check alone (the register offset is data
    independent: only ``setr`` and ``salu`` write registers, and both run in timing-only mode)."""
    dram_check(m, a[0] + m.regs[a[1]], a[2], a[3], a[4])


# Which argument of each compute handler is its (SRAM) destination operand, which ones it reads
# (matmul also reads C when accumulating; vsel keeps D where the condition is false).
DESTINATION = {_matmul: 2, _vbin: 3, _vbini: 4, _vun: 2, _vred: 2, _vsel: 2, _fill0: 0, _transpose: 1}
SOURCES = {_matmul: (0, 1), _vbin: (1, 2), _vbini: (1,), _vun: (1,), _vred: (1,), _vsel: (0, 1, 2)}
SOURCES.update({_fill0: (), _transpose: (0,)})
DESTINATION[_matmul_w4a16], SOURCES[_matmul_w4a16] = 2, (0, 1)
DESTINATION[_matmul_w4a16_cached], SOURCES[_matmul_w4a16_cached] = 2, (0, 1)
DESTINATION[_vdequant], SOURCES[_vdequant] = 1, (0,)
DESTINATION[_qa], SOURCES[_qa] = 2, (0, 1)
LOAD, STORE, GATHER, MATMUL, SETR, TRAP, NOP = _load, _store, _gather, _matmul, _setr, _trap, _nop
VTOPK, SCATTER, VATTN, KVDECOMP = _vtopk, _scatter, _vattn, _kvdecomp
SETQ, MATMUL_W4A16, VDEQUANT, QA = _setq, _matmul_w4a16, _vdequant, _qa
_TIMING_TWINS = {_load: _dma_check, _store: _dma_check, _setr: _setr, _trap: _trap, _nop: _nop}
_TIMING_TWINS.update({_salu: _salu, _setq: _setq})  # register writes: run-time extents follow them
_TIMING_TWINS.update(dict.fromkeys((_gather, _scatter, _matmul, _matmul_cached, _vtopk, *DESTINATION), _nop))
_TIMING_TWINS[_vattn] = _vattn_cost  # its cost follows the window lengths it reads
_TIMING_TWINS[_kvdecomp] = _kvdecomp_cost  # its cost follows the descriptors it reads
_TIMING_TWINS[_kvcomp] = _kvcomp_cost  # its cost follows the bytes it stores


def timing_twin(fn: Handler) -> Handler:
    """The handler a timing-only run executes instead of ``fn``: register writes, static traps and
    DMA address checks stay, every value computation becomes a no-op.  Cycles do not depend on
    values (instr_cost is static), so the run's issue and completion times are unchanged; traps
    that depend on data (a gather index out of range, an integer to a negative power) are not
    detected.  A handler not listed here runs as itself (it may write registers)."""
    return _TIMING_TWINS.get(fn, fn)


def _extent(m: Machine, a: tuple) -> None:
    """An instruction whose row count comes from a register: run its variant for that count."""
    reg, cap, variants, make, cell = a
    n = m.regs[reg]
    n = 0 if n < 0 else cap if n > cap else n
    v = variants.get(n)
    if v is None:
        v = variants[n] = make(n)
    cell[0] = v[2]  # the cost of the rows actually processed, read by the event loop
    v[0](m, v[1])


EXTENT = _extent


# -- compilation -------------------------------------------------------------------------------
class _Bounds:
    """Collects SRAM extents of one instruction's operands; raises Fault on the first overflow."""

    def __init__(self, sram_size: int):
        self.size, self.hi = sram_size, 0

    def operand(self, what: str, addr: int, rows: int, cols: int, stride: int, bcast: int, dtype: str):
        """Descriptor ``(addr, rows, cols, row_step, col_step, np_dtype, packed)`` of a typed operand;
        ``packed`` is the 4-bit dtype name (col_step then only marks broadcast: 0) or None."""
        dt = NUMPY_DTYPES[dtype]
        if dtype not in PACKED:
            size = dt.itemsize
            return self.raw(what, addr, rows, cols, stride * size, 0 if bcast else size, dt)
        if stride % 2:
            raise Fault(f"illegal instruction: {what} is {dtype} with an odd row stride {stride}")
        per_row = 1 if bcast else cols
        self._check(what, addr, sram_extent(addr, rows, nbytes(dtype, per_row), stride // 2, 1, 1))
        return (addr, rows, cols, stride // 2, 0 if bcast else 1, dt, dtype)

    def raw(self, what: str, addr: int, rows: int, cols: int, row_step: int, col_step: int, dt: np.dtype):
        """Descriptor of an operand given in byte strides (never packed)."""
        self._check(what, addr, sram_extent(addr, rows, cols, row_step, col_step, dt.itemsize))
        return (addr, rows, cols, row_step, col_step, dt, None)

    def _check(self, what: str, addr: int, hi: int) -> None:
        if hi > self.size:
            raise Fault(
                f"SRAM overflow: {what} bytes [{addr:#x}, {hi:#x}) exceed SRAM of {self.size:#x} bytes"
            )
        self.hi = max(self.hi, hi)


def compile_nop(i: Instr | Decoded, b: _Bounds, target: Any) -> tuple[Handler, tuple]:
    return _nop, ()


def compile_setr(i: Instr | Decoded, b: _Bounds, target: Any) -> tuple[Handler, tuple]:
    return _setr, (i.reg, i.value)


def compile_salu(i: Instr | Decoded, b: _Bounds, target: Any) -> tuple[Handler, tuple]:
    return _salu, (i.rd, i.func, i.rs1, i.rs2, i.simm)


def compile_setq(i: Instr | Decoded, b: _Bounds, target: Any) -> tuple[Handler, tuple]:
    group = (i.scale_a, i.scale_w, i.scale_o, i.zp_ptr, i.scale_ptr, i.group_size)
    return _setq, (group,)


def compile_dma(i: Instr | Decoded, b: _Bounds, target: Any) -> tuple[Handler, tuple]:
    if i.op in ("gather", "scatter"):
        b.raw("index", i.sram_idx, i.count, 1, 4, 4, _I32)
        side = "destination" if i.op == "gather" else "source"
        b.raw(side, i.sram, i.count, i.row_bytes, i.sram_stride, 1, _U8)
        if i.count == 0 or i.row_bytes == 0:
            return _nop, ()
        args = (i.dram, i.sram_idx, i.count, i.row_bytes, i.dram_stride, i.sram, i.sram_stride, i.limit)
        return (_gather if i.op == "gather" else _scatter), (*args, i.dram_reg)
    b.raw("SRAM side", i.sram, i.rows, i.row_bytes, i.sram_stride, 1, _U8)
    if i.rows == 0 or i.row_bytes == 0:
        return _nop, ()
    args = (i.dram, i.dram_reg, i.rows, i.row_bytes, i.dram_stride, i.sram, i.sram_stride)
    return (_load if i.op == "load" else _store), args


def matmul_operands(i: Instr | Decoded, b: _Bounds, b_dtype: str | None = None) -> tuple[tuple, tuple, tuple]:
    """The A, B (n x k when ``trans_b``) and C (f32) operand descriptors of a matmul; B holds
    ``b_dtype`` (a quantized matmul's codes), default the instruction's ``in_dtype``."""
    A = b.operand("A", i.a, i.m, i.k, i.a_stride, 0, i.in_dtype)
    rows, cols = (i.n, i.k) if i.trans_b else (i.k, i.n)
    B = b.operand("B", i.b, rows, cols, i.b_stride, 0, b_dtype or i.in_dtype)
    return A, B, b.operand("C", i.c, i.m, i.n, i.c_stride, 0, "f32")


def _empty_matmul(i: Instr | Decoded, C: tuple) -> tuple[Handler, tuple] | None:
    """The handler of a matmul with an empty extent (nothing, or C = 0 for an empty product when
    not accumulating), None when the product has work."""
    if i.m == 0 or i.n == 0:
        return _nop, ()
    if i.k == 0:
        return (_nop, ()) if i.acc else (_fill0, (C,))
    return None


def compile_matmul(i: Instr | Decoded, b: _Bounds, target: Any) -> tuple[Handler, tuple]:
    if i.in_dtype not in target.mac.macs_per_cycle:
        raise Fault(f"illegal instruction: target {target.name} has no matmul rate for {i.in_dtype}")
    A, B, C = matmul_operands(i, b)
    return _empty_matmul(i, C) or (_matmul, (A, B, C, i.trans_b, i.acc))


_SCALE_DTYPES = frozenset({"f16", "bf16", "f32"})
_CODE_DTYPES = frozenset({"i4", "u4", "i8", "u8"})


def compile_matmul_w4a16(i: Instr | Decoded, b: _Bounds, target: Any) -> tuple[Handler, tuple]:
    if i.in_dtype not in target.mac.macs_per_cycle or i.in_dtype not in _SCALE_DTYPES:
        raise Fault(f"illegal instruction: target {target.name} has no matmul rate for {i.in_dtype}")
    if i.w_dtype not in _CODE_DTYPES or i.s_dtype not in _SCALE_DTYPES:
        raise Fault(f"illegal instruction: matmul_w4a16 with w_dtype {i.w_dtype}, s_dtype {i.s_dtype}")
    A, B, C = matmul_operands(i, b, i.w_dtype)
    work = (_matmul_w4a16, (A, B, C, i.trans_b, i.acc, i.in_dtype, i.w_dtype, i.s_dtype))
    return _empty_matmul(i, C) or work


# unsigned codes multiply at their signed width's rate
MAC_RATE_DTYPE = {"u8": "i8", "u4": "i4"}
_QA_DTYPES = {"vmmul.q4f8": ({"i4"}, {"f8e4m3fn"}), "matmul_i8": ({"i8", "u8"}, {"i8", "i4"})}


def compile_qa(i: Instr | Decoded, b: _Bounds, target: Any) -> tuple[Handler, tuple]:
    qs, ws = _QA_DTYPES[i.op]
    if i.in_dtype not in _SCALE_DTYPES or i.q_dtype not in qs or i.w_dtype not in ws:
        dts = f"in_dtype {i.in_dtype}, q_dtype {i.q_dtype}, w_dtype {i.w_dtype}"
        raise Fault(f"illegal instruction: {i.op} with {dts}")
    for dt in (i.q_dtype, i.w_dtype):
        if MAC_RATE_DTYPE.get(dt, dt) not in target.mac.macs_per_cycle:
            raise Fault(f"illegal instruction: target {target.name} has no matmul rate for {dt}")
    A, B, C = matmul_operands(i, b, i.w_dtype)
    return _empty_matmul(i, C) or (_qa, (A, B, C, i.trans_b, i.acc, i.q_dtype))


def compile_vdequant(i: Instr | Decoded, b: _Bounds, target: Any) -> tuple[Handler, tuple]:
    if i.in_dtype not in _CODE_DTYPES or i.s_dtype not in _SCALE_DTYPES or i.out_dtype not in _SCALE_DTYPES:
        raise Fault(f"illegal instruction: vdequant {i.in_dtype} -> {i.out_dtype} with s_dtype {i.s_dtype}")
    S = b.operand("src", i.src, i.rows, i.cols, i.src_stride, 0, i.in_dtype)
    D = b.operand("dst", i.dst, i.rows, i.cols, i.dst_stride, 0, i.out_dtype)
    return _vdequant, (S, D, i.in_dtype, i.out_dtype, i.s_dtype)


_ATTN_DTYPES = frozenset({"f32", "f16", "bf16"})


def compile_vattn(i: Instr | Decoded, b: _Bounds, target: Any) -> tuple[Handler, tuple]:
    from .timing import attention_cost  # timing does not import this module; kept local to stay so

    if i.in_dtype not in _ATTN_DTYPES or i.kv_dtype not in _ATTN_DTYPES:
        raise Fault(f"illegal instruction: vattn with in_dtype {i.in_dtype}, kv_dtype {i.kv_dtype}")
    share, rows, d, n = max(i.share, 1), i.rows, i.head_dim, i.kv_rows
    if rows % share:
        raise Fault(f"illegal instruction: vattn rows={rows} is not a multiple of share={share}")
    if rows == 0 or d == 0:
        return _nop, ()
    entries = rows // share
    Q = b.operand("q", i.src, rows, d, d, 0, i.in_dtype)
    K = b.operand("K", i.kv, n, d, d, 0, i.kv_dtype)
    V = b.operand("V", i.kv + n * d * NUMPY_DTYPES[i.kv_dtype].itemsize, n, d, d, 0, i.kv_dtype)
    W = b.raw("window table", i.win, 2, entries, 4 * entries, 4, _I32)
    D = b.operand("dst", i.dst, rows, d, d, 0, i.in_dtype)
    H = None
    if i.heat:  # the heat table: kv_rows x share f32 after the result
        H = b.operand("heat", i.dst + vattn_heat_offset(rows, d, i.in_dtype), n, share, share, 0, "f32")

    def cost(lens: np.ndarray, heat_rows: int | None = None) -> Any:
        return attention_cost(lens, share, d, i.in_dtype, i.kv_dtype, target, heat_rows)

    cell = [cost(np.zeros(0, np.int64))]
    return _vattn, ((Q, K, V, W, D, H), i.kv_reg, n, i.scale, share, i.in_dtype, cost, cell)


def compile_kvdecomp(i: Instr | Decoded, b: _Bounds, target: Any) -> tuple[Handler, tuple]:
    from .timing import kvdecomp_data_cost  # timing does not import this module; kept local to stay so

    if i.kv_dtype not in _ATTN_DTYPES:
        raise Fault(f"illegal instruction: kvdecomp with kv_dtype {i.kv_dtype}")
    b.raw("index", i.sram_idx, i.count, 1, 4, 4, _I32)
    b.raw("destination", i.sram, i.count, i.row_bytes, i.row_bytes, 1, _U8)
    if i.count == 0 or i.row_bytes == 0:
        return _nop, ()

    def cost(row_bytes: int, d: int, desc: np.ndarray) -> Any:
        return kvdecomp_data_cost(row_bytes, d, desc, i.kv_dtype, target)

    cell = [cost(i.row_bytes, i.head_dim, np.zeros((0, 4), np.uint32))]
    args = (i.dram, i.sram_idx, i.count, i.row_bytes, i.sram, i.limit, i.count_reg, i.desc)
    return _kvdecomp, (*args, i.head_dim, i.kv_dtype, {}, cost, cell)  # {}: decoded blocks (_kvdecomp)


def compile_kvcomp(i: Instr | Decoded, b: _Bounds, target: Any) -> tuple[Handler, tuple]:
    from .kvcomp import check_fields
    from .timing import kvcomp_data_cost  # timing does not import this module; kept local to stay so

    bad = check_fields(i)
    if bad:
        raise Fault(f"illegal instruction: {bad}")

    def cost(sizes: list[int], rewritten: list[int]) -> Any:
        return kvcomp_data_cost(i, sizes, rewritten, target)

    return _kvcomp, (i, cost, [cost([0] * i.heads, [0] * i.heads)])


def data_cost_cell(fn: Handler, args: tuple) -> list | None:
    """The cell holding the cost of the last execution of a data-cost instruction (``vattn``,
    ``kvdecomp``, ``kvcomp``) compiled to ``fn``/``args``, None when it does no work (a no-op or a trap)."""
    return args[-1] if fn is _vattn or fn is _kvdecomp or fn is _kvcomp else None


def compile_vbin(i: Instr | Decoded, b: _Bounds, target: Any) -> tuple[Handler, tuple]:
    rows, cols = i.rows, i.cols
    S0 = b.operand("src0", i.src0, rows, cols, i.s0_stride, i.s0_bcast, i.in_dtype)
    S1 = b.operand("src1", i.src1, rows, cols, i.s1_stride, i.s1_bcast, i.in_dtype)
    D = b.operand("dst", i.dst, rows, cols, i.dst_stride, 0, i.out_dtype)
    return _vbin, (i.func, S0, S1, D, i.out_dtype)


def compile_vbini(i: Instr | Decoded, b: _Bounds, target: Any) -> tuple[Handler, tuple]:
    rows, cols = i.rows, i.cols
    S0 = b.operand("src0", i.src0, rows, cols, i.s0_stride, i.s0_bcast, i.in_dtype)
    D = b.operand("dst", i.dst, rows, cols, i.dst_stride, 0, i.out_dtype)
    # The immediate is an operand of in_dtype: converted once, exactly as a constant tensor is.
    imm = cast(np.asarray(np.float32(i.imm)), i.in_dtype)
    return _vbini, (i.func, S0, imm, i.rev, D, i.out_dtype)


def compile_vun(i: Instr | Decoded, b: _Bounds, target: Any) -> tuple[Handler, tuple]:
    S = b.operand("src", i.src, i.rows, i.cols, i.src_stride, i.src_bcast, i.in_dtype)
    D = b.operand("dst", i.dst, i.rows, i.cols, i.dst_stride, 0, i.out_dtype)
    return _vun, (i.func, S, D, i.out_dtype)


def compile_vred(i: Instr | Decoded, b: _Bounds, target: Any) -> tuple[Handler, tuple]:
    rows, cols = i.rows, i.cols
    S = b.operand("src", i.src, rows, cols, i.src_stride, 0, i.in_dtype)
    D = b.operand("dst", i.dst, 1, rows, 0, 0, i.out_dtype)
    if cols == 0 and rows > 0:
        raise Fault("illegal instruction: vred over rows of 0 elements")
    return _vred, (i.func, S, D, i.out_dtype)


def compile_vtopk(i: Instr | Decoded, b: _Bounds, target: Any) -> tuple[Handler, tuple]:
    rows, cols, k = i.rows, i.cols, i.topk_k
    if k > cols:
        raise Fault(f"illegal instruction: vtopk keeps topk_k={k} of rows of {cols} elements")
    S = b.operand("src", i.src, rows, cols, i.src_stride, 0, i.dtype)
    D = b.operand("dst", i.dst, rows, k, i.dst_stride, 0, i.dtype)
    I = b.operand("idx", i.idx, rows, k, i.idx_stride, 0, "i32")  # noqa: E741
    return _vtopk, (S, D, I, k, bool(i.largest), i.dtype)


def compile_vsel(i: Instr | Decoded, b: _Bounds, target: Any) -> tuple[Handler, tuple]:
    rows, cols = i.rows, i.cols
    Cd = b.raw("cond", i.cond, rows, cols, i.cond_stride, 0 if i.cond_bcast else 1, _U8)
    S = b.operand("src", i.src, rows, cols, i.src_stride, i.src_bcast, i.dtype)
    D = b.operand("dst", i.dst, rows, cols, i.dst_stride, 0, i.dtype)
    return _vsel, (Cd, S, D, i.dtype)


def compile_transpose(i: Instr | Decoded, b: _Bounds, target: Any) -> tuple[Handler, tuple]:
    dt = _ELEM_DTYPES.get(i.elem_bytes)
    if dt is None:
        raise Fault(f"illegal instruction: transpose elem_bytes={i.elem_bytes} (must be 1, 2, 4 or 8)")
    eb = i.elem_bytes
    S = b.raw("src", i.src, i.rows, i.cols, i.src_stride * eb, eb, dt)
    D = b.raw("dst", i.dst, i.cols, i.rows, i.dst_stride * eb, eb, dt)
    return _transpose, (S, D)


# Every live mnemonic -> the compile function its spec names (RuntimeError at import if one is missing).
COMPILERS: dict[str, Callable] = resolve("execute", globals())
_NO_OPERANDS = frozenset({_nop, _setr, _salu, _setq})


def compile_instr(instr: Instr | Decoded, target: Any) -> tuple[Handler, tuple, int]:
    """``(handler, args, sram_hi)`` for one instruction; a static fault becomes a trapping handler.

    ``sram_hi`` is one past the highest SRAM byte the instruction touches (0 if none or if it traps).
    """
    b = _Bounds(target.sram.size_bytes)
    try:
        compiler = COMPILERS.get(instr.op)
        if compiler is None:
            raise Fault(f"illegal instruction: no handler for {instr.op}")
        fn, args = compiler(instr, b, target)
        if fn not in _NO_OPERANDS and _empty(args):
            fn, args = _nop, ()
    except Fault as exc:
        return _trap, (str(exc),), 0
    return fn, args, b.hi


def extent_register(instr: Instr | Decoded) -> int:
    """The register setting ``instr``'s row count at run time (its spec's ``extent``), 0 if none."""
    extent = ISA[instr.op].extent
    return getattr(instr, extent[1]) if extent else 0


def compile_extent(
    instr: Instr | Decoded, target: Any, cost: Callable, static_cost: Any
) -> tuple[Handler, tuple]:
    """The handler of an instruction whose count field comes from a register (``extent_register``).

    At run time the register's value, clamped to [0, encoded count], selects a variant compiled
    (and costed with ``cost``) for exactly that count; each variant is built once per program.  The
    encoded count is the capacity: the static SRAM bounds checked for it hold for every variant.
    ``args[-1][0]`` is the cost of the last execution (``static_cost`` before any).
    """
    count_field, reg_field = ISA[instr.op].extent
    names = ISA[instr.op].field_names
    fields = {n: getattr(instr, n) for n in names}

    def make(n: int) -> tuple[Handler, tuple, Any]:
        d = Decoded(instr.op, instr.engine, instr.wait, instr.signal, {**fields, count_field: n})
        if instr.op in _ROW_KEPT and 0 < n < fields[count_field]:
            fn, args, _ = compile_instr(instr, target)  # the capacity's product, its first n rows kept
            c = fields["c"], fields["c_stride"] * 4, fields["n"] * 4
            return _rows_kept, (fn, args, c, n, fields[count_field]), cost(d, target)
        fn, args, _ = compile_instr(d, target)
        return fn, args, cost(d, target)

    return _extent, (getattr(instr, reg_field), fields[count_field], {}, make, [static_cost])


# A matmul with a run-time row count computes its rows as the capacity's product does (BLAS may
# round a product of fewer rows differently; each row's value does not depend on the others), so
# its rows in use are bit-identical to the interpreter's, which computes every row: the rows past
# the count keep their bytes.  Its cost is the count's.
_ROW_KEPT = frozenset({"matmul", "matmul_w4a16"})


def _rows_kept(m: Machine, a: tuple) -> None:
    fn, args, (addr, step, width), n, cap = a
    keep = [m.sram[addr + r * step : addr + r * step + width].copy() for r in range(n, cap)]
    fn(m, args)
    for r, row in zip(range(n, cap), keep, strict=True):
        m.sram[addr + r * step : addr + r * step + width] = row


def _empty(args: tuple) -> bool:
    # An operand with no elements makes the whole instruction a no-op (no bytes are touched).
    return any(isinstance(x, tuple) and len(x) == 7 and (x[1] == 0 or x[2] == 0) for x in args)


def is_trap(fn: Handler) -> bool:
    """Whether ``fn`` is the trapping handler of a static fault."""
    return fn is _trap


def illegal(message: str) -> tuple[Handler, tuple, int]:
    """A trapping handler for a word that did not decode."""
    return _trap, (message,), 0
