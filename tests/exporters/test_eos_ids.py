"""End-of-sequence ids a ``--max-seq`` build records (``ir.decoder_import.eos_ids``): ONNX Runtime
GenAI's ``genai_config.json``, else Hugging Face's ``generation_config.json`` (Optimum writes it beside
model.onnx), else ``config.json`` - the file transformers' ``generate`` reads (from_pretrained falls back
to ``GenerationConfig.from_model_config(config)`` only when there is no generation_config.json);
``sim generate`` stops a continuation after one."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from mcpc.arch.mcpb import read_mcpb
from mcpc.cli import cli
from mcpc.errors import InputError
from mcpc.ir.decoder_import import eos_ids

HERE = Path(__file__).resolve().parent
OPTIMUM = json.loads((HERE / "optimum" / "optimum.json").read_text())["files"]["llama-optimum.onnx"]


def _write(folder: Path, name: str, cfg) -> None:
    (folder / name).write_text(json.dumps(cfg))


def test_generation_config_then_config_json(tmp_path):
    model = tmp_path / "model.onnx"
    assert eos_ids(model) is None
    _write(tmp_path, "config.json", {"model_type": "llama", "eos_token_id": 2})
    assert eos_ids(model) == ([2], "config.json")
    _write(tmp_path, "config.json", {"model_type": "x", "text_config": {"eos_token_id": [5, 6]}})
    assert eos_ids(model) == ([5, 6], "config.json")
    # transformers reads generation_config.json alone when it is there: its list wins, its absence
    # of an id means no end-of-sequence stop (config.json's is not used)
    _write(tmp_path, "generation_config.json", {"bos_token_id": 1, "eos_token_id": [7, 8, 7]})
    assert eos_ids(model) == ([7, 8], "generation_config.json")
    _write(tmp_path, "generation_config.json", {"bos_token_id": 1})
    assert eos_ids(model) is None
    _write(tmp_path, "genai_config.json", {"model": {"eos_token_id": 3}})
    assert eos_ids(model) == ([3], "genai_config.json")


@pytest.mark.parametrize(
    ("name", "cfg", "msg"),
    [
        ("generation_config.json", {"eos_token_id": "two"}, "generation_config.json: eos_token_id is 'two'"),
        ("generation_config.json", {"eos_token_id": [1, -1]}, "eos_token_id is [1, -1]"),
        ("generation_config.json", [2], "generation_config.json: not a JSON object"),
        ("config.json", {"eos_token_id": True}, "config.json: eos_token_id is True"),
    ],
)
def test_bad_eos_ids_are_named(tmp_path, name, cfg, msg):
    _write(tmp_path, name, cfg)
    with pytest.raises(InputError, match=msg.replace("[", r"\[").replace("]", r"\]")):
        eos_ids(tmp_path / "model.onnx")


def test_optimum_export_stops_after_generation_config_eos(tmp_path):
    """An Optimum export with its generation_config.json (as save_pretrained writes it) beside it: the
    build records the ids (META eos_ids, eos_source) and sim generate stops after the first one
    emitted - here the 5th of ONNX Runtime's greedy ids."""
    want = OPTIMUM["greedy11"]
    (tmp_path / "model.onnx").write_bytes((HERE / "optimum" / "llama-optimum.onnx").read_bytes())
    _write(tmp_path, "config.json", {"model_type": "llama", "eos_token_id": want[1]})  # not read
    gen_cfg = {"_from_model_config": True, "bos_token_id": 1, "eos_token_id": [999, want[4]],
               "transformers_version": "4.57.6"}  # fmt: skip
    _write(tmp_path, "generation_config.json", gen_cfg)
    prog = tmp_path / "p.mcpb"
    built = CliRunner().invoke(
        cli, ["compile", str(tmp_path / "model.onnx"), "-c", "fp32.yaml", "--max-seq", "32", "-o", str(prog)]
    )
    assert built.exit_code == 0, built.output
    meta = read_mcpb(prog).meta["decoder"]
    assert meta["eos_ids"] == [999, want[4]] and meta["eos_source"] == "generation_config.json"
    np.save(tmp_path / "ids.npy", np.array(OPTIMUM["prompt11"], np.int64))
    gen = CliRunner().invoke(cli, ["sim", "generate", str(prog), "--prompt-ids", str(tmp_path / "ids.npy"),
                                   "--max-new-tokens", "20", "--json", str(tmp_path / "g.json")])  # fmt: skip
    assert gen.exit_code == 0, gen.output
    assert json.loads((tmp_path / "g.json").read_text())["generated_ids"] == want[: want.index(want[4]) + 1]
