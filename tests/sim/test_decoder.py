"""mcpc.sim.decoder: the kv_* inputs of a call (exact arrays), the decoder metadata, and the
generate / eval-ppl loop against a reference model of the decoder entries.

``ContractSession`` is a stand-in for a Session on a decoder build that implements the entries'
documented semantics on the host (docs/simulator.md, "Decoding"): every row stores (token,
position) at its ``kv_slot``, then attends the gathered buffer (``kv_gather`` blocks, only the
first ``kv_blocks``) from ``kv_start`` for ``kv_len`` rows.  Its logits are a pseudo-random
function of the token ids it attended, checked to be exactly positions 0..len-1 in order — so a
wrong slot, gather, start, length or position shows up as a wrong token or an assertion, and the
greedy tokens must equal a reference computed from the token history alone.
"""

from __future__ import annotations

import hashlib
import math
from types import SimpleNamespace

import numpy as np
import pytest

from mcpc.errors import InputError, UsageError
from mcpc.sim.decoder import DecoderMeta, DecoderSession, StepItem, block_bytes, step_inputs

VOCAB = 50


def meta_dict(**kw) -> dict:
    d = {"max_seq": 200, "max_batch": 2, "block": 64, "kv_blocks": 8, "prefill_chunk": 16, "layers": 2,
         "kv_heads": 2, "q_heads": 4, "head_dim": 8, "kv_dtype": "fp16", "vocab": VOCAB, "logits": "logits",
         "inputs": {"ids": "input_ids", "positions": "position_ids"}, "kv_quant": None}  # fmt: skip
    d.update(kw)
    return d


def fake_program(meta: dict | None, entries=("prefill", "decode"), weight_bytes=10_000):
    names = ["input_ids", "position_ids", "kv_slot", "kv_gather", "kv_start", "kv_len"]
    io = {e: {"inputs": [{"name": n} for n in names], "outputs": [{"name": "logits"}]} for e in entries}
    return SimpleNamespace(
        source="fake.mcpb",
        entries={e: (i, 1) for i, e in enumerate(entries)},
        io=io,
        program=SimpleNamespace(
            meta={} if meta is None else {"decoder": meta}, constants=bytes(weight_bytes)
        ),
        target=SimpleNamespace(name="fake", clock_mhz=1000.0, dram=SimpleNamespace(bandwidth_gbps=100.0)),
    )


def ref_logits(history: tuple[int, ...]) -> np.ndarray:
    """The reference model: logits a pseudo-random function of the token history."""
    seed = int.from_bytes(hashlib.sha256(repr(history).encode()).digest()[:8], "little")
    return np.random.default_rng(seed).standard_normal(VOCAB).astype(np.float32)


class ContractSession:
    """The decoder entries' contract on the host (module docstring)."""

    def __init__(self, meta: dict):
        self.program = fake_program(meta)
        self.m = DecoderMeta.from_program(self.program)
        self.store: dict[int, tuple[int, int]] = {}
        self.last_profile = None
        self.runs = 0

    def run(self, inputs, entry=None, registers=None, timing_only=False):
        m, blk = self.m, self.m.block
        S = m.prefill_chunk if entry == "prefill" else 1
        ids, pos = inputs["input_ids"], inputs["position_ids"]
        assert ids.shape == pos.shape == (m.max_batch, S)
        for name in ("kv_slot", "kv_start", "kv_len"):
            assert inputs[name].shape == (m.max_batch * S,) and inputs[name].dtype == np.int32
        assert inputs["kv_gather"].shape == (m.max_batch * m.blocks_per_seq,)
        nblocks = registers["kv_blocks"]
        assert 0 <= nblocks <= m.max_batch * m.blocks_per_seq
        self.runs += 1
        self.last_profile = {"cycles": 1000 + 10 * int(inputs["kv_len"].sum())}
        if timing_only:
            return {}
        for r, slot in enumerate(inputs["kv_slot"]):  # kv_store first: a row attends itself
            assert 0 <= slot < (m.kv_blocks + 1) * blk
            self.store[int(slot)] = (int(ids.flat[r]), int(pos.flat[r]))
        gathered = [
            self.store.get(int(g) * blk + o) for g in inputs["kv_gather"][:nblocks] for o in range(blk)
        ]
        logits = np.zeros((m.max_batch * S, VOCAB), np.float32)
        for r in range(m.max_batch * S):
            start, length = int(inputs["kv_start"][r]), int(inputs["kv_len"][r])
            if length == 0:
                continue
            assert start + length <= blk * nblocks
            seen = gathered[start : start + length]
            assert [p for _, p in seen] == list(range(length)), "attended positions out of order"
            assert int(pos.flat[r]) == length - 1
            logits[r] = ref_logits(tuple(t for t, _ in seen))
        return {"logits": logits.reshape(m.max_batch, S, VOCAB)}


def ref_greedy(prompt: list[int], n: int) -> list[int]:
    hist, out = list(prompt), []
    for _ in range(n):
        out.append(int(np.argmax(ref_logits(tuple(hist)))))
        hist.append(out[-1])
    return out


# ------------------------------------------------------------------------------ step_inputs
def test_step_inputs_builds_the_exact_kv_arrays():
    m = DecoderMeta.from_program(fake_program(meta_dict(max_seq=128, kv_blocks=4, prefill_chunk=4)))
    items = [StepItem([3], past=2, tokens=[5, 6]), StepItem([0, 2], past=63, tokens=[7, 8, 9])]
    inputs, used = step_inputs(m, 4, items)
    assert used == 3
    np.testing.assert_array_equal(inputs["kv_gather"], [3, 0, 2, 4])  # padded with the trash block (4)
    np.testing.assert_array_equal(inputs["kv_slot"], [194, 195, 256, 256, 63, 128, 129, 256])
    np.testing.assert_array_equal(inputs["kv_start"], [0, 0, 0, 0, 64, 64, 64, 0])
    np.testing.assert_array_equal(inputs["kv_len"], [3, 4, 0, 0, 64, 65, 66, 0])
    np.testing.assert_array_equal(inputs["input_ids"], [[5, 6, 0, 0], [7, 8, 9, 0]])
    np.testing.assert_array_equal(inputs["position_ids"], [[2, 3, 0, 0], [63, 64, 65, 0]])
    assert all(inputs[k].dtype == np.int32 for k in ("kv_slot", "kv_gather", "kv_start", "kv_len"))


def test_step_inputs_of_a_decode_step_with_one_of_two_sequences_and_no_positions_input():
    m = DecoderMeta.from_program(fake_program(meta_dict(inputs={"ids": "input_ids", "positions": None})))
    inputs, used = step_inputs(m, 1, [StepItem([5, 1], past=70, tokens=[11])])
    assert used == 2 and "position_ids" not in inputs
    np.testing.assert_array_equal(inputs["kv_slot"], [1 * 64 + 6, 8 * 64])
    np.testing.assert_array_equal(inputs["kv_start"], [0, 0])
    np.testing.assert_array_equal(inputs["kv_len"], [71, 0])
    np.testing.assert_array_equal(inputs["kv_gather"], [5, 1, 8, 8, 8, 8, 8, 8])


def test_step_inputs_refuses_too_many_rows_sequences_or_positions():
    m = DecoderMeta.from_program(fake_program(meta_dict(max_seq=128)))
    with pytest.raises(InputError, match="max_batch"):
        step_inputs(m, 1, [StepItem([0], 0, [1])] * 3)
    with pytest.raises(InputError, match="1..1"):
        step_inputs(m, 1, [StepItem([0], 0, [1, 2])])
    with pytest.raises(InputError, match="max_seq 128"):
        step_inputs(m, 1, [StepItem([0, 1, 2], 128, [1])])


def test_decoder_meta_and_block_bytes():
    m = DecoderMeta.from_program(fake_program(meta_dict()))
    assert (m.kv_dtype, m.blocks_per_seq, m.positions) == ("f16", 4, "position_ids")
    assert block_bytes(m) == 2 * 2 * 2 * 64 * 8 * 2  # layers, K|V, kv heads, tokens, head_dim, fp16
    m8 = DecoderMeta.from_program(fake_program(meta_dict(kv_dtype="i8")))
    assert block_bytes(m8) == 2 * 2 * 2 * 64 * (8 + 3)  # + fp16 scale and u8 zero point per vector
    mq = DecoderMeta.from_program(fake_program(meta_dict(kv_quant={"bytes_per_block": 1234})))
    assert block_bytes(mq) == 1234


def test_a_program_without_the_decoder_pair_is_a_usage_error():
    with pytest.raises(UsageError, match="not a decoder build.*--max-seq"):
        DecoderMeta.from_program(fake_program(None))
    with pytest.raises(UsageError, match="entry decode"):
        DecoderMeta.from_program(fake_program(meta_dict(), entries=("prefill",)))
    with pytest.raises(InputError, match="malformed"):
        DecoderMeta.from_program(fake_program({"max_seq": 8}))


# ------------------------------------------------------------------------------ the loop
def test_generate_equals_the_reference_greedy_loop_with_chunked_prefill():
    session = ContractSession(meta_dict())
    dec = DecoderSession(session)
    prompt = [int(t) for t in np.random.default_rng(0).integers(0, VOCAB, 37)]  # 3 chunks of 16
    res = dec.generate(prompt, 12)
    assert res["generated_ids"] == ref_greedy(prompt, 12)
    assert session.runs == 3 + 11 and res["decode_steps"] == 11
    # timing: a decode step at context c costs 1000 + 10 * c cycles at 1000 MHz
    contexts = range(38, 49)
    assert res["cycles_per_token"] == pytest.approx(np.mean([1000 + 10 * c for c in contexts]))
    assert res["latency_us_per_token"] == pytest.approx(res["cycles_per_token"] / 1000)
    assert res["tpot_ms"] == pytest.approx(res["latency_us_per_token"] / 1000)
    ttft = sum(1000 + 10 * sum(range(p0 + 1, min(p0 + 16, 37) + 1)) for p0 in (0, 16, 32))
    assert res["ttft_cycles"] == ttft and res["ttft_ms"] == pytest.approx(ttft / 1e6)
    kv = 2 * 2 * 2 * 64 * 8 * 2  # one block holds the whole 48-token context
    assert res["kv_bytes"] == kv and res["roofline_us_per_token"] == pytest.approx((10_000 + kv) / 1e5)


def test_generate_many_batches_decode_and_shares_a_common_prefix():
    session = ContractSession(meta_dict())
    dec = DecoderSession(session)
    rng = np.random.default_rng(1)
    system = [int(t) for t in rng.integers(0, VOCAB, 128)]  # two full blocks
    prompts = [system + [int(t) for t in rng.integers(0, VOCAB, k)] for k in (3, 9, 5)]
    res = dec.generate_many(prompts, 6)
    assert res["generated_ids"] == [ref_greedy(p, 6) for p in prompts]
    assert res["prefix_hit_tokens"] == 128 * 2  # prompts 2 and 3 reuse the system prompt's blocks
    block = block_bytes(dec.meta)
    assert res["kv_bytes"] == 4 * block  # two shared + one own block each, two sequences live
    assert res["kv_bytes_unshared"] == 6 * block
    assert [s["sequences"] for s in dec.steps if s["entry"] == "decode"] == [2] * 5 + [1] * 5
    unshared = DecoderSession(ContractSession(meta_dict()), prefix_sharing=False).generate_many(prompts, 6)
    assert unshared["generated_ids"] == res["generated_ids"] and unshared["prefix_hit_tokens"] == 0
    assert unshared["kv_bytes"] == 6 * block


def test_eval_ppl_scores_token_t_plus_1_from_the_logits_at_t():
    dec = DecoderSession(ContractSession(meta_dict()))
    tokens = np.random.default_rng(2).integers(0, VOCAB, 3 * 20 + 7)
    res = dec.eval_ppl(tokens, window=20, prefill=5)
    nll = []
    for w in tokens[:60].reshape(3, 20):
        for t in range(19):
            z = ref_logits(tuple(int(x) for x in w[: t + 1])).astype(np.float64)
            nll.append(np.log(np.exp(z - z.max()).sum()) + z.max() - z[w[t + 1]])
    assert res["predictions"] == 57 and res["windows"] == 3
    assert res["perplexity"] == pytest.approx(math.exp(np.mean(nll)), rel=1e-12)
    assert res["decode_steps"] == 2 * 14  # windows 1-2 together (max_batch 2), then window 3
    rows = dec.eval_ppl(tokens[:60].reshape(3, 20), prefill=5)  # 2-D: one window a row
    assert rows["perplexity"] == pytest.approx(res["perplexity"], rel=1e-12)


def test_usage_errors_of_generate_and_eval_ppl():
    dec = DecoderSession(ContractSession(meta_dict(max_seq=40)))
    with pytest.raises(UsageError, match="max_seq 40"):
        dec.generate(list(range(30)), 12)
    with pytest.raises(UsageError, match="outside the vocabulary"):
        dec.generate([1, VOCAB], 2)
    with pytest.raises(UsageError, match="empty"):
        dec.generate([], 2)
    with pytest.raises(UsageError, match="--prefill 16"):
        dec.eval_ppl(np.arange(30) % VOCAB, window=10)
    with pytest.raises(UsageError, match="no window"):
        dec.eval_ppl(np.arange(5), window=10)
    assert dec.generate(list(range(30)), 11)["generated_ids"] == ref_greedy(list(range(30)), 11)


def test_timing_only_calls_cost_cycles_but_compute_nothing():
    session = ContractSession(meta_dict())
    dec = DecoderSession(session, timing_only=True)
    seq, _ = dec.new_sequence()
    assert dec.prefill([(seq, list(range(20)))]) == [None]
    assert dec.decode([seq], [3]) is None
    assert [s["cycles"] for s in dec.steps] == [1000 + 10 * sum(range(1, 17)), 1000 + 10 * sum(range(17, 21)),
                                                1000 + 10 * 21]  # fmt: skip
    assert session.store == {}
    with pytest.raises(UsageError, match="timing_only"):
        dec.generate([1], 2)
