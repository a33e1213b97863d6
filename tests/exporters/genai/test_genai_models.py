"""The committed ONNX Runtime GenAI builder models (``make_genai.py``) import, run and compile as
fixed-dims prefills: the IR interpreter matches ONNX Runtime on a prefill with an empty past and
on a decode step, the prefill's top-1 is ONNX Runtime GenAI's first greedy token, and
``mcp-compile --qat-config fp32.yaml --dim ...`` then ``mcpc check`` pass at the fp32 tolerance
(the int4 model with its MatMulNBits rewritten to accuracy_level 0, where ONNX Runtime multiplies
exactly; at level 4 it quantizes activations to int8, which mcpc does not model: a compile note);
``--max-seq`` builds generate ONNX Runtime GenAI's greedy ids on the simulator.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner

from mcpc.cli import cli
from mcpc.ir.interpreter import interpret
from mcpc.ir.onnx_import import import_onnx

HERE = Path(__file__).resolve().parent
RECORD = json.loads((HERE / "genai.json").read_text())
LAYERS, KV_HEADS, HEAD = 2, 2, 16


def _dims(seq: int, past: int) -> dict[str, int]:
    return {"batch_size": 1, "sequence_length": seq, "total_sequence_length": seq + past,
            "past_sequence_length": past, "kv_cache_dim": HEAD}  # fmt: skip


def _feed(ids, past: dict | None = None, past_len: int = 0) -> dict:
    feed = {
        "input_ids": np.array([ids], np.int64),
        "attention_mask": np.ones((1, past_len + len(ids)), np.int64),
    }
    for i in range(LAYERS):
        for kv in ("key", "value"):
            name = f"past_key_values.{i}.{kv}"
            feed[name] = past[name] if past else np.zeros((1, KV_HEADS, 0, HEAD), np.float32)
    return feed


def _ort(path: Path, feed: dict) -> dict:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed), strict=True))


def _err(y, r) -> float:
    return float(np.abs(np.asarray(y, np.float64) - r).max() / np.abs(r).max())


def _level0(tmp_path: Path) -> Path:
    """The int4 model with every MatMulNBits at accuracy_level 0."""
    m = onnx.load(str(HERE / "int4" / "model.onnx"))
    for node in m.graph.node:
        for a in node.attribute:
            if a.name == "accuracy_level":
                a.i = 0
    onnx.save(m, tmp_path / "int4-level0.onnx")
    return tmp_path / "int4-level0.onnx"


@pytest.mark.parametrize("build", ["fp32", "int4"])
def test_interpreter_matches_onnxruntime_prefill_and_decode(tmp_path, build):
    path = HERE / "fp32" / "model.onnx" if build == "fp32" else _level0(tmp_path)
    prompt = RECORD["builds"][build]["prompt"]
    feed = _feed(prompt)
    ref = _ort(path, feed)
    got = interpret(import_onnx(path, dims=_dims(len(prompt), 0)), feed)
    for name, r in ref.items():
        assert _err(got[name], r) <= 1e-5, name
    assert int(np.asarray(got["logits"])[0, -1].argmax()) == RECORD["builds"][build]["greedy"][0]
    past = {f"past_key_values.{n[len('present.') :]}": v for n, v in ref.items() if n.startswith("present.")}
    step = _feed([RECORD["builds"][build]["greedy"][0]], past, len(prompt))
    ref2 = _ort(path, step)
    got2 = interpret(import_onnx(path, dims=_dims(1, len(prompt))), step)
    for name, r in ref2.items():
        assert _err(got2[name], r) <= 1e-5, name
    assert int(np.asarray(got2["logits"])[0, -1].argmax()) == RECORD["builds"][build]["greedy"][1]


@pytest.mark.parametrize("build", ["fp32", "int4"])
def test_fixed_dims_prefill_compiles_and_passes_mcpc_check(tmp_path, build):
    path = HERE / "fp32" / "model.onnx" if build == "fp32" else _level0(tmp_path)
    prompt = RECORD["builds"][build]["prompt"]
    np.savez(tmp_path / "in.npz", **_feed(prompt))
    dims = [x for k, v in _dims(len(prompt), 0).items() for x in ("--dim", f"{k}={v}")]
    prog = tmp_path / "p.mcpb"
    built = CliRunner().invoke(cli, ["compile", str(path), "-c", "fp32.yaml", *dims, "-o", str(prog)])
    assert built.exit_code == 0, built.output
    checked = CliRunner().invoke(cli, ["check", str(path), str(prog), "--inputs", str(tmp_path / "in.npz")])
    assert checked.exit_code == 0, checked.output


def test_accuracy_level_4_compiles_with_a_note(tmp_path):
    dims = [x for k, v in _dims(11, 0).items() for x in ("--dim", f"{k}={v}")]
    built = CliRunner().invoke(
        cli,
        [
            "compile",
            str(HERE / "int4" / "model.onnx"),
            "-c",
            "fp32.yaml",
            *dims,
            "-o",
            str(tmp_path / "p.mcpb"),
        ],
    )
    assert built.exit_code == 0, built.output
    assert "note: MatMulNBits accuracy_level=4" in built.output and "(11 nodes" in built.output


@pytest.mark.parametrize("build", ["fp32", "int4", "fp16"])
def test_max_seq_build_generates_onnxruntime_genai_greedy_ids(tmp_path, build):
    """``--max-seq`` (no --dim): the GroupQueryAttention layers become the paged cache (head size read
    off the weights, positions given by the host); ``sim generate`` reproduces ONNX Runtime GenAI's
    greedy ids (int4: its MatMulNBits at accuracy_level 4, which ONNX Runtime computes with int8
    activations and mcpc exactly: the ids agree, the compile says it in a note; fp16: the
    MultiHeadAttention form, fp16.yaml, the imported self-check's bound 1e-2 for an f16 graph)."""
    prog = tmp_path / "p.mcpb"
    model = HERE / build / "model.onnx"
    config = "fp16.yaml" if build == "fp16" else "fp32.yaml"
    built = CliRunner().invoke(cli, ["compile", str(model), "-c", config, "--max-seq", "64", "-o", str(prog)])
    assert built.exit_code == 0, built.output
    assert "self-check imported" in built.output
    assert ("note: MatMulNBits accuracy_level=4" in built.output) == (build == "int4")
    np.save(tmp_path / "ids.npy", np.array(RECORD["builds"][build]["prompt"], np.int64))
    want = RECORD["builds"][build]["greedy"]
    gen = CliRunner().invoke(
        cli, ["sim", "generate", str(prog), "--prompt-ids", str(tmp_path / "ids.npy"), "--max-new-tokens",
              str(len(want)), "--json", str(tmp_path / "g.json")]
    )  # fmt: skip
    assert gen.exit_code == 0, gen.output
    assert json.loads((tmp_path / "g.json").read_text())["generated_ids"] == want


def test_max_seq_build_refuses_what_the_paged_attention_does_not_take(tmp_path):
    m = onnx.load(str(HERE / "fp32" / "model.onnx"))
    node = next(n for n in m.graph.node if n.op_type == "GroupQueryAttention")
    node.attribute.append(onnx.helper.make_attribute("softcap", 30.0))
    for a in list(node.attribute):
        if a.name == "softcap" and a.f == 0.0:
            node.attribute.remove(a)
    onnx.save(m, tmp_path / "softcap.onnx")
    built = CliRunner().invoke(
        cli, ["compile", str(tmp_path / "softcap.onnx"), "-c", "fp32.yaml", "--max-seq", "64",
              "-o", str(tmp_path / "p.mcpb")]
    )  # fmt: skip
    assert built.exit_code == 4, built.output
    assert "GroupQueryAttention" in built.output and "softcap=30" in built.output
    assert not (tmp_path / "p.mcpb").exists()


def test_generation_stops_after_an_eos_id_of_genai_config(tmp_path):
    """The build records genai_config.json's eos_token_id (an int or a list); sim generate stops after
    emitting one, as ONNX Runtime GenAI's generator does (here an EOS list naming the 5th token)."""
    want = RECORD["builds"]["fp32"]["greedy"]
    cfg = json.loads((HERE / "fp32" / "genai_config.json").read_text())
    cfg["model"]["eos_token_id"] = [999, want[4]]
    (tmp_path / "genai_config.json").write_text(json.dumps(cfg))
    (tmp_path / "model.onnx").write_bytes((HERE / "fp32" / "model.onnx").read_bytes())
    prog = tmp_path / "p.mcpb"
    compile_args = ["compile", str(tmp_path / "model.onnx"), "-c", "fp32.yaml", "--max-seq", "32", "-o"]
    built = CliRunner().invoke(cli, [*compile_args, str(prog)])
    assert built.exit_code == 0, built.output
    np.save(tmp_path / "ids.npy", np.array(RECORD["builds"]["fp32"]["prompt"], np.int64))
    gen = CliRunner().invoke(cli, ["sim", "generate", str(prog), "--prompt-ids", str(tmp_path / "ids.npy"),
                                   "--max-new-tokens", "20", "--json", str(tmp_path / "g.json")])  # fmt: skip
    assert gen.exit_code == 0, gen.output
    assert json.loads((tmp_path / "g.json").read_text())["generated_ids"] == want[: want.index(want[4]) + 1]
    cfg["model"]["eos_token_id"] = "two"
    (tmp_path / "genai_config.json").write_text(json.dumps(cfg))
    bad = CliRunner().invoke(cli, [*compile_args, str(tmp_path / "q.mcpb")])
    assert bad.exit_code == 3, bad.output
    assert "genai_config.json: model.eos_token_id is 'two'" in bad.output


def test_max_seq_build_of_interleaved_rope_passes_the_self_check(tmp_path):
    """rotary_interleaved=1 (the pairs form): the build's self-check holds every layer's K/V and the
    logits of a prefill and two decode steps to ONNX Runtime on the original graph (1e-4)."""
    m = onnx.load(str(HERE / "fp32" / "model.onnx"))
    for node in m.graph.node:
        for a in node.attribute:
            if a.name == "rotary_interleaved":
                a.i = 1
    onnx.save(m, tmp_path / "interleaved.onnx")
    built = CliRunner().invoke(
        cli, ["compile", str(tmp_path / "interleaved.onnx"), "-c", "fp32.yaml", "--max-seq", "32",
              "-o", str(tmp_path / "p.mcpb")]
    )  # fmt: skip
    assert built.exit_code == 0, built.output
    assert "self-check imported: logits error" in built.output


def test_fp16_build_prefill_compiles_and_passes_mcpc_check(tmp_path):
    """The builder's fp16 CPU graph (MultiHeadAttention over repeat_kv'd K/V, RotaryEmbedding with
    position_ids, a Tile in the mask subgraph) as a fixed-dims prefill with fp16.yaml: the
    interpreter's next token is ONNX Runtime GenAI's first, and mcpc check passes at the fp16
    tolerance."""
    path, rec = HERE / "fp16" / "model.onnx", RECORD["builds"]["fp16"]
    feed = _feed(rec["prompt"])
    feed["position_ids"] = np.arange(len(rec["prompt"]), dtype=np.int64)[None]
    for name in feed:
        if name.startswith("past_key_values."):
            feed[name] = feed[name].astype(np.float16)
    got = interpret(import_onnx(path, dims=_dims(len(rec["prompt"]), 0)), feed)
    assert int(np.asarray(got["logits"])[0, -1].argmax()) == rec["greedy"][0]
    np.savez(tmp_path / "in.npz", **feed)
    dims = [x for k, v in _dims(len(rec["prompt"]), 0).items() for x in ("--dim", f"{k}={v}")]
    prog = tmp_path / "p.mcpb"
    built = CliRunner().invoke(cli, ["compile", str(path), "-c", "fp16.yaml", *dims, "-o", str(prog)])
    assert built.exit_code == 0, built.output
    checked = CliRunner().invoke(cli, ["check", str(path), str(prog), "--inputs", str(tmp_path / "in.npz")])
    assert checked.exit_code == 0, checked.output
