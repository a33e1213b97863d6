"""Numeric guards: count, per instruction, the NaNs it produced and its overflows.

An *overflow* is an infinity in a result element all of whose operands were finite; a *produced
NaN* is a NaN in a result element none of whose operands was a NaN (``inf - inf``, ``0 · inf`` and
``sqrt(-1)`` count).  An infinity computed from an operand that already was infinite (an attention
mask of -inf, which an fp16 build keeps as -inf) is propagation, not an overflow; so is arithmetic
on an operand equal to the largest finite value of its dtype, which is how a reduced-precision
build stores a saturated mask constant (``-1e9`` → -65504 in f16).

Cost: every compute instruction that writes floats (matmul, vbin, vbini, vun, vred — not the
value-moving vsel and transpose) is wrapped once at load time; after it runs, one
``np.isfinite(dst).all()`` decides.  Only when the destination holds a non-finite value are the
operands examined element by element.  When the destination overlaps a source (an in-place op),
that source is checked before the instruction runs and copied only if it holds a non-finite
value, so the precise check always sees the operands as they were.

The operand-to-result relation follows the instruction: elementwise ops element by element
(broadcast operands included), ``vred`` row by row, ``matmul`` row of A × column of B (and the
accumulated C when ``acc``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mcpc.arch import kernels
from mcpc.arch.numerics import NUMPY_DTYPES

from . import execute as _ex
from .execute import _Bounds, _get, _nop, _trap, matmul_operands
from .machine import Fault, Machine

FLOAT_DTYPES = frozenset({"f32", "f16", "bf16", "f8e4m3fn"})
_GUARDED = frozenset({"matmul", "vbin", "vbini", "vun", "vred"})
_BIG = {name: float(np.finfo(NUMPY_DTYPES[name]).max) for name in ("f16", "bf16") if name in NUMPY_DTYPES}


# Exponent bits that mark a non-finite value, for dtypes whose np.isfinite is slow (f16 is
# emulated in numpy: ~10x slower than testing the bits of its uint16 view).
_SPECIAL_BITS = {np.dtype(np.float16): (np.uint16, 0x7C00)}
if "bf16" in NUMPY_DTYPES:
    _SPECIAL_BITS[NUMPY_DTYPES["bf16"]] = (np.uint16, 0x7F80)
if "f8e4m3fn" in NUMPY_DTYPES:
    _SPECIAL_BITS[NUMPY_DTYPES["f8e4m3fn"]] = (np.uint8, 0x7F)  # no infinities; NaN is S.1111.111


def all_finite(x: np.ndarray) -> bool:
    """Whether every element of the float array ``x`` is finite (the cheap test after each op)."""
    done = kernels.all_finite(x)  # one pass without a temporary, when built
    if done is not None:
        return done
    bits = _SPECIAL_BITS.get(x.dtype)
    if bits is None:
        return bool(np.isfinite(x).all())
    utype, mask = bits
    return not ((x.view(utype) & mask) == mask).any()


def _extent(d: tuple) -> tuple[int, int]:
    """Byte interval [lo, hi) an operand descriptor may touch (conservative)."""
    addr, rows, cols, row_step, col_step, dt, packed = d
    hi = addr + max(rows - 1, 0) * row_step + max(cols - 1, 0) * col_step + dt.itemsize
    return addr, hi


def _overlaps(a: tuple, b: tuple) -> bool:
    (alo, ahi), (blo, bhi) = _extent(a), _extent(b)
    return alo < bhi and blo < ahi


def guard(instr: Any, target: Any, idx: int, fn, args) -> tuple:
    """``(handler, args)`` running ``fn(args)`` and then the numeric check, for instruction ``idx``;
    ``(fn, args)`` unchanged when the instruction writes no floats or never runs normally."""
    op = instr.op
    if op not in _GUARDED or fn is _nop or fn is _trap:
        return fn, args
    out = "f32" if op == "matmul" else instr.out_dtype
    if out not in FLOAT_DTYPES:
        return fn, args
    b = _Bounds(target.sram.size_bytes)
    try:
        dst, srcs, imm_bad = _operands(instr, b)
    except Fault:  # compile_instr would have trapped already; nothing to guard
        return fn, args
    alias = tuple(i for i, s in enumerate(srcs) if _overlaps(s, dst))
    if op == "matmul":
        kinds = (instr.in_dtype, instr.in_dtype, "f32")
    else:
        kinds = (instr.in_dtype,) * len(srcs)
    trans_b = bool(getattr(instr, "trans_b", 0))
    return _guarded, (fn, args, idx, op, trans_b, dst, srcs, kinds[: len(srcs)], alias, imm_bad)


def _operands(i: Any, b: _Bounds) -> tuple[tuple, tuple, bool]:
    """(destination, sources, immediate is non-finite) descriptors, as compile_instr builds them."""
    op = i.op
    if op == "matmul":
        A, B, C = matmul_operands(i, b)
        return C, ((A, B, C) if i.acc else (A, B)), False
    rows, cols = i.rows, i.cols
    if op == "vbin":
        S0 = b.operand("src0", i.src0, rows, cols, i.s0_stride, i.s0_bcast, i.in_dtype)
        S1 = b.operand("src1", i.src1, rows, cols, i.s1_stride, i.s1_bcast, i.in_dtype)
        return b.operand("dst", i.dst, rows, cols, i.dst_stride, 0, i.out_dtype), (S0, S1), False
    if op == "vbini":
        S0 = b.operand("src0", i.src0, rows, cols, i.s0_stride, i.s0_bcast, i.in_dtype)
        D = b.operand("dst", i.dst, rows, cols, i.dst_stride, 0, i.out_dtype)
        imm = np.float32(i.imm)
        return D, (S0,), bool(not np.isfinite(imm) or _at_limit(np.asarray(imm), i.in_dtype).any())
    if op == "vun":
        S = b.operand("src", i.src, rows, cols, i.src_stride, i.src_bcast, i.in_dtype)
        return b.operand("dst", i.dst, rows, cols, i.dst_stride, 0, i.out_dtype), (S,), False
    S = b.operand("src", i.src, rows, cols, i.src_stride, 0, i.in_dtype)  # vred
    return b.operand("dst", i.dst, 1, rows, 0, 0, i.out_dtype), (S,), False


def _at_limit(x: np.ndarray, dtype: str) -> np.ndarray:
    big = _BIG.get(dtype)
    if big is None:
        return np.zeros(x.shape, bool)
    with np.errstate(invalid="ignore"):
        return np.abs(x.astype(np.float32)) == big


def unwrap(fn, args) -> tuple:
    """The handler and arguments a guarded record runs (themselves when not guarded), for analyses
    of the records (``fastpath``) that know the handlers of ``execute``."""
    return (args[0], args[1]) if fn is _guarded else (fn, args)


def rewrap(fn, args, new_fn, new_args) -> tuple:
    """``(handler, args)`` running ``new_fn(new_args)`` with the guard of record ``(fn, args)``."""
    return (_guarded, (new_fn, new_args, *args[2:])) if fn is _guarded else (new_fn, new_args)


def _guarded(m: Machine, a: tuple) -> None:
    fn, args, idx, op, trans_b, dst, srcs, kinds, alias, imm_bad = a
    s = m.sram
    before = {}
    for i in alias:  # in place: keep a source that holds non-finite values as it was
        v = _get(s, srcs[i])
        if not all_finite(v):
            before[i] = np.array(v, copy=True)
    if fn(m, args) is True:  # the handler knows every value it wrote is finite
        return
    d = _get(s, dst)
    if all_finite(d):
        return
    vals = []  # each source as it was; None for an in-place source known to have been finite
    for i, src in enumerate(srcs):
        vals.append(before[i] if i in before else None if i in alias else _get(s, src))
    nans, overflows = _classify(op, trans_b, d, vals, kinds, imm_bad)
    if nans or overflows:
        m.numeric.append((idx, nans, overflows))


def _classify(op: str, trans_b: bool, d: np.ndarray, vals: list, kinds: tuple, imm_bad: bool):
    """(produced NaNs, overflows) of result ``d``; ``vals[i]`` is None for a source known finite."""
    shape = d.shape
    bad = np.zeros(shape, bool)  # an operand of the element is non-finite (or a saturated constant)
    nan_in = np.zeros(shape, bool)  # an operand of the element is NaN
    for i, v in enumerate(vals):
        if v is None:
            continue
        nonfinite = ~np.isfinite(v) | _at_limit(v, kinds[i])
        isnan = np.isnan(v)
        if op == "vred":
            nonfinite, isnan = nonfinite.any(axis=1)[None, :], isnan.any(axis=1)[None, :]
        elif op == "matmul" and i < 2:
            axis = 1 if (i == 0 or trans_b) else 0
            nonfinite, isnan = nonfinite.any(axis=axis), isnan.any(axis=axis)
            nonfinite = nonfinite[:, None] if i == 0 else nonfinite[None, :]
            isnan = isnan[:, None] if i == 0 else isnan[None, :]
        bad |= nonfinite
        nan_in |= isnan
    if imm_bad:
        bad[...] = True
    nans = int(np.count_nonzero(np.isnan(d) & ~nan_in))
    overflows = int(np.count_nonzero(np.isinf(d) & ~bad))
    return nans, overflows


# -- the report ------------------------------------------------------------------------------------
def report(program: Any, events: list[tuple[int, int, int]], outputs: dict[str, np.ndarray]) -> dict:
    """The profile's ``numeric`` section: totals, the first faulty instruction, per-node counts and
    the outputs holding non-finite values.  ``events`` are (index, NaNs, overflows) in run order."""
    by_node: dict[str, dict] = {}
    for idx, nans, over in events:
        name, op_type = program.nodes[int(program.node_of[idx])]
        row = by_node.setdefault(name, {"node": name, "op_type": op_type, "nans": 0, "overflows": 0,
                                        "instructions": 0})  # fmt: skip
        row["nans"] += nans
        row["overflows"] += over
        row["instructions"] += 1
    bad_outputs = []
    for name, y in outputs.items():
        if y.dtype.kind == "f" or y.dtype.name in ("bfloat16", "float8_e4m3fn"):
            nan, inf = int(np.count_nonzero(np.isnan(y))), int(np.count_nonzero(np.isinf(y)))
            if nan or inf:
                bad_outputs.append({"name": name, "nans": nan, "infs": inf})
    first = None
    if events:
        idx, nans, over = events[0]
        node, op_type = program.nodes[int(program.node_of[idx])]
        instr = program.instr(idx)
        first = {
            "index": idx,
            "dtype": "f32" if instr.op == "matmul" else instr.out_dtype,
            "mnemonic": program.mnemonics[idx],
            "node": node,
            "op_type": op_type,
            "ir_op": program.ir_ops[int(program.ir_op_of[idx])],
            "nans": nans,
            "overflows": over,
            "where": program.describe(idx),
        }
    return {
        "clean": not events and not bad_outputs,
        "nans_produced": sum(e[1] for e in events),
        "overflows": sum(e[2] for e in events),
        "faulty_instructions": len(events),
        "first": first,
        "nodes": list(by_node.values()),
        "outputs": bad_outputs,
    }


def message(numeric: dict) -> str | None:
    """One paragraph for a user: where the first NaN or overflow appeared, and the outputs hit;
    None when the run was clean."""
    if numeric.get("clean", True):
        return None
    parts = []
    first = numeric.get("first")
    if first:
        what = []
        if first["overflows"]:
            what.append(f"{first['overflows']} overflow(s) to infinity from finite operands")
        if first["nans"]:
            what.append(f"{first['nans']} NaN(s)")
        parts.append(f"{first['where']} produced {' and '.join(what)} (the first of "
                     f"{numeric['faulty_instructions']} such instruction(s): {numeric['overflows']} "
                     f"overflows, {numeric['nans_produced']} NaNs in all)")  # fmt: skip
        stats = ("mcp.pow", "mcp.mul", "mcp.reduce_mean", "mcp.reduce_sum", "mcp.exp")
        if first.get("dtype") in ("f16", "bf16") and first["ir_op"] in stats:
            parts.append("a norm or softmax computed in a reduced precision overflows on large "
                         "activations: keep its statistics in f32 (precision.f32_islands, "
                         "docs/passes.md)")  # fmt: skip
    for o in numeric.get("outputs", []):
        parts.append(f"output {o['name']!r} holds {o['nans']} NaN(s) and {o['infs']} infinite value(s)")
    return "; ".join(parts)


_ex._TIMING_TWINS[_guarded] = _ex.NOP  # a timing-only run computes no values, so checks none
