"""QuantSpec, QuantizedWeight, the rounding helper and RTN: properties that hold for any weight."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mcpc.arch import numerics
from mcpc.passes.quant import QuantizedWeight, QuantSpec, quantize_rtn, round_to_int
from mcpc.passes.quant.core import quantize_float


def test_round_to_int_ties():
    x = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, -3.5], np.float32)
    np.testing.assert_array_equal(round_to_int(x), [-2, -2, -0, 0, 2, 2, 4, -4])
    np.testing.assert_array_equal(round_to_int(x, "half_away"), [-3, -2, -1, 1, 2, 3, 4, -4])
    for mode in ("half_even", "half_away"):  # in place gives the same values
        y = x.copy()
        assert round_to_int(y, mode, out=y) is y
        np.testing.assert_array_equal(y, round_to_int(x, mode))


def test_round_to_int_near_ties_and_specials():
    below = np.nextafter(np.float32(0.5), np.float32(0))  # 0.49999997: x + 0.5 would round up in f32
    x = np.array([below, -below, 1e30, -7.0, np.nan], np.float32)
    for mode in ("half_even", "half_away"):
        r = round_to_int(x, mode)
        np.testing.assert_array_equal(r[:4], [0, -0, x[2], -7])
        assert np.isnan(r[4])
    with pytest.raises(ValueError, match="rounding"):
        round_to_int(x, "up")


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"bits": 1}, "bits"),
        ({"bits": 9}, "bits"),
        ({"group_size": -1}, "group_size"),
        ({"scale_dtype": "f64"}, "scale_dtype"),
        ({"rounding": "floor"}, "rounding"),
    ],
)
def test_spec_refuses_bad_fields(kwargs, field):
    with pytest.raises(ValueError, match=field):
        QuantSpec(**kwargs)


specs = st.builds(
    QuantSpec,
    bits=st.integers(2, 8),
    group_size=st.sampled_from([0, 1, 7, 16, 32, 64]),
    symmetric=st.booleans(),
    scale_dtype=st.sampled_from(["f32", "f16", "bf16"]),
    rounding=st.sampled_from(["half_even", "half_away"]),
)
weights = hnp.arrays(
    np.float32,
    st.tuples(st.integers(1, 70), st.integers(1, 9)),
    elements=st.floats(-4, 4, width=32) | st.sampled_from([0.0, 1.0, -1.0, 0.5]),
)


@settings(max_examples=150, deadline=None)
@given(w=weights, spec=specs)
def test_rtn_properties(w, spec):
    k, n = w.shape
    q = quantize_rtn(w, spec)
    g = spec.group_len(k)
    groups = math.ceil(k / g)
    assert q.codes.shape == (k, n) and q.codes.dtype == spec.code_dtype
    assert q.scales.shape == (groups, n) and q.scales.dtype == np.dtype(
        {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}[spec.scale_dtype]
    )
    assert (q.zero_points is None) == spec.symmetric
    assert q.codes.min() >= spec.qmin and q.codes.max() <= spec.qmax
    s = q.scales.astype(np.float32)
    assert np.all(np.isfinite(s)) and np.all(s != 0)
    if q.zero_points is not None:
        assert q.zero_points.shape == (groups, n) and q.zero_points.max() <= spec.qmax
    # dequantize is numerics.dequantize on the expanded qparams (the IR op's definition)
    se = np.broadcast_to(numerics.expand_qparam(s, (k, n), 0, g), (k, n))
    zp = (
        0
        if q.zero_points is None
        else np.broadcast_to(numerics.expand_qparam(q.zero_points, (k, n), 0, g), (k, n)).astype(np.int64)
    )
    ref = (q.codes.astype(np.int64) - zp).astype(np.float32) * se
    d = q.dequantize()
    assert d.dtype == np.float32
    np.testing.assert_array_equal(d, ref)
    # error: half a step inside the representable range; the symmetric short side clips by at most one step
    err = np.abs(d - w)
    lo = (spec.qmin - zp) * se
    hi = (spec.qmax - zp) * se
    tol = np.abs(se) * 1e-5 + 1e-30
    half = np.abs(se) / 2 + tol
    inside = (w >= np.minimum(lo, hi) - half) & (w <= np.maximum(lo, hi) + half)
    step = np.abs(se)
    assert np.all(err[inside] <= step[inside] / 2 + tol[inside])
    if not spec.symmetric:
        assert inside.all()  # the asymmetric grid always covers the group's range (+- half a step)
    assert np.all(err <= step + tol)  # the symmetric short side clips by at most one step
    # bits per weight: codes + scales + zero points
    sbits = 32 if spec.scale_dtype == "f32" else 16
    expect = (k * n * spec.bits + groups * n * (sbits + (0 if spec.symmetric else spec.bits))) / (k * n)
    assert q.bits_per_weight() == pytest.approx(expect)


def test_rtn_zero_groups_have_nonzero_scale():
    w = np.zeros((40, 3), np.float32)
    w[35, 1] = 1e-30  # below f16 resolution: its stored scale would be 0
    for sym in (True, False):
        for sdt in ("f16", "f32", "bf16"):
            q = quantize_rtn(w, QuantSpec(4, 32, sym, sdt))
            assert np.all(q.scales.astype(np.float32) != 0) and np.all(
                np.isfinite(q.scales.astype(np.float32))
            )
            assert np.abs(q.dequantize() - w).max() <= 1e-29


def test_rtn_subnormal_scales_quantize_zeros_exactly():
    """bf16 (and f32) scales reach subnormals, whose reciprocal overflows f32: zeros must stay
    exact zeros (not NaN codes) in both rounding modes."""
    w = np.array([[0.0, 3e-39], [2e-39, 0.0], [0.0, 0.0]], np.float32)
    for rounding in ("half_even", "half_away"):
        for sym in (True, False):
            for sdt in ("bf16", "f32"):
                spec = QuantSpec(4, 0, sym, sdt, rounding)
                s32 = np.array([[1e-40, -1e-40]], np.float32)  # subnormal: 1/s overflows f32
                zp = None if sym else np.array([[3, 3]], np.uint8)
                codes = quantize_float(w, s32, zp, spec)  # before the cast to integers
                assert np.all(np.isfinite(codes)) and codes[0, 0] == (0 if sym else 3)
                q = quantize_rtn(w, spec)
                d = q.dequantize()
                assert np.all(np.isfinite(d)) and d[0, 0] == 0 and d[2, 1] == 0
                assert np.abs(d - w).max() <= 1e-38


def test_rtn_symmetric_uses_all_levels_and_signed_scale():
    w = np.array([[1.0], [-0.5], [0.25], [0.0]], np.float32)
    q = quantize_rtn(w, QuantSpec(4, 0, True, "f32"))
    assert q.scales[0, 0] == np.float32(-0.125)  # the positive extreme maps to -8
    np.testing.assert_array_equal(q.codes[:, 0], [-8, 4, -2, 0])
    np.testing.assert_array_equal(q.dequantize(), w)
    q = quantize_rtn(-w, QuantSpec(4, 0, True, "f32"))
    assert q.scales[0, 0] == np.float32(0.125)


def test_rtn_asymmetric_formula_and_last_short_group():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((37, 4)).astype(np.float32)
    spec = QuantSpec(4, 16, False, "f32")
    q = quantize_rtn(w, spec)
    assert q.scales.shape == (3, 4)
    last = w[32:]
    lo, hi = min(last[:, 2].min(), 0), max(last[:, 2].max(), 0)
    s = np.float32((np.float32(hi) - np.float32(lo)) / np.float32(15))
    assert q.scales[2, 2] == s
    assert q.zero_points[2, 2] == np.clip(np.rint(-lo / s), 0, 15)
    np.testing.assert_array_equal(
        q.codes[32:, 2], np.clip(np.rint(last[:, 2] / s) + q.zero_points[2, 2], 0, 15)
    )


def test_rtn_refuses_bad_weights():
    spec = QuantSpec()
    with pytest.raises(ValueError, match="2-D"):
        quantize_rtn(np.zeros((2, 2, 2)), spec)
    with pytest.raises(ValueError, match="NaN"):
        quantize_rtn(np.array([[np.nan]]), spec)


def test_quantized_weight_bits_per_weight_example():
    q = QuantizedWeight(
        np.zeros((64, 8), np.uint8),
        np.zeros((2, 8), np.float16),
        np.zeros((2, 8), np.uint8),
        QuantSpec(4, 32, False, "f16"),
        "rtn",
    )
    assert q.bits_per_weight() == 4 + (16 + 4) / 32
