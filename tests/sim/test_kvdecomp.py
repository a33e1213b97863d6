"""``kvdecomp``: KV blocks gathered through their descriptors — plain ones copied as ``gather``
copies them, compressed ones read from their stored bytes in DRAM, CRC-8 checked, decoded with
``mcpc.kv.load_kv_block``; its cost follows the bytes it read.  Then a decoder build that stores its
cache compressed: its decode step reads fewer bytes and costs fewer cycles than the plain build."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import mcpc
from mcpc import driver
from mcpc.arch.isa import Instr
from mcpc.arch.target import load_target
from mcpc.ir.decoder_import import DecoderBuild
from mcpc.kv import KvSettings, load_kv_block, store_kv_block
from mcpc.kv.pool import COMPRESSED, PLAIN, descriptor, max_block_bytes
from mcpc.qat_configs.kv_cache import with_kv_flags
from mcpc.sim.decoder import DecoderSession
from mcpc.sim.execute import compile_instr, data_cost_cell, timing_twin
from mcpc.sim.machine import Fault, Machine

TARGET = load_target("mcp2026-a100")
D, ROWS = 16, 64
ROW_BYTES = ROWS * D * 2  # one block of one head, f16
PLAIN_TABLE, DESC_TABLE, POOL = 0x1000, 0x20000, 0x30000
IDX, DST = 0x100, 0x1000
RNG = np.random.default_rng(5)


def _machine(blocks: int = 4) -> tuple[Machine, np.ndarray, list[bytes]]:
    """Plain rows for every block; blocks 1 and 3 also stored INT8 in the pool, their descriptors
    compressed (tag: layer 2, V, head 1); blocks 0 and 2 plain."""
    m = Machine(1 << 20, TARGET.sram.size_bytes)
    plain = (RNG.standard_normal((blocks, ROWS, D)) * 2).astype(np.float16)
    m.dram[PLAIN_TABLE : PLAIN_TABLE + plain.nbytes] = plain.view(np.uint8).reshape(-1)
    stored = []
    for b in range(blocks):
        data = store_kv_block(plain[b][None], KvSettings(quant="int8"), layer=2)[0].data
        stored.append(data)
        if b % 2:
            addr = POOL + b * max_block_bytes(ROWS, D, 2)
            m.dram[addr : addr + len(data)] = np.frombuffer(data, np.uint8)
            desc = descriptor(addr, len(data), COMPRESSED, 1, 1, 2)
        else:
            desc = descriptor(0, 0, PLAIN, 1, 1, 2)
        m.dram[DESC_TABLE + 16 * b : DESC_TABLE + 16 * b + 16] = desc.view(np.uint8)
    return m, plain, stored


def _instr(count: int, limit: int = 4, count_reg: int = 0) -> Instr:
    return Instr("kvdecomp", dict(dram=PLAIN_TABLE, desc=DESC_TABLE, sram_idx=IDX, sram=DST, count=count,
                                  row_bytes=ROW_BYTES, limit=limit, head_dim=D, kv_dtype="f16",
                                  count_reg=count_reg))  # fmt: skip


def _run(m: Machine, ids: list[int], **kw) -> tuple[np.ndarray, object]:
    m.sram[IDX : IDX + 4 * len(ids)] = np.asarray(ids, np.int32).view(np.uint8)
    fn, args, _ = compile_instr(_instr(len(ids), **kw), TARGET)
    fn(m, args)
    rows = m.sram[DST : DST + len(ids) * ROW_BYTES].view(np.float16).reshape(len(ids), ROWS, D).copy()
    return rows, data_cost_cell(fn, args)[0]


def test_plain_blocks_are_copied_and_compressed_ones_decoded():
    m, plain, stored = _machine()
    got, cost = _run(m, [3, 0, 1, 2])
    np.testing.assert_array_equal(got[1], plain[0])  # plain: the view's rows, bit for bit
    np.testing.assert_array_equal(got[3], plain[2])
    for i, b in ((0, 3), (2, 1)):  # compressed: what load_kv_block reads from the stored bytes
        np.testing.assert_array_equal(got[i], load_kv_block(stored[b], "f16"))
        assert not np.array_equal(got[i], plain[b])  # INT8-rounded, not the view's values
    read = 16 * 4 + len(stored[3]) + len(stored[1]) + 2 * ROW_BYTES
    assert cost.dram_read == read
    decode = -(-2 * ROWS * D // TARGET.vector_lanes_for("f16"))
    assert cost.busy == -(-read // TARGET.dram_bytes_per_cycle) + decode
    assert cost.tail == TARGET.dram_latency_cycles


@pytest.mark.parametrize(
    ("setting", "kind", "tile"),
    [(KvSettings(quant="fp16", policy="topk_magnitude", sparsity_ratio=0.7), "f16", "bitmap"),
     (KvSettings(quant="int8", policy="topk_magnitude", sparsity_ratio=0.95), "int8", "coords"),
     (KvSettings(quant="int8", quant_tol=1e-9), "f16", "dense")],  # fails the check: FP16_Retain
)  # fmt: skip
def test_sparse_and_retained_blocks_decode_as_load_kv_block_reads_them(setting, kind, tile):
    m, plain, _ = _machine()
    block = store_kv_block(plain[1][None], setting, layer=2)[0]
    assert (block.kind, block.tiles) == (kind, (tile,))
    data = block.data
    addr = POOL + max_block_bytes(ROWS, D, 2)
    m.dram[addr : addr + len(data)] = np.frombuffer(data, np.uint8)
    desc = descriptor(addr, len(data), COMPRESSED, 1, 1, 2)
    m.dram[DESC_TABLE + 16 : DESC_TABLE + 32] = desc.view(np.uint8)
    got, cost = _run(m, [1])
    np.testing.assert_array_equal(got[0], load_kv_block(data, "f16"))
    assert cost.dram_read == 16 + len(data)


def test_fewer_compressed_bytes_cost_fewer_cycles_than_plain_ones():
    m, _, _ = _machine()
    _, compressed = _run(m, [1, 3, 1, 3])
    _, plain = _run(m, [0, 2, 0, 2])
    assert compressed.dram_read < plain.dram_read and compressed.busy < plain.busy


def test_a_flipped_bit_traps_naming_block_layer_kind_and_head_and_writes_nothing():
    m, _, stored = _machine()
    addr = POOL + 3 * max_block_bytes(ROWS, D, 2)
    m.dram[addr + len(stored[3]) // 2] ^= 0x04
    m.sram[DST : DST + 2 * ROW_BYTES] = 0x7E
    with pytest.raises(Fault, match=r"kvdecomp: KV block 3 \(layer 2 V head 1\): CRC-8 mismatch.*not used"):
        _run(m, [0, 3])
    assert (m.sram[DST : DST + 2 * ROW_BYTES] == 0x7E).all()  # no row of the call written


def test_a_bad_index_a_bad_kind_and_a_block_too_wide_trap():
    m, _, stored = _machine()
    with pytest.raises(Fault, match=r"kvdecomp index out of range: index\[1\] = 4 outside \[0, 4\)"):
        _run(m, [0, 4])
    m.dram[DESC_TABLE + 12] = 7  # block 0's kind
    with pytest.raises(Fault, match=r"KV block 0 \(layer 2 V head 1\): descriptor kind 7"):
        _run(m, [0])
    wide = store_kv_block(np.ones((1, ROWS, 2 * D), np.float16), KvSettings(quant="int8"), 0)[0].data
    m.dram[POOL : POOL + len(wide)] = np.frombuffer(wide, np.uint8)
    m.dram[DESC_TABLE : DESC_TABLE + 16] = descriptor(POOL, len(wide), COMPRESSED, 0, 0, 0).view(np.uint8)
    with pytest.raises(Fault, match="do not fit a row"):
        _run(m, [0])


def test_the_count_register_sets_the_blocks_read_and_the_timing_twin_costs_them():
    m, _, stored = _machine()
    m.regs[5] = 1
    _, cost = _run(m, [1, 3, 0], count_reg=5)
    assert cost.dram_read == 16 + len(stored[1])
    fn, args, _ = compile_instr(_instr(3, count_reg=5), TARGET)
    m.regs[5] = 2
    timing_twin(fn)(m, args)  # reads the ids and the descriptors, computes no value
    assert data_cost_cell(fn, args)[0].dram_read == 32 + len(stored[1]) + len(stored[3])


DECODERS = Path(__file__).parents[1] / "llm" / "decoders"
LLAMA = json.loads((DECODERS / "decoders.json").read_text())["models"]["llama"]


BUILD = DecoderBuild(max_seq=256, prefill_chunk=64)


@pytest.fixture(scope="module")
def builds():
    out = {}
    for name in ("fp16", "int8"):
        cfg = driver.load_qat_config("fp16")
        if name == "int8":
            cfg = with_kv_flags(cfg, "int8", None, None, BUILD.max_seq)
        out[name] = mcpc.compile(str(DECODERS / LLAMA["file"]), qat_config=cfg, decoder=BUILD)
    return out


def test_a_compressed_decode_step_reads_fewer_bytes_and_costs_fewer_cycles(builds):
    """Small Llama fixture, --max-seq 256, a decode step at a 200-token context: the INT8 build's
    kvdecomp reads 3 full blocks' stored bytes + the filling block plain + descriptors where the
    fp16 build gathers 4 plain blocks; cycles are deterministic, and a timing-only run, which
    charges the descriptors' nominal sizes, gives the functional cycles (exact for dense INT8)."""
    toks = [int(t) for t in np.random.default_rng(1).integers(0, LLAMA["vocab"], 199)]
    steps = {}
    for name, built in builds.items():
        for timing_only in (False, True):
            dec = DecoderSession(built, timing_only=timing_only)
            seq, _ = dec.new_sequence()
            dec.prefill([(seq, toks)])
            dec.decode([seq], [1])
            steps[name, timing_only] = dec.steps[-1]
    fp16, int8 = steps["fp16", False], steps["int8", False]
    # the step's program reads fewer bytes and takes fewer cycles; the kvcomp that stores the new
    # row on the NPU adds its own (4 kvcomps of one row: on this tiny model about as many cycles
    # as the reads save)
    assert fp16["kvcomp_cycles"] == 0 and int8["kvcomp_cycles"] > 0
    assert int8["cycles"] - int8["kvcomp_cycles"] < fp16["cycles"]
    head_blocks = LLAMA["layers"] * 2 * LLAMA["kv_heads"]
    row_bytes = 64 * LLAMA["head_dim"] * 2
    stored = 4 + 1 + 64 * (LLAMA["head_dim"] + 3) + 1  # a full dense INT8 block of one head
    fewer = head_blocks * (3 * row_bytes - 3 * stored - 4 * 16)
    assert fp16["dram_read_bytes"] - int8["dram_read_bytes"] == fewer
    assert steps["int8", True]["cycles"] == int8["cycles"]
    assert steps["int8", True]["kvcomp_cycles"] == int8["kvcomp_cycles"]
    assert steps["int8", True]["dram_read_bytes"] == int8["dram_read_bytes"]
    assert steps["fp16", True]["cycles"] == fp16["cycles"]
    assert int8["kv_bytes"] == head_blocks * (3 * stored + 4 + 1 + 8 * (LLAMA["head_dim"] + 3) + 1)


def test_a_serving_cost_grid_charges_the_compressed_blocks(builds):
    """mcpc sim serve's measurer places the cached tokens in the KV manager without a call: the
    blocks it gathers but no call stored are full, and get the nominal descriptors, so a decode
    step costs what it costs after a real (timing-only) prefill; its program, fewer cycles than the
    fp16 build's."""
    from mcpc.serve.program import measurer

    grid = {name: measurer(built, name)("decode", 1, 200) for name, built in builds.items()}
    dec = DecoderSession(builds["int8"], timing_only=True)
    seq, _ = dec.new_sequence()
    dec.prefill([(seq, [1] * 199)])
    dec.decode([seq], [1])
    step = dec.steps[-1]
    assert grid["int8"] == step["cycles"] and step["cycles"] - step["kvcomp_cycles"] < grid["fp16"]
