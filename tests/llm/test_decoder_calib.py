"""Calibration of decoder builds (``mcp-compile --max-seq N --calib TOKENS``): the matmul input
statistics collected by ONNX Runtime on the graph with past, GPTQ running on them in both entries,
and the errors for token files that do not fit."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from mcpc.cli import cli
from mcpc.errors import InputError
from mcpc.ort_decoder import OrtDecoder
from mcpc.passes.decoder_calib import collect_decoder_stats, load_tokens

DECODERS = Path(__file__).parent / "decoders"
LLAMA = DECODERS / "llama-with-past.onnx"


def _ids(tmp_path, shape=(3, 24), vocab=200, name="ids.npy"):
    ids = np.random.default_rng(5).integers(0, vocab, size=shape)
    np.save(tmp_path / name, ids)
    return tmp_path / name, ids


def test_stats_are_the_inputs_of_the_named_matmuls(tmp_path):
    """The LM head's input statistics agree with the logits ONNX Runtime returns for the same
    windows: E[y^T y] = W^T E[x^T x] W for y = x W (an identity the collection must satisfy)."""
    import onnx
    from onnx import numpy_helper

    path, ids = _ids(tmp_path)
    model = onnx.load(str(LLAMA))
    (head,) = [n for n in model.graph.node if n.op_type == "MatMul" and "lm_head" in n.name]
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    cal = collect_decoder_stats(LLAMA, path, {head.name, "no such node"})
    assert set(cal.stats) == {head.name}
    assert (cal.samples, cal.tokens) == (3, 72)
    stats = cal.stats[head.name]
    assert stats.rows == 72
    producer = {o: n for n in model.graph.node for o in n.output}
    b = head.input[1]
    if b in inits:
        w = inits[b]
    else:  # a transposed (N, K) weight
        assert producer[b].op_type == "Transpose"
        w = inits[producer[b].input[0]].T
    w = w.astype(np.float64)
    dec = OrtDecoder(LLAMA)
    y = np.concatenate([dec.run(row[None, :], None, 0)[0].reshape(-1, w.shape[1]) for row in ids])
    want = y.astype(np.float64).T @ y / len(y)
    np.testing.assert_allclose(w.T @ stats.hessian @ w, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_a_calibrated_decoder_build_runs_gptq_in_both_entries(tmp_path):
    path, _ = _ids(tmp_path)
    rep = tmp_path / "r.json"
    r = CliRunner().invoke(
        cli,
        ["compile", str(LLAMA), "--max-seq", "64", "-c", "qat_w4a16", "--calib", str(path), "--emit", "ir",
         "-o", str(tmp_path / "x.mcpir"), "--report-json", str(rep)],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert f"calibration: 3 windows (72 tokens) from {path}" in r.output
    q = json.loads(rep.read_text())["quantization"]
    assert q["calibration"] == {"source": str(path), "samples": 3, "tokens": 72}
    assert set(q["functions"]) == {"prefill", "decode"}
    for f in q["functions"].values():
        algos = {(r["lm_head"], r["algorithm"]) for r in f["layers"]}
        assert algos == {(False, "gptq"), (True, "none")}


@pytest.mark.parametrize(
    "content, message",
    [
        ({"input_ids": np.zeros((2, 8), np.int64), "attention_mask": np.ones((2, 8))}, "input_ids alone"),
        (np.zeros((2, 8), np.float32), "must be integers shaped"),
        (np.zeros((2, 2, 8), np.int64), "must be integers shaped"),
    ],
)
def test_token_files_that_do_not_fit_are_refused(tmp_path, content, message):
    if isinstance(content, dict):
        path = tmp_path / "c.npz"
        np.savez(path, **content)
    else:
        path = tmp_path / "c.npy"
        np.save(path, content)
    with pytest.raises(InputError, match=message):
        load_tokens(path)
    args = ["compile", LLAMA, "--max-seq", 64, "-c", "qat_w4a16", "--calib", path, "-o", tmp_path / "x.mcpb"]
    r = CliRunner().invoke(cli, list(map(str, args)))
    assert r.exit_code == 3 and str(path) in r.output and message in r.output, r.output


def test_npz_input_ids_and_one_window(tmp_path):
    np.savez(tmp_path / "a.npz", input_ids=np.arange(10).reshape(2, 5))
    assert load_tokens(tmp_path / "a.npz").shape == (2, 5)
    np.save(tmp_path / "b.npy", np.arange(7))
    assert load_tokens(tmp_path / "b.npy").shape == (1, 7)
    with pytest.raises(InputError, match="not a directory"):
        load_tokens(tmp_path)
