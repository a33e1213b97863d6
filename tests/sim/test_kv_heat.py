"""The model's attention statistics on the served path (docs/kv-cache.md, "Attention statistics"):
a decoder build whose KV policy or dynamic window reads the attention gets the heat the program's
``vattn``s write (META ``decoder.heat``); the host accumulates it per sequence position, and
``heavy_hitter`` keeps the hottest tokens, ``topk_entropy`` splits each layer's budget by the
heads' attention entropy, and the dynamic window narrows ``kv_start`` / ``kv_len``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from decoder_contract import InterpreterSession

import mcpc
import mcpc.sim.kv_store as kv_store
from mcpc import driver
from mcpc.ir.decoder_import import DecoderBuild
from mcpc.kv import KvSettings, dynamic_window_left, heat_entropy, keep_count, relative_heat
from mcpc.kv.policies import apportion, heavy_hitter
from mcpc.qat_configs.kv_cache import KvCache, with_kv_flags
from mcpc.sim.decoder import DecoderSession, _narrow_windows

DECODERS = Path(__file__).parents[1] / "llm" / "decoders"
LLAMA = json.loads((DECODERS / "decoders.json").read_text())["models"]["llama"]
BUILD = DecoderBuild(max_seq=128, prefill_chunk=16)
PROMPT = [int(t) for t in np.random.default_rng(3).integers(0, LLAMA["vocab"], 70)]


def _build(flags=None, window=None):
    cfg = driver.load_qat_config("fp16")
    if flags is not None:
        cfg = with_kv_flags(cfg, *flags, BUILD.max_seq)
    if window is not None:
        kv = KvCache.model_validate({"dynamic_window": {"enabled": True, "min_window": window}})
        cfg = cfg.model_copy(update={"kv_cache": kv})
    return mcpc.compile(str(DECODERS / LLAMA["file"]), qat_config=cfg, decoder=BUILD)


@pytest.fixture(scope="module")
def builds():
    return {
        "plain": _build(("int8", 0.7, "topk_magnitude")),
        "heavy_hitter": _build(("int8", 0.7, "heavy_hitter")),
        "topk_entropy": _build(("int8", 0.7, "topk_entropy")),
        "window": _build(window=8),
    }


def _steps(dec, n_decode=5, prompt=PROMPT):
    seq, _ = dec.new_sequence()
    tok = int(dec.prefill([(seq, prompt)])[0][-1].argmax())
    for _ in range(n_decode):
        tok = int(dec.decode([seq], [tok])[0].argmax())
    return seq


def test_meta_names_the_heat_only_for_builds_that_read_the_attention(builds):
    assert builds["plain"].report["decoder"]["heat"] is None
    assert "kv_heat" not in builds["plain"].module.globals
    assert all(i.fields["heat"] == 0 for i in builds["plain"].program.instructions() if i.op == "vattn")
    heat = builds["heavy_hitter"].report["decoder"]["heat"]
    assert heat == {"global": "kv_heat", "positions": 128, "min_window": None}
    assert builds["window"].report["decoder"]["heat"]["min_window"] == 8
    assert builds["window"].report["decoder"]["kv_quant"] is None  # nothing compressed
    vattn = [i for i in builds["heavy_hitter"].program.instructions() if i.op == "vattn"]
    assert vattn and all(i.fields["heat"] == 1 for i in vattn)
    from mcpc.cli import _decoder_line  # mcp-compile's summary says so

    assert "attention heat out" not in _decoder_line(builds["plain"].report)
    assert "attention heat out;" in _decoder_line(builds["heavy_hitter"].report)
    assert "attention heat out, dynamic window (min 8);" in _decoder_line(builds["window"].report)


def test_accumulated_heat_is_the_interpreters_and_sums_to_the_query_rows(builds):
    built = builds["heavy_hitter"]
    sim, ref = DecoderSession(built), DecoderSession(InterpreterSession(built))
    seqs = [_steps(dec) for dec in (sim, ref)]
    got, want = sim.heat.seqs[seqs[0]], ref.heat.seqs[seqs[1]]
    np.testing.assert_array_equal(got, want)
    # every query row's probabilities sum to 1: a head's heat over the positions is its rows so far
    rows = len(PROMPT) + 5
    np.testing.assert_allclose(got.sum(axis=2), rows, rtol=1e-4)
    assert not got[:, :, rows:].any()
    # each position was attended by the rows at and after it (a 16-row prefill chunk, then decode)
    counts, shares = sim.heat.counts[seqs[0]], sim.heat.shares[seqs[0]]
    assert counts[:rows].tolist() == [rows - p for p in range(rows)] and not counts[rows:].any()
    np.testing.assert_allclose(shares[:rows], [sum(1 / (q + 1) for q in range(p, rows)) for p in range(rows)])
    np.testing.assert_array_equal(ref.heat.shares[seqs[1]], shares)
    # relative heat: the heads' mean is near 1 (a uniform head would be exactly 1)
    rel = sim.heat.relative(seqs[0], None, 0, rows)
    np.testing.assert_allclose(rel, got[:, :, :rows] / shares[:rows])
    assert 0.5 < rel.mean() < 2
    assert sim.compressed.report()["stats"] == "the model's attention (vattn heat)"


def _spy(monkeypatch):
    calls = []
    real = kv_store.store_kv_block

    def spy(block, settings, layer, stats=None):
        out = real(block, settings, layer, stats)
        if stats is not None:
            calls.append((np.array(block), layer, stats, out))
        return out

    monkeypatch.setattr(kv_store, "store_kv_block", spy)
    return calls


def test_heavy_hitter_keeps_the_hottest_tokens_not_the_largest_k_rows(builds, monkeypatch):
    calls = _spy(monkeypatch)
    dec = DecoderSession(builds["heavy_hitter"])
    seq = _steps(dec, n_decode=0, prompt=PROMPT[:64])  # block 0 full: stored with the policy, last
    assert len(calls) == 2 * LLAMA["layers"]  # K and V of each layer
    differ = 0
    for block, layer, stats, stored in calls[::2]:  # the K calls
        np.testing.assert_array_equal(stats.heat, dec.heat.kv_heat(seq, layer, 0, 64))
        acc = dec.heat.seqs[seq][layer, :, :64].reshape(block.shape[0], -1, 64)
        np.testing.assert_allclose(stats.heat, (acc / dec.heat.shares[seq][:64]).mean(axis=1))
        assert (stats.first_position, stats.seq_len) == (0, 64)
        real = heavy_hitter(block, 0.7, stats.heat, 0, 64, 16)
        k = block.astype(np.float32)
        proxy = heavy_hitter(block, 0.7, np.sqrt((k * k).sum(-1)), 0, 64, 16)
        kept = real[:, :, 0]
        assert (kept.sum(axis=1) == keep_count(64, 0.7)).all()
        for h in range(kept.shape[0]):  # the hottest tokens outside the recent window are the ones kept
            old = np.flatnonzero(kept[h, :48])
            cold = np.setdiff1d(np.arange(48), old)
            assert stats.heat[h, old].min() >= stats.heat[h, cold].max()
            assert stored[h].kept == kept[h].sum() * block.shape[2]
        differ += int((real != proxy).any())
    assert differ > 0, "real attention and the K-norm proxy chose the same tokens in every layer"


def test_topk_entropy_splits_the_budget_by_the_heads_attention_entropy(builds, monkeypatch):
    calls = _spy(monkeypatch)
    dec = DecoderSession(builds["topk_entropy"])
    seq = _steps(dec, n_decode=0, prompt=PROMPT[:64])
    assert len(calls) == 2 * LLAMA["layers"]
    uneven = 0
    for block, layer, stats, stored in calls:
        heads, rows, d = block.shape
        ent = heat_entropy(relative_heat(dec.heat.seqs[seq][layer, :, :64], dec.heat.shares[seq][:64]), heads)
        np.testing.assert_array_equal(stats.head_entropy, ent)
        assert (ent > 0).all()
        want = apportion(keep_count(heads * rows * d, 0.7), ent, np.full(heads, rows * d))
        assert [s.kept for s in stored] == want.tolist()
        # proportional: each head's share is its entropy's share, to within one value
        np.testing.assert_allclose(want, want.sum() * ent / ent.sum(), atol=1)
        uneven += int(len(set(want.tolist())) > 1)
    assert uneven > 0, "every layer split its budget evenly"


def test_narrow_windows_moves_start_and_shrinks_len():
    from mcpc.sim.decoder import StepItem

    inputs = {"kv_start": np.array([0, 0, 128, 128], np.int32), "kv_len": np.array([5, 6, 3, 0], np.int32)}
    items = [StepItem([0], 4, [1, 2]), StepItem([1, 2], 2, [3])]
    _narrow_windows(inputs, 2, items, ["a", "b"], lambda seq, pos: {"a": 2, "b": 9}[seq])
    assert inputs["kv_start"].tolist() == [2, 2, 128 + 2, 128]  # "b" at position 2: at most pos
    assert inputs["kv_len"].tolist() == [3, 4, 1, 0]


def test_the_dynamic_window_narrows_each_row_by_the_heat_rule(builds, monkeypatch):
    dec = DecoderSession(builds["window"])
    assert dec.compressed is None and dec.heat.min_window == 8
    seq, _ = dec.new_sequence()
    tok = int(dec.prefill([(seq, PROMPT[:40])])[0][-1].argmax())
    acc = dec.heat.seqs[seq]
    # recent positions hot, the first 30 cold: the rule's left edge moves past them
    acc[:, :, :30] *= 1e-3
    heat_before, counts_before = acc.copy(), dec.heat.counts[seq].copy()
    want = dynamic_window_left((acc[:, :, :40] / dec.heat.shares[seq][:40]).mean(axis=(0, 1)), 8)
    assert 0 < want <= 40 - 8 + 1
    seen = []
    real = dec.session.run

    def run(inputs, **kw):
        seen.append((int(inputs["kv_start"][0]), int(inputs["kv_len"][0])))
        return real(inputs, **kw)

    monkeypatch.setattr(dec.session, "run", run)
    dec.decode([seq], [tok])
    assert seen == [(want, 41 - want)]
    added = dec.heat.seqs[seq] - heat_before
    assert not added[:, :, :want].any() and added[:, :, want:41].sum() > 0  # left of the edge: unread
    np.testing.assert_allclose(added.sum(axis=2), 1.0, rtol=1e-4)
    seen = dec.heat.counts[seq] - counts_before  # the decode row counts only where it attended
    assert not seen[:want].any() and (seen[want:41] == 1).all()
    # the report says where the window put every row (eval-ppl / generate --json "dynamic_window")
    assert dec.steps[-1]["window"] == ([want], [41 - want])
    lefts = [e for s in dec.steps for e in s["window"][0]]
    report = dec._timing(dec.steps)["dynamic_window"]
    assert report["rows"] == 41 and report["max_left"] == max(lefts) >= want
    assert report["narrowed_rows"] == sum(e > 0 for e in lefts) >= 1
    assert report["mean_left"] == pytest.approx(np.mean(lefts))
    assert report["mean_width"] == pytest.approx(np.mean([p + 1 - e for p, e in enumerate(lefts)]))


def test_timing_only_runs_have_no_heat_and_attend_every_position(builds):
    full, timed = (
        DecoderSession(builds["heavy_hitter"]),
        DecoderSession(builds["heavy_hitter"], timing_only=True),
    )
    cycles = []
    for dec in (full, timed):
        seq, _ = dec.new_sequence()
        dec.prefill([(seq, PROMPT)])
        dec.decode([seq], [1])
        cycles.append([s["cycles"] for s in dec.steps])
    assert cycles[0] == cycles[1]
    assert full._timing(full.steps)["dynamic_window"] is None  # no window in this build
    assert timed.heat.seqs == {} and timed.heat.window_left(0, 50) == 0


def test_settings_say_when_the_attention_is_needed():
    assert KvSettings(policy="heavy_hitter", sparsity_ratio=0.7).needs_attention
    assert KvSettings(policy="topk_entropy", sparsity_ratio=0.5).needs_attention
    assert KvSettings(dynamic_window=True).needs_attention
    assert not KvSettings(policy="heavy_hitter", sparsity_ratio=0.0).needs_attention
    assert not KvSettings(quant="int8", policy="topk_magnitude", sparsity_ratio=0.7).needs_attention


def test_batched_sequences_get_their_own_heat():
    """Two sequences decoded together: each one's heat is read from its own part of the gathered
    buffer (gathered row base_b + p is its position p), as when it runs alone."""
    built = mcpc.compile(
        str(DECODERS / LLAMA["file"]),
        qat_config=with_kv_flags(driver.load_qat_config("fp32"), None, 0.7, "heavy_hitter", 128),
        decoder=DecoderBuild(max_seq=128, max_batch=2, prefill_chunk=16),
    )
    prompts = [PROMPT[:70], PROMPT[5:30]]
    together = DecoderSession(built, prefix_sharing=False)
    seqs = [together.new_sequence()[0] for _ in prompts]
    together.prefill(list(zip(seqs, prompts, strict=True)))
    together.decode(seqs, [7, 9])
    for seq, prompt, tok in zip(seqs, prompts, [7, 9], strict=True):
        alone = DecoderSession(built, prefix_sharing=False)
        s, _ = alone.new_sequence()
        alone.prefill([(s, prompt)])
        alone.decode([s], [tok])
        np.testing.assert_allclose(together.heat.seqs[seq], alone.heat.seqs[s], rtol=1e-5, atol=1e-7)
        assert together.heat.seqs[seq][:, :, : len(prompt) + 1].sum() > 0
