"""Acceptance: RTN in ONNX Runtime's rounding mode gives exactly the unpacked int4 codes and the
scales (and zero points) of ONNX Runtime's MatMulNBitsQuantizer on the same model."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import require_extra
from onnx import TensorProto, helper, numpy_helper
from ort_nbits import ort_quantize, unpack_matmul_nbits

from mcpc.passes.quant import QuantSpec, quantize_rtn


def _matmul_model(weights: dict[str, np.ndarray]) -> helper.ModelProto:
    """x -> MatMul(W0) -> MatMul(W1) ... (each W (K, N), chained)."""
    names = list(weights)
    k0 = weights[names[0]].shape[0]
    nodes, inits, prev = [], [], "x"
    for i, name in enumerate(names):
        out = "y" if i == len(names) - 1 else f"h{i}"
        nodes.append(helper.make_node("MatMul", [prev, name], [out], name=f"mm{i}"))
        inits.append(numpy_helper.from_array(weights[name], name))
        prev = out
    n_last = weights[names[-1]].shape[1]
    graph = helper.make_graph(
        nodes,
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, k0])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, n_last])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    w0 = rng.standard_normal((96, 80)).astype(np.float32) * 0.05
    w0[:32, 3] = 0.0  # an all-zero block
    w0[32:64, 5] = np.linspace(-1, 1, 32, dtype=np.float32)  # equal |min| and |max|
    w0[64:, 7] = np.abs(w0[64:, 7])  # one-signed blocks
    w0[:32, 9] = -np.abs(w0[:32, 9])
    # block of column 11: extreme -1 (scale 1/8), the rest odd multiples of 1/16: every w/scale a tie
    w0[:32, 11] = np.float32(0.0625) * (2 * rng.integers(-7, 7, 32) + 1)
    w0[0, 11] = -1.0
    w1 = rng.standard_normal((80, 70)).astype(np.float32)  # K = 80: the last block is short (16 rows)
    w2 = rng.laplace(size=(70, 33)).astype(np.float32)  # K = 70, odd N
    return {"W0": w0, "W1": w1, "W2": w2}


@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
def test_rtn_half_away_matches_matmul_nbits_quantizer(symmetric):
    require_extra("onnx_ir", "dev")
    weights = _weights(7)
    ref = unpack_matmul_nbits(ort_quantize(_matmul_model(weights), 32, symmetric))
    assert sorted(ref) == sorted(weights)
    spec = QuantSpec(bits=4, group_size=32, symmetric=symmetric, scale_dtype="f32", rounding="half_away")
    for name, w in weights.items():
        q = quantize_rtn(w, spec)
        r = ref[name]
        ours_u = q.codes.astype(np.int16) + 8 if symmetric else q.codes.astype(np.int16)
        zero_block = r["scales"] == 0  # ONNX Runtime stores scale 0 for an all-zero block; we do not
        scales = np.where(zero_block, 0, q.scales)
        np.testing.assert_array_equal(ours_u, r["codes"], err_msg=name)
        np.testing.assert_array_equal(scales, r["scales"], err_msg=name)
        if not symmetric:
            np.testing.assert_array_equal(q.zero_points, r["zero_points"], err_msg=name)
        assert zero_block.any() == (name == "W0")


def test_half_even_differs_from_ort_only_at_ties():
    """The default rounding gives other codes than ONNX Runtime's exactly where w/scale is a tie."""
    require_extra("onnx_ir", "dev")
    w = _weights(7)["W0"]
    ref = unpack_matmul_nbits(ort_quantize(_matmul_model({"W0": w}), 32, True))["W0"]
    q = quantize_rtn(w, QuantSpec(4, 32, True, "f32", "half_even"))
    diff = (q.codes.astype(np.int16) + 8) != ref["codes"]
    assert diff[:32, 11].sum() > 8  # the tie column: half away and half even part ways
    # ONNX Runtime rounds w/scale + 8 (positive) half away, i.e. w/scale half up: the two differ at a
    # tie whose upper neighbour is odd
    t = w[:32, 11] / np.float32(0.125)
    expect = (t % 1 == 0.5) & (np.floor(t + 0.5) % 2 == 1)
    np.testing.assert_array_equal(diff[:32, 11], expect)
    rest = diff.copy()
    rest[:32, 11] = False
    assert not rest.any(), np.argwhere(rest)[:5]
