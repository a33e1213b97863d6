"""``mcp-compile --max-seq``: a decoder build from the command line — the IR it writes, the report's
``decoder`` descriptor and self-check, and the usage errors and refusals with their exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner
from decoder_models import make_decoder

from mcpc.cli import cli
from mcpc.ir import parse_module

FIXTURES = Path(__file__).parents[1] / "torch_models" / "fixtures"


def run(args):
    return CliRunner().invoke(cli, ["compile", *map(str, args)])


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    path = tmp_path_factory.mktemp("dec") / "hf.onnx"
    onnx.save(make_decoder(), path)
    return path


def test_max_seq_builds_two_entries_with_the_descriptor_and_the_self_check(hf, tmp_path):
    out, rep = tmp_path / "d.mcpir", tmp_path / "r.json"
    result = run([hf, "--max-seq", 128, "--dim", "batch=2", "--prefill-chunk", 16, "--emit", "ir",
                  "-o", out, "--report-json", rep])  # fmt: skip
    assert result.exit_code == 0, result.output
    module = parse_module(out.read_text())
    assert list(module.functions) == ["prefill", "decode"]
    assert module.globals["kv_v_1"].type.shape == (2 * 5 * 64, 8)  # 2 heads x (2 * 2 blocks + trash)
    assert module.globals["kv_v_1"].type.dtype.name == "f16"  # fp16.yaml: the activation dtype
    report = json.loads(rep.read_text())
    d = report["decoder"]
    assert (d["max_seq"], d["max_batch"], d["kv_blocks"], d["prefill_chunk"]) == (128, 2, 4, 16)
    assert (d["layers"], d["kv_heads"], d["q_heads"], d["head_dim"], d["vocab"]) == (2, 2, 4, 8, 48)
    assert d["kv_dtype"] == "f16" and d["logits"] == "logits" and d["block"] == 64
    imported, built = report["decoder_check"]
    assert imported["max_norm_err"] == 1e-4 and max(imported["errors"].values()) < 1e-4
    assert built["max_norm_err"] == 5e-2 and 0 < max(built["errors"].values()) < 5e-2


@pytest.mark.parametrize(
    ("extra", "code", "message"),
    [
        (["--dim", "seq=3"], 2, "--dim seq: a --max-seq build binds"),
        (["--shape", "input_ids=1x3"], 2, "--shape is not taken by a --max-seq build"),
        (["--dim", "batch=2", "--max-batch", "3"], 2, "disagree"),
        (["--prefill-chunk", "65"], 2, "--prefill-chunk 65 exceeds --max-seq 64"),
    ],
)
def test_usage_errors(hf, tmp_path, extra, code, message):
    result = run([hf, "--max-seq", 64, "--emit", "ir", "-o", tmp_path / "x.mcpir", *extra])
    assert result.exit_code == code and message in result.output, result.output


def test_decoder_options_need_max_seq(hf, tmp_path):
    result = run([hf, "--kv-blocks", 4, "--emit", "ir", "-o", tmp_path / "x.mcpir"])
    assert result.exit_code == 2 and "--kv-blocks is an option of a decoder build" in result.output


def test_graphs_that_do_not_fit_exit_4_naming_what_broke(tmp_path):
    result = run(
        [FIXTURES / "gpt-torchscript-op17.onnx", "--max-seq", 64, "--emit", "ir", "-o", tmp_path / "x.mcpir"]
    )
    assert result.exit_code == 4 and "no past K/V inputs" in result.output, result.output
    onnx.save(make_decoder(positions="past_shape"), tmp_path / "ranged.onnx")
    result = run([tmp_path / "ranged.onnx", "--max-seq", 64, "--emit", "ir", "-o", tmp_path / "x.mcpir"])
    assert result.exit_code == 4 and "(Shape) reads 'past_key_values.0.key'" in result.output, result.output


def test_our_torch_fixture_builds_with_positions_from_position_ids(tmp_path):
    rep = tmp_path / "r.json"
    args = [FIXTURES / "gpt_kv-torchscript-op17.onnx", "--max-seq", 32, "-c", "fp32", "--emit", "ir"]
    result = run([*args, "-o", tmp_path / "x.mcpir", "--report-json", rep])
    assert result.exit_code == 0, result.output
    d = json.loads(rep.read_text())["decoder"]
    assert d["inputs"] == {"ids": "input_ids", "positions": "position_ids"} and d["prefill_chunk"] == 32


def test_a_quantizing_build_reports_its_accuracy_cost_instead_of_failing(tmp_path):
    """W4A16 of a small random decoder misses the config's logits bound (so does its single-graph
    build): the decoder build still compiles, the rewrite having been held to 1e-4 as imported, and
    the report and the summary say the bound was exceeded."""
    rep = tmp_path / "r.json"
    model = Path(__file__).parents[1] / "llm" / "decoders" / "llama-with-past.onnx"
    result = run([model, "--max-seq", 64, "-c", "qat_w4a16", "--emit", "ir", "-o", tmp_path / "x.mcpir",
                  "--report-json", rep])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "EXCEEDED: the quantization's accuracy cost" in result.output
    imported, built = json.loads(rep.read_text())["decoder_check"]
    assert imported["within_tolerance"] and imported["errors"]["logits"] < 1e-4
    assert not built["within_tolerance"] and built["errors"]["logits"] > built["max_norm_err"] == 0.25
    assert "the first to differ is layer" in built["note"]
