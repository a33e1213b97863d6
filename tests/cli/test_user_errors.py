"""Every bad input a user can hand the CLI gets its documented exit code and one paragraph naming
what to change — never a traceback, never exit 70: unbound and bad dims, targets too small,
`sim run` without inputs, and `inspect-model` describing a model before any compile."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

from mcpc.cli import cli
from mcpc.examples import build_examples

FIXTURES = Path(__file__).resolve().parents[1] / "torch_models" / "fixtures"
GPT_KV = FIXTURES / "gpt_kv-dynamo-op18.onnx"  # input_ids [batch, seq], past K/V [batch, 4, past_seq, 16]
GPT_KV_TS = FIXTURES / "gpt_kv-torchscript-op17.onnx"  # the same dims, TorchScript's graph
BERT = FIXTURES / "bert-dynamo-op18.onnx"  # input_ids, attention_mask [batch, seq]
KV_DIMS = "batch (input_ids dim 0, past_key_0 dim 0"


@pytest.fixture(scope="module")
def examples(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("examples")
    build_examples(directory)
    return directory


def run(args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def error_paragraph(result, code: int) -> str:
    """The one ``error: ...`` paragraph of a failed command; asserts the exit code and no traceback."""
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output and "internal error" not in result.output
    text = result.output.strip()
    assert text.startswith("error: ") and "\n" not in text, text
    return text


def test_kv_fixture_is_present():
    assert GPT_KV.is_file() and BERT.is_file()


def test_unbound_dims_are_all_listed_with_the_dim_line(tmp_path):
    msg = error_paragraph(run(["compile", GPT_KV, "--emit", "ir", "-o", tmp_path / "m.mcpir"]), 3)
    assert "3 symbolic dim(s) are unbound" in msg
    assert "--dim batch=N --dim seq=N --dim past_seq=N" in msg
    assert not (tmp_path / "m.mcpir").exists()


@pytest.mark.parametrize(
    "model, args, fragment",
    [
        (  # (the dynamo export's graph fails earlier: a Reshape copying a 0 dim, as ONNX Runtime does)
            GPT_KV_TS,
            ["--dim", "batch=1", "--dim", "seq=0", "--dim", "past_seq=0"],
            "--dim seq=0 --dim past_seq=0 makes every output empty (logits 1x0x256, present_key_0",
        ),
        (
            GPT_KV,
            ["--dim", "batch=1", "--dim", "seq=2", "--dim", "past_seq=2", "--dim", "sequence=2"],
            "--dim sequence=2: the model has no input dim named 'sequence'",
        ),  # fmt: skip
        (
            GPT_KV,
            ["--dim", "batch=1", "--dim", "seq=-3", "--dim", "past_seq=2"],
            "--dim seq=-3: a size must be >= 0",
        ),
        (
            GPT_KV,
            ["--shape", "input_ids=1x-3", "--dim", "past_seq=2"],
            "--shape input_ids=1x-3: sizes must be >= 0",
        ),
        (GPT_KV, ["--shape", "ids=1x3", "--dim", "past_seq=2"], "--shape ids=1x3: 'ids' is not an input"),
        (
            GPT_KV_TS,
            ["--shape", "input_ids=1x0", "--dim", "past_seq=0"],
            "--dim past_seq=0 --shape input_ids=1x0 makes every output empty",
        ),
    ],
)
def test_bad_dims_are_usage_errors_listing_the_model_dims(tmp_path, model, args, fragment):
    msg = error_paragraph(run(["compile", model, "--emit", "ir", "-o", tmp_path / "m.mcpir", *args]), 2)
    assert fragment in msg
    assert "the model's symbolic dims: batch (input_ids dim 0" in msg


def test_a_zero_onnx_leaves_undefined_is_refused_naming_the_node(tmp_path):
    # BERT with no tokens: ONNX Runtime fails at this Reshape too (a 0 copies a dim the input lacks)
    args = ["compile", BERT, "--emit", "ir", "-o", tmp_path / "m.mcpir", "--dim", "batch=1", "--dim", "seq=0"]
    msg = error_paragraph(run(args), 3)
    assert "node 'node_Reshape_97' (op_type Reshape, opset 18)" in msg
    assert "a dim bound to 0 reaches this Reshape (inputs bound as input_ids=1x0" in msg
    assert "not a valid ONNX model" not in msg  # ONNX's inference fails on it too: not the model's fault
    assert not (tmp_path / "m.mcpir").exists()


def test_zero_past_seq_compiles_a_prefill(tmp_path):
    out = tmp_path / "prefill.mcpir"
    result = run(["compile", GPT_KV, "--emit", "ir", "-o", out, "--dim", "batch=1", "--dim", "seq=3",
                  "--dim", "past_seq=0"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "tensor<1x4x0x16xf32>" in out.read_text()


def test_target_too_small_exits_6_with_the_set_key(examples, tmp_path):
    out = tmp_path / "m.mcpb"
    msg = error_paragraph(
        run(["compile", examples / "mlp.onnx", "-o", out, "--set", "dram.size_bytes=100000"]), 6
    )
    assert "does not fit the target" in msg and "of DRAM, target mcp2026-a100 has 100000 bytes" in msg
    assert "--set dram.size_bytes=N" in msg and not out.exists()
    args = [
        "compile",
        examples / "decoder_block.onnx",
        "-o",
        out,
        "--dim",
        "seq=4",
        "--set",
        "sram.size_bytes=1024",
    ]
    msg = error_paragraph(run(args), 6)
    assert "of SRAM" in msg and "--set sram.size_bytes=N (N at least" in msg and "ONNX node" in msg


@pytest.mark.parametrize("dim", ["seq=1000000000000", "seq=100000"])
def test_huge_dims_do_not_fit_the_target(examples, tmp_path, dim):
    msg = error_paragraph(
        run(["compile", examples / "decoder_block.onnx", "-o", tmp_path / "m.mcpb", "--dim", dim]), 6
    )
    assert "of DRAM" in msg and "smaller dims" in msg


def test_fixed_huge_input_dim_does_not_fit(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "huge",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 10**12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10**12])],
    )
    model = tmp_path / "huge.onnx"
    model.write_bytes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    )
    msg = error_paragraph(run(["compile", model, "-o", tmp_path / "m.mcpb"]), 6)
    assert "'x', 1x1000000000000" in msg and "no target can hold it" in msg and "--set" not in msg


def test_sim_run_without_inputs_points_at_random_inputs(examples, tmp_path):
    prog = tmp_path / "mlp.mcpb"
    assert run(["compile", examples / "mlp.onnx", "-o", prog]).exit_code == 0
    msg = error_paragraph(run(["sim", "run", prog]), 2)
    assert "x (f32 4x256)" in msg and "--inputs IN.npz" in msg and "--random-inputs" in msg
    assert run(["sim", "run", prog, "--random-inputs"]).exit_code == 0


def test_inspect_model_text(examples):
    result = run(["inspect-model", GPT_KV])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "input_ids  INT64  [batch, seq]" in out and "past_key_0  FLOAT  [batch, 4, past_seq, 16]" in out
    assert "opset: ai.onnx 18 (supported)" in out
    assert "bind them with: --dim batch=N --dim seq=N --dim past_seq=N" in out
    assert "past_seq: past_key_0 dim 2" in out and "may be 0" in out.split("past_seq:")[1].splitlines()[0]
    assert "may be 0" not in out.split("  seq:")[1].splitlines()[0]
    assert "all supported" in out
    fixed = run(["inspect-model", examples / "mlp.onnx"]).output
    assert "symbolic dims: none" in fixed and "initializers: 4 tensors, 2102272 bytes" in fixed


def test_inspect_model_json_counts_ops_support_and_weights_once(tmp_path):
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 4], [0.5] * 16)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm1"),
        helper.make_node("MatMul", ["h", "w"], ["h2"], name="mm2"),  # w read twice: counted once
        helper.make_node("Det", ["h2"], ["d"], name="det"),  # no handler
        helper.make_node("MyOp", ["h2"], ["y"], name="custom", domain="com.example"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [
            helper.make_tensor_value_info("d", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
        ],
        [w],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)]
    model = tmp_path / "m.onnx"
    model.write_bytes(helper.make_model(graph, opset_imports=opsets).SerializeToString())
    result = run(["inspect-model", model, "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["inputs"] == [{"name": "x", "dtype": "FLOAT", "mcpc_dtype": "f32", "shape": ["n", 4]}]
    assert info["dim_line"] == "--dim n=N" and info["dims"]["n"]["may_be_zero"] is False
    ops = {o["op_type"]: o for o in info["ops"]}
    assert ops["MatMul"]["count"] == 2 and ops["MatMul"]["supported"]
    assert not ops["Det"]["supported"] and ops["Det"]["unsupported_nodes"] == ["det"]
    assert ops["MyOp"]["domain"] == "com.example" and not ops["MyOp"]["supported"]
    assert info["unsupported_nodes"] == 2
    # the importer's groups, each saying why (the same ones `compile` refuses with, exit 4)
    assert info["unsupported"] == [
        {
            "domain": "ai.onnx",
            "op_type": "Det",
            "opset": 17,
            "reason": "not imported",
            "count": 1,
            "first_node": "det",
        },
        {
            "domain": "com.example",
            "op_type": "MyOp",
            "opset": 1,
            "reason": "domain com.example is not imported",
            "count": 1,
            "first_node": "custom",
        },
    ]
    assert info["initializers"] == {"count": 1, "bytes": 64, "bytes_listed": 64, "shared": 1}
    text = run(["inspect-model", model]).output
    assert "2 node(s) unsupported" in text and "UNSUPPORTED (1)" in text
    assert "Det (ai.onnx opset 17), 1 node 'det': not imported" in text
    assert "MyOp (com.example opset 1), 1 node 'custom': domain com.example is not imported" in text
    assert "docs/onnx-ops.md lists every op mcpc imports" in text


def test_compile_refuses_every_unsupported_op_in_one_paragraph_exit_4(tmp_path):
    """Many unsupported nodes: one paragraph, grouped with count and first node, exit 4; what
    inspect-model shows for the same model."""
    nodes = [helper.make_node("Det", ["x"], [f"d{i}"], name=f"det{i}") for i in range(3)]
    nodes.append(helper.make_node("MyOp", ["x"], ["y"], name="custom", domain="com.example"))
    outs = [helper.make_tensor_value_info(f"d{i}", TensorProto.FLOAT, []) for i in range(3)]
    outs.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4]))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])], outs
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)]
    model = tmp_path / "m.onnx"
    model.write_bytes(helper.make_model(graph, opset_imports=opsets).SerializeToString())
    msg = error_paragraph(run(["compile", model, "-o", tmp_path / "m.mcpb"]), 4)
    groups = "Det (ai.onnx opset 17), 3 nodes, first 'det0': not imported; MyOp (com.example opset 1), 1 node"
    assert f"4 nodes cannot be imported, in 2 groups: {groups} 'custom': domain com.example" in msg
    assert "det1" not in msg and not (tmp_path / "m.mcpb").exists()
    text = run(["inspect-model", model]).output
    assert "Det (ai.onnx opset 17), 3 nodes, first 'det0': not imported" in text


@pytest.mark.parametrize("content", [None, b"not a model at all"])
def test_inspect_model_bad_file_exits_3(tmp_path, content):
    model = tmp_path / "m.onnx"
    if content is not None:
        model.write_bytes(content)
    msg = error_paragraph(run(["inspect-model", model]), 3)
    assert str(model) in msg


def test_help_lists_exit_codes_6_and_7():
    out = run(["--help"]).output
    assert "6   does not fit the target" in out and "7   numeric fault" in out


def _console(*args, cwd=None) -> subprocess.CompletedProcess:
    mcpc = Path(sys.executable).parent / "mcpc"
    assert mcpc.is_file(), f"the mcpc console script is not installed next to {sys.executable}"
    env = {k: v for k, v in os.environ.items() if k != "MCPC_DEBUG"}
    return subprocess.run([str(mcpc), *map(str, args)], capture_output=True, text=True, env=env, timeout=300)


def test_console_script_exit_codes(examples, tmp_path):
    bad_dim = _console("compile", GPT_KV_TS, "--emit", "ir", "-o", tmp_path / "m.mcpir", "--dim", "batch=1",
                       "--dim", "seq=0", "--dim", "past_seq=0")  # fmt: skip
    assert bad_dim.returncode == 2 and "--dim seq=0" in bad_dim.stderr and "Traceback" not in bad_dim.stderr
    small = _console(
        "compile", examples / "mlp.onnx", "-o", tmp_path / "m.mcpb", "--set", "dram.size_bytes=1000"
    )
    assert (
        small.returncode == 6
        and "--set dram.size_bytes=N" in small.stderr
        and "Traceback" not in small.stderr
    )
