"""``kvcomp``: a KV block compressed on the NPU with the one implementation in ``mcpc.kv`` — the
unrounded rows kept in the block's pool slot while it fills, the policy's mask (on chip, or the
host's token choice / per-head budgets from its descriptors), the stored bytes + CRC-8 in the slot,
the rounded rows back in the view.  Then a decoder build whose blocks ``kvcomp`` stores: the same
bytes, tokens and perplexity as the host's compression, with the compression cycles charged."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import mcpc
from mcpc import driver
from mcpc.arch.asm import disassemble, parse_asm
from mcpc.arch.isa import Instr, decode, encode
from mcpc.arch.target import load_target
from mcpc.errors import InputError
from mcpc.ir.decoder_import import DecoderBuild
from mcpc.kv import AttentionStats, KvSettings, load_kv_block, store_kv_block
from mcpc.kv.codec import KIND_CODES
from mcpc.kv.policies import heavy_hitter_rows
from mcpc.kv.pool import COMPRESSED, PLAIN, descriptor, max_block_bytes
from mcpc.kv.pool import POOL as POOL_NAME
from mcpc.qat_configs.kv_cache import with_kv_flags
from mcpc.sim import kv_store
from mcpc.sim.decoder import DecoderSession
from mcpc.sim.execute import compile_instr, data_cost_cell, timing_twin
from mcpc.sim.machine import Fault, Machine

TARGET = load_target("mcp2026-a100")
H, D, LIMIT = 2, 80, 3  # head_dim 80: one 64-column tile and one of 16
ROW_BYTES = 64 * D * 2
VIEW, DESC, POOL = 0x1000, 0x40000, 0x50000
SLOT = max_block_bytes(64, D, 2)
RNG = np.random.default_rng(11)


def _machine(block: int = 1) -> tuple[Machine, np.ndarray]:
    """Unrounded rows of every (head, block) in the view; block ``block``'s descriptors plain,
    addressing its slots (as the host writes them before a call)."""
    m = Machine(1 << 20, TARGET.sram.size_bytes)
    view = (RNG.standard_normal((H, LIMIT, 64, D)) * 3).astype(np.float16)
    m.dram[VIEW : VIEW + view.nbytes] = view.view(np.uint8).reshape(-1)
    for h in range(H):
        e = DESC + 16 * (h * LIMIT + block)
        m.dram[e : e + 16] = descriptor(POOL + h * SLOT, 0, PLAIN, 1, h, 3).view(np.uint8)
    return m, view


def _kvcomp(block=1, lo=0, tokens=64, full=1, policy=0, quant=1, ratio=0, tol=20000) -> Instr:
    return Instr("kvcomp", dict(dram=VIEW, desc=DESC, row_bytes=ROW_BYTES, limit=LIMIT, block=block, lo=lo,
                                tokens=tokens, heads=H, kv_dtype="f16", quant=quant, full=full, policy=policy,
                                tol=tol, ratio=ratio))  # fmt: skip


def _run(m: Machine, instr: Instr):
    fn, args, _ = compile_instr(instr, TARGET)
    fn(m, args)
    return data_cost_cell(fn, args)[0]


def _desc(m: Machine, h: int, block: int = 1) -> list[int]:
    e = DESC + 16 * (h * LIMIT + block)
    return [int(w) for w in m.dram[e : e + 16].view("<u4")]


def _view(m: Machine) -> np.ndarray:
    return m.dram[VIEW : VIEW + H * LIMIT * ROW_BYTES].view(np.float16).reshape(H, LIMIT, 64, D)


def test_kvcomp_round_trips_through_encoder_decoder_and_assembler():
    i = _kvcomp(block=2, lo=17, tokens=33, full=0, policy=3, ratio=700000)
    assert decode(encode(i)) == i
    text = disassemble([i])
    assert "kvcomp" in text and "tokens=33" in text
    assert parse_asm(text) == [i]


@pytest.mark.parametrize(
    "settings",
    [KvSettings(quant="int8"), KvSettings(quant="int8", policy="topk_magnitude", sparsity_ratio=0.7),
     KvSettings(quant="int8", policy="topk_magnitude", sparsity_ratio=0.95),
     KvSettings(quant="fp16", policy="topk_magnitude", sparsity_ratio=0.5)],
    ids=["int8", "int8-topk70", "int8-topk95-coords", "fp16-topk50"],
)  # fmt: skip
def test_a_full_block_is_stored_byte_identical_to_store_kv_block(settings):
    m, view = _machine()
    policy = 1 if settings.policy == "topk_magnitude" else 0
    cost = _run(
        m, _kvcomp(policy=policy, quant=int(settings.quant == "int8"), ratio=round(1e6 * settings.ratio(0)))
    )
    want = store_kv_block(view[:, 1], settings, layer=3)
    for h, s in enumerate(want):
        addr, hi, nbytes, tag = _desc(m, h)
        assert (addr | hi << 32, nbytes, tag) == (
            POOL + h * SLOT,
            s.nbytes,
            int(descriptor(0, 0, COMPRESSED, 1, h, 3)[3]),
        )
        assert m.dram[addr : addr + nbytes].tobytes() == s.data
        np.testing.assert_array_equal(_view(m)[h, 1], load_kv_block(s, "f16"))  # rounded in the view
    np.testing.assert_array_equal(_view(m)[:, [0, 2]], view[:, [0, 2]])  # other blocks untouched
    stored = sum(s.nbytes for s in want)
    assert cost.dram_write == H * (16 + 64 * D * 2) + stored and cost.dram_read == H * (16 + 64 * D * 2)


def test_a_filling_block_keeps_its_unrounded_rows_in_the_slot_until_it_is_full():
    """Three calls fill block 1 (rows 0..19, 20..40, 41..63): the stored bytes at the end are those
    of the unrounded rows, although the view holds rounded ones in between."""
    settings = KvSettings(quant="int8", policy="topk_magnitude", sparsity_ratio=0.7)
    m, view = _machine()
    raw = view[:, 1].copy()
    for lo, n in ((0, 20), (20, 41)):
        _run(m, _kvcomp(lo=lo, tokens=n, full=0, policy=1, ratio=700000))
        filling = store_kv_block(raw[:, :n], KvSettings(quant="int8"), layer=3)
        for h, s in enumerate(filling):
            w = _desc(m, h)
            assert w[3] & 0xFF == PLAIN and w[2] == s.nbytes | (KIND_CODES["int8"] + 1) << 24
            np.testing.assert_array_equal(_view(m)[h, 1, :n], load_kv_block(s, "f16"))
            slot = m.dram[POOL + h * SLOT : POOL + h * SLOT + n * D * 2].view(np.float16).reshape(n, D)
            np.testing.assert_array_equal(slot, raw[h, :n])  # unrounded
        assert not np.array_equal(_view(m)[:, 1, :n], raw[:, :n])
    _run(m, _kvcomp(lo=41, tokens=64, full=1, policy=1, ratio=700000))
    for h, s in enumerate(store_kv_block(raw, settings, layer=3)):
        addr, _, nbytes, _ = _desc(m, h)
        assert m.dram[addr : addr + nbytes].tobytes() == s.data


def test_the_host_supplies_heavy_hitters_tokens_and_topk_entropys_budgets():
    heat = RNG.random((H, 64))
    stats = AttentionStats(heat=heat, first_position=64, seq_len=128)
    settings = KvSettings(quant="int8", policy="heavy_hitter", sparsity_ratio=0.7)
    m, view = _machine()
    rows = heavy_hitter_rows(H, 64, 0.7, heat, 64, 128, settings.recent_window)
    for h in range(H):  # the host's token choice after the slot's rows
        bits = sum(1 << r for r in np.flatnonzero(rows[h]).tolist())
        m.dram[POOL + h * SLOT + ROW_BYTES : POOL + h * SLOT + ROW_BYTES + 8] = np.frombuffer(
            bits.to_bytes(8, "little"), np.uint8
        )
    _run(m, _kvcomp(policy=3, ratio=700000))
    for h, s in enumerate(store_kv_block(view[:, 1], settings, layer=0, stats=stats)):
        addr, _, nbytes, _ = _desc(m, h)
        assert m.dram[addr : addr + nbytes].tobytes() == s.data
    ent = np.array([0.3, 1.7])
    settings = KvSettings(quant="int8", policy="topk_entropy", sparsity_ratio=0.7)
    m, view = _machine()
    from mcpc.kv.policies import entropy_head_budgets

    budgets = entropy_head_budgets(H, 64, D, 0.7, ent)
    assert budgets[0] != budgets[1]
    for h in range(H):
        e = DESC + 16 * (h * LIMIT + 1) + 8
        m.dram[e : e + 4] = np.array([budgets[h]], "<u4").view(np.uint8)
    _run(m, _kvcomp(policy=2, ratio=700000))
    for h, s in enumerate(
        store_kv_block(view[:, 1], settings, layer=0, stats=AttentionStats(head_entropy=ent))
    ):
        addr, _, nbytes, _ = _desc(m, h)
        assert m.dram[addr : addr + nbytes].tobytes() == s.data and s.kept == budgets[h]


def test_illegal_fields_a_compressed_descriptor_and_timing_only_runs():
    m, _ = _machine()
    for bad, needle in [
        (_kvcomp(lo=5, tokens=5), "lo 5"),
        (_kvcomp(block=3), "block 3 outside"),
        (Instr("kvcomp", {**_kvcomp().fields, "kv_dtype": "i8"}), "kv_dtype i8"),
        (_kvcomp(tol=0), "tol 0"),
    ]:
        fn, args, _ = compile_instr(bad, TARGET)
        with pytest.raises(Fault, match=needle):
            fn(m, args)
    cost = _run(m, _kvcomp())
    with pytest.raises(Fault, match=r"KV block 1 \(layer 3 V head 0\): descriptor kind 1, not plain"):
        _run(m, _kvcomp())  # the block is compressed now: a second kvcomp of it is refused
    fn, args, _ = compile_instr(_kvcomp(), TARGET)
    timing_twin(fn)(None, args)  # no machine: the nominal sizes of dense INT8 blocks
    assert data_cost_cell(fn, args)[0] == cost


# -- a decoder build ----------------------------------------------------------------------------
DECODERS = Path(__file__).parents[1] / "llm" / "decoders"
LLAMA = json.loads((DECODERS / "decoders.json").read_text())["models"]["llama"]
BUILD = DecoderBuild(max_seq=128, prefill_chunk=16)
TOKENS = np.random.default_rng(0).integers(0, LLAMA["vocab"], 2 * 100)


@pytest.fixture(scope="module")
def builds():
    out = {}
    for name, flags in {"int8": ("int8", None, None), "heavy_hitter": ("int8", 0.7, "heavy_hitter"),
                        "topk_magnitude": ("int8", 0.7, "topk_magnitude")}.items():  # fmt: skip
        cfg = with_kv_flags(driver.load_qat_config("fp16"), *flags, BUILD.max_seq)
        out[name] = mcpc.compile(str(DECODERS / LLAMA["file"]), qat_config=cfg, decoder=BUILD)
    return out


def _session(built, use_kvcomp: bool, timing_only: bool = False) -> DecoderSession:
    dec = DecoderSession(built, timing_only=timing_only)
    c = dec.compressed
    dec.compressed = kv_store.CompressedKV(
        c.settings, dec.meta, dec.session, timing_only, dec.heat, use_kvcomp
    )
    assert dec.compressed.kvcomp == use_kvcomp
    return dec


@pytest.mark.parametrize("name", ["int8", "heavy_hitter", "topk_magnitude"])
def test_a_decoder_build_gets_the_hosts_bytes_tokens_and_perplexity_and_pays_the_cycles(builds, name):
    """Small Llama, --max-seq 128: the same generated tokens, perplexity (2 windows of 100) and
    stored bytes as the host's compression; every step now carries kvcomp cycles."""
    runs = {}
    for use in (False, True):
        gen = _session(builds[name], use)
        g = gen.generate(LLAMA["prompt"], 24)
        dec = _session(builds[name], use)
        p = dec.eval_ppl(TOKENS, window=100)
        runs[use] = g, p, dec
    (g0, p0, host), (g1, p1, npu) = runs[False], runs[True]
    assert g1["generated_ids"] == g0["generated_ids"]
    assert p1["perplexity"] == p0["perplexity"] and p1["kv_bytes"] == p0["kv_bytes"]
    assert p1["kv_store"]["compressed_by"] == "kvcomp (the NPU)"
    blocks = [b for b, blk in npu.compressed.blocks.items() if blk.full]
    assert blocks
    for b in blocks:  # the blocks the last window filled: kvcomp's bytes are the host's
        assert npu.compressed.block_data(b) == host.compressed.block_data(b)
    # cycles: the program's are the host path's, kvcomp's come on top, and repeat exactly
    steps0 = [s["cycles"] for s in host.steps]
    steps1 = [s["cycles"] - s["kvcomp_cycles"] for s in npu.steps]
    assert steps1 == steps0
    assert all(s["kvcomp_cycles"] > 0 for s in npu.steps) and not any(s["kvcomp_cycles"] for s in host.steps)
    assert g1["kvcomp_cycles_per_token"] > 0 and g1["cycles_per_token"] > g0["cycles_per_token"]
    again = _session(builds[name], True)
    again.eval_ppl(TOKENS, window=100)
    assert [s["cycles"] for s in again.steps] == [s["cycles"] for s in npu.steps]


def test_timing_only_runs_charge_kvcomp_as_functional_ones_do(builds):
    """INT8: the nominal sizes are exact (dense blocks), so a timing-only run's kvcomp cycles, and
    its steps' cycles, are the functional run's."""
    toks = [int(t) for t in TOKENS[:100]]
    got = {}
    for timing_only in (False, True):
        dec = DecoderSession(builds["int8"], timing_only=timing_only)
        seq, _ = dec.new_sequence()
        dec.prefill([(seq, toks[:70])])
        for t in toks[70:75]:
            dec.decode([seq], [t])
        got[timing_only] = [(s["cycles"], s["kvcomp_cycles"]) for s in dec.steps]
    assert got[True] == got[False] and all(k > 0 for _, k in got[False])


def test_a_ratio_kvcomp_cannot_hold_is_refused(builds):
    dec = DecoderSession(builds["int8"])
    s = KvSettings(quant="int8", policy="topk_magnitude", sparsity_ratio=0.1234567)
    with pytest.raises(InputError, match="whole millionths"):
        kv_store.CompressedKV(s, dec.meta, dec.session)


def test_the_pool_holds_what_kvcomp_stored(builds):
    dec = DecoderSession(builds["int8"])
    seq, _ = dec.new_sequence()
    dec.prefill([(seq, [int(t) for t in TOKENS[:64]])])
    block = dec.kv.block_table(seq)[0]
    data = dec.compressed.block_data(block)
    assert len(data) == LLAMA["layers"] * 2 * LLAMA["kv_heads"]
    pool = dec.session.persistent_view(POOL_NAME)
    assert all(load_kv_block(v, "f16").shape == (64, LLAMA["head_dim"]) for v in data.values())
    assert pool.size >= sum(len(v) for v in data.values())


def test_kvcomp_in_a_program_runs_and_is_costed_from_what_it_stored():
    """An assembled program with one kvcomp: run_program stores the block into the output region
    its descriptors name, charges the stored bytes, and a timing-only run gives the same cycles."""
    from simprog import build, loaded

    from mcpc.sim.api import run_program

    io = {
        "inputs": {"view": ("f16", (H * LIMIT * 64 * D,)), "desc": ("i32", (H * LIMIT * 4,))},
        "outputs": {"pool": ("u8", (H * SLOT,))},
    }
    _, addrs = build("halt", **io)
    code = [
        Instr("kvcomp", {**_kvcomp().fields, "dram": addrs["view"], "desc": addrs["desc"]}),
        Instr("halt", {}),
    ]
    program = build(code, **io)[0]
    view = (RNG.standard_normal((H, LIMIT, 64, D)) * 3).astype(np.float16)
    desc = np.zeros((H, LIMIT, 4), np.uint32)
    for h in range(H):
        desc[h, 1] = descriptor(addrs["pool"] + h * SLOT, 0, PLAIN, 0, h, 5)
    inputs = {"view": view.reshape(-1), "desc": desc.view(np.int32).reshape(-1)}
    res = run_program(loaded(program), inputs)
    pool = res.outputs["pool"].reshape(H, SLOT)
    want = store_kv_block(view[:, 1], KvSettings(quant="int8"), layer=5)
    for h, s in enumerate(want):
        assert pool[h, : s.nbytes].tobytes() == s.data
    timing = run_program(loaded(program), inputs, timing_only=True)
    assert timing.profile["cycles"] == res.profile["cycles"] > TARGET.dram_latency_cycles
