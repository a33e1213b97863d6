"""matmul_w4a16: the simulator's instruction == the IR interpreter's mcp.matmul_w4a16 == a numpy
reference of the quantized math, on random shapes, code dtypes, group sizes and layouts."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_sim_exec import TARGET, get, machine, put, run

from mcpc.arch.dtypes import pack_nibbles
from mcpc.arch.numerics import NUMPY_DTYPES
from mcpc.ir import ops
from mcpc.ir.core import Value
from mcpc.ir.dtypes import dtype_from_name
from mcpc.ir.interpreter import evaluate_op
from mcpc.ir.types import TensorType
from mcpc.sim.execute import compile_instr
from mcpc.sim.machine import Fault
from mcpc.sim.timing import instr_cost

_RANGE = {"i4": (-8, 8), "u4": (0, 16), "i8": (-128, 128), "u8": (0, 256)}


def _codes(rng, dtype, shape):
    lo, hi = _RANGE[dtype]
    return rng.integers(lo, hi, shape).astype(NUMPY_DTYPES[dtype])


def _raw(arr: np.ndarray, dtype: str) -> np.ndarray:
    """Rows of ``arr`` as stored in SRAM: packed two per byte (each row on a byte) for 4-bit."""
    if dtype in ("i4", "u4"):
        return np.stack([pack_nibbles(np.asarray(r)) for r in arr])
    return np.ascontiguousarray(arr).view(np.uint8).reshape(arr.shape[0], -1)


def _sim(a, codes, scale, zp, group, trans_b, a_dt, w_dt, s_dt, acc_init=None):
    m_, k = a.shape
    n = codes.shape[0] if trans_b else codes.shape[1]
    mach = machine()
    put(mach, 0x0, a)
    raw = _raw(codes, w_dt)
    put(mach, 0x4000, raw)
    put(mach, 0x10000, scale)
    if zp is not None:
        put(mach, 0x12000, _raw(zp, w_dt))
    if acc_init is not None:
        put(mach, 0x14000, acc_init)
    b_stride = raw.shape[1] * (2 if w_dt in ("i4", "u4") else 1)
    run(mach, "setq", scale_ptr=0x10000, zp_ptr=0x12000 if zp is not None else 0, group_size=group)
    run(mach, "matmul_w4a16", a=0, b=0x4000, c=0x14000, m=m_, n=n, k=k, a_stride=k, b_stride=b_stride,
        c_stride=n, in_dtype=a_dt, w_dtype=w_dt, s_dtype=s_dt, acc=int(acc_init is not None),
        trans_b=int(trans_b))  # fmt: skip
    return get(mach, 0x14000, m_, n, "f32")


def _interp(a, codes, scale, zp, group, trans_b, a_dt):
    def val(x, name):
        return Value(TensorType(x.shape, dtype_from_name(name)))

    w_dt = next(k for k, v in NUMPY_DTYPES.items() if v == codes.dtype and k in _RANGE)
    s_dt = next(k for k, v in NUMPY_DTYPES.items() if v == scale.dtype)
    z = zp if zp is not None else np.zeros(scale.shape, codes.dtype)
    operands = [val(a, a_dt), val(codes, w_dt), val(scale, s_dt), val(z, w_dt)]
    op = ops.MatMulW4A16Op(operands, {"trans_b": trans_b, "group_size": group, "out": dtype_from_name("f32")})
    return evaluate_op(op, [a, codes, scale, z])[0]


def _numpy_ref(a, codes, scale, zp, group, trans_b):
    """The quantized math written out: per-group (code - zp) * scale in f32, rounded to a's dtype."""
    w = codes.astype(np.int64).T if trans_b else codes.astype(np.int64)  # (k, n)
    s = scale.astype(np.float32).T if trans_b else scale.astype(np.float32)
    z = np.zeros(s.shape, np.int64) if zp is None else zp.astype(np.int64)
    z = z.T if trans_b and zp is not None else z
    k = w.shape[0]
    g = group or k
    rows = np.arange(k) // g
    deq = ((w - z[rows]).astype(np.float32) * s[rows]).astype(a.dtype)
    return a.astype(np.float32) @ deq.astype(np.float32)


@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(1, 9),
    n=st.integers(1, 12).map(lambda x: 2 * x),
    groups=st.integers(1, 4),
    group=st.sampled_from([0, 2, 4, 8, 32]),
    trans_b=st.booleans(),
    w_dt=st.sampled_from(["i4", "u4", "i8", "u8"]),
    a_dt=st.sampled_from(["f16", "f32", "bf16"]),
    s_dt=st.sampled_from(["f16", "f32"]),
    with_zp=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_sim_equals_interpreter_equals_numpy(m, n, groups, group, trans_b, w_dt, a_dt, s_dt, with_zp, seed):
    rng = np.random.default_rng(seed)
    k = groups * (group or 6)
    if trans_b and w_dt in ("i4", "u4") and k % 2:
        k += 1
    a = rng.standard_normal((m, k)).astype(np.float32).astype(NUMPY_DTYPES[a_dt])
    codes = _codes(rng, w_dt, (n, k) if trans_b else (k, n))
    kg = -(-k // group) if group else 1
    sshape = (n, kg) if trans_b else (kg, n)
    scale = (rng.random(sshape) * 0.1 + 0.01).astype(NUMPY_DTYPES[s_dt])
    zp = _codes(rng, w_dt, sshape) if with_zp else None
    if zp is not None and trans_b and w_dt in ("i4", "u4") and kg % 2:
        zp = None  # packed rows of an odd length: covered by the byte-aligned layout test
    sim = _sim(a, codes, scale, zp, group, trans_b, a_dt, w_dt, s_dt)
    ours = _interp(a, codes, scale, zp, group, trans_b, a_dt)
    np.testing.assert_array_equal(sim.view(np.uint32), ours.view(np.uint32))
    ref = _numpy_ref(a, codes, scale, zp, group, trans_b)
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(ref).max())))


def test_packed_zero_point_rows_start_on_a_byte_and_acc_adds():
    rng = np.random.default_rng(1)
    n, k, group = 4, 6, 2  # 3 groups: zero-point rows of 3 nibbles take 2 bytes each
    a = rng.standard_normal((2, k)).astype(np.float16)
    codes = _codes(rng, "u4", (n, k))
    scale = (rng.random((n, 3)) * 0.1).astype(np.float16)
    zp = _codes(rng, "u4", (n, 3))
    init = rng.standard_normal((2, n)).astype(np.float32)
    sim = _sim(a, codes, scale, zp, group, True, "f16", "u4", "f16", acc_init=init)
    expect = init + _interp(a, codes, scale, zp, group, True, "f16")
    np.testing.assert_array_equal(sim, expect)


def test_scale_tile_outside_sram_traps():
    mach = machine()
    run(mach, "setq", scale_ptr=TARGET.sram.size_bytes - 2, group_size=32)
    fn, args, _ = compile_instr_w4(m=1, n=64, k=64)
    with pytest.raises(Fault, match="scale tile"):
        fn(mach, args)


def compile_instr_w4(**f):
    from mcpc.arch.isa import Instr

    fields = dict(a=0, b=0x1000, c=0x2000, a_stride=f["k"], b_stride=f["n"], c_stride=f["n"], in_dtype="f16",
                  w_dtype="i4", s_dtype="f16", **f)  # fmt: skip
    return compile_instr(Instr("matmul_w4a16", fields), TARGET)


def test_ingestion_counts_packed_code_bytes():
    """A weight-streaming (one-row) matmul is bound by the bytes the array ingests: int4 codes take
    a quarter of the f16 weight's, so the busy cycles drop by ~4x."""
    from mcpc.arch.isa import Instr

    n = k = 1024
    common = dict(a=0, b=0x1000, c=0x2000, m=1, n=n, k=k, a_stride=k, b_stride=n, c_stride=n, in_dtype="f16")
    f16 = instr_cost(Instr("matmul", common), TARGET)
    w4 = instr_cost(Instr("matmul_w4a16", {**common, "w_dtype": "i4", "s_dtype": "f16"}), TARGET)
    w8 = instr_cost(Instr("matmul_w4a16", {**common, "w_dtype": "i8", "s_dtype": "f16"}), TARGET)
    assert f16.busy / w4.busy == pytest.approx(4, rel=0.05)
    assert f16.busy / w8.busy == pytest.approx(2, rel=0.05)
    assert w4.macs == f16.macs == n * k


def test_unknown_dtypes_trap():
    fn, args, _ = compile_instr_w4(m=1, n=2, k=2, **{})
    assert fn.__name__ != "_trap"
    from mcpc.arch.isa import Instr

    bad = Instr("matmul_w4a16", dict(m=1, n=2, k=2, in_dtype="f16", w_dtype="f16", s_dtype="f16"))
    fn, args, _ = compile_instr(bad, TARGET)
    with pytest.raises(Fault, match="w_dtype f16"):
        fn(machine(), args)


def test_ml_dtypes_int4_rows_match_onnx_packing():
    """Low nibble first: the code at an even index is the low half of its byte (ONNX's int4)."""
    row = np.array([1, -2, 3], dtype=ml_dtypes.int4)
    assert pack_nibbles(row).tolist() == [0xE1, 0x03]


@settings(max_examples=30, deadline=None)
@given(
    rows=st.integers(1, 6),
    half_cols=st.integers(1, 40),
    group=st.sampled_from([0, 2, 8, 32]),
    w_dt=st.sampled_from(["i4", "u4", "i8", "u8"]),
    out=st.sampled_from(["f16", "f32", "bf16"]),
    with_zp=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_vdequant_equals_interpreter_dequantize(rows, half_cols, group, w_dt, out, with_zp, seed):
    """vdequant == mcp.dequantize {axis -1, block_size} of the interpreter, bit for bit."""
    rng = np.random.default_rng(seed)
    cols = 2 * half_cols
    codes = _codes(rng, w_dt, (rows, cols))
    groups = -(-cols // group) if group else 1
    scale = (rng.random((rows, groups)) * 0.2 - 0.1).astype(np.float16)
    zp = _codes(rng, w_dt, (rows, groups)) if with_zp else np.zeros((rows, groups), NUMPY_DTYPES[w_dt])
    mach = machine()
    raw = _raw(codes, w_dt)
    put(mach, 0x0, raw)
    put(mach, 0x8000, scale)
    put(mach, 0x9000, _raw(zp, w_dt))
    run(mach, "setq", scale_ptr=0x8000, zp_ptr=0x9000 if with_zp else 0, group_size=group)
    run(mach, "vdequant", in_dtype=w_dt, out_dtype=out, s_dtype="f16", dst=0x10000, src=0, rows=rows,
        cols=cols, dst_stride=cols, src_stride=raw.shape[1] * (2 if w_dt in ("i4", "u4") else 1))  # fmt: skip
    got = get(mach, 0x10000, rows, cols, out)

    def val(x, name):
        return Value(TensorType(x.shape, dtype_from_name(name)))

    block = group or cols
    operands = [val(codes, w_dt), val(scale, "f16"), val(zp, w_dt)]
    op = ops.DequantizeOp(operands, {"axis": -1, "block_size": block, "out": dtype_from_name(out)})
    want = evaluate_op(op, [codes, scale, zp])[0]
    np.testing.assert_array_equal(got.view(np.uint8), np.ascontiguousarray(want).view(np.uint8))


@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(1, 6),
    n=st.integers(1, 10).map(lambda x: 2 * x),
    k=st.integers(1, 40).map(lambda x: 2 * x),
    variant=st.sampled_from(
        [
            ("vmmul.q4f8", "i4", "f8e4m3fn"),
            ("matmul_i8", "i8", "i8"),
            ("matmul_i8", "u8", "i8"),
            ("matmul_i8", "u8", "i4"),
        ]
    ),  # fmt: skip
    trans_b=st.booleans(),
    per_column=st.booleans(),
    a_dt=st.sampled_from(["f16", "f32"]),
    seed=st.integers(0, 2**16),
)
def test_quantized_activation_matmuls(m, n, k, variant, trans_b, per_column, a_dt, seed):
    """vmmul.q4f8 and matmul_i8 == mcp.matmul_qa in the interpreter == numpy's quantized math."""
    op_name, q_dt, w_dt = variant
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal((m, k)) * 2).astype(NUMPY_DTYPES[a_dt])
    shape = (n, k) if trans_b else (k, n)
    if w_dt == "f8e4m3fn":
        codes = (rng.standard_normal(shape) * 40).astype(np.float32).astype(ml_dtypes.float8_e4m3fn)
    else:
        codes = _codes(rng, w_dt, shape)
    scale_a = np.float32(0.05 + rng.random() * 0.3)
    za = {"i4": 0, "i8": 0, "u8": int(rng.integers(100, 156))}[q_dt]
    zp = np.array([za], NUMPY_DTYPES[q_dt])
    scale = (rng.random(n if per_column else 1) * 0.01 + 1e-3).astype(np.float32)
    mach = machine()
    put(mach, 0x0, a)
    raw = _raw(codes, w_dt) if w_dt != "f8e4m3fn" else codes.view(np.uint8)
    put(mach, 0x4000, raw)
    put(mach, 0x10000, scale)
    put(mach, 0x11000, _raw(zp.reshape(1, 1), q_dt))
    b_stride = raw.shape[1] * (2 if w_dt == "i4" else 1)
    run(mach, "setq", scale_a=float(scale_a), scale_w=float(scale[0]), scale_o=1.0,
        zp_ptr=0x11000 if za else 0, scale_ptr=0x10000 if per_column else 0)  # fmt: skip
    run(mach, op_name, a=0, b=0x4000, c=0x14000, m=m, n=n, k=k, a_stride=k, b_stride=b_stride, c_stride=n,
        in_dtype=a_dt, q_dtype=q_dt, w_dtype=w_dt, trans_b=int(trans_b))  # fmt: skip
    sim = get(mach, 0x14000, m, n, "f32")

    def val(x, name):
        return Value(TensorType(x.shape, dtype_from_name(name)))

    operands = [val(a, a_dt), val(codes, w_dt), val(scale, "f32"), val(zp, q_dt)]
    attrs = {"scale_a": float(scale_a), "trans_b": trans_b, "out": dtype_from_name("f32")}
    ours = evaluate_op(ops.MatMulQAOp(operands, attrs), [a, codes, scale, zp])[0]
    np.testing.assert_array_equal(sim.view(np.uint32), ours.view(np.uint32))
    # numpy: quantize A (round half to even, clip), exact integer/fp8 products, one f32 scale
    lo, hi = {"i4": (-8, 7), "i8": (-128, 127), "u8": (0, 255)}[q_dt]
    q = np.clip(np.rint(a.astype(np.float32) / scale_a) + za, lo, hi) - za
    w = codes.astype(np.float64).T if trans_b else codes.astype(np.float64)
    ref = (q.astype(np.float64) @ w) * scale.astype(np.float64)
    np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-6 * max(1.0, float(np.abs(ref).max())))
