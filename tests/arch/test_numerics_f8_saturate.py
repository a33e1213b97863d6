"""numerics.cast to f8e4m3fn saturates (ONNX Cast's default ``saturate=1``), found by the ONNX
node-test conformance run: the interpreter and the simulator share this kernel."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from onnx import numpy_helper

from mcpc.arch.numerics import cast

F8 = ml_dtypes.float8_e4m3fn


@given(st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), min_size=1, max_size=64))
def test_f32_to_f8_matches_onnx_saturate_cast(values):
    x = np.array(values, dtype=np.float32)
    got = cast(x, "f8e4m3fn").astype(np.float32)
    want = numpy_helper.saturate_cast(x, F8).astype(np.float32)
    np.testing.assert_array_equal(got, want)  # NaN positions compare equal in assert_array_equal


def test_integers_and_f16_saturate_too():
    assert cast(np.array([1000, -1000, 3], dtype=np.int64), "f8e4m3fn").astype(np.float32).tolist() == [
        448.0,
        -448.0,
        3.0,
    ]
    assert cast(np.array([np.inf, 6e4], dtype=np.float16), "f8e4m3fn").astype(np.float32).tolist() == [
        448,
        448,
    ]
