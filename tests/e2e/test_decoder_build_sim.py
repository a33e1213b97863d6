"""Decoder builds on the simulator: ``mcpc.compile(..., decoder=DecoderBuild(...))`` of the three
small transformers families and of our torch fixture, run through a ``Session``'s prefill and
decode entries over the paged cache in simulated DRAM, give ONNX Runtime's greedy tokens."""

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from decoder_models import ort_greedy, paged_greedy

import mcpc
from mcpc.ir.decoder_import import DecoderBuild
from mcpc.sim.session import Session

TESTS = Path(__file__).parents[1]
DECODERS = TESTS / "llm" / "decoders"


def _session_greedy(result, prompts, new, tables):
    session = Session(result)

    def run(entry, inputs, registers):
        return session.run(inputs, entry=entry, registers=registers)["logits"]

    return paged_greedy(run, result.program.meta["decoder"], prompts, new, tables)


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_fp32_builds_generate_onnx_runtimes_24_greedy_tokens_on_the_simulator(family):
    record = json.loads((DECODERS / "decoders.json").read_text())["models"][family]
    result = mcpc.compile(
        DECODERS / record["file"], qat_config="fp32", decoder=DecoderBuild(max_seq=64, prefill_chunk=4)
    )
    meta = result.program.meta["decoder"]
    assert (meta["kv_dtype"], meta["layers"], meta["kv_heads"]) == ("f32", 2, record["kv_heads"])
    assert _session_greedy(result, [record["prompt"]], 24, [[0]]) == [record["greedy"]]


def test_two_sequences_of_our_torch_fixture_decode_together_on_the_simulator():
    """The gpt_kv fixture (RoPE positions from the past length, gathered at position_ids), batch 2,
    each sequence at its own context, blocks interleaved in a 4-block cache."""
    path = TESTS / "torch_models" / "fixtures" / "gpt_kv-torchscript-op17.onnx"
    build = DecoderBuild(max_seq=100, max_batch=2, kv_blocks=4, prefill_chunk=8)
    result = mcpc.compile(path, qat_config="fp32", decoder=build)
    rng = np.random.default_rng(7)
    prompts = [list(rng.integers(0, 256, 7)), list(rng.integers(0, 256, 12))]
    want = [ort_greedy(onnx.load(path), p, 24) for p in prompts]
    assert _session_greedy(result, prompts, 24, [[2, 1], [0, 3]]) == want
