"""Intermediates kept in SRAM (``npu-schedule{keep-in-sram}``, ``backend/residency.py``): same bits,
race-free schedules, no store/load round trip through DRAM, and a decode step at its DRAM roofline."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_lower_vector import compile_check
from test_schedule import ROW, build_kernel, kernel_shapes

import mcpc
from mcpc.arch.isa import decode_program
from mcpc.arch.target import load_target
from mcpc.backend import BackendOptions, compile_to_program
from mcpc.backend.emitter import Emitter
from mcpc.backend.residency import Resident, ResidentPlan, forward
from mcpc.backend.schedule import check_hazards, schedule
from mcpc.ir.interpreter import interpret
from mcpc.sim.api import random_inputs, run_program
from mcpc.sim.loader import from_program

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from llama_decode import LlamaConfig, llama_decode_step, roofline_bytes  # noqa: E402

# A Llama-shaped decode step whose 5 MiB of f16 weights do not fit the 1 MiB scratchpad below.
SMALL = LlamaConfig(hidden=256, layers=2, heads=4, kv_heads=2, head_dim=64, ffn=768, vocab=4096, max_pos=64)
PAST = 32
TARGET = "mcp2026-edge"
SRAM = ["sram.size_bytes=1048576"]


@pytest.fixture(scope="module")
def decode_module(tmp_path_factory):
    path = tmp_path_factory.mktemp("decode") / "decode.onnx"
    onnx.save(llama_decode_step(SMALL), path)
    module = mcpc.compile(path, target=TARGET, qat_config="fp16.yaml", dims={"past": PAST}, overrides=SRAM)
    return module.module


@pytest.fixture(scope="module")
def decode_runs(decode_module):
    tgt = load_target(TARGET, SRAM)
    inputs = None
    runs = {}
    for keep in (True, False):
        prog = compile_to_program(decode_module, tgt, BackendOptions(keep_in_sram=keep))
        assert prog.meta["keep_in_sram"] is keep
        instrs = decode_program(prog.text)
        check_hazards(instrs)  # deadlock, token balance, no cross-engine race
        loaded = from_program(prog)
        inputs = inputs or random_inputs(loaded, "main", seed=3)
        runs[keep] = (prog, instrs, run_program(loaded, inputs))
    return runs


def test_decode_step_is_within_1_3x_of_its_dram_roofline(decode_runs):
    tgt = load_target(TARGET, SRAM)
    roof = roofline_bytes(SMALL, PAST)
    assert roof["weights"] > 4 * tgt.sram.size_bytes  # weights stream from DRAM every step
    roof_cycles = roof["total"] / tgt.dram_bytes_per_cycle
    on, off = (decode_runs[k][2].profile for k in (True, False))
    assert on["cycles"] <= 1.3 * roof_cycles, on["cycles"] / roof_cycles
    assert off["cycles"] > 1.8 * roof_cycles  # what the round trips cost (measured 2.2x)
    for name, got in decode_runs[True][2].outputs.items():  # bit-identical with the option off
        want = decode_runs[False][2].outputs[name]
        assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), name
    for prog, _, run in decode_runs.values():
        assert run.profile["peak_sram_bytes"] <= prog.memory_map["sram_peak_bytes"] <= tgt.sram.size_bytes


def _round_trips(instrs) -> int:
    """Loads that read DRAM bytes an earlier store of the program wrote."""
    written: list[tuple[int, int]] = []
    count = 0
    for i in instrs:
        if i.op not in ("load", "store", "gather"):
            continue
        lo = i.dram
        hi = lo + (max(i.rows, 1) - 1) * i.dram_stride + i.row_bytes if i.op != "gather" else lo + 1
        if i.op == "store":
            written.append((lo, hi))
        elif any(a < hi and lo < b for a, b in written):
            count += 1
    return count


def test_keep_in_sram_removes_the_store_load_round_trips(decode_runs):
    prog, instrs, _ = decode_runs[True]
    off_instrs = decode_runs[False][1]
    assert _round_trips(off_instrs) > 100
    assert _round_trips(instrs) == 0
    # the only stores left write the program's outputs (logits, present K/V)
    outs = [(b["dram"], b["dram"] + b["bytes"]) for b in prog.io["main"]["outputs"]]
    stores = [i for i in instrs if i.op == "store"]
    assert stores and all(any(a <= i.dram < b for a, b in outs) for i in stores)
    assert len(stores) < sum(i.op == "store" for i in off_instrs) / 4


def test_pass_option_turns_it_off(tmp_path):
    path = tmp_path / "decode.onnx"
    tiny = LlamaConfig(hidden=64, layers=1, heads=4, kv_heads=2, head_dim=16, ffn=96, vocab=128, max_pos=64)
    onnx.save(llama_decode_step(tiny), path)
    pipe = "fold-constants,convert-precision{dtype=f16},dce,tile-matmul,npu-schedule{keep-in-sram=false}"
    off = mcpc.compile(path, target=TARGET, qat_config="fp16.yaml", passes=pipe, dims={"past": 8})
    on = mcpc.compile(path, target=TARGET, qat_config="fp16.yaml", dims={"past": 8})
    assert off.program.meta["keep_in_sram"] is False and on.program.meta["keep_in_sram"] is True
    assert _round_trips(decode_program(off.program.text)) > 0
    assert _round_trips(decode_program(on.program.text)) == 0


TINY = LlamaConfig(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, ffn=96, vocab=128, max_pos=64)


@pytest.mark.parametrize("sram", [8192, 32768])
def test_tiny_scratchpad_stays_correct(sram, tmp_path):
    """The resident area and the kernel ring share a scratchpad barely larger than the largest
    kernel: bits, races and the SRAM bound still hold."""
    path = tmp_path / "tiny.onnx"
    onnx.save(llama_decode_step(TINY), path)
    over = [f"sram.size_bytes={sram}"]
    module = mcpc.compile(
        path, target=TARGET, qat_config="fp16.yaml", dims={"past": 8}, overrides=over
    ).module
    _, instrs, program = compile_check(module, overrides=over)  # bits, races, SRAM bound
    assert program.meta["keep_in_sram"] is True
    assert _round_trips(instrs) < _round_trips(
        decode_program(
            compile_to_program(module, load_target(TARGET, over), BackendOptions(keep_in_sram=False)).text
        )
    )


@pytest.mark.slow
def test_encoder_block_on_a_small_scratchpad(tmp_path):
    from mcpc.examples import causal_mask, encoder_block

    path = tmp_path / "encoder.onnx"
    onnx.save(encoder_block(), path)
    over = ["sram.size_bytes=65536"]
    module = mcpc.compile(path, target=TARGET, qat_config="fp32.yaml", overrides=over).module
    x = np.random.default_rng(1).standard_normal((1, 64, 256)).astype(np.float32)
    compile_check(module, {"x": x, "mask": causal_mask(64)}, overrides=over)


def test_interpreter_equals_simulator_on_the_decode_step(decode_module, decode_runs):
    _, _, run = decode_runs[True]
    inputs = random_inputs(from_program(decode_runs[True][0]), "main", seed=3)
    want = interpret(decode_module, inputs)
    for name, value in want.items():
        got = np.ascontiguousarray(run.outputs[name])
        assert np.array_equal(got.view(np.uint8), np.ascontiguousarray(value).view(np.uint8)), name


# -- the rewrite and the scheduler on random kernel sequences ----------------------------------------
@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(kernel_shapes(), *(st.integers(1, 3),) * 2, *(st.integers(0, 3),) * 2),
        min_size=1,
        max_size=6,
    ),
    st.booleans(),
)
def test_forwarded_kernel_sequences_are_balanced_and_race_free(kernels, output):
    """Random kernels reading earlier kernels' results, their outputs kept in SRAM: ``forward``
    turns loads into on-chip copies and leaves stores out; the schedule must stay race-free."""
    built, values = [], []
    for idx, (shape, ins, outs, src, place) in enumerate(kernels):
        src_at = (idx - src) * 65536 if src <= idx else (1 << 24) + idx * 65536
        base = 65536 + place * 1024  # ring-like placement: kernels overlap earlier ones' SRAM at random
        built.append(build_kernel(shape, ins, outs, src=src_at, dst=(idx + 1) * 65536, sram_base=base))
        values.append(Resident(idx * 16 * ROW, (idx + 1) * 65536, 16 * ROW, idx, len(kernels), output))
    plan = ResidentPlan(size=len(kernels) * 16 * ROW, values=values)
    forward(built, list(range(len(built))), plan, Emitter(load_target("mcp2026-a100")))
    check_hazards(schedule(built, prefetch=True, early_compute=True))


def test_register_offset_dma_is_never_forwarded():
    """A DMA whose address a register offsets may touch any byte: it stays a DMA, and a store of
    it keeps the values live at its kernel out of SRAM (their stores stay, nothing reads them on chip)."""
    em = Emitter(load_target("mcp2026-a100"))
    producer = build_kernel([(True, True, True)], 1, 1, src=0, dst=65536, sram_base=4096)
    consumer = build_kernel([(True, True, True)], 1, 1, src=65536, dst=131072, sram_base=8192)
    (ld,) = consumer.steps[0].loads
    consumer.steps[0].loads = [ld.replace(dram_reg=3)]  # set after the Kernel's contract check
    plan = ResidentPlan(size=1024, values=[Resident(0, 65536, 16 * ROW, 0, 1)])
    forward([producer, consumer], [0, 1], plan, em)
    assert consumer.steps[0].loads and consumer.steps[0].loads[0].fields["dram_reg"] == 3
    assert producer.steps[0].stores and plan.forwarded_loads == 0
    # the same consumer without the register reads the producer's result on chip
    producer = build_kernel([(True, True, True)], 1, 1, src=0, dst=65536, sram_base=4096)
    consumer = build_kernel([(True, True, True)], 1, 1, src=65536, dst=131072, sram_base=8192)
    plan = ResidentPlan(size=1024, values=[Resident(0, 65536, 16 * ROW, 0, 1)])
    forward([producer, consumer], [0, 1], plan, em)
    assert not consumer.steps[0].loads and plan.forwarded_loads == 1 and not producer.steps[0].stores
