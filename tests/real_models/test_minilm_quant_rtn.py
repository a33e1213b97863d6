"""Acceptance on the real model: RTN in ONNX Runtime's rounding mode (half away from zero) gives the
same unpacked int4 codes, scales and zero points as ONNX Runtime's MatMulNBitsQuantizer on every
MatMul weight of MiniLM-L3 (block 32, symmetric and asymmetric)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import require_extra
from onnx import numpy_helper
from real_model import MINILM

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "passes" / "quant"))
from ort_nbits import ort_quantize, unpack_matmul_nbits  # noqa: E402

from mcpc.passes.quant import QuantSpec, quantize_rtn  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
def test_minilm_rtn_half_away_matches_matmul_nbits_quantizer(symmetric):
    require_extra("onnx_ir", "dev")
    try:
        model = onnx.load(str(MINILM.path()))
    except LookupError as e:
        pytest.fail(str(e), pytrace=False)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    weights = {
        n.input[1]: inits[n.input[1]]
        for n in model.graph.node
        if n.op_type == "MatMul" and n.input[1] in inits
    }
    assert len(weights) == 18
    ref = unpack_matmul_nbits(ort_quantize(model, 32, symmetric))
    assert sorted(ref) == sorted(weights)
    spec = QuantSpec(bits=4, group_size=32, symmetric=symmetric, scale_dtype="f32", rounding="half_away")
    for name, w in weights.items():
        q = quantize_rtn(w, spec)
        r = ref[name]
        np.testing.assert_array_equal(
            q.codes.astype(np.int16) + (8 if symmetric else 0), r["codes"], err_msg=name
        )
        np.testing.assert_array_equal(q.scales, r["scales"], err_msg=name)
        if not symmetric:
            np.testing.assert_array_equal(q.zero_points, r["zero_points"], err_msg=name)
