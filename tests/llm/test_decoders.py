"""The committed random-weight decoders (``decoders/``, made by ``make_decoders.py``) and the ONNX
Runtime reference loop of ``ort_greedy.py``: names and dims of each with-past graph, the family
traits the fixtures exist for, the recorded greedy continuations (prefill with past 0, then one
token per step) and eval-ppl's NLL protocol against one full-sequence call.  numpy + onnxruntime
only: no torch.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import OPTIONAL_EXTRA_SKIP
from ort_greedy import OrtDecoder, greedy, ort_nll, perplexity, windows

HERE = Path(__file__).parent
DECODERS = HERE / "decoders"
MANIFEST = json.loads((DECODERS / "decoders.json").read_text())
FAMILIES = ["llama", "qwen2", "gpt2"]
TORCH_KV = HERE.parent / "torch_models" / "fixtures" / "gpt_kv-torchscript-op17.onnx"


def _dims(vi) -> list:
    return [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


@pytest.fixture(scope="module", params=FAMILIES)
def fixture(request):
    meta = MANIFEST["models"][request.param]
    return meta, OrtDecoder(DECODERS / meta["file"])


def test_every_family_is_committed_small_and_recorded():
    assert list(MANIFEST["models"]) == FAMILIES
    assert MANIFEST["opset"] == 17 and MANIFEST["versions"]["torch"].startswith("2.13.0")
    for meta in MANIFEST["models"].values():
        path = DECODERS / meta["file"]
        assert path.stat().st_size < 1_000_000, path
        assert meta["hidden"] == 64 and meta["layers"] == 2 and 256 <= meta["vocab"] <= 512
        assert meta["max_positions"] >= 512
        assert meta["file"] in (DECODERS / "README.md").read_text()


def test_with_past_graph_names_and_dims(fixture):
    meta, _ = fixture
    g = onnx.load(str(DECODERS / meta["file"])).graph
    kv = [f"{i}.{t}" for i in range(meta["layers"]) for t in ("key", "value")]
    assert [i.name for i in g.input] == [
        "input_ids",
        "attention_mask",
        "position_ids",
        *(f"past_key_values.{n}" for n in kv),
    ]
    assert [o.name for o in g.output] == ["logits", *(f"present.{n}" for n in kv)]
    h, d = meta["kv_heads"], meta["head_dim"]
    assert _dims(g.input[0]) == ["batch", "seq"] and _dims(g.input[2]) == ["batch", "seq"]
    assert _dims(g.input[1]) == ["batch", "total_seq"]
    assert all(_dims(i) == ["batch", h, "past_seq", d] for i in g.input[3:])
    assert all(_dims(o) == ["batch", h, "total_seq", d] for o in g.output[1:])
    assert _dims(g.output[0]) == ["batch", "seq", meta["vocab"]]
    assert onnx.load(str(DECODERS / meta["file"])).opset_import[0].version == 17


def test_family_traits_are_in_the_graphs():
    """What each fixture exists for: GQA (kv heads < q heads) in Llama and Qwen2, q/k/v biases and a
    RoPE base of 1e6 in Qwen2, and GPT-2's LayerNorm, Conv1D as Gemm, fused QKV Split, tanh GELU."""
    m = MANIFEST["models"]
    assert (m["llama"]["q_heads"], m["llama"]["kv_heads"]) == (4, 2)
    assert (m["qwen2"]["q_heads"], m["qwen2"]["kv_heads"]) == (8, 2)
    assert m["qwen2"]["rope_theta"] == 1e6 and m["llama"]["rope_theta"] == 1e4
    ops = {}
    inits = {}
    for fam in FAMILIES:
        g = onnx.load(str(DECODERS / m[fam]["file"])).graph
        ops[fam] = {n.op_type for n in g.node}
        inits[fam] = {i.name: tuple(i.dims) for i in g.initializer}
    q_bias = [n for n in inits["qwen2"] if n.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias"))]
    assert len(q_bias) == 3 * 2
    assert not [n for n in inits["llama"] if n.endswith("proj.bias")]
    for fam in ("llama", "qwen2"):
        assert {"Pow", "ReduceMean", "Sqrt", "Sin", "Cos"} <= ops[fam]
        assert "LayerNormalization" not in ops[fam]
    assert {"LayerNormalization", "Gemm", "Split", "Tanh"} <= ops["gpt2"]
    assert "Sin" not in ops["gpt2"]  # learned positions, no RoPE
    assert inits["gpt2"]["model.transformer.h.0.attn.c_attn.weight"] == (64, 3 * 64)


def test_ort_greedy_matches_the_record_and_is_not_degenerate(fixture):
    meta, dec = fixture
    tokens, margins = greedy(dec, meta["prompt"], 24, return_margins=True)
    assert tokens == meta["greedy"]
    assert len(set(tokens)) >= 8, tokens  # random weights scaled so greedy moves between tokens
    assert min(margins) == pytest.approx(meta["min_margin"], abs=1e-3) and min(margins) > 0.05


def test_kv_loop_equals_one_call_over_the_whole_sequence(fixture):
    """The graph's past > 0 path agrees with its past 0 path: a prefill of 5 tokens, then 7 steps,
    gives the logits of one call over all 12 tokens (batch 2, different tokens per row)."""
    meta, dec = fixture
    ids = np.random.default_rng(1).integers(0, meta["vocab"], (2, 12))
    full, present_full = dec.run(ids, None, 0)
    logits, past = dec.run(ids[:, :5], None, 0)
    steps = [logits]
    for t in range(5, 12):
        logits, past = dec.run(ids[:, t : t + 1], past, t)
        steps.append(logits)
    got = np.concatenate(steps, axis=1)
    assert got.shape == (2, 12, meta["vocab"])
    assert np.abs(got - full).max() <= 1e-5 * np.abs(full).max()
    assert past[0].shape == (2, meta["kv_heads"], 12, meta["head_dim"])
    assert np.abs(past[-1] - present_full[-1]).max() <= 1e-5 * np.abs(present_full[-1]).max()
    assert dec.layers == meta["layers"] and dec.vocab == meta["vocab"]


def test_ort_nll_is_eval_ppl_protocol(fixture):
    """ort_nll over 3 windows of 20 (prefill 6 then one token per step) equals −log softmax of one
    call per window at the next token; batching the windows changes nothing beyond rounding."""
    meta, dec = fixture
    tokens = np.random.default_rng(2).integers(0, meta["vocab"], 3 * 20 + 7)  # 7 left over: dropped
    nll = ort_nll(dec, tokens, 20, prefill=6)
    assert nll.shape == (3, 19)
    w = windows(tokens, 20)
    logits, _ = dec.run(w, None, 0)
    want = -np.take_along_axis(_log_softmax(logits[:, :-1]), w[:, 1:, None], -1)[..., 0]
    assert np.abs(nll - want).max() < 1e-4
    one_by_one = ort_nll(dec, w, prefill=6, batch=1)
    assert np.abs(one_by_one - nll).max() < 1e-4
    assert perplexity(nll) == pytest.approx(np.exp(want.mean()), rel=1e-5)
    assert 1.0 < perplexity(nll) < 10 * meta["vocab"]


def test_ort_nll_refuses_a_prefill_outside_the_window():
    dec = OrtDecoder(DECODERS / MANIFEST["models"]["llama"]["file"])
    with pytest.raises(ValueError, match="prefill 20"):
        ort_nll(dec, np.zeros(40, np.int64), 20, prefill=20)
    with pytest.raises(ValueError, match="no window"):
        ort_nll(dec, np.zeros(10, np.int64), 20)
    with pytest.raises(ValueError, match="need a window"):
        ort_nll(dec, np.zeros(40, np.int64))
    with pytest.raises(ValueError, match="not 16"):
        ort_nll(dec, np.zeros((2, 20), np.int64), 16)


def test_reference_reads_the_torch_fixture_naming():
    """past_key_<i> / present_key_<i> (tests/torch_models, no mask nor position inputs) runs too."""
    dec = OrtDecoder(TORCH_KV)
    assert dec.layers == 2 and not dec.has_mask and not dec.has_positions
    assert dec.present_names[:2] == ["present_key_0", "present_value_0"]
    ids = np.array([[3, 17, 101, 42, 7, 250]])
    full, _ = dec.run(ids, None, 0)
    tokens = greedy(dec, ids[0, :4], 3)
    assert tokens[0] == int(np.argmax(dec.run(ids[:, :4], None, 0)[0][0, -1]))
    logits, past = dec.run(ids[:, :4], None, 0)
    step, _ = dec.run(ids[:, 4:5], past, 4)
    assert np.abs(step[0, 0] - full[0, 4]).max() <= 1e-5 * np.abs(full).max()


def test_reference_refuses_a_graph_without_past():
    with pytest.raises(ValueError, match="no past_key_values"):
        OrtDecoder(TORCH_KV.with_name("gpt-torchscript-op17.onnx"))


@pytest.mark.slow
def test_make_decoders_reproduces_the_committed_record(tmp_path):
    """Re-running the script (the ``llm`` extra) writes graphs with the same interface and the
    same greedy continuations as the committed ones."""
    import importlib.util

    from export_smollm2 import EXTRA_MODULES

    absent = [m for m in EXTRA_MODULES[:2] if importlib.util.find_spec(m) is None]
    if absent:
        pytest.skip(f"{OPTIONAL_EXTRA_SKIP}: llm (missing {', '.join(absent)}; make llm-models)")
    import make_decoders

    assert make_decoders.main(["--out", str(tmp_path)]) == 0
    made = json.loads((tmp_path / "decoders.json").read_text())
    for fam in FAMILIES:
        want, got = MANIFEST["models"][fam], made["models"][fam]
        assert {k: got[k] for k in ("prompt", "greedy", "q_heads", "kv_heads", "head_dim", "vocab")} == {
            k: want[k] for k in ("prompt", "greedy", "q_heads", "kv_heads", "head_dim", "vocab")
        }
        assert got["min_margin"] == pytest.approx(want["min_margin"], abs=1e-3)
        assert greedy(OrtDecoder(tmp_path / got["file"]), want["prompt"], 24) == want["greedy"]


@pytest.mark.slow
def test_decode_step_of_each_fixture_passes_check_as_a_single_graph_build(fixture, tmp_path):
    """Today's single-graph build of one decode step (batch 2, past 7 from the reference's own
    prefill) agrees with ONNX Runtime: the fixtures import and compile as exported."""
    import subprocess
    import sys

    meta, dec = fixture
    ids = np.random.default_rng(3).integers(0, meta["vocab"], (2, 8))
    _, past = dec.run(ids[:, :7], None, 0)
    feeds = {
        "input_ids": ids[:, 7:],
        "attention_mask": np.ones((2, 8), np.int64),
        "position_ids": np.full((2, 1), 7, np.int64),
        **dict(zip(dec.past_names, past, strict=True)),
    }
    np.savez(tmp_path / "step.npz", **feeds)
    model, prog = DECODERS / meta["file"], tmp_path / "step.mcpb"
    binary = Path(sys.executable).parent
    dims = ["--dim", "batch=2", "--dim", "seq=1", "--dim", "past_seq=7", "--dim", "total_seq=8"]
    done = subprocess.run(
        [str(binary / "mcp-compile"), "-t", "mcp2026-a100", "-c", "fp32", *dims, "-o", str(prog), str(model)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    report = tmp_path / "check.json"
    args = ["check", str(model), str(prog), "--inputs", str(tmp_path / "step.npz"), "--json", str(report)]
    done = subprocess.run([str(binary / "mcpc"), *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    logits = next(o for o in json.loads(report.read_text())["outputs"] if o["name"] == "logits")
    assert logits["top1"] == 1.0 and logits["norm_max_err"] <= 1e-5
