"""mcpc export-onnx: ONNX Runtime runs the quantized model and agrees with our IR interpreter to
float rounding (int4 blocked, asymmetric act-order GPTQ, fp8 + int4 activations, AWQ + int8
activations, mixed); mcpc quant report: per-layer sensitivity, precision and bytes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parents[1] / "passes"))
from quant_models import tiny_lm, token_batches  # noqa: E402

from mcpc import driver  # noqa: E402
from mcpc.cli import cli  # noqa: E402
from mcpc.ir.interpreter import interpret  # noqa: E402

AWQ = """schema: 1
name: awq
precision: {weights: u4, activations: f16, accumulate: f32}
pipeline: quant-fp16
quantization:
  weights: {bits: 4, group_size: 32, symmetric: false, algorithm: awq}
  activations: {dtype: i8, where: output_layer}
check: {min_cosine: 0.99}
"""


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    d = tmp_path_factory.mktemp("qexp")
    onnx.save(tiny_lm(), d / "lm.onnx")
    np.savez(d / "calib.npz", ids=token_batches(8))
    (d / "awq.yaml").write_text(AWQ)
    return d


@pytest.mark.parametrize(
    "config", ["qat_w4a16.yaml", "qat_gptq_g128.yaml", "qat_int4_fp8.yaml", "qat_mixed.yaml", "awq"]
)
def test_onnx_runtime_runs_the_export_and_matches_the_interpreter(lm, config):
    import onnxruntime as ort

    cfg = lm / "awq.yaml" if config == "awq" else config
    out = lm / f"{config}.onnx"
    result = driver.export_onnx(lm / "lm.onnx", cfg, out, calib=lm / "calib.npz")
    model = onnx.load(out)
    assert model.opset_import[0].version == 21
    ops = {n.op_type for n in model.graph.node}
    assert "DequantizeLinear" in ops
    tied_table_quantized = "E" not in {i.name for i in model.graph.initializer}
    rows = result.report["quantization"]["functions"]["main"]["layers"]
    assert tied_table_quantized == any(r["layer"] == "lm_head" and "kept" not in r["precision"] for r in rows)
    options = ort.SessionOptions()
    options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    session = ort.InferenceSession(str(out), options, providers=["CPUExecutionProvider"])
    for seed in range(3):
        feeds = {"ids": token_batches(1, seed=10 + seed)}
        got = session.run(None, feeds)[0]
        want = interpret(result.module, feeds)["logits"]
        assert np.abs(got - want).max() <= 1e-6 * np.abs(want).max(), config
    fp32 = interpret(driver.load_model(lm / "lm.onnx"), feeds)["logits"]
    assert not np.allclose(got, fp32, rtol=1e-4, atol=1e-4)  # it is the quantized model


def test_export_cli_and_refusal(lm):
    r = CliRunner().invoke(
        cli, ["export-onnx", str(lm / "lm.onnx"), "-c", "qat_w4a16.yaml", "-o", str(lm / "x.onnx")]
    )
    assert r.exit_code == 0, r.output
    assert "wrote" in r.output and "by mse" in r.output
    r = CliRunner().invoke(
        cli, ["export-onnx", str(lm / "lm.onnx"), "-c", "fp16.yaml", "-o", str(lm / "y.onnx")]
    )
    assert r.exit_code == 2 and "does not quantize" in r.output


def test_quant_report_table_and_json(lm):
    args = ["quant", "report", str(lm / "lm.onnx"), "-c", "qat_mixed.yaml", "--calib", str(lm / "calib.npz")]
    r = CliRunner().invoke(cli, [*args, "--json", str(lm / "r.json")])
    assert r.exit_code == 0, r.output
    assert "quantization by layer" in r.output and "lm_head" in r.output
    report = json.loads((lm / "r.json").read_text())
    rows = report["quantization"]["functions"]["main"]["layers"]
    assert [r["layer"] for r in rows] == ["up", "down", "lm_head"]
    thresholds = driver.load_qat_config("qat_mixed.yaml").quantization.sensitivity.thresholds
    for row in rows:  # the precision follows the INT6-probe sensitivity and the thresholds
        s = row["sensitivity"]
        want = "i6" if s <= thresholds.int6 else "i8" if s <= thresholds.int8 else "f16 (kept)"
        assert row["precision"] == want, row
        assert row["bytes"] > 0
    assert report["weights"]["after"]["bytes"] == sum(r["bytes"] for r in rows)


def test_quant_report_without_calibration_measures_nothing(lm):
    r = CliRunner().invoke(cli, ["quant", "report", str(lm / "lm.onnx"), "-c", "qat_w4a16.yaml"])
    assert r.exit_code == 0, r.output
    assert "sensitivity: not measured" in r.output


def test_sensitivity_orders_layers_by_their_output_error():
    """A layer whose weight is scaled up (larger quantization error on the output) is measured as
    more sensitive than the same model's other layers, and a threshold between them splits them."""
    from mcpc.ir.onnx_import import import_onnx
    from mcpc.passes.calibration import CalibrationData
    from mcpc.passes.quantize_weights import find_layers
    from mcpc.passes.sensitivity import measure_sensitivity
    from mcpc.qat_configs import load_config

    func = import_onnx(tiny_lm()).main
    from mcpc.passes.fold_constants import fold_function

    fold_function(func)
    calib = CalibrationData(tuple({"ids": token_batches(4)[i : i + 1]} for i in range(4)), "t")
    quant = load_config("qat_mixed.yaml").quantization
    layers = find_layers(func)
    sens = measure_sensitivity(func, layers, quant, calib, "rel_l2", 6)
    assert set(sens) == {"up", "down", "lm_head"} and all(v > 0 for v in sens.values())
    sens4 = measure_sensitivity(func, layers, quant, calib, "rel_l2", 4)
    assert all(sens4[k] > sens[k] for k in sens)  # fewer bits, more error
