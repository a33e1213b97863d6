"""mcpc._kernels (mcpc/_kernels.c through mcpc.arch.kernels): the f16 <-> f32 conversions and the
f16/f32 elementwise arithmetic give numpy's bits, erf gives scipy's and exp numpy's — every f16
value, dense and random f32 values (every f32 value in the slow suite), every operation, broadcast
and strided layouts, immediates on either side — and a simulated program gives the same outputs and
cycles with and without them."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import special

import mcpc
from mcpc.arch import kernels
from mcpc.arch.numerics import unary
from mcpc.sim.api import from_program, run_program

pytestmark = pytest.mark.skipif(not kernels.AVAILABLE, reason="mcpc._kernels was not built (no C compiler)")

_UFUNCS = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}


def _bits(x: np.ndarray) -> np.ndarray:
    return x.view(np.uint16 if x.dtype == np.float16 else np.uint32)


def _narrow_ref(f: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return f.astype(np.float16)


def test_widen_gives_numpys_f32_for_every_f16_value():
    every = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    for shape in [(1, 1 << 16), (256, 256), (1 << 16, 1), (4096, 16)]:
        x = every.reshape(shape)
        for src in (x, x.T, x[:, ::3]):
            out = np.empty(src.shape, np.float32)
            assert kernels.convert(out, src) in (0, 1)
            assert np.array_equal(_bits(out), _bits(src.astype(np.float32)))


def _dense_f32() -> np.ndarray:
    """Every exponent around the f16 range with the low 13 mantissa bits exhaustive, the rounding
    ties and their neighbours, random mantissas, both signs, infinities and NaNs."""
    rng = np.random.default_rng(0)
    e = np.arange(90, 150, dtype=np.uint32)
    top = np.arange(1 << 10, dtype=np.uint32) << 13
    m = np.concatenate([np.arange(1 << 13, dtype=np.uint32), top | 0x1000, top | 0xFFF, top | 0x1001,
                        rng.integers(0, 1 << 23, 1 << 14).astype(np.uint32)])  # fmt: skip
    u = ((e[:, None] << 23) | m[None, :]).ravel()
    special = np.array([0x7F800000, 0x7F800001, 0x7FC00000, 0x7FBFFFFF, 0x7F802000, 0x7FFFE000, 0x477FEFFF,
                        0x477FF000, 0x477FE000, 0x33000000, 0x33000001, 0x00000001], np.uint32)  # fmt: skip
    u = np.concatenate([u, special])
    return np.concatenate([u, u | 0x80000000]).view(np.float32)


def test_narrow_gives_numpys_f16_on_dense_and_random_f32_values():
    rng = np.random.default_rng(1)
    values = [
        _dense_f32(),
        rng.integers(0, 1 << 32, 1 << 22, dtype=np.uint64).astype(np.uint32).view(np.float32),
    ]
    for f in values:
        x = f[: f.size - f.size % 64].reshape(64, -1)
        for src in (x, x[:, 1::2], x.T):
            out = np.empty(src.shape, np.float16)
            kernels.convert(out, src)
            assert np.array_equal(_bits(out), _bits(_narrow_ref(src)))


def _every_f32():
    """All 2^32 f32 bit patterns, 2^24 at a time: (first pattern, a (1, 2^24) array)."""
    chunk = 1 << 24
    for start in range(0, 1 << 32, chunk):
        yield (
            start,
            np.arange(start, start + chunk, dtype=np.uint64)
            .astype(np.uint32)
            .view(np.float32)
            .reshape(1, -1),
        )


@pytest.mark.slow
def test_narrow_gives_numpys_f16_for_every_f32_value():
    out = np.empty((1, 1 << 24), np.float16)
    for start, f in _every_f32():
        kernels.convert(out, f)
        assert np.array_equal(_bits(out), _bits(_narrow_ref(f))), hex(start)


def _random_bits(rng, ubits, shape) -> np.ndarray:
    return rng.integers(0, np.iinfo(ubits).max, shape, dtype=np.uint64).astype(ubits)


def _check_binary(func, dst_dtype, a, b, imm=0.0, rev=False):
    shape = np.broadcast_shapes(a.shape, a.shape if b is None else b.shape)
    dst = np.empty(shape, dst_dtype)
    done = kernels.binary(func, dst, a, b, imm, rev)
    assert done in (0, 1)
    wa = a.astype(np.float32)
    wb = np.float32(imm) if b is None else b.astype(np.float32)
    with np.errstate(all="ignore"):
        ref = (_UFUNCS[func](wb, wa) if rev else _UFUNCS[func](wa, wb)).astype(dst_dtype)
    # A NaN computed from two NaN operands is a NaN; its payload is whichever operand numpy's loop
    # for the layout happens to pass first (numpy's own loops differ), so only that case is NaN == NaN.
    both = np.isnan(wa) & np.isnan(wb)
    same = (_bits(dst) == _bits(ref)) | (both & np.isnan(dst) & np.isnan(ref))
    assert same.all(), (func, dst_dtype, a.dtype, int((~same).sum()))
    assert done == int(np.isfinite(ref).all())


@pytest.mark.parametrize("src_dtype", [np.float16, np.float32])
@pytest.mark.parametrize("dst_dtype", [np.float16, np.float32])
@pytest.mark.parametrize("func", ["add", "sub", "mul", "div"])
def test_binary_gives_numpys_bits(func, dst_dtype, src_dtype, monkeypatch):
    # all-f32 arithmetic too, which binary() leaves to numpy on CPUs without AVX-512: the kernel's
    # own scalar and AVX2 rows are checked on every CPU
    monkeypatch.setattr(kernels, "_F32_FAST", True)
    rng = np.random.default_rng(2)
    ubits = np.uint16 if src_dtype == np.float16 else np.uint32
    for trial in range(6):
        if trial % 2:  # any bit pattern: NaNs, infinities, subnormals
            a, b = (_random_bits(rng, ubits, (37, 515)).view(src_dtype) for _ in range(2))
        else:  # finite values of a model's size, some overflowing f16
            a, b = ((rng.standard_normal((37, 515)) * 10.0**trial).astype(src_dtype) for _ in range(2))
        _check_binary(func, dst_dtype, a, b)
        _check_binary(func, dst_dtype, a, b[:1])  # one row for every row (a bias)
        _check_binary(func, dst_dtype, a, b[:, :1])  # one value per row (a norm's statistic)
        _check_binary(func, dst_dtype, a[:, ::3], b[:, 1::3])  # strided columns
        _check_binary(func, dst_dtype, a.T, b.T)
        imm = float(np.float32(rng.standard_normal() * 3))
        _check_binary(func, dst_dtype, a, None, imm)
        _check_binary(func, dst_dtype, a, None, imm, rev=True)


def test_in_place_is_computed_and_partial_overlap_is_left_to_numpy():
    rng = np.random.default_rng(3)
    buf = rng.standard_normal(4096).astype(np.float32)
    x = buf[:2048].reshape(32, 64)
    y = rng.standard_normal((32, 64)).astype(np.float16)  # (f16: taken on every CPU, AVX-512 or not)
    want = x + y.astype(np.float32)
    assert kernels.binary("add", x, x, y) == 1  # in place: the same element read, then written
    assert np.array_equal(x, want)
    before = buf.copy()
    shifted = buf[1:2049].reshape(32, 64)  # overlaps x, one element off
    assert kernels.binary("add", x, shifted, y) == -1
    assert np.array_equal(buf, before)  # not done: untouched
    h = buf.view(np.float16)[:2048].reshape(32, 64)  # f16 over the same bytes as f32 values
    assert kernels.convert(h, buf[:2048].reshape(32, 64)) == -1


def test_what_the_kernels_do_not_take_is_declined():
    a = np.ones((4, 4), np.float64)
    assert kernels.convert(np.empty((4, 4), np.float32), a) == -1
    assert kernels.binary("max", np.empty((4, 4), np.float32), a.astype(np.float32), None) == -1
    assert kernels.widen(np.ones((2, 2, 2), np.float16)) is None
    with pytest.raises(ValueError):
        kernels._native.binary(0, np.empty((4, 4), np.float32), np.ones((3, 4), np.float32), None, 0.0)


@pytest.mark.parametrize("name", ["encoder_block", "decoder_block"])
def test_programs_give_the_same_bits_and_cycles_without_the_kernels(examples_dir, name, monkeypatch):
    dims = {"seq": 32} if name == "decoder_block" else None
    result = mcpc.compile(examples_dir / f"{name}.onnx", target="mcp2026-a100", qat_config="fp16", dims=dims)
    with np.load(examples_dir / f"{name}.npz") as data:
        inputs = dict(data)
    runs = []
    for native in (kernels._native, None):
        with monkeypatch.context() as mp:
            mp.setattr(kernels, "_native", native)
            program = from_program(result.program)
            runs.append([run_program(program, inputs) for _ in range(2)])  # fresh, then warm
    for with_k, without in zip(runs[0], runs[1], strict=True):
        assert with_k.profile["cycles"] == without.profile["cycles"]
        for out in with_k.outputs:
            assert with_k.outputs[out].tobytes() == without.outputs[out].tobytes(), out


def _neighbours(values) -> np.ndarray:
    """Each f32 value with the three f32 values on either side of it: (len(values), 7)."""
    bits = np.asarray(values, np.float32).view(np.uint32).astype(np.int64)
    return (bits[:, None] + np.arange(-3, 4)[None, :]).astype(np.uint32).view(np.float32)


def _erf_ref(x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return special.erf(x.astype(np.float64)).astype(np.float32)


def test_erf_gives_scipys_f32_bits():
    """The kernel's own f64 erf rounded where the rounding is certain, scipy's elsewhere: scipy's
    bits on random values of every scale, the interval ends of the kernel's polynomials and their
    neighbours, NaN, infinities, zeros and subnormals; contiguous (vector) and strided (scalar) rows,
    in place too."""
    rng = np.random.default_rng(4)
    # the interval ends of both tables (widths 7/8 and 7/16 from 1 to 4.5), an eighth grid over the
    # same range, where rounding to 1 begins
    grid = np.concatenate([1.0 + np.arange(0, 9) * 0.4375, 1.0 + np.arange(0, 29) * 0.125])
    ends = np.concatenate([grid, [6.0, 3.85, 3.9, 1e-20, 1e-40]])
    near = _neighbours(np.concatenate([ends, -ends]))
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], np.float32)
    for scale in (1e-3, 0.3, 1.5, 3.0, 10.0):
        x = (rng.standard_normal(1 << 18) * scale).astype(np.float32)
        x = np.concatenate([x, near.ravel(), specials]).astype(np.float32)
        x = x[: x.size - x.size % 64].reshape(64, -1)
        for src in (x, x[:, ::2], x.T):
            dst = np.empty(src.shape, np.float32)
            assert kernels.erf(dst, src) in (0, 1)
            assert np.array_equal(_bits(dst), _bits(_erf_ref(src)))
        inplace = x.copy()
        kernels.erf(inplace, inplace)
        assert np.array_equal(_bits(inplace), _bits(_erf_ref(x)))


@pytest.mark.slow
def test_erf_gives_scipys_f32_bits_for_every_f32_value():
    """Exhaustive: the kernel's f32 results are scipy's for all 2^32 inputs (about 2 minutes)."""
    dst = np.empty((1, 1 << 24), np.float32)
    for start, x in _every_f32():
        kernels.erf(dst, x)
        assert np.array_equal(_bits(dst), _bits(_erf_ref(x))), hex(start)


def _exp_ref(x: np.ndarray) -> np.ndarray:
    return unary("exp", x, "f32")  # the simulator's definition: numpy's f64 exp rounded to f32


def _exp_kernel() -> bool:
    return kernels.AVAILABLE and kernels.exp(np.empty((1, 8), np.float32), np.zeros((1, 8), np.float32)) >= 0


@pytest.mark.skipif(not _exp_kernel(), reason="the exp kernel needs AVX-512")
def test_exp_gives_numpys_f32_bits():
    rng = np.random.default_rng(5)
    edges = np.array([88.72283, 88.72284, 88.7229, -87.33655, -103.27893, -103.97208, -104.0, -200.0, -745.2,
                      0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, -1e-30], np.float32)  # fmt: skip
    near = _neighbours(edges)
    for scale in (1e-3, 1.0, 10.0, 60.0, 1e4):
        x = np.concatenate([(rng.standard_normal(1 << 18) * scale).astype(np.float32), near.ravel()])
        x = x[: x.size - x.size % 64].reshape(64, -1)
        dst = np.empty(x.shape, np.float32)
        assert kernels.exp(dst, x) in (0, 1)
        assert np.array_equal(_bits(dst), _bits(_exp_ref(x)))
        inplace = x.copy()
        kernels.exp(inplace, inplace)
        assert np.array_equal(_bits(inplace), _bits(_exp_ref(x)))
    assert kernels.exp(np.empty((64, 32), np.float32), x[:, ::2][:, :32]) == -1  # strided: numpy's


@pytest.mark.slow
def test_exp_gives_numpys_f32_bits_for_every_f32_value():
    dst = np.empty((1, 1 << 24), np.float32)
    for start, x in _every_f32():
        if kernels.exp(dst, x) < 0:
            pytest.skip("the exp kernel needs AVX-512")
        assert np.array_equal(_bits(dst), _bits(_exp_ref(x))), hex(start)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_all_finite_finds_every_non_finite_value(dtype):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((131, 67)).astype(dtype)
    for src in (x, x.T, x[:, ::3]):
        assert kernels.all_finite(src) is True
    for pos in [(0, 0), (130, 66), (57, 17), (130, 64), (3, 65)]:
        for value in (np.inf, -np.inf, np.nan):
            y = x.copy()
            y[pos] = value
            for src in (y, y.T, y[:, pos[1] % 3 :: 3]):
                assert kernels.all_finite(src) is False, (pos, value)
    assert kernels.all_finite(np.ones((2, 2, 2), dtype)) is None
