"""Batches of prompts of different lengths through ``sim generate --prompts`` on a ``--max-seq`` build
with ``--dim <the exporter's batch name>=2`` (``batch`` TorchScript, ``batch_size`` Optimum and GenAI,
a dynamo ``s<N>``): each prompt's ids equal ONNX Runtime's greedy loop for that prompt alone and,
where the graph takes a left-padded batch, ONNX Runtime's batched loop with left padding, the
attention mask and position ids (``mcpc.ort_decoder.greedy_left_padded``) - the paged cache holds
each sequence at its own length, so no padding enters the build.

ONNX Runtime GenAI's GroupQueryAttention graphs have no position_ids and derive ``seqlens_k`` and
the rotary positions from the mask's row sums, which assumes right padding: their left-padded batch
is not a reference (ONNX Runtime's own rows then differ from the prompts alone); the per-prompt loop is.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

from mcpc.cli import cli
from mcpc.ort_decoder import OrtDecoder, greedy, greedy_left_padded

TESTS = Path(__file__).resolve().parents[1]
PROMPTS = [[5, 17, 33, 8, 21, 40, 11, 3, 29, 14, 7], [9, 2, 30], [12, 4, 25, 19, 6, 38]]
NEW = 10
MODELS = {
    "torchscript": (TESTS / "llm" / "decoders" / "llama-with-past.onnx", "batch", True),
    "optimum": (TESTS / "exporters" / "optimum" / "llama-optimum.onnx", "batch_size", True),
    "genai": (TESTS / "exporters" / "genai" / "fp32" / "model.onnx", "batch_size", False),
}


def _generate(model: Path, tmp_path: Path, *dims: str) -> tuple[int, str, list[list[int]] | None]:
    prog = tmp_path / "p.mcpb"
    args = ["compile", str(model), "-c", "fp32.yaml", "--max-seq", "32", "-o", str(prog)]
    built = CliRunner().invoke(cli, [*args, *(a for d in dims for a in ("--dim", d))])
    if built.exit_code:
        return built.exit_code, built.output, None
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    args = [
        "sim",
        "generate",
        str(prog),
        "--prompts",
        str(tmp_path / "p.jsonl"),
        "--max-new-tokens",
        f"{NEW}",
    ]
    gen = CliRunner().invoke(cli, [*args, "--json", str(tmp_path / "g.json")])
    assert gen.exit_code == 0, gen.output
    return 0, built.output, json.loads((tmp_path / "g.json").read_text())["generated_ids"]


@pytest.mark.parametrize("family", list(MODELS))
def test_a_batch_of_two_generates_each_prompts_onnxruntime_ids(family, tmp_path):
    model, batch, left_pads = MODELS[family]
    code, text, got = _generate(model, tmp_path, f"{batch}=2")
    assert code == 0, text
    assert "decoder: prefill 2x32 + decode 2x1 rows" in text
    ort = OrtDecoder(model, kv_heads=2, head_dim=16)
    assert got == [greedy(ort, p, NEW) for p in PROMPTS]
    if left_pads:
        assert got == greedy_left_padded(ort, PROMPTS, NEW)


def test_the_batch_dim_binds_under_any_name_the_exporter_gave_it(tmp_path):
    """A dynamo-style export names the batch by symbols (here 's10' for the ids, 's43' for the mask's
    own): either binds the build's batch; two that disagree, or a --max-batch that differs, are refused."""
    m = onnx.load(str(MODELS["optimum"][0]))
    for vi in m.graph.input:
        dims = vi.type.tensor_type.shape.dim
        if len(dims):
            dims[0].dim_param = "s43" if vi.name == "attention_mask" else "s10"
    onnx.save(m, tmp_path / "dyn.onnx")
    res = CliRunner().invoke(cli, ["inspect-model", str(tmp_path / "dyn.onnx")])
    assert "mcp-compile --max-seq N --dim s10=1 " in res.output
    assert "(--dim s10=B: B sequences a call, the same as --max-batch B)" in res.output
    code, text, got = _generate(tmp_path / "dyn.onnx", tmp_path, "s43=2")
    assert code == 0 and got == [greedy(MODELS["optimum"][0], p, NEW) for p in PROMPTS], text
    code, text, _ = _generate(tmp_path / "dyn.onnx", tmp_path, "s10=2", "s43=3")
    assert code == 2 and "--dim s10=2 and --dim s43=3 disagree" in text, text
    code, text, _ = _generate(tmp_path / "dyn.onnx", tmp_path, "s10=2", "s70=3")
    assert code == 2 and "--dim s70: a --max-seq build binds" in text and "--dim batch=B, --dim s10=B" in text
