"""Decoder builds run on the simulator: the committed small decoders (decoders/) compiled once with
``--max-seq``, prefill in chunks then decode, every call in one Session (the paged cache stays in
NPU memory), bit-identical to the IR interpreter on the compiled module call after call, and the
greedy continuation equal to ONNX Runtime's own KV loop (decoders.json)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import mcpc
from mcpc.decoder_check import paged_feeds
from mcpc.ir.decoder_import import DecoderBuild
from mcpc.ir.interpreter import ModuleState, interpret
from mcpc.sim import Session

DECODERS = Path(__file__).parent / "decoders"
RECORDS = json.loads((DECODERS / "decoders.json").read_text())["models"]


def _greedy(built, prompt: list[int], new: int) -> tuple[list[int], list[int]]:
    """Greedy tokens of one sequence (block table [0]) through the simulator, each call checked
    against the interpreter; and the cycles of every decode step."""
    m, info = built.module, built.report["decoder"]
    state, session = ModuleState(m), Session(built)
    chunk, b_max = info["prefill_chunk"], info["max_batch"]
    gather = b_max * -(-info["max_seq"] // 64)
    cycles = []

    def call(entry: str, toks: list[int], past: int) -> int:
        seq = chunk if entry == "prefill" else 1
        feeds, used = paged_feeds([[0]], [past], [len(toks)], seq, gather, info["kv_blocks"])
        ids, pos = np.zeros((b_max, seq), np.int64), np.zeros((b_max, seq), np.int64)
        ids[0, : len(toks)], pos[0, : len(toks)] = toks, np.arange(past, past + len(toks))
        inputs = {"input_ids": ids, "position_ids": pos, **feeds}
        regs = {"kv_blocks": used, **({"prefill_rows": len(toks)} if entry == "prefill" else {})}
        want = interpret(m, inputs, entry, state, regs)["logits"]
        got = session.run(inputs, entry=entry, registers=regs)["logits"]
        np.testing.assert_array_equal(got, want, err_msg=f"{entry} at past {past}")
        if entry == "decode":
            cycles.append(session.last_profile["cycles"])
        return int(got[0, len(toks) - 1].argmax())

    for start in range(0, len(prompt), chunk):
        first = call("prefill", prompt[start : start + chunk], start)
    out = [first]
    for i in range(new - 1):
        out.append(call("decode", [out[-1]], len(prompt) + i))
    return out, cycles


@pytest.mark.parametrize(
    ("family", "config"),
    [
        ("llama", "fp32"),
        pytest.param("qwen2", "fp32", marks=pytest.mark.slow),
        pytest.param("gpt2", "fp32", marks=pytest.mark.slow),
        pytest.param("llama", "fp16", marks=pytest.mark.slow),
    ],
)
def test_small_decoders_generate_onnx_runtimes_tokens_on_the_simulator(family, config):
    record = RECORDS[family]
    built = mcpc.compile(
        str(DECODERS / record["file"]), qat_config=config, decoder=DecoderBuild(max_seq=64, prefill_chunk=4)
    )
    ops = [i.op for i in built.program.instructions()]
    assert "vattn" in ops and "scatter" in ops
    tokens, cycles = _greedy(built, record["prompt"], 24)
    assert tokens == record["greedy"]
    assert cycles == sorted(cycles)  # one block, growing windows: never cheaper as the context grows


def test_batched_calls_cost_the_same_timing_only():
    """Two sequences at their own contexts (blocks interleaved across the cache): a timing-only run
    of each call (vattn costed from the window table its loads bring) gives the functional cycles,
    and a longer context costs more."""
    record = RECORDS["qwen2"]
    built = mcpc.compile(
        str(DECODERS / record["file"]), qat_config="fp32",
        decoder=DecoderBuild(max_seq=256, max_batch=2, prefill_chunk=8),
    )  # fmt: skip
    info, session = built.report["decoder"], Session(built)
    gather = info["max_batch"] * -(-info["max_seq"] // 64)
    tables = [[0, 2, 4, 6], [1, 3, 5, 7]]
    cycles = []
    for entry, seq, past in (("prefill", 8, [0, 0]), ("decode", 1, [100, 37]), ("decode", 1, [200, 150])):
        feeds, used = paged_feeds(tables, past, [seq, seq], seq, gather, info["kv_blocks"])
        pos = np.array([np.arange(p, p + seq) for p in past])
        inputs = {"input_ids": np.ones((2, seq), np.int64), "position_ids": pos, **feeds}
        regs = {"kv_blocks": used, **({"prefill_rows": 2 * seq} if entry == "prefill" else {})}
        session.run(inputs, entry=entry, registers=regs)
        cycles.append(session.last_profile["cycles"])
        session.run(inputs, entry=entry, registers=regs, timing_only=True)
        assert session.last_profile["cycles"] == cycles[-1], (entry, past)
    assert cycles[2] > cycles[1]


def test_batched_decode_reads_the_weights_once():
    """A ``--max-batch 8`` build: every projection's weight is one matrix, so a decode step of 8
    sequences streams the weights once for all batch rows (DRAM bytes ~ weights + KV, not 8x the
    weights) and costs about what one sequence costs."""
    from mcpc.serve.program import measurer

    built = mcpc.compile(
        str(DECODERS / RECORDS["llama"]["file"]), qat_config="fp32",
        decoder=DecoderBuild(max_seq=128, max_batch=8),
    )  # fmt: skip
    weights = len(built.program.constants)  # every constant (the embedding table is only gathered)
    measure = measurer(Session(built), "llama")
    one, eight = measure("decode", 1, 64), measure("decode", 8, 64)
    assert eight.dram_bytes < 1.5 * weights, (eight.dram_bytes, weights)
    assert eight.dram_bytes - one.dram_bytes < 0.5 * weights  # 7 more sequences' KV and activations
    assert float(eight) < 1.2 * float(one), (float(one), float(eight))
