"""Elementwise results the simulator writes straight into SRAM (f16/f32 vbin, vbini, vun copy)
hold the bits numerics computes, special values, broadcasts and in-place operands included."""

from __future__ import annotations

import numpy as np
import pytest

from mcpc.arch import numerics as nx
from mcpc.arch.isa import Instr
from mcpc.arch.numerics import NUMPY_DTYPES
from mcpc.arch.target import load_target
from mcpc.sim.execute import compile_instr
from mcpc.sim.machine import Machine

TARGET = load_target("mcp2026-edge")
ROWS, COLS = 6, 40
SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65520.0, -7e4, 6e-8, 3e-5, 1e-40, 3.4e38]


def _values(dtype: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((ROWS, COLS)) * 1e3 ** rng.integers(-2, 3, (ROWS, COLS))).astype(np.float32)
    x.flat[rng.choice(x.size, len(SPECIAL), replace=False)] = SPECIAL
    return nx.cast(x, dtype)


def _put(m: Machine, addr: int, x: np.ndarray) -> None:
    raw = np.ascontiguousarray(x).view(np.uint8).reshape(-1)
    m.sram[addr : addr + raw.size] = raw


def _get(m: Machine, addr: int, dtype: str, shape=(ROWS, COLS)) -> np.ndarray:
    dt = NUMPY_DTYPES[dtype]
    return m.sram[addr : addr + dt.itemsize * shape[0] * shape[1]].view(dt).reshape(shape).copy()


def _run(m: Machine, op: str, **fields) -> None:
    fn, args, _ = compile_instr(Instr(op, fields), TARGET)
    fn(m, args)


def _bits(x: np.ndarray) -> bytes:
    return np.ascontiguousarray(x).tobytes()


A, B, D = 0x0, 0x2000, 0x4000


@pytest.mark.parametrize("in_dtype", ["f16", "f32"])
@pytest.mark.parametrize("out_dtype", ["f16", "f32"])
@pytest.mark.parametrize("func", ["add", "sub", "mul", "div"])
@pytest.mark.parametrize("bcast", ["none", "row", "col"])
def test_vbin_direct_equals_numerics(in_dtype, out_dtype, func, bcast):
    a, b = _values(in_dtype, 0), _values(in_dtype, 1)
    m = Machine(0, TARGET.sram.size_bytes)
    _put(m, A, a)
    _put(m, B, b)
    s1 = {"none": dict(s1_stride=COLS), "row": dict(s1_stride=0), "col": dict(s1_stride=1, s1_bcast=1)}[bcast]
    fields = dict(func=func, in_dtype=in_dtype, out_dtype=out_dtype, src0=A, src1=B, rows=ROWS, cols=COLS,
                  dst_stride=COLS, s0_stride=COLS, **s1)  # fmt: skip
    _run(m, "vbin", dst=D, **fields)
    bb = {"none": b, "row": b[:1], "col": b.reshape(-1)[:ROWS, None]}[bcast]
    assert _bits(_get(m, D, out_dtype)) == _bits(nx.binary(func, a, bb, out_dtype))
    if in_dtype == out_dtype:  # in place: the destination is the first source
        _run(m, "vbin", dst=A, **fields)
        assert _bits(_get(m, A, out_dtype)) == _bits(nx.binary(func, a, bb, out_dtype))


@pytest.mark.parametrize("out_dtype", ["f16", "f32"])
@pytest.mark.parametrize("func", ["add", "sub", "mul", "div"])
def test_vbini_f32_direct_equals_numerics(out_dtype, func):
    a = _values("f32", 2)
    m = Machine(0, TARGET.sram.size_bytes)
    _put(m, A, a)
    for rev in (0, 1):
        for imm in (0.7071, -3.0, float("inf")):
            _run(m, "vbini", func=func, in_dtype="f32", out_dtype=out_dtype, dst=D, src0=A, imm=imm, rev=rev,
                 rows=ROWS, cols=COLS, dst_stride=COLS, s0_stride=COLS)  # fmt: skip
            v = np.asarray(np.float32(imm))
            ref = nx.binary(func, v, a, out_dtype) if rev else nx.binary(func, a, v, out_dtype)
            assert _bits(_get(m, D, out_dtype)) == _bits(ref), (rev, imm)


@pytest.mark.parametrize(("in_dtype", "out_dtype"), [("f32", "f16"), ("f16", "f32"), ("f16", "f16"),
                                                     ("i32", "i32"), ("bf16", "bf16")])  # fmt: skip
def test_vun_copy_direct_equals_numerics(in_dtype, out_dtype):
    x = _values("f32", 3).view(np.int32) if in_dtype == "i32" else _values(in_dtype, 3)
    m = Machine(0, TARGET.sram.size_bytes)
    _put(m, A, x)
    _run(m, "vun", func="copy", in_dtype=in_dtype, out_dtype=out_dtype, dst=D, src=A, rows=ROWS, cols=COLS,
         dst_stride=COLS, src_stride=COLS)  # fmt: skip
    assert _bits(_get(m, D, out_dtype)) == _bits(nx.unary("copy", x, out_dtype))
    # overlapping: the destination starts one row into the source
    row = COLS * NUMPY_DTYPES[in_dtype].itemsize
    if in_dtype == out_dtype:
        _run(m, "vun", func="copy", in_dtype=in_dtype, out_dtype=out_dtype, dst=A + row, src=A, rows=ROWS,
             cols=COLS, dst_stride=COLS, src_stride=COLS)  # fmt: skip
        assert _bits(_get(m, A + row, out_dtype)) == _bits(x)
