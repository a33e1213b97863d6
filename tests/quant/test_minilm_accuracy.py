"""Issue 9's accuracy acceptance on MiniLM-L3 (the real fixture, the ``models`` extra): per-sentence
cosine of the pooled output ``461`` against ONNX Runtime fp32 over the 80 committed evaluation
sentences, calibrated on the 289 others, beside ONNX Runtime's MatMulNBitsQuantizer in the same
run.  Slow (one compile + simulation of the 80-sentence batch per build).  A config of the
acceptance that is not shipped fails its test, naming it: the acceptance is not met until it is.
"""

from __future__ import annotations

import pytest
from minilm_eval import CALIB, QUANT_CONFIGS, run
from real_model import MINILM

from mcpc.quant_eval import peer_of

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def report():
    try:
        MINILM.path()
    except LookupError as e:
        pytest.fail(str(e), pytrace=False)
    return run(QUANT_CONFIGS)


def _row(report, name):
    if name.split(" ")[0] in report["missing"]:
        pytest.fail(f"qat_configs/{name.split(' ')[0]}.yaml is not shipped: issue 9's acceptance is not met")
    return next(r for r in report["rows"] if r["name"] == name)


def test_reference_and_peer_rows(report):
    ref, sym, asym = (_row(report, n) for n in ("onnx fp32", "ort-rtn-sym", "ort-rtn-asym"))
    assert report["output"] == "461" and report["sentences"] >= 64
    assert ref["bits_per_weight"] == 32 and ref["weights"] == 3 * (4 * 384 * 384 + 2 * 384 * 1536)
    # MatMulNBits with fp32 scales per block of 32 (+ 4-bit zero points): 5 and 5.125 bits
    assert sym["bits_per_weight"] == pytest.approx(5.0) and asym["bits_per_weight"] == pytest.approx(5.125)
    # plain RTN at 4 bits costs about 1 % of cosine here (0.987 / 0.989 when this was written)
    for r in (sym, asym):
        assert 0.97 < r["cosine"] < 0.995, r


def test_fp16_build_is_nearly_lossless(report):
    fp16 = _row(report, "fp16")
    assert fp16["cosine"] > 0.99999 and fp16["bits_per_weight"] == 16


def test_w4a16_as_shipped_beats_onnxruntime_rtn(report):
    row = _row(report, "qat_w4a16 +calib")
    peer = peer_of(row, report)
    assert peer is not None, "qat_w4a16.yaml states no quantization.weights.symmetric"
    assert row["cosine"] >= 0.99, row
    assert row["error"] <= 0.7 * peer["error"], (row["error"], peer["name"], peer["error"])
    assert row["bits_per_weight"] <= 4.65, row


def test_w4a16_without_calibration_data(report):
    row = _row(report, "qat_w4a16")
    assert row["detail"]["calib"] is None and row["bits_per_weight"] <= 4.65
    assert row["cosine"] > 0.98, row


def test_mixed_precision_build(report):
    assert _row(report, "qat_mixed +calib")["cosine"] >= 0.995


def test_int4_fp8_build_is_measured(report):
    row = _row(report, "qat_int4_fp8 +calib")
    assert 0.0 < row["cosine"] <= 1.0 and row["bits_per_weight"] < 16
    assert row["detail"]["calib"] == str(CALIB)
