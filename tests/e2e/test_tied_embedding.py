"""Weights stored once: a tied embedding (the Gather table that is also the LM head weight, read
through Transpose, by Gemm transB=1, or as a second initializer with the same bytes) lands once
in the ``.mcpb``, the matmul reads it transposed, and the outputs still agree with ONNX Runtime
and, bit for bit, with the interpreter on the compiled IR."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from e2e_util import norm_max_err
from tied_lm import HEADS, float_initializer_bytes, tied_lm

import mcpc
from mcpc.check import run_onnxruntime
from mcpc.cli import cli
from mcpc.ir.interpreter import interpret
from mcpc.sim.api import load_program, run_program

VOCAB, HIDDEN, SEQ = 4096, 256, 8
BOUND = {"fp32.yaml": 1e-5, "fp16.yaml": 2e-2}


def _ids(seed=0):
    return {"input_ids": np.random.default_rng(seed).integers(0, VOCAB, (1, SEQ)).astype(np.int64)}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("tied")
    out = {}
    for head in HEADS:
        model = tied_lm(VOCAB, HIDDEN, SEQ, head)
        path = d / f"tied_{head}.onnx"
        onnx.save(model, path)
        out[head] = (model, path)
    return out


@pytest.mark.parametrize("qat_config", ["fp32.yaml", "fp16.yaml"])
@pytest.mark.parametrize("head", HEADS)
def test_tied_embedding_is_stored_once_and_outputs_agree(models, tmp_path, head, qat_config):
    model, path = models[head]
    out = tmp_path / "tied.mcpb"
    result = mcpc.compile(path, target="mcp2026-a100", qat_config=qat_config, output=out)
    # the weights once, in the build's precision (fp16: half the f32 initializer bytes)
    weights = float_initializer_bytes(model) // (2 if qat_config == "fp16.yaml" else 1)
    size = out.stat().st_size
    assert size <= 1.02 * weights, f"{head} {qat_config}: .mcpb {size} bytes for {weights} bytes of weights"
    table = VOCAB * HIDDEN * (2 if qat_config == "fp16.yaml" else 4)
    assert len(result.program.constants) < weights + table // 2  # a second table would not fit
    # the LM head reads the table transposed; no transposed copy, no transpose at run time
    matmuls = [op for op in result.module.main.ops if op.name == "mcp.matmul"]
    head_mm = next(op for op in matmuls if op.result.type.shape[-1] == VOCAB)
    assert head_mm.attrs["trans_b"] and head_mm.operands[1].owner.name == "mcp.constant"
    assert not any(op.name == "mcp.transpose" for op in result.module.main.ops)

    ids = _ids()
    got = run_program(load_program(out), ids).outputs["logits"]
    ref = run_onnxruntime(path, ids)["logits"]
    assert norm_max_err(got, ref) <= BOUND[qat_config]
    assert (got.argmax(-1) == ref.argmax(-1)).all()
    want = interpret(result.module, ids)["logits"]
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), "simulator differs from the interpreter"


def test_inspect_reports_the_constants_stored_once(models, tmp_path):
    model, path = models["copy"]
    out = tmp_path / "tied.mcpb"
    mcpc.compile(path, target="mcp2026-a100", qat_config="fp32.yaml", output=out)
    res = CliRunner().invoke(cli, ["inspect", str(out)], terminal_width=200)
    assert res.exit_code == 0, res.output
    weights = float_initializer_bytes(model)
    assert float_initializer_bytes(model, distinct=False) > 1.7 * weights  # the ONNX file holds two
    line = next(x for x in res.output.splitlines() if "constants" in x)
    stored = int(line.split("constants ")[1].split(" bytes")[0])
    assert weights <= stored <= 1.02 * weights
    assert "shared" in line


TORCH_FIXTURES = Path(__file__).parents[1] / "torch_models" / "fixtures"


@pytest.mark.parametrize("exporter", ["dynamo-op18", "torchscript-op17"])
def test_torch_exports_of_a_tied_lm_head_store_the_table_once(exporter):
    """The committed PyTorch exports of a GPT whose LM head is tied to the embedding (dynamo:
    ``MatMul(h, Transpose(W))``; TorchScript: a folded transposed copy of W as a second
    initializer): the constants are their distinct weight bytes (a transposed copy counted
    once), where each used to hold the table twice."""
    path = TORCH_FIXTURES / f"gpt-{exporter}.onnx"
    result = mcpc.compile(path, target="mcp2026-a100", qat_config="fp32.yaml", dims={"batch": 1, "seq": 8})
    weights = float_initializer_bytes(onnx.load(path))
    assert len(result.program.constants) <= 1.02 * weights
