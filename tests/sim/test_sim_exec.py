"""Functional results of every instruction against plain numpy: strides, broadcasts, dtypes, aliasing."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from mcpc.arch.isa import Instr
from mcpc.arch.numerics import NUMPY_DTYPES, matmul_2d
from mcpc.arch.target import load_target
from mcpc.errors import SimTrap
from mcpc.sim.execute import compile_instr
from mcpc.sim.machine import Fault, Machine

TARGET = load_target("mcp2026-edge")
F32 = np.float32
RNG = np.random.default_rng(0)


def machine() -> Machine:
    return Machine(1 << 16, TARGET.sram.size_bytes)


def put(m: Machine, addr: int, arr: np.ndarray, row_stride: int | None = None) -> None:
    """Write a 2-D array into SRAM at ``addr`` with ``row_stride`` elements between rows."""
    arr = np.atleast_2d(arr)
    size = arr.dtype.itemsize
    rs = (row_stride or arr.shape[1]) * size
    for r, row in enumerate(arr):
        raw = np.ascontiguousarray(row).view(np.uint8)
        m.sram[addr + r * rs : addr + r * rs + raw.size] = raw


def get(m: Machine, addr: int, rows: int, cols: int, dtype: str, row_stride: int | None = None) -> np.ndarray:
    dt = NUMPY_DTYPES[dtype]
    rs = (row_stride or cols) * dt.itemsize
    return np.stack(
        [m.sram[addr + r * rs : addr + r * rs + cols * dt.itemsize].view(dt) for r in range(rows)]
    )


def run(mach: Machine, op: str, **fields) -> None:
    fn, args, _ = compile_instr(Instr(op, fields), TARGET)
    fn(mach, args)


def data(dtype: str, shape, low=-4, high=5) -> np.ndarray:
    if dtype in ("f32", "f16", "bf16"):
        return RNG.standard_normal(shape).astype(F32).astype(NUMPY_DTYPES[dtype])
    return RNG.integers(low, high, shape).astype(NUMPY_DTYPES[dtype])


def f32_then(dtype: str, x: np.ndarray) -> np.ndarray:
    """The reference rounding: compute in f32 (or i64), store in ``dtype``."""
    return x.astype(NUMPY_DTYPES[dtype])


REF = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "i32"])
@pytest.mark.parametrize("func", sorted(REF))
def test_vbin_strided_row_broadcast(dtype, func):
    m = machine()
    a = data(dtype, (3, 8))  # stored with 8 elements per row, 5 used
    b = data(dtype, (1, 5))  # one row repeated (row stride 0)
    put(m, 0x0, a)
    put(m, 0x400, b)
    run(
        m,
        "vbin",
        func=func,
        in_dtype=dtype,
        out_dtype=dtype,
        dst=0x800,
        src0=0x0,
        src1=0x400,
        rows=3,
        cols=5,
        dst_stride=6,
        s0_stride=8,
        s1_stride=0,
    )
    wide = "f32" if dtype != "i32" else "i32"
    ref = f32_then(dtype, REF[func](a[:, :5].astype(NUMPY_DTYPES[wide]), b.astype(NUMPY_DTYPES[wide])))
    got = get(m, 0x800, 3, 5, dtype, row_stride=6)
    np.testing.assert_array_equal(got.astype(F32), ref.astype(F32))


def test_vbin_column_broadcast_and_comparison():
    m = machine()
    a = data("f32", (4, 6))
    col = data("f32", (4, 1))
    put(m, 0, a)
    put(m, 0x200, col)
    run(
        m,
        "vbin",
        func="gt",
        in_dtype="f32",
        out_dtype="i1",
        dst=0x400,
        src0=0,
        src1=0x200,
        rows=4,
        cols=6,
        dst_stride=6,
        s0_stride=6,
        s1_stride=1,
        s1_bcast=1,
    )
    np.testing.assert_array_equal(get(m, 0x400, 4, 6, "i1"), a > col)


def test_vbin_integer_division_truncates_and_dst_aliases_src():
    m = machine()
    a = np.array([[-7, 7, -8, 9]], dtype=np.int32)
    b = np.array([[2, -2, 3, 4]], dtype=np.int32)
    put(m, 0, a)
    put(m, 0x40, b)
    run(
        m,
        "vbin",
        func="div",
        in_dtype="i32",
        out_dtype="i32",
        dst=0,
        src0=0,
        src1=0x40,
        rows=1,
        cols=4,
        dst_stride=4,
        s0_stride=4,
        s1_stride=4,
    )
    np.testing.assert_array_equal(get(m, 0, 1, 4, "i32"), [[-3, -3, -2, 2]])


def test_vbini_reverse_and_immediate_in_dtype():
    m = machine()
    a = data("f16", (2, 4))
    put(m, 0, a)
    run(
        m,
        "vbini",
        func="sub",
        in_dtype="f16",
        out_dtype="f32",
        dst=0x100,
        src0=0,
        imm=1.5,
        rev=1,
        rows=2,
        cols=4,
        dst_stride=4,
        s0_stride=4,
    )
    np.testing.assert_array_equal(get(m, 0x100, 2, 4, "f32"), F32(1.5) - a.astype(F32))
    ints = np.array([[5, -5, 7, 0]], dtype=np.int32)
    put(m, 0x200, ints)
    # the f32 immediate 2.9 becomes the i32 operand 2 (truncation), as a constant tensor would
    run(
        m,
        "vbini",
        func="mul",
        in_dtype="i32",
        out_dtype="i32",
        dst=0x200,
        src0=0x200,
        imm=2.9,
        rows=1,
        cols=4,
        dst_stride=4,
        s0_stride=4,
    )
    np.testing.assert_array_equal(get(m, 0x200, 1, 4, "i32"), ints * 2)


def test_vun_functions_casts_and_broadcast():
    m = machine()
    x = data("f32", (3, 4))
    put(m, 0, x)
    run(
        m,
        "vun",
        func="exp",
        in_dtype="f32",
        out_dtype="f32",
        dst=0x100,
        src=0,
        rows=3,
        cols=4,
        dst_stride=4,
        src_stride=4,
    )
    np.testing.assert_array_equal(get(m, 0x100, 3, 4, "f32"), np.exp(x.astype(np.float64)).astype(F32))
    run(
        m,
        "vun",
        func="copy",
        in_dtype="f32",
        out_dtype="bf16",
        dst=0x200,
        src=0,
        rows=3,
        cols=4,
        dst_stride=4,
        src_stride=4,
    )
    np.testing.assert_array_equal(get(m, 0x200, 3, 4, "bf16"), x.astype(ml_dtypes.bfloat16))
    # src_bcast: element r of a column repeated along row r
    run(
        m,
        "vun",
        func="neg",
        in_dtype="f32",
        out_dtype="f32",
        dst=0x300,
        src=0,
        rows=3,
        cols=5,
        dst_stride=5,
        src_stride=4,
        src_bcast=1,
    )
    np.testing.assert_array_equal(get(m, 0x300, 3, 5, "f32"), np.repeat(-x[:, :1], 5, axis=1))
    ints = np.array([[-3, 4, -1, 0]], dtype=np.int32)
    put(m, 0x400, ints)
    run(
        m,
        "vun",
        func="relu",
        in_dtype="i32",
        out_dtype="i32",
        dst=0x400,
        src=0x400,
        rows=1,
        cols=4,
        dst_stride=4,
        src_stride=4,
    )
    np.testing.assert_array_equal(get(m, 0x400, 1, 4, "i32"), np.maximum(ints, 0))


@pytest.mark.parametrize("func,ref", [("sum", np.sum), ("max", np.max), ("min", np.min)])
def test_vred_rows_with_stride(func, ref):
    m = machine()
    x = data("f16", (5, 16))
    put(m, 0, x)
    run(
        m,
        "vred",
        func=func,
        in_dtype="f16",
        out_dtype="f32",
        dst=0x400,
        src=0,
        rows=5,
        cols=12,
        src_stride=16,
    )
    want = ref(x[:, :12].astype(F32), axis=1)
    np.testing.assert_allclose(get(m, 0x400, 1, 5, "f32")[0], want, rtol=1e-6)
    if func != "sum":
        np.testing.assert_array_equal(get(m, 0x400, 1, 5, "f32")[0], want)


def test_vsel_in_place_with_broadcast_condition():
    m = machine()
    cond = np.array([[1], [0], [1]], dtype=np.bool_)
    src = data("f16", (3, 4))
    dst = data("f16", (3, 4))
    put(m, 0, cond)
    put(m, 0x40, src)
    put(m, 0x100, dst)
    run(
        m,
        "vsel",
        cond=0,
        src=0x40,
        dst=0x100,
        dtype="f16",
        rows=3,
        cols=4,
        cond_stride=1,
        src_stride=4,
        dst_stride=4,
        cond_bcast=1,
    )
    np.testing.assert_array_equal(get(m, 0x100, 3, 4, "f16"), np.where(cond, src, dst))


@pytest.mark.parametrize("dtype", ["f16", "f32", "i64", "i8"])
def test_transpose_strided(dtype):
    m = machine()
    x = data(dtype, (3, 8))
    put(m, 0, x)
    size = NUMPY_DTYPES[dtype].itemsize
    run(m, "transpose", dst=0x400, src=0, rows=3, cols=5, elem_bytes=size, src_stride=8, dst_stride=4)
    np.testing.assert_array_equal(get(m, 0x400, 5, 3, dtype, row_stride=4), x[:, :5].T)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_matmul_k_tiles_match_numerics_bit_exact(dtype):
    m = machine()
    a = data(dtype, (6, 40))
    b = data(dtype, (40, 10))
    put(m, 0, a)
    put(m, 0x1000, b.T.copy())  # stored n x k: exercises trans_b
    for k0 in range(0, 40, 16):
        kk = min(16, 40 - k0)
        size = NUMPY_DTYPES[dtype].itemsize
        run(
            m,
            "matmul",
            a=k0 * size,
            b=0x1000 + k0 * size,
            c=0x3000,
            m=6,
            n=10,
            k=kk,
            a_stride=40,
            b_stride=40,
            c_stride=12,
            in_dtype=dtype,
            acc=int(k0 > 0),
            trans_b=1,
        )
    want = matmul_2d(a, b, tile=(0, 0, 16))
    np.testing.assert_array_equal(get(m, 0x3000, 6, 10, "f32", row_stride=12), want)
    np.testing.assert_allclose(want, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-2, atol=1e-2)


def test_load_store_gather_and_registers():
    m = machine()
    table = np.arange(40, dtype=np.float32).reshape(10, 4)
    m.dram[0x100 : 0x100 + table.nbytes] = table.view(np.uint8).reshape(-1)
    run(m, "setr", reg=3, value=32)  # skip two rows of 16 bytes
    run(m, "load", dram=0x100, dram_reg=3, sram=0, rows=3, row_bytes=8, dram_stride=16, sram_stride=12)
    np.testing.assert_array_equal(get(m, 0, 3, 2, "f32", row_stride=3), table[2:5, :2])
    put(m, 0x200, np.array([[7, 0, 7, 3]], dtype=np.int32))
    run(
        m,
        "gather",
        dram=0x100,
        sram_idx=0x200,
        count=4,
        row_bytes=16,
        dram_stride=16,
        sram=0x400,
        sram_stride=16,
        limit=10,
    )
    np.testing.assert_array_equal(get(m, 0x400, 4, 4, "f32"), table[[7, 0, 7, 3]])
    run(m, "store", dram=0x800, sram=0x400, rows=4, row_bytes=16, dram_stride=32, sram_stride=16)
    back = m.dram[0x800 : 0x800 + 4 * 32].view(np.float32).reshape(4, 8)[:, :4]
    np.testing.assert_array_equal(back, table[[7, 0, 7, 3]])


def test_static_and_dynamic_faults():
    m = machine()
    size = TARGET.sram.size_bytes
    fn, args, _ = compile_instr(
        Instr("vbin", dict(dst=size - 8, src0=0, src1=0, rows=1, cols=4, dst_stride=4)), TARGET
    )
    with pytest.raises(Fault, match="SRAM overflow: dst"):
        fn(m, args)
    put(m, 0x200, np.array([[1, 12]], dtype=np.int32))
    with pytest.raises(Fault, match=r"gather index out of range: index\[1\] = 12 outside \[0, 10\)"):
        run(m, "gather", dram=0, sram_idx=0x200, count=2, row_bytes=4, dram_stride=4, sram=0, limit=10)
    with pytest.raises(Fault, match="DRAM address out of range"):
        run(m, "load", dram=(1 << 16) - 4, sram=0, rows=1, row_bytes=8)
    assert not issubclass(Fault, SimTrap)  # the executor adds address, mnemonic and node
