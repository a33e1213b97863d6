"""``mcpc sim generate`` and ``mcpc sim eval-ppl``: reports, JSON keys and exit codes.

The decoding loop runs on ``ContractSession`` (decoder_contract.py, the entries' documented
semantics on the host) put in the place of the simulator Session; a program that is not a decoder
build is a real .mcpb.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import require_extra
from decoder_contract import VOCAB, ContractSession, meta_dict, ref_greedy
from simprog import add_program

from mcpc.arch.mcpb import write_mcpb
from mcpc.sim.cli import sim_group
from mcpc.sim.decoder import DecoderSession

KEYS = {"kv_bytes", "ttft_ms", "tpot_ms", "cycles_per_token", "latency_us_per_token", "roofline_us_per_token"}


@pytest.fixture
def decoder(monkeypatch, tmp_path):
    """A decoder 'program' path whose Session is the contract model (max_seq 200, max_batch 2)."""
    monkeypatch.setattr("mcpc.sim.session.Session", lambda program: ContractSession(meta_dict()))
    path = tmp_path / "dec.mcpb"
    path.write_bytes(b"")  # never read: the Session stand-in ignores it
    return path


def _invoke(*args):
    return CliRunner().invoke(sim_group, [*map(str, args)])


def test_generate_from_prompt_ids_prints_and_writes_the_report(decoder, tmp_path):
    prompt = np.arange(3, 40).reshape(1, -1) % VOCAB
    np.save(tmp_path / "ids.npy", prompt)
    res = _invoke("generate", decoder, "--prompt-ids", tmp_path / "ids.npy", "--max-new-tokens", 8,
                  "--json", tmp_path / "r.json")  # fmt: skip
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["generated_ids"] == ref_greedy(prompt[0].tolist(), 8)
    assert KEYS <= set(report) and report["decode_steps"] == 7
    assert "TTFT" in res.output and "time per token" in res.output and "KV bytes" in res.output
    assert " ".join(map(str, report["generated_ids"])) in res.output
    # per step: cycles, roofline (weights 10 000 B + inputs + outputs + KV in use at 100 B/cycle),
    # chain, bound; inputs: ids and positions 2 x 2 i64, kv_slot/start/len 3 x 2 i32, kv_gather
    # 2 x 4 i32; outputs: logits 2 x 50 f32
    io = 2 * 2 * 8 + 3 * 2 * 4 + 2 * 4 * 4 + 2 * VOCAB * 4
    kv = report["decode_kv_bytes"]
    assert report["decode_roofline_cycles"] == pytest.approx([(10_000 + io + b) / 100 for b in kv])
    assert report["decode_chain_cycles"] == [400] * 7
    assert report["decode_bound_cycles"] == pytest.approx([(10_000 + io + b) / 100 / 0.85 + 400 for b in kv])
    assert report["within_bound"] is False  # 1000 + 10 * context cycles against ~680
    assert "some step exceeds it" in res.output and res.output.count("      400  ") == 7


def test_generate_several_prompts_reports_kv_bytes_with_and_without_sharing(decoder, tmp_path):
    rng = np.random.default_rng(3)
    system = rng.integers(0, VOCAB, 130).tolist()
    prompts = [system + rng.integers(0, VOCAB, k).tolist() for k in (2, 4)]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts) + "\n")
    res = _invoke("generate", decoder, "--prompts", tmp_path / "p.jsonl", "--max-new-tokens", 4,
                  "--json", tmp_path / "r.json")  # fmt: skip
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["generated_ids"] == [ref_greedy(p, 4) for p in prompts]
    assert report["prefix_hit_tokens"] == 128 and report["kv_bytes"] < report["kv_bytes_unshared"]
    assert "without sharing" in res.output and "128 prompt tokens reused" in res.output


def test_generate_from_text_with_a_tokenizer(decoder, tmp_path):
    tokenizers = require_extra("tokenizers", "quant")
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    tok = tokenizers.Tokenizer(WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    res = _invoke("generate", decoder, "--tokenizer", tmp_path / "tokenizer.json", "--prompt", "w5 w7 w9",
                  "--max-new-tokens", 3, "--json", tmp_path / "r.json")  # fmt: skip
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["generated_ids"] == ref_greedy([5, 7, 9], 3)
    assert report["generated_text"] == " ".join(f"w{i}" for i in report["generated_ids"])


def test_eval_ppl_reports_the_perplexity_of_the_api(decoder, tmp_path):
    tokens = np.random.default_rng(4).integers(0, VOCAB, 70)
    np.save(tmp_path / "t.npy", tokens)
    res = _invoke("eval-ppl", decoder, "--tokens", tmp_path / "t.npy", "--window", 32, "--prefill", 8,
                  "--json", tmp_path / "r.json")  # fmt: skip
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "r.json").read_text())
    want = DecoderSession(ContractSession(meta_dict())).eval_ppl(tokens, 32, 8)["perplexity"]
    assert report["perplexity"] == pytest.approx(want, rel=1e-12)
    assert KEYS <= set(report) and report["windows"] == 2 and report["predictions"] == 62
    assert "perplexity" in res.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--max-new-tokens", 2], "exactly one of"),
        (["--prompt-ids", "{ids2d}", "--max-new-tokens", 2], "(n,) or (1, n)"),
        (["--prompt-ids", "{big}", "--max-new-tokens", 2], "outside the vocabulary"),
        (["--prompt-ids", "{long}", "--max-new-tokens", 2], "max_seq 200"),
        (["--prompt", "hello", "--max-new-tokens", 2], "needs --tokenizer"),
        (["--prompts", "{badjsonl}", "--max-new-tokens", 2], "p.jsonl:2: expected a JSON list"),
    ],
)
def test_generate_usage_errors_exit_2(decoder, tmp_path, args, message):
    np.save(tmp_path / "ids2d.npy", np.zeros((2, 3), np.int64))
    np.save(tmp_path / "big.npy", np.array([1, VOCAB]))
    np.save(tmp_path / "long.npy", np.zeros(200, np.int64))
    (tmp_path / "p.jsonl").write_text('[1, 2]\n{"a": 1}\n')
    paths = {k: tmp_path / f"{k}.npy" for k in ("ids2d", "big", "long")} | {"badjsonl": tmp_path / "p.jsonl"}
    res = _invoke("generate", decoder, *[str(a).format(**paths) for a in args])
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output


def test_eval_ppl_usage_and_input_errors(decoder, tmp_path):
    np.save(tmp_path / "t.npy", np.arange(40) % VOCAB)
    res = _invoke("eval-ppl", decoder, "--tokens", tmp_path / "t.npy")
    assert res.exit_code == 2 and "--window" in res.output
    (tmp_path / "bad.npy").write_bytes(b"not numpy")
    res = _invoke("eval-ppl", decoder, "--tokens", tmp_path / "bad.npy", "--window", 8)
    assert res.exit_code == 3 and "cannot read the tokens" in res.output


def test_a_program_that_is_not_a_decoder_build_exits_2(tmp_path):
    path = tmp_path / "add.mcpb"
    write_mcpb(path, add_program())
    np.save(tmp_path / "ids.npy", np.array([1, 2, 3]))
    res = _invoke("generate", path, "--prompt-ids", tmp_path / "ids.npy", "--max-new-tokens", 2)
    assert res.exit_code == 2, res.output
    assert "not a decoder build" in res.output and "--max-seq" in res.output
    np.save(tmp_path / "t.npy", np.arange(40))
    assert _invoke("eval-ppl", path, "--tokens", tmp_path / "t.npy", "--window", 8).exit_code == 2
