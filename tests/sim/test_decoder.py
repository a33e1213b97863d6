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

import math

import numpy as np
import pytest
from decoder_contract import VOCAB, ContractSession, fake_program, meta_dict, ref_greedy, ref_logits

from mcpc.errors import InputError, UsageError
from mcpc.sim.decoder import DecoderMeta, DecoderSession, StepItem, block_bytes, step_inputs


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
    # the compulsory bytes: weights + the decode entry's inputs (ids, positions 2 x 2 i64; kv_slot,
    # kv_start, kv_len 3 x 2 i32; kv_gather 2 x 4 i32) and outputs (logits 2 x 50 f32) + KV in use
    io = 2 * 2 * 8 + 3 * 2 * 4 + 2 * 4 * 4 + 2 * VOCAB * 4
    assert res["kv_bytes"] == kv and res["roofline_us_per_token"] == pytest.approx((10_000 + io + kv) / 1e5)


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


def test_block_bytes_can_be_given_and_updated_per_block():
    dec = DecoderSession(ContractSession(meta_dict()), bytes_per_block=lambda bid: 1000 + bid)
    seq, _ = dec.new_sequence()
    dec.prefill([(seq, list(range(70)))])
    assert dec.kv.kv_bytes == 1000 + 1001
    dec.kv.set_block_bytes(0, 300)  # block 0 stored compressed
    dec.decode([seq], [1])
    assert dec.steps[-1]["kv_bytes"] == 300 + 1001 and dec.kv.peak_kv_bytes == 2001
