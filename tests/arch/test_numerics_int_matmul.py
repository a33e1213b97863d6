"""Integer matmul tiles on float64 BLAS: exact (equal to the i64 product) up to the 2**53 bound on
k·max|a|·max|b|, and computed in i64 beyond it."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from mcpc.arch import numerics as nx


@pytest.mark.parametrize(
    "a_dt, b_dt, lo, hi",
    [(np.int8, np.int8, -128, 128), (np.uint8, np.int8, 0, 256), (ml_dtypes.int4, np.uint8, -8, 8)],
)
@pytest.mark.parametrize("k", [1, 5, 333])
def test_small_integer_tiles_are_exact(a_dt, b_dt, lo, hi, k):
    rng = np.random.default_rng(k)
    a = rng.integers(lo, hi, (7, k)).astype(a_dt)
    b = rng.integers(np.iinfo(b_dt).min, np.iinfo(b_dt).max + 1, (k, 4)).astype(b_dt)
    a[0], b[:, 0] = lo, np.iinfo(b_dt).min  # extreme magnitudes
    want = np.matmul(a.astype(np.int64), b.astype(np.int64))
    assert nx.matmul_in_f64(a.dtype, b.dtype, k)
    got = nx.matmul_tile(a, b)
    assert got.dtype == np.int64 and np.array_equal(got, want)


def test_bound_is_2_to_the_53():
    i8, i32 = np.dtype(np.int8), np.dtype(np.int32)
    assert nx.matmul_in_f64(i8, i8, 2**53 // 2**14 - 1)
    assert not nx.matmul_in_f64(i8, i8, 2**53 // 2**14)
    assert not nx.matmul_in_f64(i32, i32, 1)  # 2**62: not every product is a float64
    assert not nx.matmul_in_f64(np.dtype(np.bool_), i8, 1)  # bool tiles keep numpy's bool matmul


def test_beyond_the_bound_is_still_exact():
    # products of 2**31-sized values differ in their low bits from any float64 rounding
    a = np.array([[2**31 - 1, 2**31 - 3]], dtype=np.int32)
    b = np.array([[2**31 - 5], [-(2**31) + 7]], dtype=np.int32)
    want = (2**31 - 1) * (2**31 - 5) + (2**31 - 3) * (-(2**31) + 7)
    assert int(nx.matmul_tile(a, b)[0, 0]) == want
