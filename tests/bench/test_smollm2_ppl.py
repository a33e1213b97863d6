"""bench/smollm2_ppl.py on the small Llama decoder of tests/llm/decoders (SmolLM2's rows are the same
commands on its export): each row is an mcp-compile and an `mcpc sim eval-ppl --json`, the table
compares INT8 KV with the build without it and states the acceptance verdicts, and `--reuse`
assembles a table from rows measured earlier without running them again."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import smollm2_ppl  # noqa: E402


@pytest.mark.slow  # two compiles and two served evaluations
def test_rows_table_and_reuse(tmp_path, capsys):
    onnx = ROOT / "tests" / "llm" / "decoders" / "llama-with-past.onnx"
    tokens = tmp_path / "tokens.npy"
    np.save(tokens, np.random.default_rng(0).integers(0, 512, (2, 24)).astype(np.int64))
    common = ["--onnx", str(onnx), "--tokens", str(tokens), "--window", "24", "--max-seq", "64",
              "--work", str(tmp_path / "work"), "--json", str(tmp_path / "t.json"),
              "--markdown", str(tmp_path / "t.md"), "--ort"]  # fmt: skip
    assert smollm2_ppl.main([*common, "--rows", "w4a16,w4a16_kv8"]) == 0
    result = json.loads((tmp_path / "t.json").read_text())
    rows = {r["key"]: r for r in result["rows"]}
    assert set(rows) == {"w4a16", "w4a16_kv8"} and result["windows"] == 2
    assert result["ort_source"].startswith("measured") and result["ort_fp32"] > 1
    for r in rows.values():
        assert r["perplexity"] > 1 and r["cycles_per_token"] > 0 and r["predictions"] == 2 * 23
        assert r["eval"]["wall_s"] > 0 and r["build"]["wall_s"] > 0 and len(r["eval"]["load_avg"]) == 2
        assert r["eval"]["env"] == {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
        assert "--max-seq" in r["build"]["command"] and "eval-ppl" in r["eval"]["command"]
    assert rows["w4a16_kv8"]["kv_bytes"] < rows["w4a16"]["kv_bytes"]  # INT8 blocks are smaller
    md = (tmp_path / "t.md").read_text()
    assert "Q4_1" in md and "| W4A16 + INT8 KV |" in md
    ratio = rows["w4a16"]["kv_bytes"] / rows["w4a16_kv8"]["kv_bytes"]
    assert f"kv_bytes {ratio:.3f}x smaller" in md
    assert "W4A16 + INT8 KV: the evaluation in <= 600 s of wall time" in md and "| load avg |" in md
    assert "INT8 KV makes kv_bytes >= 1.85x smaller" in md and "Not measured: fp32, fp16 (Q4_1 weights)" in md
    capsys.readouterr()
    # a second run with --reuse keeps both rows as measured (same figures, nothing rebuilt)
    assert smollm2_ppl.main([*common, "--rows", "w4a16,w4a16_kv8", "--reuse"]) == 0
    assert capsys.readouterr().err.count("reused") == 2
    again = {r["key"]: r for r in json.loads((tmp_path / "t.json").read_text())["rows"]}
    assert again["w4a16_kv8"]["perplexity"] == rows["w4a16_kv8"]["perplexity"]


def test_a_missing_export_is_one_line(tmp_path, capsys):
    assert smollm2_ppl.main(["--onnx", str(tmp_path / "none.onnx")]) == 2
    err = capsys.readouterr().err
    assert "make llm-models" in err and len(err.strip().splitlines()) == 1
