"""mcp-compile with quantizing configs: the weight summary every compile prints, --calib, and the
refusals (calibration data missing for a key that needs it, data for a config that does not
quantize)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parents[1] / "passes"))
from quant_models import tiny_lm, token_batches  # noqa: E402

from mcpc.cli import cli  # noqa: E402


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    d = tmp_path_factory.mktemp("qlm")
    onnx.save(tiny_lm(), d / "lm.onnx")
    np.savez(d / "calib.npz", ids=token_batches(8))
    return d


def _run(*args):
    return CliRunner().invoke(cli, list(map(str, args)))


def test_w4a16_compile_without_calibration_says_what_ran(lm):
    r = _run(
        "compile", lm / "lm.onnx", "--qat-config", "qat_w4a16.yaml", "--emit", "ir", "-o", lm / "w4.mcpir"
    )
    assert r.exit_code == 0, r.output
    # the LM head (tied to the embedding) stays f16: 50 x 64 x 2 bytes of the 12.4 kB
    assert "3 MatMul/Gemm weights, 13,440 params: 53.8 kB -> 12.4 kB (32 -> 7.381 bits/weight" in r.output
    assert "quantization: 2 x i4 g32 by mse, 1 x f16 (kept); calibration: none" in r.output
    assert "kept in float: lm_head (LM head, tied to the embedding): 6.4 kB of weights" in r.output
    assert "activations: not quantized" in r.output
    assert "mcp.matmul_w4a16" in (lm / "w4.mcpir").read_text()


def test_every_compile_reports_weight_bytes(lm):
    r = _run("compile", lm / "lm.onnx", "--emit", "ir", "-o", lm / "f16.mcpir")
    assert r.exit_code == 0, r.output
    assert "53.8 kB -> 26.9 kB (32 -> 16 bits/weight" in r.output and "quantization:" not in r.output


def test_a_config_needing_calibration_without_it_is_refused_naming_the_key(lm):
    r = _run(
        "compile", lm / "lm.onnx", "--qat-config", "qat_gptq_g128.yaml", "--emit", "ir", "-o", lm / "g.mcpir"
    )
    assert r.exit_code == 2
    assert (
        "qat_gptq_g128.yaml: quantization.weights.algorithm: gptq needs calibration data: give --calib"
        in r.output
    )
    r = _run(
        "compile", lm / "lm.onnx", "--qat-config", "qat_mixed.yaml", "--emit", "ir", "-o", lm / "m.mcpir"
    )
    assert r.exit_code == 2 and "quantization.sensitivity needs calibration data" in r.output


def test_calibration_for_a_float_config_is_refused(lm):
    r = _run("compile", lm / "lm.onnx", "--calib", lm / "calib.npz", "--emit", "ir", "-o", lm / "x.mcpir")
    assert r.exit_code == 2 and "does not quantize" in r.output


def test_bad_calibration_file_is_bad_input(lm):
    np.savez(lm / "wrong.npz", input_ids=token_batches(2))
    r = _run("compile", lm / "lm.onnx", "-c", "qat_w4a16.yaml", "--calib", lm / "wrong.npz", "--emit", "ir",
             "-o", lm / "x.mcpir")  # fmt: skip
    assert r.exit_code == 3 and "no array for input(s) 'ids'" in r.output
