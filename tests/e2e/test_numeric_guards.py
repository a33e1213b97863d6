"""Never silently wrong, end to end: the fp16 build of a Llama-style block with activations whose
squares overflow fp16 is right with the precision policy, and without it (turned off in the QAT
config) ``sim run --strict`` and ``check`` exit 7 naming the RMSNorm's Pow node; the -inf causal
mask is not flagged; a NaN-producing model is flagged."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from conftest import make_model, vi
from e2e_util import compile_and_run, norm_max_err
from numeric_models import large_inputs, llama_block
from onnx import helper

import mcpc
from mcpc.cli import cli

FP16_NO_ISLANDS = """\
schema: 1
name: fp16-plain
description: "fp16 without the precision policy"
precision: {weights: f16, activations: f16, accumulate: f32, f32_islands: []}
pipeline: fp16
check: {rtol: 2.0e-2, atol: 1.0e-2}
"""


def _invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama")
    onnx.save(llama_block(), d / "m.onnx")
    np.savez(d / "in.npz", **large_inputs())
    (d / "plain.yaml").write_text(FP16_NO_ISLANDS)
    mcpc.compile(d / "m.onnx", qat_config="fp16", output=d / "policy.mcpb")
    mcpc.compile(d / "m.onnx", qat_config=d / "plain.yaml", output=d / "plain.mcpb")
    return d


def test_policy_build_is_right_and_clean(tmp_path):
    y, profile, ref, _ = compile_and_run(tmp_path, llama_block(), large_inputs(), qat_config="fp16.yaml")
    assert norm_max_err(y["y"], ref["y"]) < 5e-3
    assert profile["numeric"]["clean"], profile["numeric"]  # the -inf causal mask is no overflow
    y, profile, ref, _ = compile_and_run(tmp_path, llama_block(), large_inputs(), qat_config="fp32.yaml")
    assert norm_max_err(y["y"], ref["y"]) < 1e-5 and profile["numeric"]["clean"]


def test_policy_build_passes_check(llama):
    res = _invoke("check", llama / "m.onnx", llama / "policy.mcpb", "--inputs", llama / "in.npz",
                  "--json", llama / "c.json")  # fmt: skip
    assert res.exit_code == 0, res.output
    report = json.loads((llama / "c.json").read_text())
    assert report["passed"] and report["numeric"]["clean"]


def test_without_the_policy_the_pow_overflow_is_flagged(llama):
    args = [llama / "plain.mcpb", "--inputs", llama / "in.npz"]
    res = _invoke("sim", "run", *args)
    assert res.exit_code == 0 and "warning: numeric fault" in res.output and "ln1.pow" in res.output
    res = _invoke("sim", "run", *args, "--strict", "--profile-json", llama / "p.json")
    assert res.exit_code == 7, res.output
    assert "ONNX node ln1.pow" in res.output and "overflow" in res.output and "f32_islands" in res.output
    numeric = json.loads((llama / "p.json").read_text())["numeric"]
    assert numeric["first"]["node"] == "ln1.pow" and numeric["first"]["ir_op"] == "mcp.pow"
    assert numeric["first"]["dtype"] == "f16"
    assert {n["node"] for n in numeric["nodes"]} == {"ln1.pow", "ln2.pow", "ln_f.pow"}
    res = _invoke("check", llama / "m.onnx", *args)
    assert res.exit_code == 7 and "ONNX node ln1.pow" in res.output, res.output


def test_a_nan_producing_model_is_flagged(tmp_path):
    model = make_model(
        [helper.make_node("Sqrt", ["x"], ["y"], name="root")], [vi("x", [2, 8])], [vi("y", [2, 8])]
    )
    onnx.save(model, tmp_path / "m.onnx")
    x = np.abs(np.random.default_rng(0).standard_normal((2, 8))).astype(np.float32)
    x[1, 3] = -2.0
    np.savez(tmp_path / "in.npz", x=x)
    mcpc.compile(tmp_path / "m.onnx", qat_config="fp32", output=tmp_path / "m.mcpb")
    # ONNX Runtime gives the same NaN, so only the numeric guard can fail this check
    res = _invoke("check", tmp_path / "m.onnx", tmp_path / "m.mcpb", "--inputs", tmp_path / "in.npz")
    assert res.exit_code == 7, res.output
    assert "ONNX node root" in res.output and "1 NaN(s)" in res.output
    assert "f32_islands" not in res.output  # no precision hint for an f32 build
