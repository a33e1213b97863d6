"""Functional runs on the program's own machine (sim/fastpath.py): every run gives the bits a run
on a fresh machine gives (constants and inputs placed into zeroed DRAM), whatever ran before it;
constant matmul operands are prepared once and shared; anything the analysis cannot account for
falls back to the fresh machine."""

from __future__ import annotations

import numpy as np
import pytest
from simprog import build

import mcpc
from mcpc.sim import execute as ex
from mcpc.sim import fastpath, numeric
from mcpc.sim.api import from_program, run_program


def _fresh(program, inputs, monkeypatch):
    """A run on a fresh machine, as every run was before the fast path."""
    with monkeypatch.context() as mp:
        mp.setattr(fastpath, "plan", lambda *a: None)
        return run_program(program, inputs).outputs


def _same(a: dict, b: dict) -> None:
    assert set(a) == set(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].tobytes() == b[name].tobytes(), name


def _runs_equal_fresh(result, examples_dir, name, runs, seed, monkeypatch):
    """Run a compiled example ``runs`` times on its own machine (the bundled inputs, then fresh
    random ``x``), each equal to a fresh machine's run bit for bit; the loaded program."""
    program = from_program(result.program)
    with np.load(examples_dir / f"{name}.npz") as data:
        base = dict(data)
    rng = np.random.default_rng(seed)
    for i in range(runs):
        inputs = dict(base, x=rng.standard_normal(base["x"].shape).astype(np.float32)) if i else base
        _same(run_program(program, inputs).outputs, _fresh(from_program(result.program), inputs, monkeypatch))
    return program


@pytest.mark.parametrize("config", ["fp32", "fp16"])
@pytest.mark.parametrize("name", ["mlp", "encoder_block", "decoder_block"])
def test_repeated_runs_with_changing_inputs_equal_fresh_runs(examples_dir, name, config, monkeypatch):
    dims = {"seq": 32} if name == "decoder_block" else None
    result = mcpc.compile(examples_dir / f"{name}.onnx", target="mcp2026-a100", qat_config=config, dims=dims)
    program = _runs_equal_fresh(result, examples_dir, name, 3, 5, monkeypatch)
    st = fastpath.state(program)
    plan = st.plans["main"]
    assert plan is not None and plan.ready  # every slot filled: the lean records run
    cached = [s[0] for s in st.slots.values()]
    # weights prepared once (f16 widened), kept as f32 contiguous tiles and shared across the runs
    assert cached and all(w is not None and w.dtype == np.float32 and w.flags.c_contiguous for w in cached)
    skipped = sum(1 for f, l in zip(plan.full, plan.lean, strict=True) if f[3] is not l[3])
    assert skipped > 0  # weight loads only the slots read are skipped


@pytest.mark.parametrize("config", ["qat_w4a16", "qat_int4_fp8", "qat_mixed"])
@pytest.mark.parametrize("name", ["mlp", "decoder_block"])
def test_quantized_builds_run_on_their_own_machine_with_the_bits_of_fresh_runs(
    examples_dir, name, config, monkeypatch
):
    """QParam groups (setq) and the scale/zero-point tiles they point at are followed by the
    analysis: a matmul_w4a16 keeps its dequantized weight in a slot, the other quantized
    instructions read their tiles each run; every run equals a fresh one bit for bit."""
    dims = {"seq": 32} if name == "decoder_block" else None
    calib = examples_dir / f"{name}.npz"  # the example's inputs calibrate the activation quantizers
    result = mcpc.compile(
        examples_dir / f"{name}.onnx", target="mcp2026-a100", qat_config=config, dims=dims, calib=calib
    )
    program = _runs_equal_fresh(result, examples_dir, name, 4, 7, monkeypatch)
    plan = fastpath.state(program).plans["main"]
    assert plan is not None and plan.ready
    w4 = [r for r in plan.lean if numeric.unwrap(r[3], r[4])[0] is ex._matmul_w4a16_cached]
    n_w4 = sum(1 for op in program.mnemonics if op == "matmul_w4a16")
    if config == "qat_w4a16":
        assert n_w4 > 0 and len(w4) == n_w4  # every weight-quantized matmul from its slot
        slots = [r[4][-1] if r[3] is ex._matmul_w4a16_cached else r[4][1][-1] for r in plan.lean
                 if numeric.unwrap(r[3], r[4])[0] is ex._matmul_w4a16_cached]  # fmt: skip
        assert all(s[0] is not None and s[0].dtype == np.float32 for s in slots)
        skipped = sum(1 for f, l in zip(plan.full, plan.lean, strict=True) if f[3] is not l[3])
        assert skipped > 0  # the code and scale loads only the slots read are skipped
    else:
        assert len(w4) == n_w4


def _scratch_program():
    """y = (scratch + x) where the scratch DRAM row is read before the run stores x + scratch to it:
    a run that does not restore DRAM would see the previous run's store."""
    io = {"inputs": {"x": ("f32", (1, 8))}, "outputs": {"y": ("f32", (1, 8))}}
    _, at = build("halt", **io, scratch=64)
    code = f"""
load dram={at["scratch"]} sram=0x0 rows=1 row_bytes=32 signal=EX
load dram={at["x"]} sram=0x100 rows=1 row_bytes=32 signal=EX
vbin func=add in_dtype=f32 out_dtype=f32 dst=0x200 src0=0x0 src1=0x100 rows=1 cols=8 wait=LD signal=ST
vbin func=add in_dtype=f32 out_dtype=f32 dst=0x300 src0=0x0 src1=0x100 rows=1 cols=8 wait=LD signal=ST
store dram={at["scratch"]} sram=0x200 rows=1 row_bytes=32 wait=EX
store dram={at["y"]} sram=0x300 rows=1 row_bytes=32 wait=EX
halt
"""
    return build(code, **io, scratch=64)[0]


def test_stores_are_undone_before_the_next_run():
    program = from_program(_scratch_program())
    x = {"x": np.arange(8, dtype=np.float32).reshape(1, 8)}
    first = run_program(program, x).outputs["y"]
    assert np.array_equal(first, x["x"])  # scratch starts as zeros
    for _ in range(2):
        assert np.array_equal(run_program(program, x).outputs["y"], first)
    assert fastpath.state(program).plans["main"] is not None


def test_a_store_into_the_constants_falls_back_to_a_fresh_machine():
    io = {"inputs": {"x": ("f32", (1, 8))}, "outputs": {"y": ("f32", (1, 8))}}
    consts = np.full(8, 2.0, np.float32).tobytes()
    _, at = build("halt", **io, constants=consts)
    code = f"""
load dram=0 sram=0x0 rows=1 row_bytes=32
load dram={at["x"]} sram=0x100 rows=1 row_bytes=32 signal=EX
vbin func=mul in_dtype=f32 out_dtype=f32 dst=0x200 src0=0x0 src1=0x100 rows=1 cols=8 wait=LD signal=ST
store dram=0 sram=0x200 rows=1 row_bytes=32 wait=EX
store dram={at["y"]} sram=0x200 rows=1 row_bytes=32
halt
"""
    program = from_program(build(code, **io, constants=consts)[0])
    x = {"x": np.full((1, 8), 3.0, np.float32)}
    for _ in range(3):  # the constant is 2 again in every run (not the 6 the last run stored)
        assert np.array_equal(run_program(program, x).outputs["y"], np.full((1, 8), 6.0, np.float32))
    assert fastpath.state(program).plans["main"] is None


def test_a_program_with_a_gather_runs_on_its_own_machine(monkeypatch):
    """An embedding lookup (gather of constant rows at input indices) then a product with a constant
    weight: the plan is made (a gather does not make the analysis give up) and every run gives the
    bits of a fresh machine."""
    rng = np.random.default_rng(3)
    table = rng.standard_normal((8, 4)).astype(np.float32)
    weight = rng.standard_normal((4, 4)).astype(np.float32)
    consts = table.tobytes() + weight.tobytes()
    io = {"inputs": {"ids": ("i32", (1, 4))}, "outputs": {"y": ("f32", (4, 4))}}
    _, at = build("halt", **io, constants=consts)
    code = f"""
load dram={at["ids"]} sram=0x0 rows=1 row_bytes=16
load dram=128 sram=0x200 rows=1 row_bytes=64
gather dram=0 sram_idx=0x0 count=4 row_bytes=16 dram_stride=16 sram=0x100 sram_stride=16 limit=8 signal=EX
matmul a=0x100 b=0x200 c=0x300 m=4 n=4 k=4 a_stride=4 b_stride=4 c_stride=4 wait=LD signal=ST
store dram={at["y"]} sram=0x300 rows=1 row_bytes=64 wait=EX
halt
"""
    prog = build(code, **io, constants=consts)[0]
    program = from_program(prog)
    for ids in ([[1, 2, 3, 4]], [[7, 0, 0, 5]], [[6, 6, 1, 2]]):
        x = {"ids": np.array(ids, dtype=np.int32)}
        y = run_program(program, x).outputs["y"]
        _same({"y": y}, _fresh(from_program(prog), x, monkeypatch))
        np.testing.assert_allclose(y, table[ids[0]] @ weight, rtol=1e-6)
    assert fastpath.state(program).plans["main"] is not None


def test_a_program_with_vtopk_runs_on_its_own_machine(monkeypatch):
    """Top-k (two destinations) of x times a constant row: the plan is made, runs match fresh ones."""
    consts = np.linspace(-1, 1, 8, dtype=np.float32).tobytes()
    io = {"inputs": {"x": ("f32", (2, 8))}, "outputs": {"v": ("f32", (2, 3)), "i": ("i32", (2, 3))}}
    _, at = build("halt", **io, constants=consts)
    vbin = "vbin func=mul in_dtype=f32 out_dtype=f32 dst=0x200 src0=0x100 src1=0x0 rows=2 cols=8"
    vtopk = "vtopk dtype=f32 dst=0x300 idx=0x400 src=0x200 rows=2 cols=8 topk_k=3 largest=1"
    code = f"""
load dram=0 sram=0x0 rows=1 row_bytes=32
load dram={at["x"]} sram=0x100 rows=1 row_bytes=64 signal=EX
{vbin} dst_stride=8 s0_stride=8 s1_stride=0 wait=LD
{vtopk} src_stride=8 dst_stride=3 idx_stride=3 signal=ST
store dram={at["v"]} sram=0x300 rows=1 row_bytes=24 wait=EX
store dram={at["i"]} sram=0x400 rows=1 row_bytes=24
halt
"""
    prog = build(code, **io, constants=consts)[0]
    program = from_program(prog)
    rng = np.random.default_rng(4)
    for _ in range(3):
        x = {"x": rng.standard_normal((2, 8)).astype(np.float32)}
        _same(run_program(program, x).outputs, _fresh(from_program(prog), x, monkeypatch))
    assert fastpath.state(program).plans["main"] is not None


def test_a_weight_loaded_twice_is_prepared_once(monkeypatch):
    """Two loads of the same constant bytes (to different SRAM places, as for two row tiles) feed
    two matmuls: one slot holds the prepared weight for both, and runs match fresh ones."""
    rng = np.random.default_rng(6)
    weight = rng.standard_normal((4, 4)).astype(np.float16)
    io = {"inputs": {"x": ("f16", (2, 4))}, "outputs": {"y": ("f32", (2, 4))}}
    _, at = build("halt", **io, constants=weight.tobytes())
    mm = "matmul in_dtype=f16 m=1 n=4 k=4 a_stride=4 b_stride=4 c_stride=4"
    code = f"""
load dram=0 sram=0x200 rows=1 row_bytes=32
load dram={at["x"]} sram=0x0 rows=1 row_bytes=16
load dram=0 sram=0x600 rows=1 row_bytes=32 signal=EX
{mm} a=0x0 b=0x200 c=0x300 wait=LD
{mm} a=0x8 b=0x600 c=0x310 signal=ST
store dram={at["y"]} sram=0x300 rows=1 row_bytes=32 wait=EX
halt
"""
    prog = build(code, **io, constants=weight.tobytes())[0]
    program = from_program(prog)
    for _ in range(3):
        x = {"x": rng.standard_normal((2, 4)).astype(np.float16)}
        y = run_program(program, x).outputs["y"]
        _same({"y": y}, _fresh(from_program(prog), x, monkeypatch))
        np.testing.assert_allclose(y, x["x"].astype(np.float32) @ weight.astype(np.float32), rtol=1e-5)
    st = fastpath.state(program)
    assert st.plans["main"] is not None and len(st.slots) == 1


@pytest.mark.parametrize("config", ["fp32", "fp16"])
def test_the_recorded_schedule_gives_the_event_loops_cycles_and_trace(examples_dir, config, monkeypatch):
    """From the run after the plan is made, the handlers run in the recorded order without the event
    loop: outputs, profile and trace equal a fresh run's, and the event loop is not entered."""
    result = mcpc.compile(examples_dir / "encoder_block.onnx", target="mcp2026-a100", qat_config=config)
    program = from_program(result.program)
    with np.load(examples_dir / "encoder_block.npz") as data:
        base = dict(data)
    rng = np.random.default_rng(8)
    for i in range(4):
        inputs = dict(base, x=rng.standard_normal(base["x"].shape).astype(np.float32))
        if i == 3:  # the schedule was recorded on the plan's first run (i == 1)
            monkeypatch.setattr(fastpath, "simulate", _no_event_loop)
        got = run_program(program, inputs, trace=True)
        with monkeypatch.context() as mp:
            mp.setattr(fastpath, "plan", lambda *a: None)
            want = run_program(from_program(result.program), inputs, trace=True)
        _same(got.outputs, want.outputs)
        assert got.profile == want.profile and got.trace_events == want.trace_events
    plan = fastpath.state(program).plans["main"]
    assert plan.static and plan.schedule is not None and len(plan.schedule[0]) == got.profile["instructions"]


def _no_event_loop(*args, **kwargs):
    raise AssertionError("the event loop ran although the schedule was recorded")


def _gather_program():
    rows = np.arange(32, dtype=np.float32).reshape(8, 4)
    io = {"inputs": {"ids": ("i32", (1, 4))}, "outputs": {"y": ("f32", (4, 4))}}
    _, at = build("halt", **io, constants=rows.tobytes())
    neg = "vun func=neg in_dtype=f32 out_dtype=f32 dst=0x200 src=0x100 rows=4 cols=4 src_stride=4"
    code = f"""
load dram={at["ids"]} sram=0x0 rows=1 row_bytes=16
gather dram=0 sram_idx=0x0 count=4 row_bytes=16 dram_stride=16 sram=0x100 sram_stride=16 limit=8 signal=EX
{neg} dst_stride=4 wait=LD signal=ST
store dram={at["y"]} sram=0x200 rows=1 row_bytes=64 wait=EX
halt
"""
    return build(code, **io, constants=rows.tobytes())[0]


def test_a_trap_and_a_cycle_limit_on_a_recorded_schedule_are_those_of_the_event_loop():
    """A data-dependent trap (a gather index out of range) on a replayed schedule names the same
    instruction as the event loop; a cycle limit below the recorded schedule's last issue traps."""
    prog = _gather_program()
    program = from_program(prog)
    good = {"ids": np.array([[1, 2, 3, 7]], dtype=np.int32)}
    for _ in range(3):
        y = run_program(program, good).outputs["y"]
    assert fastpath.state(program).plans["main"].schedule is not None
    np.testing.assert_array_equal(y, -np.arange(32, dtype=np.float32).reshape(8, 4)[[1, 2, 3, 7]])
    bad = {"ids": np.array([[1, 9, 3, 7]], dtype=np.int32)}
    with pytest.raises(mcpc.errors.SimTrap) as fresh:
        run_program(from_program(prog), bad)
    with pytest.raises(mcpc.errors.SimTrap) as replayed:
        run_program(program, bad)
    assert "gather index out of range" in str(fresh.value) and str(replayed.value) == str(fresh.value)
    cycles = run_program(program, good).profile["cycles"]
    with pytest.raises(mcpc.errors.SimTrap, match="cycle limit"):
        run_program(program, good, max_cycles=1)
    assert run_program(program, good, max_cycles=cycles).profile["cycles"] == cycles


def test_a_matmul_with_a_row_count_from_a_register_and_constant_operands(monkeypatch):
    """A matmul whose row count comes from a register (an extent) over constant A and B tiles,
    plus an input-dependent one beside it: the analysis covers the extent at its capacity and never
    treats its (register, capacity, variants) arguments as matmul operands; every run equals a fresh
    one and numpy's product of the first r1 rows."""
    rng = np.random.default_rng(11)
    a = rng.standard_normal((8, 16)).astype(np.float32)
    b = rng.standard_normal((16, 8)).astype(np.float32)
    consts = a.tobytes() + b.tobytes()
    io = {"inputs": {"x": ("f32", (8, 16))}, "outputs": {"y": ("f32", (8, 8)), "z": ("f32", (8, 8))}}
    _, at = build("halt", **io, constants=consts)
    mm = "matmul m=8 n=8 k=16 a_stride=16 b_stride=8 c_stride=8"
    code = f"""
setr reg=1 value=5 signal=LD
load dram=0 sram=0x0 rows=1 row_bytes=512 wait=EX
load dram=512 sram=0x1000 rows=1 row_bytes=512
load dram={at["x"]} sram=0x2000 rows=1 row_bytes=512 signal=EX
{mm} a=0x0 b=0x1000 c=0x3000 m_reg=1 wait=LD
{mm} a=0x2000 b=0x1000 c=0x4000 signal=ST
store dram={at["y"]} sram=0x3000 rows=1 row_bytes=256 wait=EX
store dram={at["z"]} sram=0x4000 rows=1 row_bytes=256
halt
"""
    prog = build(code, **io, constants=consts)[0]
    program = from_program(prog)
    for _ in range(4):
        x = {"x": rng.standard_normal((8, 16)).astype(np.float32)}
        out = run_program(program, x).outputs
        _same(out, _fresh(from_program(prog), x, monkeypatch))
        np.testing.assert_array_equal(out["y"][:5], mcpc.arch.numerics.matmul_tile(a[:5], b))
        assert not out["y"][5:].any()
        np.testing.assert_array_equal(out["z"], mcpc.arch.numerics.matmul_tile(x["x"], b))
    assert fastpath.state(program).plans["main"] is not None
