"""The paged KV cache ops compiled (backend/lower_kv.py: scatter, gather by a run-time block count,
vattn) and simulated in a Session: bit-identical to the IR interpreter step after step, work that
follows the context in use and not the reservation, traps for bad slots, block ids and windows."""

import json
from pathlib import Path

import numpy as np
import pytest

import mcpc
from mcpc.arch.isa import N_REGS
from mcpc.backend.compile import persistent_ranges
from mcpc.backend.hazards import check_hazards
from mcpc.errors import InputError, SimTrap, UnsupportedError
from mcpc.ir import parse_module
from mcpc.ir.decoder_import import DecoderBuild
from mcpc.ir.interpreter import ModuleState, interpret
from mcpc.sim import Session
from mcpc.sim.loader import from_program

STEP = (Path(__file__).parents[1] / "data" / "paged_step.mcpir").read_text()
BLOCK, TRASH = 4, 3  # paged_step.mcpir: blocks of 4 rows, 3 blocks + the trash block per head


@pytest.fixture(scope="module", params=["fp32", "fp16"])
def step(request):
    return mcpc.compile(parse_module(STEP), qat_config=request.param)


def _walk(step, steps=8, seed=1):
    """Two sequences decode ``steps`` tokens with interleaved block tables (sequence 0 owns blocks 2
    then 0, sequence 1 block 1, then writes to the trash block): (inputs, registers) per step."""
    module = step.module
    args = module.functions["step"].args
    dtype = {a.name: a.type.dtype.name for a in args}
    rng = np.random.default_rng(seed)
    tables = {0: [2, 0], 1: [1]}
    out = []
    for t in range(steps):
        lens = [t + 1, min(t + 1, BLOCK)]
        slot1 = tables[1][0] * BLOCK + t if t < BLOCK else TRASH * BLOCK
        slot = np.array([tables[0][t // BLOCK] * BLOCK + t % BLOCK, slot1], np.int32)
        nb0 = -(-lens[0] // BLOCK)
        gather = np.array([*tables[0][:nb0], tables[1][0], 0, 0][:4], np.int32)
        inputs = {
            "q": rng.standard_normal((2, 4, 1, 8)), "kn": rng.standard_normal((2, 2, 1, 8)),
            "vn": rng.standard_normal((2, 2, 1, 8)), "slot": slot, "gather": gather,
            "start": np.array([0, nb0 * BLOCK], np.int32), "len": np.array(lens, np.int32),
        }  # fmt: skip
        inputs = {k: v.astype(np.float16 if dtype[k] == "f16" else v.dtype) for k, v in inputs.items()}
        inputs = {k: v.astype(np.float32) if dtype[k] == "f32" else v for k, v in inputs.items()}
        out.append((inputs, {"kv_blocks": nb0 + 1}))
    return out


def test_every_step_is_bit_identical_to_the_interpreter(step):
    state = ModuleState(step.module)
    session = Session(step)
    for inputs, regs in _walk(step):
        want = interpret(step.module, inputs, "step", state, regs)["out"]
        got = session.run(inputs, registers=regs)["out"]
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    for name in ("k", "v"):  # the caches too, trash block included
        np.testing.assert_array_equal(session.persistent_buffer(name), state.globals[name])


def test_the_schedule_orders_every_access_to_the_cache(step):
    program = step.program
    regions = persistent_ranges(program.memory_map["regions"])
    regs = [None if r == 1 else 0 for r in range(N_REGS)]  # r1: the kv_blocks host register
    check_hazards(program.instructions(), regs=regs, regions=regions)
    ops = [i.op for i in program.instructions()]
    assert ops.count("scatter") == 4 and ops.count("gather") == 4 and ops.count("vattn") == 2


def test_timing_only_gives_the_functional_cycles(step):
    session = Session(step)
    for inputs, regs in _walk(step, steps=6):
        session.run(inputs, registers=regs)
        cycles = session.last_profile["cycles"]
        session.run(inputs, registers=regs, timing_only=True)
        assert session.last_profile["cycles"] == cycles


# -- work follows the context, not the reservation -------------------------------------------------
def _decoder_attention(batch: int, max_blocks: int, heads=(6, 2), d=64, dtype="f32") -> str:
    """One layer's cache write and paged attention, blocks of 64, ``max_blocks`` per sequence."""
    hq, hk = heads
    nb = batch * max_blocks
    rows = hk * (nb + 1) * 64
    q, kv = f"tensor<{batch}x{hq}x1x{d}x{dtype}>", f"tensor<{batch}x{hk}x1x{d}x{dtype}>"
    b = f"tensor<{batch}xi32>"
    return f"""module @dec {{
  global @k : tensor<{rows}x{d}x{dtype}>
  global @v : tensor<{rows}x{d}x{dtype}>
  host_reg @kv_blocks {{max = {nb}, min = 0}}
  func @decode(%q: {q}, %kn: {kv}, %vn: {kv}, %slot: {b}, %gather: tensor<{nb}xi32>, %start: {b}, %len: {b}) -> ("out": {q}) {{
    mcp.kv_store %kn, %slot {{global = "k"}} : ({kv}, {b}) -> ()
    mcp.kv_store %vn, %slot {{global = "v"}} : ({kv}, {b}) -> ()
    %0 = mcp.host_reg {{name = "kv_blocks"}} : () -> tensor<i32>
    %1 = mcp.paged_attention %q, %gather, %start, %len, %0 {{block_size = 64, k_global = "k", kv_heads = {hk}, scale = 0.125, v_global = "v"}} : ({q}, tensor<{nb}xi32>, {b}, {b}, tensor<i32>) -> {q}
    mcp.return %1 : ({q}) -> ()
  }}
}}
"""  # noqa: E501


def _cycles(program, context: int, batch: int = 1, timing_only: bool = True) -> int:
    """Cycles of one decode step of ``batch`` sequences at ``context`` tokens each (blocks in order)."""
    blocks = -(-context // 64)
    session = Session(program)
    shapes = {b["name"]: b["shape"] for b in session.program.io["decode"]["inputs"]}
    rng = np.random.default_rng(0)
    inputs = {n: rng.standard_normal(shapes[n]).astype(np.float32) for n in ("q", "kn", "vn")}
    inputs["slot"] = np.array([(context - 1) + b * blocks * 64 for b in range(batch)], np.int32)
    gather = np.zeros(shapes["gather"], np.int32)
    gather[: batch * blocks] = np.arange(batch * blocks)
    inputs["gather"] = gather
    inputs["start"] = np.array([b * blocks * 64 for b in range(batch)], np.int32)
    inputs["len"] = np.full(batch, context, np.int32)
    session.run(inputs, registers={"kv_blocks": batch * blocks}, timing_only=timing_only)
    return session.last_profile["cycles"]


@pytest.fixture(scope="module")
def builds():
    """The same layer reserved for 2 and for 32 blocks a sequence (128 and 2048 tokens)."""
    build = {mb: parse_module(_decoder_attention(1, mb)) for mb in (2, 32)}
    return {mb: mcpc.compile(module, qat_config="fp32").program for mb, module in build.items()}


def test_cycles_follow_the_context_not_the_reservation(builds):
    small, large = builds[2], builds[32]
    for context in (1, 64, 100):
        a, b = _cycles(small, context), _cycles(large, context)
        assert abs(a - b) <= 0.02 * a, (context, a, b)
    grow = [_cycles(large, c) for c in (64, 512, 1024, 2048)]
    assert grow == sorted(grow) and grow[-1] > grow[0] * 1.5, grow
    assert _cycles(large, 512, timing_only=False) == grow[1]  # timing-only: the same cycles


def test_gathers_read_the_kv_bytes_in_use(builds):
    loaded = from_program(builds[32])  # its counters hold the last run's run-time extents
    gathers = [i for i, m in enumerate(loaded.mnemonics) if m == "gather"]
    for blocks in (1, 10):
        _cycles(loaded, 64 * blocks)
        # K and V of 2 KV heads: blocks in use x 64 rows x 64 f32, nothing for the 32 reserved
        assert int(sum(loaded.dram_read[i] for i in gathers)) == 4 * blocks * 64 * 64 * 4


def test_a_cache_too_big_for_sram_is_refused():
    text = _decoder_attention(8, 64, heads=(8, 8), d=128)
    with pytest.raises(UnsupportedError, match=r"mcp.paged_attention.*gathered K and V of 512 blocks"):
        mcpc.compile(parse_module(text), qat_config="fp32")


# -- traps -----------------------------------------------------------------------------------------
def _bad(step, **over):
    inputs, regs = _walk(step, steps=1)[0]
    inputs = {**inputs, **{k: np.array(v, np.int32) for k, v in over.items() if k != "kv_blocks"}}
    return inputs, {"kv_blocks": over.get("kv_blocks", regs["kv_blocks"])}


@pytest.mark.parametrize(
    ("over", "match"),
    [
        ({"slot": [0, 16]}, r"scatter.*scatter index out of range: index\[1\] = 16 outside \[0, 16\)"),
        ({"gather": [0, 4, 0, 0]}, r"gather.*gather index out of range: index\[1\] = 4 outside \[0, 4\)"),
        ({"len": [1, 5]}, r"vattn.*vattn window 1 = \[4, 9\) is outside the 8 K/V rows in use"),
        ({"len": [1, 1], "kv_blocks": 1}, r"vattn window 1 = \[4, 5\) is outside the 4 K/V rows in use"),
    ],
)
def test_bad_slots_block_ids_and_windows_trap(step, over, match):
    inputs, regs = _bad(step, **over)
    with pytest.raises(SimTrap, match=match):
        Session(step).run(inputs, registers=regs)
    with pytest.raises(InputError, match="outside"):  # the interpreter refuses them too
        interpret(step.module, inputs, "step", ModuleState(step.module), regs)


def test_the_heads_of_a_kv_store_scatter_without_waiting_for_each_other():
    # 3 KV heads, more than the 2 input slots of a kernel: each head has a buffer of its own in one
    # copy step, so no scatter waits for an earlier one to land (a DRAM latency)
    program = mcpc.compile(parse_module(_decoder_attention(1, 2, heads=(6, 3))), qat_config="fp32").program
    loaded = from_program(program)
    session = Session(loaded)
    shapes = {b["name"]: b["shape"] for b in loaded.io["decode"]["inputs"]}
    rng = np.random.default_rng(0)
    inputs = {n: rng.standard_normal(shapes[n]).astype(np.float32) for n in ("q", "kn", "vn")}
    inputs |= {"slot": np.array([9], np.int32), "gather": np.array([0, 0], np.int32),
               "start": np.array([0], np.int32), "len": np.array([10], np.int32)}  # fmt: skip
    session.run(inputs, registers={"kv_blocks": 1}, trace=True)
    clk = loaded.target.clock_mhz
    scatters = sorted(
        (ev["args"]["addr"], ev["ts"] * clk)
        for ev in session.last_trace
        if ev.get("ph") == "X" and ev["name"] == "scatter"
    )
    assert len(scatters) == 6  # K then V, three heads each
    for times in ([t for _, t in scatters[:3]], [t for _, t in scatters[3:]]):
        assert max(times) - min(times) < loaded.target.dram_latency_cycles, times


def test_a_decoder_build_copies_the_new_k_v_rows_on_chip():
    # the K/V projections' results stay in SRAM (keep-in-sram): kv_store copies them into its
    # buffers instead of storing them and loading them back; only the slots come from DRAM
    decoders = Path(__file__).parents[1] / "llm" / "decoders"
    rec = json.loads((decoders / "decoders.json").read_text())["models"]["gpt2"]  # 4 KV heads, 2 slots
    res = mcpc.compile(str(decoders / rec["file"]), qat_config="fp16", decoder=DecoderBuild(max_seq=128))
    loaded = from_program(res.program)
    start, count = loaded.entries["decode"]
    stores = [i for i in range(start, start + count) if loaded.ir_ops[loaded.ir_op_of[i]] == "mcp.kv_store"]
    ops = [loaded.mnemonics[i] for i in stores]
    layers = res.program.meta["decoder"]["layers"]
    assert ops.count("load") == 2 * layers  # the slots of K and of V, per layer
    assert ops.count("scatter") == ops.count("vun") == 2 * layers * res.program.meta["decoder"]["kv_heads"]


def test_kv_store_through_the_input_slots_when_its_rows_are_many(monkeypatch):
    # rows beyond an eighth of the scratchpad: one copy step per head through the kernel's slots,
    # still bit-identical and race-free (forced here by asking a share no kv_store meets)
    one_step = [i.op for i in mcpc.compile(parse_module(STEP), qat_config="fp32").program.instructions()]
    monkeypatch.setattr("mcpc.backend.lower_kv.ONE_STEP_SHARE", 1 << 40)
    step = mcpc.compile(parse_module(STEP), qat_config="fp32")
    program = step.program
    regions = persistent_ranges(program.memory_map["regions"])
    regs = [None if r == 1 else 0 for r in range(N_REGS)]
    check_hazards(program.instructions(), regs=regs, regions=regions)
    ops = [i.op for i in program.instructions()]
    assert ops.count("scatter") == 4
    # an EX nop per copy step: the slots' step and one per head (2 kv_stores x 2 heads), not one each
    assert ops.count("nop") == one_step.count("nop") + 2 * 2
    state = ModuleState(step.module)
    session = Session(step)
    for inputs, regs in _walk(step, steps=5):
        want = interpret(step.module, inputs, "step", state, regs)["out"]
        np.testing.assert_array_equal(session.run(inputs, registers=regs)["out"], want)
