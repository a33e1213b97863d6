"""A decoder build with a compressed KV cache (``kv_cache:`` / ``--kv-quant``, ``--kv-sparsity``,
``--kv-policy``): META["decoder"]["kv_quant"], the stored blocks of ``DecoderSession``
(sim/kv_store.py), their bytes, their accuracy cost and their CRC-8 on the simulator."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from decoder_contract import InterpreterSession
from decoder_models import make_decoder

import mcpc
from mcpc import driver
from mcpc.errors import EXIT_SIM_TRAP, SimTrap
from mcpc.ir.decoder_import import DecoderBuild
from mcpc.kv import KvSettings, load_kv_block
from mcpc.kv.pool import DESC, POOL, desc_column
from mcpc.qat_configs.kv_cache import with_kv_flags
from mcpc.sim import fastpath
from mcpc.sim.decoder import DecoderSession

DECODERS = Path(__file__).parents[1] / "llm" / "decoders"
LLAMA = json.loads((DECODERS / "decoders.json").read_text())["models"]["llama"]
BUILD = DecoderBuild(max_seq=128, prefill_chunk=16)


def _build(model, quant=None, ratio=None, policy=None, config="fp16"):
    cfg = driver.load_qat_config(config)
    if (quant, ratio, policy) != (None, None, None):
        cfg = with_kv_flags(cfg, quant, ratio, policy, BUILD.max_seq)
    return mcpc.compile(model, qat_config=cfg, decoder=BUILD)


@pytest.fixture(scope="module")
def llama_builds():
    path = str(DECODERS / LLAMA["file"])
    return {
        "fp16": _build(path),
        "int8": _build(path, "int8"),
        "heavy_hitter": _build(path, "int8", 0.7, "heavy_hitter"),
        "topk_magnitude": _build(path, "int8", 0.7, "topk_magnitude"),
    }


TOKENS = np.random.default_rng(0).integers(0, LLAMA["vocab"], 2 * 100)


@pytest.fixture(scope="module")
def llama_runs(llama_builds):
    out = {}
    for name, built in llama_builds.items():
        gen = DecoderSession(built).generate(LLAMA["prompt"], 24)
        ppl = DecoderSession(built).eval_ppl(TOKENS, window=100)
        out[name] = gen, ppl
    return out


def test_meta_carries_the_kv_settings(llama_builds):
    assert llama_builds["fp16"].report["decoder"]["kv_quant"] is None
    got = KvSettings.from_json(llama_builds["heavy_hitter"].report["decoder"]["kv_quant"])
    assert (got.quant, got.policy, got.sparsity_ratio) == ("int8", "heavy_hitter", 0.7)
    assert llama_builds["int8"].report["decoder"]["kv_dtype"] == "f16"  # the view the program reads


def test_int8_kv_keeps_tokens_and_perplexity(llama_runs):
    gen16, ppl16 = llama_runs["fp16"]
    gen8, ppl8 = llama_runs["int8"]
    same = sum(a == b for a, b in zip(gen16["generated_ids"], gen8["generated_ids"], strict=True))
    assert same >= 22, (gen16["generated_ids"], gen8["generated_ids"])
    assert abs(ppl8["perplexity"] / ppl16["perplexity"] - 1) < 0.01
    assert ppl8["perplexity"] != ppl16["perplexity"]  # the decode steps did read the rounded K/V
    store = ppl8["kv_store"]
    assert store["stored_blocks"] == 2 and store["fp16_retained_head_blocks"] == 0


def test_int8_kv_bytes_follow_the_stored_blocks(llama_runs):
    """A window of 100 holds 99 positions: the fp16 cache counts its two reserved blocks, the INT8
    cache what it stored: per layer, K|V and head, a block of 64 rows and one of 35, each a 4-byte
    header, one tile byte, per row 16 codes + fp16 scale + u8 zero point, and the CRC."""
    ppl16, ppl8 = llama_runs["fp16"][1], llama_runs["int8"][1]
    head_blocks = 2 * 2 * 2  # layers x (K, V) x kv_heads
    assert ppl16["kv_bytes"] == 2 * head_blocks * 64 * 16 * 2
    assert ppl8["kv_bytes"] == head_blocks * sum(4 + 1 + 19 * rows + 1 for rows in (64, 35))
    assert ppl8["roofline_us_per_token"] < ppl16["roofline_us_per_token"]  # fewer KV bytes in use


def test_int8_kv_bytes_are_185x_smaller_at_head_dim_64(tmp_path):
    model = tmp_path / "d64.onnx"
    onnx.save(make_decoder(layers=1, q_heads=2, kv_heads=1, head_dim=64, vocab=48, seed=3), model)
    toks = np.random.default_rng(1).integers(0, 48, 128)
    reports = {q: DecoderSession(_build(str(model), q)).eval_ppl(toks, window=128) for q in ("fp16", "int8")}
    assert reports["fp16"]["kv_bytes"] / reports["int8"]["kv_bytes"] >= 1.85
    assert abs(reports["int8"]["perplexity"] / reports["fp16"]["perplexity"] - 1) < 0.01


def test_sparsity_stores_fewer_bytes_and_its_cost_is_measured(llama_runs):
    ppl8 = llama_runs["int8"][1]
    for policy in ("heavy_hitter", "topk_magnitude"):
        sparse = llama_runs[policy][1]
        assert sparse["kv_bytes"] < 0.8 * ppl8["kv_bytes"]
        assert sparse["perplexity"] != ppl8["perplexity"]  # the dropped values are gone when read
        assert sparse["kv_store"]["settings"]["policy"] == policy


def _descriptor(dec, block, layer, kind, head):
    """(address, nbytes, tag) of a block's descriptor in the simulated DRAM's kv_desc."""
    m = dec.meta
    words = dec.session.persistent_view(DESC).view(np.uint32)
    e = 4 * (desc_column(layer, kind, head, m.kv_heads, m.kv_blocks) + block)
    lo, hi, nbytes, tag = (int(x) for x in words[e : e + 4])
    return lo | hi << 32, nbytes, tag


def test_a_flipped_bit_in_the_simulated_dram_pool_is_a_trap_naming_the_block(llama_builds):
    """The stored bytes live in NPU DRAM (the kv_pool buffer): a bit flipped there is caught by
    kvdecomp's CRC-8 check, a trap (exit 5) naming the block, layer, K|V and head."""
    dec = DecoderSession(llama_builds["int8"])
    seq, _ = dec.new_sequence()
    prompt = [int(t) for t in TOKENS[:64]]
    dec.prefill([(seq, prompt)])  # block 0 full: stored with its CRC
    block = dec.kv.block_table(seq)[0]
    addr, nbytes, tag = _descriptor(dec, block, 1, 1, 0)
    stored = dec.compressed.block_data(block)[1, "v", 0]  # what kvcomp wrote there
    assert nbytes == len(stored) and tag & 0xFF == 1  # compressed
    pool = dec.session.program.memory_map["regions"]
    base = next(r["dram"] for r in pool if r["name"] == POOL)
    dram = dec.session.persistent_view(POOL).view(np.uint8)
    assert bytes(dram[addr - base : addr - base + nbytes]) == stored
    assert load_kv_block(stored, "f16").shape == (64, LLAMA["head_dim"])  # its CRC-8 holds
    dram[addr - base + nbytes // 2] ^= 0x10
    with pytest.raises(SimTrap) as info:
        dec.decode([seq], [1])
    assert info.value.exit_code == EXIT_SIM_TRAP
    msg = info.value.message
    assert "kvdecomp" in msg and f"KV block {block} (layer 1 V head 0)" in msg and "CRC-8 mismatch" in msg
    assert "not used" in msg


def test_a_block_decoded_before_still_traps_once_its_bytes_flip(llama_builds):
    """kvdecomp keeps a block's decoded rows beside the bytes they came from: steps that read the
    same bytes give the same logits as steps that decode every block afresh, and a bit flipped in
    the pool after the block was read (and kept) is still a CRC-8 trap, the flipped bytes never used."""
    from mcpc.sim import execute

    prompt = [int(t) for t in TOKENS[:64]]
    dec, fresh = DecoderSession(llama_builds["int8"]), DecoderSession(llama_builds["int8"])
    kept = [r[4][-3] for r in fresh.session.program.recs if r[3] is execute.KVDECOMP]
    assert len(kept) == 2 * LLAMA["layers"] * LLAMA["kv_heads"] * 2
    seq, _ = dec.new_sequence()
    fseq, _ = fresh.new_sequence()
    dec.prefill([(seq, prompt)])
    fresh.prefill([(fseq, prompt)])
    block = dec.kv.block_table(seq)[0]
    for t in (1, 2, 3):  # block 0 read by each step: decoded by the first, kept for the others
        out = dec.decode([seq], [t])
        for d in kept:
            d.clear()
        np.testing.assert_array_equal(out, fresh.decode([fseq], [t]))
    mine = [r[4][-3] for r in dec.session.program.recs if r[3] is execute.KVDECOMP]
    assert all(a is not b for a, b in zip(mine, kept, strict=True))
    assert sum(len(d) for d in mine) == LLAMA["layers"] * LLAMA["kv_heads"] * 2  # block 0's head blocks
    addr, nbytes, _ = _descriptor(dec, block, 0, 0, 1)
    base = next(r["dram"] for r in dec.session.program.memory_map["regions"] if r["name"] == POOL)
    dec.session.persistent_view(POOL).view(np.uint8)[addr - base + nbytes // 3] ^= 0x01
    with pytest.raises(SimTrap) as info:
        dec.decode([seq], [4])
    assert info.value.exit_code == EXIT_SIM_TRAP
    msg = info.value.message
    assert f"KV block {block} (layer 0 K head 1)" in msg and "CRC-8 mismatch" in msg


def test_the_program_reads_compressed_blocks_with_kvdecomp(llama_builds):
    """A compressing build's attention reads its blocks with kvdecomp (one for K, one for V per KV
    head and layer) instead of gather; the plain build keeps its gathers."""
    from mcpc.sim.loader import from_program

    counts = {}
    for name in ("fp16", "int8"):
        mnemonics = from_program(llama_builds[name].program).mnemonics
        counts[name] = (mnemonics.count("kvdecomp"), mnemonics.count("gather"))
    per_entry = LLAMA["layers"] * LLAMA["kv_heads"] * 2
    assert counts["int8"][0] == 2 * per_entry  # prefill and decode
    assert counts["fp16"][0] == 0 and counts["fp16"][1] >= counts["int8"][1] + 2 * per_entry
    pool = llama_builds["int8"].report["decoder"]["kv_pool"]
    assert pool["slot_bytes"] >= 4 + 64 * 16 * 2 + 1 and pool["desc_bytes"] == 16 * 2 * 2 * 2 * (2 + 1)


def test_mcp_compile_kv_flags_make_a_compressing_build(tmp_path):
    from mcpc.cli import compile_command

    out = tmp_path / "d.mcpb"
    res = CliRunner().invoke(compile_command, [str(DECODERS / LLAMA["file"]), "--max-seq", "64",
                                               "--kv-quant", "int8", "--kv-sparsity", "0.5", "--kv-policy",
                                               "topk_magnitude", "-o", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "in f16, stored as int8 + topk_magnitude dropping 0.5 in a 16,512-byte pool;" in res.output
    from mcpc.sim.loader import load_program

    meta = load_program(out).program.meta["decoder"]["kv_quant"]
    assert (meta["quant"], meta["policy"], meta["sparsity_ratio"]) == ("int8", "topk_magnitude", 0.5)


def test_timing_only_runs_charge_the_nominal_stored_sizes(llama_builds):
    """No values to compress: the sizes are nominal_block_bytes, exact for dense INT8 blocks."""
    prompt = [int(t) for t in TOKENS[:80]]
    sizes = []
    for timing_only in (False, True):
        dec = DecoderSession(llama_builds["int8"], timing_only=timing_only)
        seq, _ = dec.new_sequence()
        dec.prefill([(seq, prompt)])
        dec.decode([seq], [1])
        sizes.append([dec.kv.block_bytes(b) for b in dec.kv.block_table(seq)])
    assert sizes[0] == sizes[1] == [8 * (6 + 19 * 64), 8 * (6 + 19 * 17)]


def test_sim_eval_ppl_reports_the_stored_cache(llama_builds, tmp_path):
    from mcpc.arch.mcpb import write_mcpb
    from mcpc.sim.cli import sim_group

    prog, toks = tmp_path / "d.mcpb", tmp_path / "t.npy"
    write_mcpb(prog, llama_builds["heavy_hitter"].program)
    np.save(toks, TOKENS[:100])
    res = CliRunner().invoke(sim_group, ["eval-ppl", str(prog), "--tokens", str(toks), "--window", "100",
                                         "--json", str(tmp_path / "r.json")])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "KV stored as        int8, heavy_hitter dropping 0.7: 1 full blocks stored" in res.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["kv_store"]["settings"]["policy"] == "heavy_hitter" and report["kv_bytes"] > 0


@pytest.mark.parametrize("build", ["int8", "heavy_hitter"])
def test_interpreter_and_simulator_are_bit_exact_with_a_stored_cache(llama_builds, build):
    from mcpc.sim.session import Session

    built = llama_builds[build]
    sim = DecoderSession(built)
    ref = DecoderSession(InterpreterSession(built, Session(built).program))
    prompt = [int(t) for t in TOKENS[:70]]
    logits = []
    for dec in (sim, ref):
        seq, _ = dec.new_sequence()
        got = [dec.prefill([(seq, prompt)])[0]]
        tok = int(got[0][-1].argmax())
        for _ in range(6):
            got.append(dec.decode([seq], [tok]))
            tok = int(got[-1][0].argmax())
        logits.append(np.concatenate([g.reshape(-1) for g in got]))
    np.testing.assert_array_equal(logits[0], logits[1])
    # the decode steps after the first two ran on the fast path's plan (vattn's heat included)
    assert (build == "heavy_hitter") == (sim.heat is not None)
    assert fastpath.state(sim.session.program).plans["decode"] is not None
    # the simulator's kvcomp stored exactly the bytes the host stores for the interpreter
    assert sim.compressed.kvcomp and not ref.compressed.kvcomp
    table = sim.kv.block_table(0)
    full = sim.compressed.block_data(table[0])
    assert len(full) == LLAMA["layers"] * 2 * LLAMA["kv_heads"]
    assert full == ref.compressed.block_data(table[0])
    assert [sim.compressed.size(b) for b in table] == [ref.compressed.size(b) for b in table]


def test_a_corrupt_block_under_sim_generate_exits_5_naming_it(llama_builds, tmp_path, monkeypatch):
    """A bit flipped in the simulated DRAM pool once a block is stored (the fault model of DRAM):
    the CLI reports kvdecomp's trap in one paragraph with the simulator's exit code, no traceback."""
    import mcpc.sim.kv_store as kv_store
    from mcpc.arch.mcpb import write_mcpb
    from mcpc.sim.cli import sim_group

    real = kv_store._Pool.stored  # the host reads a block's sizes once its kvcomps have run

    def flipped(self, bid, full, int8):
        out = real(self, bid, full, int8)
        if full:
            addr, nbytes, _ = _descriptor(self, bid, 0, 0, 0)
            self.session.persistent_view(POOL).view(np.uint8)[addr - self.pool_addr + 5] ^= 0x01
        return out

    monkeypatch.setattr(kv_store._Pool, "stored", flipped)
    prog, ids = tmp_path / "d.mcpb", tmp_path / "ids.npy"
    write_mcpb(prog, llama_builds["int8"].program)
    np.save(ids, TOKENS[:70])
    res = CliRunner().invoke(
        sim_group, ["generate", str(prog), "--prompt-ids", str(ids), "--max-new-tokens", "4"]
    )
    assert res.exit_code == EXIT_SIM_TRAP, res.output
    assert "KV block 0 (layer 0 K head 0)" in res.output and "Traceback" not in res.output


def test_a_compressing_build_refuses_a_fixed_block_size(llama_builds):
    from mcpc.errors import UsageError

    with pytest.raises(UsageError, match="stores its KV cache compressed"):
        DecoderSession(llama_builds["int8"], bytes_per_block=100)
