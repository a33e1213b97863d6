"""Hugging Face Optimum's exports (``optimum/``, made by ``optimum/make_fixtures.py``) as a user
meets them: ``inspect-model`` names the exporter and prints a ``--dim`` line that pastes into a
shell and compiles; a ``--max-seq`` build generates ONNX Runtime's greedy ids, says which I/O
convention it found, and its prefill costs what the TorchScript export's of the same model costs
(the RoPE-angle matmul with the positions as B keeps the run-time row extents); an optimisation
refused is listed in the compile summary with its cost."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import mcpc
from mcpc.ir.decoder_import import DecoderBuild
from mcpc.sim.cli import sim_group

HERE = Path(__file__).parent / "optimum"
RECORD = json.loads((HERE / "optimum.json").read_text())["files"]
TORCHSCRIPT = Path(__file__).parents[1] / "llm" / "decoders"
BIN = Path(sys.executable).parent


def shell(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """``command`` run by bash as a user pastes it, the console scripts of this venv first on PATH."""
    env = {k: v for k, v in os.environ.items() if k != "MCPC_DEBUG"}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, cwd=cwd, env=env, timeout=300
    )


def test_fixtures_record_their_exporter_and_dims():
    llama = RECORD["llama-optimum.onnx"]
    mask = next(i for i in llama["inputs"] if i["name"] == "attention_mask")
    assert mask["dims"] == ["batch_size", "past_sequence_length + sequence_length"]
    assert {"IsNaN", "MatMul"} <= set(llama["op_types"]) and llama["opset"] == 18
    assert RECORD["llama-optimum-merged.onnx"]["op_types"]["If"] == 1


def test_inspect_model_line_pastes_and_compiles(tmp_path):
    model = HERE / "llama-optimum.onnx"
    res = shell(f"mcpc inspect-model {model}", tmp_path)
    assert res.returncode == 0, res.stderr
    assert "exporter: Hugging Face Optimum" in res.stdout
    assert re.search(r"past_sequence_length \+ sequence_length: attention_mask dim 1; derived from "
                     r"past_sequence_length, sequence_length", res.stdout)  # fmt: skip
    line = next(x for x in res.stdout.splitlines() if x.startswith("bind them with: "))
    line = line.removeprefix("bind them with: ")
    assert line == "--dim batch_size=N --dim sequence_length=N --dim past_sequence_length=N"
    build = next(x for x in res.stdout.splitlines() if x.startswith("a decoder with past: "))
    assert build.endswith(f"mcp-compile --max-seq N --dim batch_size=1 {model}")
    sizes = iter(["1", "5", "3"])
    line = re.sub(r"=N\b", lambda _: "=" + next(sizes), line)
    max_seq = build.removeprefix("a decoder with past: build it for generation with: ").replace(" N ", " 64 ")
    res = shell(
        f"mcp-compile -c fp32.yaml {line} {model} -o p.mcpb && {max_seq} -c fp32.yaml -o d.mcpb", tmp_path
    )
    assert res.returncode == 0, res.stderr


@pytest.mark.slow
def test_the_expression_bound_itself_pastes(tmp_path):
    """The expression bound as a whole, quoted as a shell keeps it: the name it leaves unbound is
    derived, and the program is the one the plain names give."""
    model = HERE / "llama-optimum.onnx"
    plain = "--dim batch_size=1 --dim sequence_length=5 --dim past_sequence_length=3"
    quoted = "--dim batch_size=1 --dim sequence_length=5 --dim 'past_sequence_length + sequence_length=8'"
    res = shell(f"mcp-compile -c fp32.yaml {plain} {model} -o p.mcpb && "
                f"mcp-compile -c fp32.yaml {quoted} {model} -o q.mcpb", tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "p.mcpb").read_bytes() == (tmp_path / "q.mcpb").read_bytes()


@pytest.mark.slow
def test_a_quoted_name_pastes(tmp_path):
    """A dim name with spaces and shell characters that is not an expression: printed quoted."""
    import onnx
    from onnx import helper

    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["my dim(1)", 4])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["my dim(1)", 4])
    m = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                          opset_imports=[helper.make_opsetid("", 17)])  # fmt: skip
    m.ir_version = 8
    onnx.save(m, tmp_path / "m.onnx")
    res = shell("mcpc inspect-model m.onnx", tmp_path)
    line = next(x for x in res.stdout.splitlines() if x.startswith("bind them with: "))
    assert line == "bind them with: --dim 'my dim(1)=N'"
    res = shell(f"mcp-compile -c fp32.yaml {line.removeprefix('bind them with: ').replace('=N', '=2')} "
                "m.onnx -o m.mcpb", tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr


def _generate(model: Path, prompt: list[int], tmp_path: Path, tag: str) -> tuple[dict, str, dict]:
    out = tmp_path / f"{tag}.mcpb"
    result = mcpc.compile(model, qat_config="fp32", decoder=DecoderBuild(max_seq=64), output=out)
    np.save(tmp_path / "ids.npy", np.array(prompt, np.int64))
    args = ["generate", out, "--prompt-ids", tmp_path / "ids.npy", "--max-new-tokens", 20,
            "--json", tmp_path / f"{tag}.json"]  # fmt: skip
    res = CliRunner().invoke(sim_group, [str(a) for a in args])
    assert res.exit_code == 0, res.output
    return json.loads((tmp_path / f"{tag}.json").read_text()), res.output, result.report


@pytest.mark.parametrize("family", ["llama", pytest.param("qwen2", marks=pytest.mark.slow)])
def test_max_seq_build_generates_at_the_torchscript_prefill_cost(family, tmp_path):
    rec = RECORD[f"{family}-optimum.onnx"]
    got, text, report = _generate(HERE / rec["file"], rec["prompt11"], tmp_path, "optimum")
    assert got["generated_ids"] == rec["greedy11"]
    assert report["refused"] == []
    ext = report["decoder"]["convention"]
    assert ext["exporter"].startswith("Hugging Face Optimum") and ext["positions"] == "position_ids"
    first = text.splitlines()[0]
    assert first.startswith("convention (Hugging Face Optimum (optimum-cli export onnx)): "
                            "past_key_values.{i}.key|value -> present.{i}.key|value (2 layers)")  # fmt: skip
    ts, ts_text, _ = _generate(TORCHSCRIPT / f"{family}-with-past.onnx", rec["prompt11"], tmp_path, "ts")
    assert ts["generated_ids"] == rec["greedy11"]
    assert "TorchScript exporter" in ts_text.splitlines()[0]
    ratio = got["ttft_cycles"] / ts["ttft_cycles"]
    assert 1 / 1.1 < ratio < 1.1, (got["ttft_cycles"], ts["ttft_cycles"])


def test_a_refused_extent_is_listed_with_its_cost(tmp_path, monkeypatch):
    """Were the prefill's row extents refused (here: made to be), the compile summary says which
    op refused them and what every prefill call costs instead."""
    from mcpc.backend import row_extent
    from mcpc.cli import compile_command

    def refuse(fn, rows):
        raise row_extent.NotRowLocal("mcp.matmul (ONNX node '/model/rotary_emb/MatMul'): an example")

    monkeypatch.setattr(row_extent, "token_axes", refuse)
    args = [HERE / "llama-optimum.onnx", "-c", "fp32.yaml", "--max-seq", 64, "-o", tmp_path / "p.mcpb"]
    res = CliRunner().invoke(compile_command, [str(a) for a in args])
    assert res.exit_code == 0, res.output
    np.save(tmp_path / "ids.npy", np.array([1, 2, 3], np.int64))
    gen = CliRunner().invoke(sim_group, ["generate", str(tmp_path / "p.mcpb"), "--prompt-ids",
                                         str(tmp_path / "ids.npy"), "--max-new-tokens", "2"])  # fmt: skip
    assert gen.exit_code == 0, gen.output
    note = gen.output.splitlines()[1]
    assert note.startswith("note: the prefill runs every call at its full chunk (row extents refused: ")
    assert note.endswith("(ONNX node '/model/rotary_emb/MatMul'): an example)")
    assert ("refused: run-time row extents of the prefill entry: mcp.matmul (ONNX node "
            "'/model/rotary_emb/MatMul'): an example; cost: every prefill call computes all 64 token "
            "rows of its capacity") in res.output  # fmt: skip


def test_merged_decoder_builds_from_its_with_past_branch(tmp_path):
    """The merged decoder (use_cache_branch, If): a --max-seq build of its with-past branch gives
    the greedy ids ONNX Runtime gives on the merged graph switching branches (recorded)."""
    rec = RECORD["llama-optimum-merged.onnx"]
    got, text, report = _generate(HERE / rec["file"], rec["prompt"], tmp_path, "merged")
    assert got["generated_ids"] == rec["greedy"][:20]
    assert report["decoder"]["convention"]["merged"] is True
    assert text.splitlines()[0].endswith(
        "a merged decoder: its use_cache_branch=true branch, the one with past"
    )
    import onnx

    from mcpc.ir.merged_decoder import merged_if

    assert merged_if(onnx.load(str(HERE / "llama-optimum.onnx"))) is None


def _compile_and_check(model: Path, dims: dict[str, int], inputs: dict, tmp_path: Path, *extra: str) -> str:
    from mcpc.cli import cli

    prog = tmp_path / "p.mcpb"
    args = [
        model,
        "-c",
        "fp32.yaml",
        "-o",
        prog,
        *(x for k, v in dims.items() for x in ("--dim", f"{k}={v}")),
    ]
    res = CliRunner().invoke(cli, ["compile", *map(str, args)])
    assert res.exit_code == 0, res.output
    np.savez(tmp_path / "in.npz", **inputs)
    res = CliRunner().invoke(
        cli, ["check", str(model), str(prog), "--inputs", str(tmp_path / "in.npz"), *extra]
    )
    assert res.exit_code == 0, res.output
    return res.output


def test_feature_extraction_encoder_matches_onnx_runtime(tmp_path):
    """--task feature-extraction's BERT, right-padded, scored where the mask is 1."""
    rng = np.random.default_rng(0)
    mask = np.ones((2, 8), np.int64)
    mask[1, 5:] = 0
    inputs = {"input_ids": rng.integers(0, 512, (2, 8)), "attention_mask": mask,
              "token_type_ids": np.zeros((2, 8), np.int64)}  # fmt: skip
    out = _compile_and_check(HERE / "bert-optimum.onnx", {"batch_size": 2, "sequence_length": 8}, inputs,
                             tmp_path, "--mask", "attention_mask")  # fmt: skip
    assert "last_hidden_state" in out


@pytest.mark.slow
def test_prefill_with_an_empty_past_matches_onnx_runtime(tmp_path):
    rec = RECORD["llama-optimum.onnx"]
    n = len(rec["prompt11"])
    inputs = {"input_ids": np.array([rec["prompt11"]]), "attention_mask": np.ones((1, n), np.int64),
              "position_ids": np.arange(n)[None]}  # fmt: skip
    inputs |= {
        f"past_key_values.{i}.{k}": np.zeros((1, 2, 0, 16), np.float32)
        for i in range(2)
        for k in ("key", "value")
    }
    dims = {"batch_size": 1, "sequence_length": n, "past_sequence_length": 0}
    assert "logits" in _compile_and_check(HERE / "llama-optimum.onnx", dims, inputs, tmp_path)
