"""``mcpc check``: scale-relative tolerances, ``--mask``, ``--ignore-outputs``, top-1 agreement of
logits, full output names, and a build with one weight flipped failing (exit 1)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from conftest import make_model, vi
from onnx import TensorProto, helper, numpy_helper

from mcpc.check import compare, is_logits, mask_axes, vocabulary_sizes
from mcpc.cli import cli

VOCAB, HIDDEN, BATCH, SEQ = 40, 16, 3, 6
LOGITS = "logits_of_the_language_model_head_with_a_deliberately_long_name_that_a_narrow_table_would_cut"


def run(args):
    return CliRunner().invoke(cli, args)


def toy_lm(seed: int = 0) -> onnx.ModelProto:
    """input_ids, attention_mask [batch, seq] -> embedding -> tanh(x W1) * mask -> logits over the
    vocabulary, plus the masked mean of the hidden states ``pooled`` [batch, hidden]."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32), "emb"),
        numpy_helper.from_array((rng.standard_normal((HIDDEN, HIDDEN)) / 4).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.standard_normal((HIDDEN, VOCAB)).astype(np.float32), "w_out"),
        numpy_helper.from_array(np.array([2], dtype=np.int64), "last"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "seq_axis"),
    ]
    nodes = [
        helper.make_node("Gather", ["emb", "input_ids"], ["e"]),
        helper.make_node("MatMul", ["e", "w1"], ["h0"]),
        helper.make_node("Tanh", ["h0"], ["h1"]),
        helper.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["m", "last"], ["m3"]),
        helper.make_node("Mul", ["h1", "m3"], ["h"]),
        helper.make_node("MatMul", ["h", "w_out"], [LOGITS]),
        helper.make_node("ReduceSum", ["h", "seq_axis"], ["pooled"], keepdims=0),
    ]
    return make_model(
        nodes,
        [vi(n, ["batch", "seq"], TensorProto.INT64) for n in ("input_ids", "attention_mask")],
        [vi(LOGITS, ["batch", "seq", VOCAB]), vi("pooled", ["batch", HIDDEN])],
        inits,
    )  # fmt: skip


def toy_inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    mask = (np.arange(SEQ)[None, :] < np.array([SEQ, 4, 2])[:, None]).astype(np.int64)
    ids = np.where(mask == 1, rng.integers(1, VOCAB, (BATCH, SEQ)), 0).astype(np.int64)
    return {"input_ids": ids, "attention_mask": mask}


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    d = tmp_path_factory.mktemp("toy")
    onnx.save(toy_lm(), d / "lm.onnx")
    np.savez(d / "in.npz", **toy_inputs())
    for config in ("fp32", "fp16"):
        dims = ["--dim", f"batch={BATCH}", "--dim", f"seq={SEQ}"]
        built = run(["compile", str(d / "lm.onnx"), "-c", config, *dims, "-o", str(d / f"lm-{config}.mcpb")])
        assert built.exit_code == 0, built.output
    return d


def _check(d, config, *extra, model="lm.onnx"):
    args = ["check", str(d / model), str(d / f"lm-{config}.mcpb"), "--inputs", str(d / "in.npz")]
    return run([*args, "--json", str(d / "report.json"), *extra])


# --- compare: the numbers ---------------------------------------------------------------------


def test_norm_max_err_is_relative_to_the_output_scale():
    r = np.linspace(-20, 20, 100)
    c = compare("logits", r + 1e-3, r, max_norm_err=1e-4)
    assert c.norm_max_err == pytest.approx(1e-3 / 20) and c.passed  # 5e-5: an atol of 1e-5 would fail
    small = compare("h", (r + 1e-3) / 1000, r / 1000, max_norm_err=1e-4)
    assert small.norm_max_err == pytest.approx(1e-3 / 20) and small.passed
    assert not compare("h", r + 1e-2, r, max_norm_err=1e-4).passed
    assert compare("z", np.zeros(4), np.zeros(4), max_norm_err=0).passed  # zero scale: absolute


def test_cosine_and_elementwise_criteria():
    r = np.arange(1.0, 9.0)
    flipped = r.copy()
    flipped[0] = -flipped[0]
    c = compare("y", flipped, r, min_cosine=0.999)
    assert c.cosine < 0.999 and not c.passed and "cosine" in c.reasons[0]
    e = compare("y", r + 0.01, r, rtol=0, atol=1e-3)
    assert e.violations == 8 and not e.passed
    assert compare("y", r + 0.01, r, rtol=0, atol=1e-3 + 0.01).passed


def test_non_finite_output_always_fails_but_matching_infinities_agree():
    r = np.array([1.0, -np.inf, 3.0])
    assert compare("y", r.copy(), r, max_norm_err=0).passed  # the reference's own -inf (a mask)
    bad = compare("y", np.array([1.0, -np.inf, np.inf]), r, max_norm_err=10.0)
    assert not bad.passed and bad.nonfinite == 1 and "non-finite" in bad.reasons[0]
    nan = compare("y", np.array([np.nan, -np.inf, 3.0]), r)  # no tolerance given at all
    assert not nan.passed and nan.nonfinite == 1


def test_mask_axes_are_batch_seq_leading_or_kv_layout():
    assert mask_axes((2, 7), (2, 7, 50)) == (0, 1)  # [batch, seq, vocab]
    assert mask_axes((2, 7), (2, 7)) == (0, 1)
    assert mask_axes((2, 7), (2, 3, 7, 64)) == (0, 2)  # [batch, kv_heads, seq, head_dim]
    assert mask_axes((2, 7), (2, 7, 7, 64)) == (0, 1)  # leading axes win when both fit
    assert mask_axes((2, 7), (2, 384)) is None and mask_axes((2, 7), (2, 1, 50)) is None


def test_mask_scores_only_positions_whose_mask_is_one():
    rng = np.random.default_rng(0)
    r = rng.standard_normal((2, 5, 8))
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    y = r.copy()
    y[0, 3:] += 100.0  # garbage only where the mask is 0
    whole = compare("h", y, r, max_norm_err=1e-6)
    assert not whole.passed and whole.scored == y.size
    masked = compare("h", y, r, max_norm_err=1e-6, mask=mask)
    assert masked.passed and masked.scored == 8 * 8 and masked.masked_axes == (0, 1)
    y[1, 4, 0] += 1.0  # a real position is wrong: the mask does not hide it
    assert not compare("h", y, r, max_norm_err=1e-6, mask=mask).passed
    kv = rng.standard_normal((2, 3, 5, 4))
    ykv = kv.copy()
    ykv[0, :, 4] = 50.0
    c = compare("present.0.key", ykv, kv, max_norm_err=1e-6, mask=mask)
    assert c.passed and c.masked_axes == (0, 2) and c.scored == 8 * 3 * 4


def test_top1_agreement_of_logits_over_scored_positions():
    rng = np.random.default_rng(0)
    r = rng.standard_normal((2, 5, 10))
    y = r.copy()
    y[0, 0] = -r[0, 0]  # a different argmax at one of ten positions
    c = compare("logits", y, r, min_top1=0.95, top1=True)
    assert c.top1 == pytest.approx(0.9) and not c.passed and "top-1 agreement 90.00% < 95%" in c.reasons
    mask = np.ones((2, 5), dtype=np.int64)
    mask[0, 0] = 0
    masked = compare("logits", y, r, min_top1=0.95, top1=True, mask=mask)
    assert masked.top1 == 1.0 and masked.passed
    assert compare("h", y, r, min_top1=0.95).top1 is None  # not logits-like: no argmax criterion


def test_logits_like_outputs_are_found_from_the_embedding_table(tmp_path):
    onnx.save(toy_lm(), tmp_path / "lm.onnx")
    vocab = vocabulary_sizes(tmp_path / "lm.onnx")
    assert vocab == {VOCAB}
    assert is_logits(LOGITS, (2, 3, VOCAB), vocab) and not is_logits("pooled", (2, HIDDEN), vocab)
    assert is_logits("logits", (4, 10), set()) and not is_logits("logits", (4, 1), set())


# --- the command ------------------------------------------------------------------------------


@pytest.mark.parametrize("config", ["fp32", "fp16"])
def test_check_passes_with_the_builds_tolerances_and_mask(toy, config):
    result = _check(toy, config, "--mask", "attention_mask")
    assert result.exit_code == 0, result.output
    report = json.loads((toy / "report.json").read_text())
    assert report["passed"] and report["mask"] == "attention_mask" and report["precision"] == config
    expected = {"fp32": {"max_norm_err": 1e-4, "min_cosine": 0.99999, "min_top1": 0.99},
                "fp16": {"max_norm_err": 5e-2, "min_cosine": 0.999, "min_top1": 0.99}}[config]  # fmt: skip
    assert report["tolerances"] == expected
    outs = {o["name"]: o for o in report["outputs"]}
    real = int(toy_inputs()["attention_mask"].sum())
    assert outs[LOGITS]["masked_axes"] == [0, 1] and outs[LOGITS]["scored"] == real * VOCAB
    assert outs[LOGITS]["top1"] == 1.0
    assert outs["pooled"]["masked_axes"] is None and outs["pooled"]["top1"] is None
    assert LOGITS in result.output  # the full name, in an 80-column table


def test_check_ignore_outputs_and_usage_errors(toy):
    result = _check(toy, "fp32", "--ignore-outputs", "pooled")
    assert result.exit_code == 0, result.output
    report = json.loads((toy / "report.json").read_text())
    assert [o["name"] for o in report["outputs"]] == [LOGITS] and report["ignored"] == ["pooled"]
    assert "ignored" in result.output
    bad = _check(toy, "fp32", "--ignore-outputs", "pooled,nope")
    assert bad.exit_code == 2 and "nope not an output" in bad.output and LOGITS in bad.output
    both = _check(toy, "fp32", "--ignore-outputs", f"pooled,{LOGITS}")
    assert both.exit_code == 2 and "leaves no output" in both.output
    missing = _check(toy, "fp32", "--mask", "mask")
    assert missing.exit_code == 2 and "--mask mask: no such input" in missing.output
    assert "attention_mask, input_ids" in missing.output
    bad_mask = _check(toy, "fp32", "--mask", "input_ids")
    assert bad_mask.exit_code == 2 and "only 0 and 1" in bad_mask.output


def test_command_line_tolerances_override_the_builds(toy):
    strict = _check(toy, "fp16", "--max-norm-err", "1e-9")
    assert strict.exit_code == 1 and "norm max err" in strict.output
    assert json.loads((toy / "report.json").read_text())["tolerances"]["max_norm_err"] == 1e-9
    elementwise = _check(toy, "fp16", "--atol", "0", "--rtol", "0")
    assert elementwise.exit_code == 1 and "elements outside atol 0 + rtol 0" in elementwise.output


@pytest.mark.parametrize("config", ["fp32", "fp16"])
def test_build_with_one_weight_flipped_fails(toy, config, negate_largest_weight):
    """The broken model compiled, then checked against the intact one: exit 1, naming the output."""
    broken = toy_lm()
    what = negate_largest_weight(broken)
    assert what.startswith("w_out[")
    onnx.save(broken, toy / "broken.onnx")
    dims = ["--dim", f"batch={BATCH}", "--dim", f"seq={SEQ}"]
    prog = toy / f"broken-{config}.mcpb"
    assert run(["compile", str(toy / "broken.onnx"), "-c", config, *dims, "-o", str(prog)]).exit_code == 0
    args = [
        "check",
        str(toy / "lm.onnx"),
        str(prog),
        "--inputs",
        str(toy / "in.npz"),
        "--mask",
        "attention_mask",
    ]
    result = run(args)
    assert result.exit_code == 1, result.output
    assert "outside tolerance" in result.output and "FAIL" in result.output
