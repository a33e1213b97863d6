"""``mcpc sim generate`` / ``mcpc sim eval-ppl`` on real decoder builds of the three small families
(tests/llm/decoders: Llama, Qwen2, GPT-2), against ONNX Runtime running the same ONNX graph in its
own KV loop (ort_greedy.py): the greedy tokens are ONNX Runtime's, the perplexity its to 1e-5, and
several prompts through one KV manager — batched decode, a shared prefix stored once — give each
prompt's own tokens.  Each model is compiled once (fp32) per module."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from ort_greedy import greedy, ort_nll, perplexity

import mcpc
from mcpc.ir.decoder_import import DecoderBuild
from mcpc.sim.cli import sim_group
from mcpc.sim.decoder import DecoderSession, block_bytes

DECODERS = Path(__file__).parent / "decoders"
RECORDS = json.loads((DECODERS / "decoders.json").read_text())["models"]
REPORT_KEYS = {"kv_bytes", "ttft_ms", "tpot_ms", "cycles_per_token", "latency_us_per_token",
               "roofline_us_per_token"}  # fmt: skip


@pytest.fixture(scope="module", params=["llama", "qwen2", "gpt2"])
def build(request, tmp_path_factory):
    family = request.param
    out = tmp_path_factory.mktemp(family) / f"{family}.mcpb"
    mcpc.compile(
        DECODERS / RECORDS[family]["file"],
        qat_config="fp32",
        decoder=DecoderBuild(max_seq=64, prefill_chunk=4),
        output=out,
    )
    return family, out


def _invoke(*args):
    res = CliRunner().invoke(sim_group, [*map(str, args)])
    assert res.exit_code == 0, res.output
    return res


def test_generate_gives_onnx_runtimes_24_greedy_tokens(build, tmp_path):
    family, program = build
    rec = RECORDS[family]
    np.save(tmp_path / "ids.npy", np.array([rec["prompt"]], np.int64))  # (1, n)
    res = _invoke("generate", program, "--prompt-ids", tmp_path / "ids.npy", "--max-new-tokens", 24,
                  "--json", tmp_path / "r.json")  # fmt: skip
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["generated_ids"] == rec["greedy"]
    assert REPORT_KEYS <= set(report) and report["decode_steps"] == 23
    assert report["cycles_per_token"] > 0 and report["roofline_us_per_token"] > 0
    assert report["decode_context"] == list(range(9, 32))  # the step feeding token t attends t + 1
    assert all(
        0 < a < c for a, c in zip(report["decode_attention_cycles"], report["decode_cycles"], strict=True)
    )
    assert report["kv_bytes"] == block_bytes(DecoderSession(program).meta)  # 8 + 23 positions: one block
    assert "TTFT" in res.output and "DRAM roofline" in res.output
    # each step beside its roofline, chain latency and bound (roofline / 0.85 + chain)
    roof, chain, bound = (report[f"decode_{k}_cycles"] for k in ("roofline", "chain", "bound"))
    assert all(0 < c <= cyc for c, cyc in zip(chain, report["decode_cycles"], strict=True))
    assert bound == pytest.approx([r / 0.85 + c for r, c in zip(roof, chain, strict=True)])
    assert "dependency chain" in res.output and f"{chain[0]:,d}" in res.output
    # the roofline counts what a step reads: the embedding's gathered rows, not its whole table
    # (GPT-2 and these fixtures keep separate embedding and LM head tables)
    assert 0 < report["weight_bytes_per_step"] < report["weight_bytes"]


def test_eval_ppl_equals_onnx_runtimes_perplexity(build, tmp_path):
    family, program = build
    tokens = np.random.default_rng(3).integers(0, RECORDS[family]["vocab"], 2 * 24 + 5)
    np.save(tmp_path / "t.npy", tokens)
    _invoke("eval-ppl", program, "--tokens", tmp_path / "t.npy", "--window", 24, "--prefill", 6,
            "--json", tmp_path / "r.json")  # fmt: skip
    report = json.loads((tmp_path / "r.json").read_text())
    want = perplexity(ort_nll(DECODERS / RECORDS[family]["file"], tokens, 24, 6))
    assert report["perplexity"] == pytest.approx(want, rel=1e-5)
    assert (
        report["windows"] == 2 and report["predictions"] == 46 and report["decode_steps"] == 2 * 17
    )  # max_batch 1: a window at a time


def test_prompts_sharing_a_prefix_decode_together_and_store_it_once(tmp_path):
    """Llama, max_batch 2, a 4-block cache: three prompts with a shared 70-token prefix (one full
    block), the first two decoded together, each equal to its own ONNX Runtime continuation."""
    model = DECODERS / RECORDS["llama"]["file"]
    out = tmp_path / "llama.mcpb"
    mcpc.compile(model, qat_config="fp32", output=out,
                 decoder=DecoderBuild(max_seq=128, max_batch=2, kv_blocks=4, prefill_chunk=16))  # fmt: skip
    rng = np.random.default_rng(9)
    shared = rng.integers(0, 512, 70).tolist()
    prompts = [shared + rng.integers(0, 512, k).tolist() for k in (5, 11, 2)]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
    _invoke("generate", out, "--prompts", tmp_path / "p.jsonl", "--max-new-tokens", 10,
            "--json", tmp_path / "r.json")  # fmt: skip
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["generated_ids"] == [greedy(model, p, 10) for p in prompts]
    assert report["prefix_hit_tokens"] == 2 * 64
    block = report["kv_block_bytes"]
    assert report["kv_bytes"] == 3 * block and report["kv_bytes_unshared"] == 4 * block


@pytest.mark.slow
def test_smollm2_fp32_build_generates_onnx_runtimes_20_greedy_tokens(tmp_path):
    """SmolLM2-135M (the `llm` extra; ~6 min on a busy 2-core machine): the fp32 --max-seq build of
    the with-past export, `mcpc sim generate` on the English prompt of tests/data, against ONNX
    Runtime's recorded KV-loop continuation (test_reference_data.GREEDY_20)."""
    from conftest import OPTIONAL_EXTRA_SKIP
    from export_smollm2 import ensure_exported, missing_extra
    from test_reference_data import GREEDY_20

    problem = missing_extra()
    if problem:
        pytest.skip(f"{OPTIONAL_EXTRA_SKIP}: llm ({problem})")  # the one allowed skip
    out = tmp_path / "smollm2.mcpb"
    mcpc.compile(ensure_exported()["decode"], qat_config="fp32", decoder=DecoderBuild(max_seq=64), output=out)
    prompt = Path(__file__).parents[1] / "data" / "smollm2_prompt.npy"
    _invoke("generate", out, "--prompt-ids", prompt, "--max-new-tokens", 20, "--json", tmp_path / "r.json")
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["generated_ids"] == GREEDY_20
    assert report["kv_bytes"] == 30 * 2 * 3 * 64 * 64 * 4  # one f32 block: 30 layers, K|V, 3 kv heads
