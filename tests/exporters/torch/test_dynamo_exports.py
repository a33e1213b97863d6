"""The dynamo-exporter decoders of ``fixtures/`` (``make_fixtures.py``: Llama and Qwen2 exported by
transformers' ``OnnxExporter`` at opsets 18 and 23, and by a bare ``torch.onnx.export(...,
dynamo=True)`` at opset 18) end to end, against ONNX Runtime:

* a prefill with an empty past, every dim bound by the exporter's own names (``--dim s44=1 --dim
  s70=11 --dim s43=1 --dim s53=11 --dim s36=0``; the plain export: ``--dim s10=1 ... --dim s15=0
  --dim s89=0 --dim s81=0``; the mask's own batch symbol too; outputs sized by ``s36 + s70``),
  compiled fp32 and run on the simulator: logits and present K/V within the fp32 tolerance; the
  same for a one-token step after a past of 5;
* ``mcp-compile --qat-config fp32 --max-seq 128`` (no ``--dim``: past/present read by structure,
  ``past_key_values.layers.{i}.keys`` -> ``cache.layers.{i}.keys``) then ``mcpc sim generate``:
  ONNX Runtime's 24 greedy tokens (``dynamo.json``), and the time to first token of an 11-token
  prompt within 1.1x of the TorchScript export of the same weights (``tests/llm/decoders``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from conftest import norm_max_err

from mcpc.check import run_onnxruntime
from mcpc.cli import cli, compile_command
from mcpc.sim.api import load_program, run_program

HERE = Path(__file__).parent
FIXTURES = HERE / "fixtures"
MANIFEST = json.loads((FIXTURES / "dynamo.json").read_text())
FILES = sorted(MANIFEST["files"])
TORCHSCRIPT = HERE.parents[1] / "llm" / "decoders"
FP32 = 1e-4  # the fp32 QAT config's normalized max error


def _invoke(command, *args):
    res = CliRunner().invoke(command, [*map(str, args)])
    assert res.exit_code == 0, res.output
    return res


def _inputs(path: Path, past: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Feeds for one call of batch 1: ``seq`` new tokens after ``past`` random K/V rows."""
    rng = np.random.default_rng(seed)
    rec = MANIFEST["files"][path.name]
    vocab = rec["io"]["logits"][-1]
    feeds = {
        "input_ids": rng.integers(0, vocab, (1, seq)).astype(np.int64),
        "attention_mask": np.ones((1, past + seq), np.int64),
        "position_ids": np.arange(past, past + seq, dtype=np.int64)[None],
    }
    for name, dims in rec["io"].items():
        if name.startswith("past_key_values."):
            feeds[name] = rng.standard_normal((1, int(dims[1]), past, int(dims[3]))).astype(np.float32)
    return feeds


def _dims(path: Path, past: int, seq: int) -> list[str]:
    """The ``--dim`` arguments binding the file's own symbols (read from its inputs)."""
    io = MANIFEST["files"][path.name]["io"]
    batch, new = io["input_ids"]
    mask_batch, total = io["attention_mask"]
    values = {batch: 1, new: seq, mask_batch: 1, total: past + seq}
    # the plain export has a past symbol per group of past inputs torch could not prove equal
    values.update({dims[2]: past for name, dims in io.items() if name.startswith("past_key_values.")})
    return [a for name, v in values.items() for a in ("--dim", f"{name}={v}")]


@pytest.mark.parametrize("past, seq", [(0, 11), (5, 1)], ids=["prefill-empty-past", "step-after-5"])
@pytest.mark.parametrize("name", FILES)
def test_fixed_dims_build_matches_onnx_runtime(name, past, seq, tmp_path):
    path = FIXTURES / name
    out = tmp_path / "p.mcpb"
    _invoke(compile_command, path, "--qat-config", "fp32", *_dims(path, past, seq), "-o", out)
    feeds = _inputs(path, past, seq)
    got = run_program(load_program(out), feeds).outputs
    want = run_onnxruntime(path, feeds)
    assert set(got) == set(want)
    for key, ref in want.items():
        assert got[key].shape == ref.shape, key
        assert norm_max_err(got[key], ref) <= FP32, (key, norm_max_err(got[key], ref))


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """``--max-seq 128`` fp32 builds, made once: each fixture's and its family's TorchScript export."""
    made = {}

    def build(path: Path) -> Path:
        if path not in made:
            out = tmp_path_factory.mktemp("b") / f"{path.stem}.mcpb"
            _invoke(compile_command, path, "--qat-config", "fp32", "--max-seq", 128, "-o", out)
            made[path] = out
        return made[path]

    return build


def _generate(program: Path, prompt, new: int, tmp_path: Path) -> dict:
    np.save(tmp_path / "ids.npy", np.array(prompt, np.int64))
    ids, out = tmp_path / "ids.npy", tmp_path / "g.json"
    res = _invoke(
        cli, "sim", "generate", program, "--prompt-ids", ids, "--max-new-tokens", new, "--json", out
    )
    return {**json.loads((tmp_path / "g.json").read_text()), "output": res.output}


@pytest.mark.parametrize("name", FILES)
def test_max_seq_build_generates_onnx_runtimes_greedy_tokens(name, builds, tmp_path):
    rec = MANIFEST["files"][name]
    report = _generate(builds(FIXTURES / name), rec["prompt"], len(rec["greedy"]), tmp_path)
    assert report["generated_ids"] == rec["greedy"]
    line = next(x for x in report["output"].splitlines() if x.startswith("convention"))
    want = (
        "past_key_values.{i}.key|value -> present.{i}.key|value"
        if "plain" in name
        else "past_key_values.layers.{i}.keys|past_key_values.layers.{i}.values -> "
        "cache.layers.{i}.keys|cache.layers.{i}.values (paired by structure"
    )
    assert line.startswith("convention (torch.onnx.export, dynamo exporter): " + want), line


@pytest.mark.parametrize("name", FILES)
def test_time_to_first_token_within_1_1x_of_the_torchscript_export(name, builds, tmp_path):
    rec = MANIFEST["files"][name]
    prompt = (rec["prompt"] * 2)[:11]
    dynamo = _generate(builds(FIXTURES / name), prompt, 2, tmp_path)
    torchscript = _generate(builds(TORCHSCRIPT / Path(rec["torchscript"]).name), prompt, 2, tmp_path)
    assert dynamo["generated_ids"] == torchscript["generated_ids"]
    ratio = dynamo["ttft_cycles"] / torchscript["ttft_cycles"]
    assert 1 / 1.1 <= ratio <= 1.1, (dynamo["ttft_cycles"], torchscript["ttft_cycles"])


def test_inspect_model_offers_the_exporters_symbols_and_no_numbered_dims():
    """The heads / head_dim of the past inputs are dims named "2" and "16": fixed, not to bind."""
    res = _invoke(cli, "inspect-model", FIXTURES / "llama-dynamo-opset18.onnx")
    line = next(x for x in res.output.splitlines() if x.startswith("bind them with:"))
    assert line == "bind them with: --dim s44=N --dim s70=N --dim s43=N --dim s53=N --dim s36=N"
    assert "GatherND" in res.output and "UNSUPPORTED" not in res.output


def test_fixtures_are_as_recorded():
    """Each committed file still has the op types ``dynamo.json`` records (regenerate both together)."""
    for name, rec in MANIFEST["files"].items():
        ops: dict[str, int] = {}
        for node in onnx.load(str(FIXTURES / name)).graph.node:
            ops[node.op_type] = ops.get(node.op_type, 0) + 1
        assert dict(sorted(ops.items())) == rec["op_types"], name


def test_a_past_whose_name_says_neither_key_nor_value_is_refused_naming_it(tmp_path):
    from mcpc.errors import UnsupportedError
    from mcpc.ir.decoder_import import DecoderBuild, import_decoder

    model = onnx.load(str(FIXTURES / "llama-dynamo-opset18.onnx"))
    old, new = "past_key_values.layers.1.values", "cache_in.1.second"
    for vi in model.graph.input:
        if vi.name == old:
            vi.name = new
    for node in model.graph.node:
        node.input[:] = [new if x == old else x for x in node.input]
    with pytest.raises(UnsupportedError, match="input 'cache_in.1.second' is extended into output"):
        import_decoder(model, DecoderBuild(max_seq=64))


def test_a_dim_named_by_a_number_is_that_fixed_size():
    from onnx import TensorProto, helper

    from mcpc.ir.interpreter import interpret
    from mcpc.ir.onnx_import import import_onnx

    node = helper.make_node("Relu", ["x"], ["y"])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "3"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "3"])
    model = helper.make_model(
        helper.make_graph([node], "g", [x], [y]), opset_imports=[helper.make_opsetid("", 18)]
    )
    module = import_onnx(model, dims={"b": 2})  # "3" needs no binding
    got = interpret(module, {"x": -np.ones((2, 3), np.float32)})
    assert got["y"].shape == (2, 3) and model.graph.input[0].type.tensor_type.shape.dim[1].dim_param == "3"


@pytest.mark.parametrize(
    "attr, value, why", [("softcap", 30.0, "a softcap"), ("left_window_size", 8, "a sliding window")]
)
def test_a_fused_attention_the_paged_build_cannot_take_is_refused_naming_it(attr, value, why):
    from onnx import helper

    from mcpc.errors import UnsupportedError
    from mcpc.ir.decoder_import import DecoderBuild, import_decoder

    model = onnx.load(str(FIXTURES / "llama-dynamo-opset23.onnx"))
    node = next(n for n in model.graph.node if n.op_type == "Attention")
    kept = [a for a in node.attribute if a.name != attr]
    del node.attribute[:]
    node.attribute.extend([*kept, helper.make_attribute(attr, value)])
    with pytest.raises(UnsupportedError, match=f"layer 0: node '{node.name}' \\(Attention\\) has {why}"):
        import_decoder(model, DecoderBuild(max_seq=64))


@pytest.mark.parametrize("batch_dims", [0, 1])
def test_gathernd_compiled_on_the_simulator_matches_onnx_runtime(batch_dims, tmp_path):
    """GatherND on run-time data with constant indices (the causal mask's lookup), as a build."""
    from onnx import TensorProto, helper, numpy_helper

    import mcpc

    rng = np.random.default_rng(batch_dims)
    x = rng.standard_normal((2, 5, 3)).astype(np.float32)
    idx = (
        rng.integers(-5, 5, (2, 4, 1))
        if batch_dims
        else np.stack([rng.integers(0, 2, 6), rng.integers(-5, 5, 6)], -1)
    )
    nodes = [
        helper.make_node("GatherND", ["x", "i"], ["g"], batch_dims=batch_dims),
        helper.make_node("Relu", ["g"], ["y"]),
    ]
    out = [2, 4, 3] if batch_dims else [6, 3]
    inits = [numpy_helper.from_array(idx.astype(np.int64), "i")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.save(model, tmp_path / "m.onnx")
    mcpc.compile(tmp_path / "m.onnx", qat_config="fp32", output=tmp_path / "m.mcpb")
    got = run_program(load_program(tmp_path / "m.mcpb"), {"x": x}).outputs["y"]
    np.testing.assert_array_equal(got, run_onnxruntime(tmp_path / "m.onnx", {"x": x})["y"])
