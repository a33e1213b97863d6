"""The command line through click's CliRunner: options, exit codes, error messages, outputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

from mcpc import __version__
from mcpc.cli import cli, compile_command
from mcpc.passes import PRESETS, REGISTRY, load_all_passes, parse_pipeline
from mcpc.qat_configs import load_config, shipped_configs


def run(command, args, env=None):
    return CliRunner().invoke(command, args, env=env)


def _preset_passes_missing(preset: str) -> list[str]:
    load_all_passes()
    return [name for name, _ in parse_pipeline(PRESETS[preset]) if name not in REGISTRY]


def test_version_on_both_entry_points():
    for command in (cli, compile_command):
        result = run(command, ["--version"])
        assert result.exit_code == 0 and __version__ in result.output


def test_help_documents_exit_codes():
    for command, args in ((cli, ["--help"]), (compile_command, ["--help"]), (cli, ["compile", "--help"])):
        result = run(command, args)
        assert result.exit_code == 0
        assert "Exit codes:" in result.output and "70  internal error" in result.output


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--bogus", "m.onnx"], "No such option"),
        (["--emit", "elf", "m.onnx"], "Invalid value for '--emit'"),
        (["--shape", "x=1xa", "m.onnx"], "shape must be sizes joined by 'x'"),
        (["--shape", "x", "m.onnx"], "expected NAME=VALUE"),
        (["--dim", "seq=long", "m.onnx"], "size must be an integer"),
        (["--set", "sram.size_bytes", "m.onnx"], "expected NAME=VALUE"),
        ([], "Missing argument 'MODEL.onnx'"),
        (["--passes", "a{k=1", "--print-pipeline"], "invalid pipeline at column 6"),
        (["--passes", "no-such-pass", "--print-pipeline"], "unknown pass 'no-such-pass'"),
    ],
)
def test_usage_errors_exit_2(args, fragment):
    result = run(compile_command, args)
    assert result.exit_code == 2, result.output
    assert fragment in result.output
    assert "Traceback" not in result.output


def test_missing_model_exits_3_without_output(tmp_path):
    model = tmp_path / "absent.onnx"
    result = run(compile_command, [str(model), "--emit", "ir"])
    assert result.exit_code == 3
    assert f"error: {model}: no such model file" in result.output
    assert list(tmp_path.iterdir()) == []


def test_unknown_qat_config_exits_3():
    result = run(compile_command, ["--qat-config", "fp17", "--print-pipeline"])
    assert result.exit_code == 3
    assert "fp17: no such config file" in result.output


def test_config_pipeline_with_unknown_pass_names_the_config_file(tmp_path):
    cfg = tmp_path / "mine.yaml"
    cfg.write_text(
        "schema: 1\nname: mine\nprecision: {weights: f32, activations: f32, accumulate: f32}\n"
        "pipeline: not-a-pass\ncheck: {rtol: 1.0e-4, atol: 1.0e-5}\n"
    )
    result = run(compile_command, ["--qat-config", str(cfg), "--print-pipeline"])
    assert result.exit_code == 3
    assert f"{cfg}: pipeline: unknown pass 'not-a-pass'" in result.output


def test_print_pipeline_with_explicit_empty_passes():
    result = run(compile_command, ["--print-pipeline", "--passes", ""])
    assert result.exit_code == 0 and result.output == "\n"


@pytest.mark.parametrize("config", shipped_configs())
def test_print_pipeline_shows_the_config_preset(config):
    preset = load_config(config).preset
    assert not _preset_passes_missing(preset), "a preset names a pass that is not registered"
    result = run(cli, ["compile", "--qat-config", config, "--print-pipeline"])
    assert result.exit_code == 0, result.output
    assert [n for n, _ in parse_pipeline(result.output.strip())] == [
        n for n, _ in parse_pipeline(PRESETS[preset])
    ]


def test_mcpb_to_stdout_is_a_usage_error(tmp_path):
    model = tmp_path / "m.onnx"
    model.write_bytes(b"")
    result = run(compile_command, [str(model), "-o", "-"])
    assert result.exit_code == 2 and "only for --emit ir or --emit asm" in result.output


def test_internal_error_exits_70_with_report_hint(tmp_path, monkeypatch):
    import mcpc.driver

    def broken(*args, **kwargs):
        raise RuntimeError("invariant violated")

    monkeypatch.setattr(mcpc.driver, "compile", broken)
    model = tmp_path / "m.onnx"
    model.write_bytes(b"")
    result = run(compile_command, [str(model)])
    assert result.exit_code == 70
    assert "internal error: RuntimeError: invariant violated" in result.output
    assert "Traceback" not in result.output
    debug = run(compile_command, [str(model)], env={"MCPC_DEBUG": "1"})
    assert debug.exit_code == 70 and "Traceback" in debug.output


def test_targets_lists_the_shipped_targets():
    result = run(cli, ["targets"])
    assert result.exit_code == 0
    for name in ("mcp2026-a100", "mcp2026-a10", "mcp2026-edge"):
        assert name in result.output


def test_unknown_target_exits_3(tmp_path):
    model = _mlp(tmp_path)
    result = run(compile_command, [str(model), "--emit", "ir", "--passes", "", "--target", "mcp1999"])
    assert result.exit_code == 3 and "mcp1999" in result.output
    assert not model.with_suffix(".mcpir").exists()


# -- end to end on a real ONNX model (once the importer exists) ---------------------------------


def _mlp(tmp_path, op="Relu"):
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((8, 4)).astype(np.float32)
    w = helper.make_tensor("w", TensorProto.FLOAT, weights.shape, weights.ravel())
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
        helper.make_node(op, ["h"], ["y"], name="act"),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ("batch", 8))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ("batch", 4))],
        initializer=[w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "mlp.onnx"
    onnx.save(model, path)
    return path


def test_emit_ir_writes_file_report_and_timings(tmp_path):
    from mcpc.ir import parse_module

    model = _mlp(tmp_path)
    report = tmp_path / "r.json"
    args = [str(model), "--emit", "ir", "--dim", "batch=2", "--passes", "", "--time-passes"]
    result = run(cli, ["compile", *args, "--report-json", str(report), "--qat-config", "fp32"])
    assert result.exit_code == 0, result.output
    out = model.with_suffix(".mcpir")
    module = parse_module(out.read_text(), str(out))
    module.verify()
    data = json.loads(report.read_text())
    assert data["target"] == "mcp2026-a100" and data["qat_config"] == "fp32" and data["emit"] == "ir"
    assert data["pipeline"] == [] and data["output"] == str(out)
    assert sum(data["ir_ops"].values()) == sum(1 for _ in module.walk())
    assert "pass timing" in result.output and f"wrote {out}" in result.output


def test_emit_ir_to_stdout(tmp_path):
    model = _mlp(tmp_path)
    result = run(compile_command, [str(model), "--emit", "ir", "-o", "-", "--shape", "x=3x8", "--passes", ""])
    assert result.exit_code == 0, result.output
    assert "func @main" in result.output
    assert not model.with_suffix(".mcpir").exists()


def test_unsupported_op_exits_4_without_output(tmp_path):
    model = _mlp(tmp_path, op="Hardmax")
    result = run(compile_command, [str(model), "--emit", "ir", "--dim", "batch=2", "--passes", ""])
    assert result.exit_code == 4, result.output
    assert "Hardmax" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp.onnx"]


def test_truncated_model_exits_3_without_output(tmp_path):
    model = _mlp(tmp_path)
    model.write_bytes(model.read_bytes()[:40])
    result = run(compile_command, [str(model), "--emit", "ir", "--dim", "batch=2", "--passes", ""])
    assert result.exit_code == 3, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp.onnx"]


def test_missing_output_directory_exits_3(tmp_path):
    model = _mlp(tmp_path)
    result = run(compile_command, [str(model), "--emit", "ir", "-o", str(tmp_path / "no" / "x.mcpir")])
    assert result.exit_code == 3 and "does not exist" in result.output


def test_examples_build_writes_and_lists_models(tmp_path):
    out = tmp_path / "new" / "dir"
    result = run(cli, ["examples", "build", str(out)])
    assert result.exit_code == 0, result.output
    listed = [line for line in result.output.splitlines() if line]
    assert listed and all(Path(p).is_file() and Path(p).parent == out for p in listed)
    assert any(p.endswith(".onnx") for p in listed)
    onnx.checker.check_model(onnx.load(next(p for p in listed if p.endswith(".onnx"))))


def test_subcommands_listed_only_when_their_layer_exists():
    import importlib.util

    result = run(cli, ["--help"])
    for command, module in (("examples", "mcpc.examples"), ("sim", "mcpc.sim.cli")):
        present = importlib.util.find_spec(module) is not None
        assert (f"  {command} " in result.output) == present
