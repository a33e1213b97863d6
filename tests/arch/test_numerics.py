"""The shared NPU arithmetic: rounding ties, integer division, reduction and matmul order."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from mcpc.arch import numerics as nx

UINT = {8: np.uint8, 16: np.uint16}
NARROW = {"f16": 16, "bf16": 16, "f8e4m3fn": 8}


def _from_bits(name, bits):
    return np.array([bits], dtype=UINT[NARROW[name]]).view(nx.np_dtype(name))


def _check_tie(name, bits):
    """The f32 midpoint of two adjacent ``name`` values rounds to the one with an even pattern."""
    lo, hi = _from_bits(name, bits), _from_bits(name, bits + 1)
    with np.errstate(invalid="ignore"):  # NaN bit patterns are drawn too, then rejected
        assume(np.isfinite(lo.astype(np.float64)).all() and np.isfinite(hi.astype(np.float64)).all())
    mid = (float(lo[0]) + float(hi[0])) / 2
    assert float(np.float32(mid)) == mid  # the tie itself is exact in f32
    got = nx.cast(np.array([mid], dtype=np.float32), name).view(UINT[NARROW[name]])
    assert int(got[0]) == (bits if bits % 2 == 0 else bits + 1), (name, hex(bits), mid)
    # just off the tie rounds to the nearer neighbour
    above = np.nextafter(np.float32(mid), np.float32(np.copysign(np.inf, mid)))  # away from lo
    towards_hi = nx.cast(np.array([above], dtype=np.float32), name).view(UINT[NARROW[name]])
    assert int(towards_hi[0]) == bits + 1


@settings(max_examples=400, deadline=None)
@given(st.integers(0, 2**16 - 2))
def test_f16_ties_round_half_to_even(bits):
    _check_tie("f16", bits)


@settings(max_examples=400, deadline=None)
@given(st.integers(0, 2**16 - 2))
def test_bf16_ties_round_half_to_even(bits):
    _check_tie("bf16", bits)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**8 - 2))
def test_f8e4m3fn_ties_round_half_to_even(bits):
    _check_tie("f8e4m3fn", bits)


def test_f16_tie_examples():
    # 1 + 2**-11 lies halfway between 1 and 1 + 2**-10: the even mantissa (1.0) wins
    assert nx.cast(np.array([1 + 2**-11], dtype=np.float32), "f16")[0] == np.float16(1.0)
    assert nx.cast(np.array([1 + 3 * 2**-11], dtype=np.float32), "f16")[0] == np.float16(1 + 2**-9)


def test_float_to_int_truncates_and_bool_is_nonzero():
    x = np.array([-1.7, 1.7, -0.5, 0.5, 126.9], dtype=np.float32)
    assert nx.cast(x, "i32").tolist() == [-1, 1, 0, 0, 126]
    assert nx.cast(x, "i8").tolist() == [-1, 1, 0, 0, 126]
    assert nx.cast(x, "i1").tolist() == [True, True, True, True, True]
    assert nx.cast(np.array([0.0, -0.0]), "i1").tolist() == [False, False]


def _trunc_div(a, b):
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


@settings(max_examples=300, deadline=None)
@given(st.integers(-(2**31), 2**31 - 1), st.integers(-(2**31), 2**31 - 1).filter(lambda b: b != 0))
def test_i32_division_truncates_toward_zero(a, b):
    assume(not (a == -(2**31) and b == -1))
    got = nx.binary("div", np.array([a], np.int32), np.array([b], np.int32), "i32")
    assert got.dtype == np.int32 and int(got[0]) == _trunc_div(a, b)


@settings(max_examples=300, deadline=None)
@given(st.integers(-(2**63) + 1, 2**63 - 1), st.integers(-(2**63) + 1, 2**63 - 1).filter(lambda b: b != 0))
def test_i64_division_is_exact_beyond_2_pow_53(a, b):
    got = nx.binary("div", np.array([a], np.int64), np.array([b], np.int64), "i64")
    assert int(got[0]) == _trunc_div(a, b)


@pytest.mark.parametrize("cols", [1, 3, 8, 17, 128, 1000, 4097])
@pytest.mark.parametrize("func", ["sum", "max", "min"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_row_reduce_is_independent_of_row_count(cols, func, dtype):
    rng = np.random.default_rng(cols)
    x = (rng.standard_normal((37, cols)) * 10).astype(dtype)
    whole = nx.row_reduce(func, x, "f32")
    assert whole.dtype == np.float32 and whole.shape == (37,)
    for i in range(37):
        assert nx.row_reduce(func, x[i : i + 1], "f32").tobytes() == whole[i : i + 1].tobytes()
    for lo, hi in [(0, 5), (5, 36), (3, 4)]:
        assert nx.row_reduce(func, x[lo:hi], "f32").tobytes() == whole[lo:hi].tobytes()
    # a non-contiguous view of the same rows gives the same bits
    wide = np.zeros((37, 2 * cols), dtype=dtype)
    wide[:, ::2] = x
    assert nx.row_reduce(func, wide[:, ::2], "f32").tobytes() == whole.tobytes()


def test_matmul_first_tile_overwrites(monkeypatch):
    # Only a -0.0 tile product can tell "acc = first" from "acc = 0; acc += first" (0 + -0 is +0).
    # BLAS never returns -0.0 for a product of zeros, so feed matmul_2d tiles that do.
    def negative_zero_tile(a, b):
        return np.full((a.shape[0], b.shape[1]), -0.0, dtype=np.float32)

    monkeypatch.setattr(nx, "matmul_tile", negative_zero_tile)
    a, b = np.zeros((2, 4), np.float32), np.zeros((4, 3), np.float32)
    for tile in [None, (1, 1, 1), (2, 3, 2), (0, 0, 4)]:
        assert np.signbit(nx.matmul_2d(a, b, tile)).all(), tile


def test_matmul_k_tiles_accumulate_in_ascending_order(monkeypatch):
    calls = []
    real = nx.matmul_tile

    def spy(a, b):
        calls.append((a.shape, b.shape))
        return real(a, b)

    monkeypatch.setattr(nx, "matmul_tile", spy)
    nx.matmul_2d(np.ones((3, 10), np.float32), np.ones((10, 2), np.float32), (2, 0, 4))
    # output row tiles of 2 then 1 rows; K tiles 4, 4, 2 in order inside each
    assert calls == [((2, 4), (4, 2)), ((2, 4), (4, 2)), ((2, 2), (2, 2))] + [
        ((1, 4), (4, 2)),
        ((1, 4), (4, 2)),
        ((1, 2), (2, 2)),
    ]


def _manual(a, b, tm, tn, tk):
    m, k = a.shape
    n = b.shape[1]
    out = np.zeros((m, n), np.float32)
    for i in range(0, m, tm):
        for j in range(0, n, tn):
            acc = None
            for kk in range(0, k, tk):
                p = np.matmul(
                    np.ascontiguousarray(a[i : i + tm, kk : kk + tk], np.float32),
                    np.ascontiguousarray(b[kk : kk + tk, j : j + tn], np.float32),
                )
                acc = p if acc is None else acc + p
            out[i : i + tm, j : j + tn] = acc
    return out


@pytest.mark.parametrize("tile", [(1, 1, 1), (3, 5, 7), (8, 8, 64), (100, 100, 100), (0, 2, 0)])
def test_matmul_2d_tile_order(tile):
    rng = np.random.default_rng(7)
    a = rng.standard_normal((9, 50)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((50, 6)).astype(ml_dtypes.bfloat16)
    m, k = a.shape
    n = b.shape[1]
    tm, tn, tk = tile[0] or m, tile[1] or n, tile[2] or k
    got = nx.matmul_2d(a, b, tile)
    assert got.dtype == np.float32
    assert got.tobytes() == _manual(a.astype(np.float32), b.astype(np.float32), tm, tn, tk).tobytes()


def test_matmul_2d_empty_k_is_zero():
    got = nx.matmul_2d(np.zeros((2, 0), np.float32), np.zeros((0, 3), np.float32))
    assert got.shape == (2, 3) and not got.any()


def test_rank0_operands_stay_rank0():
    x = np.array(2.0, dtype=np.float16)
    assert nx.binary("add", x, x, "f16").shape == ()
    assert nx.unary("exp", x, "f32").shape == ()
    assert nx.unary("copy", x, "f32").shape == ()
    assert nx.select(np.array(True), x, x, "f16").shape == ()


def test_special_functions_round_once_from_f64():
    x = np.linspace(-4, 4, 101, dtype=np.float32)
    assert nx.unary("exp", x, "f32").tobytes() == np.exp(x.astype(np.float64)).astype(np.float32).tobytes()
    assert nx.unary("gelu", x, "f16").dtype == np.float16


# -- 8/16-bit operands through tables: the values of the direct computation ----------------------
_UNARY_FUNCS = sorted(nx.SPECIAL_FUNCTIONS | {"neg", "abs", "floor", "round", "relu", "copy"})


def _every(name):
    return np.arange(1 << NARROW[name], dtype=UINT[NARROW[name]]).view(nx.np_dtype(name))


def _same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("name", ["f16", "bf16", "f8e4m3fn"])
@pytest.mark.parametrize("func", _UNARY_FUNCS)
def test_unary_table_equals_direct_computation(name, func):
    # every bit pattern, shuffled and in a strided 2-D view: if the direct computation depended on
    # an element's position (a vectorised loop and a scalar tail disagreeing), this would differ
    rng = np.random.default_rng(0)
    every = _every(name)
    vals = np.resize(rng.permutation(every), max(every.size, 2 * nx._TABLE_MIN)).reshape(16, -1)
    buf = np.zeros((16, 2 * vals.shape[1] + 1), every.dtype)
    buf[:, 1::2] = vals
    x = buf[:, 1::2]  # a strided view of every value
    assert x.size >= nx._TABLE_MIN
    for out in ("f32", "f16", name):
        got = nx.unary(func, x, out)
        assert _same_bits(got, nx._unary(func, np.ascontiguousarray(x), out)), (func, name, out)
        assert _same_bits(got, np.stack([nx._unary(func, row, out) for row in x])), (func, name, out)


@pytest.mark.parametrize("name", ["f16", "bf16"])
@pytest.mark.parametrize("func", sorted(nx._TABLE_BINARY))
def test_binary_with_one_value_table_equals_direct_computation(name, func):
    rng = np.random.default_rng(1)
    x = rng.permutation(_every(name)).reshape(256, 256)[:, 1:]
    for value in (0.7071, -3.0, 0.0, 65504.0, float("inf"), float("nan")):
        v = nx.cast(np.asarray(np.float32(value)), name)
        for out in ("f16", "f32"):
            assert _same_bits(nx.binary(func, x, v, out), nx._binary(func, x, v, out)), (func, value)
            assert _same_bits(nx.binary(func, v, x, out), nx._binary(func, v, x, out)), (func, value)
            col = v.reshape(1, 1)  # a one-element operand of the same rank (a broadcast column)
            assert _same_bits(nx.binary(func, x, col, out), nx._binary(func, x, col, out)), (func, value)


def test_tables_are_bounded_and_reused():
    x = np.ones((64, 128), np.float16)
    nx.unary("exp", x, "f32")
    key = ("unary", "exp", x.dtype.str, "f32")
    table = nx._TABLES[key]
    nx.unary("exp", x, "f32")
    assert nx._TABLES[key] is table and len(nx._TABLES) <= nx._TABLES_MAX
    small = np.ones(nx._TABLE_MIN - 1, np.float16)
    assert not nx._tabled(small) and nx._tabled(np.ones(nx._TABLE_MIN, np.float16))
    assert not nx._tabled(np.ones(nx._TABLE_MIN, np.float32))
