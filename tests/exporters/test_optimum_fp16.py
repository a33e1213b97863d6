"""The fp16 Hugging Face Optimum export (``optimum/make_fp16.py``: ``main_export(dtype="fp16")``,
the model loaded in float16) of the tiny llama: its SDPA multiplies float32 probabilities by V cast
to float32 (the recogniser follows the Cast; the paged attention's result is cast as the matmul's
was), and ``--max-seq`` with ``fp16.yaml`` generates ONNX Runtime's greedy ids on it (recorded in
``fp16.json``; equal to the fp32 export's), its self-checks within the fp16 bounds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from mcpc.cli import cli

HERE = Path(__file__).resolve().parent / "optimum"
REC = json.loads((HERE / "fp16.json").read_text())["files"]["llama-optimum-fp16.onnx"]
FP32 = json.loads((HERE / "optimum.json").read_text())["files"]["llama-optimum.onnx"]


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    out = tmp_path_factory.mktemp("fp16") / "p.mcpb"
    args = ["compile", str(HERE / REC["file"]), "-c", "fp16.yaml", "--max-seq", "64", "-o", str(out)]
    built = CliRunner().invoke(cli, [*args, "--dim", "batch_size=1"])
    assert built.exit_code == 0, built.output
    assert "KV cache 1 blocks of 64 tokens in f16; self-check imported: logits error" in built.output
    return out


def test_the_export_is_fp16_and_onnxruntime_agrees_with_the_fp32_one():
    kinds = {v["name"]: v["dtype"] for v in REC["inputs"] + REC["outputs"]}
    assert kinds["past_key_values.0.key"] == kinds["logits"] == "FLOAT16"
    assert REC["greedy"] == FP32["greedy"] and REC["greedy11"] == FP32["greedy11"]


@pytest.mark.parametrize(("prompt", "want"), [("prompt", "greedy"), ("prompt11", "greedy11")])
def test_max_seq_fp16_build_generates_onnxruntime_ids(program, tmp_path, prompt, want):
    np.save(tmp_path / "ids.npy", np.array(REC[prompt], np.int64))
    args = ["sim", "generate", str(program), "--prompt-ids", str(tmp_path / "ids.npy"), "--max-new-tokens"]
    gen = CliRunner().invoke(cli, [*args, str(len(REC[want])), "--json", str(tmp_path / "g.json")])
    assert gen.exit_code == 0, gen.output
    assert json.loads((tmp_path / "g.json").read_text())["generated_ids"] == REC[want]
