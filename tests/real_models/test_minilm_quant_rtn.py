"""Acceptance on the real model: RTN in ONNX Runtime's rounding mode (half away from zero) gives the
same unpacked int4 codes, scales and zero points as ONNX Runtime's MatMulNBitsQuantizer on every
MatMul weight of MiniLM-L3 (block 32, symmetric and asymmetric); and GPTQ / AWQ bring MiniLM's pooled
output closer to f32 than RTN does.  Both slow (`make real-models`, `make test-all`)."""

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


@pytest.mark.slow
def test_minilm_data_aware_algorithms_beat_rtn_on_the_pooled_output():
    """On MiniLM-L3 (random-token calibration, 64 sequences; 16 held-out), GPTQ with act-order and
    AWQ bring the pooled output closer to f32 than RTN with the same storage (int4 g32 f16 asym)."""
    bench = Path(__file__).resolve().parents[2] / "bench"
    sys.path.insert(0, str(bench))
    try:
        import bench_quant
    finally:
        sys.path.remove(str(bench))
    from real_model import realistic_inputs

    from mcpc.passes.quant import quantize_awq, quantize_gptq

    try:
        model = onnx.load(str(MINILM.path()))
    except LookupError as e:
        pytest.fail(str(e), pytrace=False)
    layers = bench_quant.linear_weights(model)
    names = list(dict.fromkeys(x for _, x, _ in layers))
    stats = bench_quant.calibration_stats(model, realistic_inputs, names, 64, 64, 0)
    evaluator = bench_quant._Evaluator(model, realistic_inputs, "461", 16, 64, 0)
    spec = QuantSpec(4, 32, False, "f16")

    def one_minus_cos(fn):
        eff = {}
        for node, x, w in layers:
            r = fn(w, stats[x])
            eff[node] = r[0].dequantize() / r[1][:, None] if isinstance(r, tuple) else r.dequantize()
        return 1.0 - evaluator.cosine(bench_quant.with_weights(model, eff))

    rtn = one_minus_cos(lambda w, s: quantize_rtn(w, spec))
    gptq = one_minus_cos(lambda w, s: quantize_gptq(w, s, spec, desc_act=True))
    awq = one_minus_cos(lambda w, s: quantize_awq(w, s, spec))
    assert 0 < gptq < 0.5 * rtn
    assert 0 < awq < 0.8 * rtn
