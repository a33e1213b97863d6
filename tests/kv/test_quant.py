"""INT8_Asymmetric per token and head, and the seed's error check."""

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mcpc.kv.quant import dequantize_rows, passes_check, quantize_rows, relative_error

# Per-row range widened to 0 is at most 2 max|x|; a code is off by at most one step (rounding of
# x / scale and of the zero point add up), a step is the range / 255 with the scale rounded up to
# fp16 (2^-10 relative); dequantizing to f16 adds 2^-11 relative: 2/255 x (1 + 2^-10) + 2^-11.
BOUND = 2 / 255 * (1 + 2**-10) + 2**-11


@settings(max_examples=200, deadline=None)
@given(
    hnp.arrays(
        np.float32,
        st.tuples(st.integers(1, 64), st.integers(1, 96)),
        elements=st.floats(-300, 300, width=32),
    ),
    st.sampled_from(["f16", "f32"]),
)
def test_quant_error_bound(x, out):
    # a block whose maximum is below 255 x the smallest normal fp16 needs subnormal scales (and its
    # values subnormal f16): it may fail the check and is then stored unquantized (test_store)
    assume(np.abs(x).max() == 0 or np.abs(x).max() >= 255 * 2**-14)
    q = quantize_rows(x)
    assert q.codes.dtype == np.uint8 and q.scale.dtype == np.float16 and q.zero_point.dtype == np.uint8
    assert q.codes.shape == x.shape and q.scale.shape == q.zero_point.shape == (x.shape[0],)
    y = dequantize_rows(q, out)
    assert y.shape == x.shape and y.dtype == np.dtype(np.float16 if out == "f16" else np.float32)
    assert relative_error(x, y) <= BOUND


def test_a_row_is_one_token_of_one_head():
    x = np.array([[0.0, 1.0, 2.0, 3.0], [-100.0, 0.0, 50.0, 100.0]], np.float32)
    q = quantize_rows(x)
    for scale, want in zip(q.scale, (3 / 255, 200 / 255), strict=True):  # the smallest fp16 >= range / 255
        assert float(scale) >= want > float(np.nextafter(scale, np.float16(0)))
    assert float(q.scale[0]) >= 3 / 255 and float(q.scale[1]) >= 200 / 255
    assert q.zero_point.tolist() == [0, round(100 / float(q.scale[1]))]
    assert q.codes[0, 0] == 0 and q.codes[0, 3] == 255 and q.codes[1, 0] == 0
    assert np.allclose(dequantize_rows(q, "f32"), x, atol=float(q.scale.max()))


def test_all_zeros_and_dropped_values_read_back_as_zero():
    z = np.zeros((64, 64), np.float16)
    q = quantize_rows(z)
    assert (q.scale == 1).all() and (q.zero_point == 0).all()
    assert (dequantize_rows(q, "f16") == 0).all() and relative_error(z, dequantize_rows(q, "f16")) == 0.0
    x = np.array([[5.0, -7.0, 1.0]], np.float32)
    keep = np.array([[True, False, True]])
    q = quantize_rows(x, keep)
    y = dequantize_rows(q, "f32")
    assert y[0, 1] == 0.0  # the dropped code is the zero point
    assert float(q.scale[0]) >= 5 / 255 and float(q.scale[0]) < 12 / 255  # range of kept values only
    assert relative_error(x, y, keep) <= BOUND


def test_non_finite_values_fail_the_check():
    for bad in (np.nan, np.inf, -np.inf):
        x = np.ones((4, 8), np.float32)
        x[2, 3] = bad
        err = relative_error(x, dequantize_rows(quantize_rows(x), "f32"))
        assert not passes_check(err)


def test_the_check_is_strict_less_than_tol():
    assert passes_check(0.0199, 0.02) and not passes_check(0.02, 0.02) and not passes_check(float("nan"))
    x = np.array([[1.0, 0.0], [0.0, 1e-30]], np.float64)
    assert relative_error(x, x + [[0.5, 0.0], [0.0, 0.0]]) == 0.5
