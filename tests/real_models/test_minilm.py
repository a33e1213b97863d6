"""A real exported transformer end to end: paraphrase-MiniLM-L3-v2 (3 BERT layers, hidden 384,
vocabulary 30 522, int64 ``input_ids``/``attention_mask``; PyTorch 2.3 export, opset 17) from the
PyPI package in the ``models`` extra.

The default run compiles it with the console scripts a user types (``mcp-compile --dim ...``, fp32
and fp16, one target, a short padded sequence) and requires ``mcpc check`` to pass against ONNX
Runtime.  Tests marked slow cover every target, a padded batch of two at sequence 128, a
``token_type_ids`` input, and the bit-exact interpreter == simulator link.  Without the package
every test fails with the install command: a missing model is never a silent skip.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from real_model import MINILM, dim_bindings, realistic_inputs, with_token_type_ids

import mcpc
from mcpc.check import Tolerances, compare, run_onnxruntime
from mcpc.errors import InputError
from mcpc.ir.interpreter import interpret
from mcpc.ir.onnx_import import import_onnx
from mcpc.sim.api import load_program, run_program

BIN = Path(sys.executable).parent
TARGETS = ("mcp2026-a100", "mcp2026-a10", "mcp2026-edge")
FAST_TARGET = "mcp2026-edge"  # the smallest SRAM: the 30 522-row embedding must stream through it
SEQ, BATCH = 16, 1


@pytest.fixture(scope="module")
def model_path() -> Path:
    try:
        return MINILM.path()
    except LookupError as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="module")
def model(model_path) -> onnx.ModelProto:
    return onnx.load(str(model_path))


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MCPC_DEBUG"}
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)


def _dim_args(model, batch: int, seq: int) -> list[str]:
    return [a for k, v in dim_bindings(model, batch, seq).items() for a in ("--dim", f"{k}={v}")]


def test_realistic_inputs_read_the_model(model):
    feeds = realistic_inputs(model, batch=3, seq=32, seed=1)
    assert set(feeds) == {"input_ids", "attention_mask"}
    ids, mask = feeds["input_ids"], feeds["attention_mask"]
    assert ids.dtype == mask.dtype == np.int64 and ids.shape == mask.shape == (3, 32)
    assert ids.max() < 30522 and ids.min() == 0  # the vocabulary comes from the embedding table
    assert mask.sum(axis=1).tolist() == [28, 24, 20]  # every row padded, lengths differ
    assert ((ids == 0) == (mask == 0)).all()  # padding ids exactly where the mask is 0
    assert dim_bindings(model, 3, 32) == {"batch_size": 3, "sequence_length": 32}


@pytest.mark.parametrize("config", ["fp32", "fp16"])
def test_cli_compile_then_check_passes(model, model_path, tmp_path, config):
    """The user's two commands on the shipped file, with the build's own default tolerances."""
    feeds = tmp_path / "inputs.npz"
    np.savez(feeds, **realistic_inputs(model, BATCH, SEQ))
    prog, report = tmp_path / f"minilm-{config}.mcpb", tmp_path / "check.json"
    compiled = _run(
        str(BIN / "mcp-compile"),
        *("--target", FAST_TARGET, "--qat-config", config),
        *_dim_args(model, BATCH, SEQ),
        *("-o", str(prog), str(model_path)),
    )
    assert compiled.returncode == 0, compiled.stderr
    checked = _run(
        str(BIN / "mcpc"), "check", str(model_path), str(prog), "--inputs", str(feeds), "--json", str(report)
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    result = json.loads(report.read_text())
    assert result["passed"] and result["precision"] == config
    outs = {o["name"]: o for o in result["outputs"]}
    assert set(outs) == {o.name for o in model.graph.output}
    bound = 1e-5 if config == "fp32" else 2e-2
    for name in ("onnx::Shape_422", "461"):  # token embeddings and the mean-pooled sentence embedding
        assert outs[name]["norm_max_err"] <= bound and outs[name]["cosine"] >= 0.9999, outs[name]


@pytest.mark.slow
@pytest.mark.parametrize("config", ["fp32", "fp16"])
def test_padded_batch_of_eight_passes_check_with_mask_and_a_flipped_weight_fails(
    model, model_path, tmp_path, config, negate_largest_weight
):
    """Batch 8 at sequence 128, every row padded: ``mcpc check --mask attention_mask`` passes with
    the build's own tolerances; the same build with its largest matmul weight negated fails."""
    batch, seq = 8, 128
    feeds = tmp_path / "inputs.npz"
    np.savez(feeds, **realistic_inputs(model, batch, seq))
    broken = onnx.load(str(model_path))
    negate_largest_weight(broken)
    onnx.save(broken, tmp_path / "broken.onnx")
    for source, want in ((model_path, 0), (tmp_path / "broken.onnx", 1)):
        prog, report = tmp_path / f"{Path(source).stem}-{config}.mcpb", tmp_path / "check.json"
        compiled = _run(
            str(BIN / "mcp-compile"),
            "-c",
            config,
            *_dim_args(model, batch, seq),
            "-o",
            str(prog),
            str(source),
        )
        assert compiled.returncode == 0, compiled.stderr
        args = (str(model_path), str(prog), "--inputs", str(feeds), "--mask", "attention_mask")
        checked = _run(str(BIN / "mcpc"), "check", *args, "--json", str(report))
        assert checked.returncode == want, checked.stdout + checked.stderr
        outs = {o["name"]: o for o in json.loads(report.read_text())["outputs"]}
        hidden = outs["onnx::Shape_422"]  # token embeddings [batch, seq, 384], masked on (batch, seq)
        assert hidden["masked_axes"] == [0, 1] and hidden["scored"] < batch * seq * 384
        if want == 0:
            assert hidden["norm_max_err"] <= (1e-5 if config == "fp32" else 1e-2), hidden


def test_interpreter_on_imported_model_matches_onnxruntime(model, model_path):
    """Chain link 1 on the real file: the imported IR, interpreted, is the ONNX model (fp32)."""
    feeds = realistic_inputs(model, BATCH, SEQ, seed=2)
    module = import_onnx(str(model_path), dims=dim_bindings(model, BATCH, SEQ))
    ours, ref = interpret(module, feeds), run_onnxruntime(model_path, feeds)
    for name, r in ref.items():
        assert compare(name, ours[name], r, rtol=0, atol=0).norm_max_err <= 1e-5, name


def test_sequence_beyond_the_position_table_is_a_clear_error(model, model_path):
    with pytest.raises(InputError, match=r"Expand.*do not broadcast.*input_ids=1x600"):
        import_onnx(str(model_path), dims=dim_bindings(model, 1, 600))


def test_token_id_outside_the_vocabulary_traps_naming_the_embedding(model, model_path, tmp_path):
    prog = tmp_path / "m.mcpb"
    mcpc.compile(model_path, target=FAST_TARGET, output=prog, dims=dim_bindings(model, BATCH, SEQ))
    feeds = realistic_inputs(model, BATCH, SEQ)
    feeds["input_ids"][0, 3] = 30522
    from mcpc.errors import SimTrap

    with pytest.raises(SimTrap, match=r"word_embeddings/Gather.*index.*30522 outside \[0, 30522\)"):
        run_program(load_program(prog), feeds)


def _compile_and_compare(model_path, model, tmp_path, target, config, batch, seq):
    feeds = realistic_inputs(model, batch, seq, seed=seq)
    prog = tmp_path / f"{target}-{config}.mcpb"
    mcpc.compile(
        model_path, target=target, qat_config=config, output=prog, dims=dim_bindings(model, batch, seq)
    )
    program = load_program(prog)
    tol = Tolerances.of_program(program.meta)
    sim = run_program(program, feeds)
    ref = run_onnxruntime(model_path, feeds)
    mask = feeds["attention_mask"]
    return {n: tol.compare(n, y, ref[n], mask=mask) for n, y in sim.outputs.items()}


@pytest.mark.slow
@pytest.mark.parametrize("config", ["fp32", "fp16"])
@pytest.mark.parametrize("target", TARGETS)
def test_every_target_padded_batch_of_two(model, model_path, tmp_path, target, config):
    results = _compile_and_compare(model_path, model, tmp_path, target, config, batch=2, seq=128)
    bound = 1e-5 if config == "fp32" else 2e-2
    for r in results.values():
        assert r.passed and r.norm_max_err <= bound and r.cosine >= 0.9999, r


@pytest.mark.slow
@pytest.mark.parametrize("config", ["fp32", "fp16"])
def test_token_type_ids_input(model, tmp_path, config):
    """The Hugging Face BERT export feeds token_type_ids; the exporter's own buffer path goes dead."""
    variant = with_token_type_ids(model)
    path = tmp_path / "minilm-tt.onnx"
    onnx.save(variant, path)
    feeds = realistic_inputs(variant, 2, 32, seed=3)
    assert feeds["token_type_ids"].max() == 1  # a second segment really is marked
    results = _compile_and_compare(path, variant, tmp_path, "mcp2026-a10", config, batch=2, seq=32)
    assert all(r.passed for r in results.values()), results


@pytest.mark.slow
def test_compiled_ir_interpreted_equals_simulator_bit_for_bit(model, model_path, tmp_path):
    """Chain link 2: the interpreter on the compiled IR and the simulator agree exactly (fp16)."""
    dims = dim_bindings(model, 2, 64)
    feeds = realistic_inputs(model, 2, 64)
    result = mcpc.compile(
        model_path, target="mcp2026-a10", qat_config="fp16", output=tmp_path / "m.mcpb", dims=dims
    )
    ours = interpret(result.module, feeds)
    sim = run_program(load_program(tmp_path / "m.mcpb"), feeds).outputs
    for name, y in sim.items():
        assert y.dtype == ours[name].dtype and np.array_equal(y, ours[name]), name
