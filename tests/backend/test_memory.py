"""Memory planning: SRAM arenas and row tiling, DRAM liveness reuse, aliases, constants, I/O."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcpc.backend.memory import (
    DRAM_ALIGN,
    SramArena,
    align_up,
    assign_offsets,
    plan_dram,
    rows_that_fit,
)
from mcpc.errors import PassError
from mcpc.ir import DTYPES, Function, Module, TensorType
from mcpc.ir.ops import AddOp, ConstantOp, ExpOp, ReshapeOp, ReturnOp

F32 = DTYPES["f32"]


@st.composite
def live_buffers(draw):
    n = draw(st.integers(1, 40))
    out = []
    for _ in range(n):
        first = draw(st.integers(0, 30))
        last = first + draw(st.integers(0, 10))
        out.append((first, last, draw(st.integers(0, 5000))))
    return out


@settings(max_examples=300, deadline=None)
@given(live_buffers(), st.sampled_from([1, 64, 128]))
def test_live_buffers_never_overlap(buffers, align):
    offsets, total = assign_offsets(buffers, align)
    for i, ((f1, l1, n1), o1) in enumerate(zip(buffers, offsets, strict=True)):
        assert o1 % align == 0 and o1 + max(n1, 1) <= total
        for (f2, l2, n2), o2 in zip(buffers[i + 1 :], offsets[i + 1 :], strict=True):
            if f1 <= l2 and f2 <= l1:  # both live at some op
                assert o1 + max(n1, 1) <= o2 or o2 + max(n2, 1) <= o1, "live buffers overlap"


def test_disjoint_lifetimes_share_memory():
    offsets, total = assign_offsets([(0, 1, 1000), (2, 3, 1000), (4, 5, 1000)])
    assert offsets == [0, 0, 0] and total == align_up(1000, DRAM_ALIGN)
    # a buffer used by op 1 is still live while op 1 defines its result: no in-place reuse
    offsets, _ = assign_offsets([(0, 1, 64), (1, 2, 64)])
    assert offsets[0] != offsets[1]


def test_best_fit_takes_the_smallest_hole():
    bufs = [(0, 9, 64), (0, 1, 512), (0, 9, 64), (0, 1, 128), (0, 9, 64), (2, 9, 128)]
    offsets, _ = assign_offsets(bufs, 64)
    assert offsets[5] == offsets[3]  # the 128-byte hole, not the 512-byte one


def test_sram_arena_allocates_aligned_and_reports_overflow():
    arena = SramArena(1024, 128)
    a = arena.alloc(1, "a")
    ring = arena.ring(2, 100, "x")
    assert a == 0 and ring.addr(0) == 128 and ring.addr(1) == 256 and ring.addr(2) == 128
    assert arena.peak == 384
    with pytest.raises(PassError, match="needs 768 bytes"):
        arena.alloc(700, "big tile")


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 1 << 20),
    st.sampled_from([1, 64, 128]),
    st.integers(1, 2),
    st.lists(st.integers(1, 4096), min_size=1, max_size=3),
    st.lists(st.integers(1, 4096), min_size=0, max_size=2),
    st.integers(0, 4096),
)
def test_rows_that_fit_is_the_largest_that_fits(budget, align, slots, ins, outs, persistent):
    def need(t):
        per = (
            sum(align_up(t * b, align) for b in ins) * slots
            + sum(align_up(t * b, align) for b in outs) * slots
        )
        return per + align_up(persistent, align)

    t = rows_that_fit(budget, align, slots, slots, ins, outs, persistent, max_rows=10_000)
    if t == 0:
        assert need(1) > budget
    else:
        assert need(t) <= budget and (t == 10_000 or need(t + 1) > budget)


def _module(ops_builder):
    f = Function("main", [TensorType((4, 8), F32)], ["x"])
    outs = ops_builder(f)
    f.append(ReturnOp(outs))
    f.result_names = [f"y{i}" for i in range(len(outs))]
    m = Module("t")
    m.add_function(f)
    m.verify()
    return m, f


def test_plan_places_constants_io_and_reuses_scratch():
    c_val = np.arange(32, dtype=np.float32).reshape(4, 8)

    def build(f):
        c = f.append(ConstantOp([], {"value": c_val}, loc="w")).result
        v = f.args[0]
        for i in range(6):  # a chain: each intermediate dies one op later
            v = f.append(ExpOp([v], loc=f"e{i}") if i % 2 else AddOp([v, c], loc=f"a{i}")).result
        r = f.append(ReshapeOp([v], {"shape": [32]}, loc="r")).result
        return [r]

    m, f = _module(build)
    plan = plan_dram(m)
    cst = f.ops[0].result
    assert plan.placements[cst] == 0 and plan.cnst[: c_val.nbytes] == c_val.tobytes()
    assert np.array_equal(plan.constants[cst], c_val)
    kinds = [r["kind"] for r in plan.regions]
    assert kinds == ["const", "input", "output", "scratch"]
    out_region = plan.regions[2]
    reshape = f.ops[-2]
    # the reshape aliases its operand, which lives in the output region
    assert plan.placements[reshape.result] == plan.placements[reshape.operands[0]] == out_region["dram"]
    scratch = plan.regions[3]
    assert scratch["bytes"] <= 2 * align_up(4 * 8 * 4, DRAM_ALIGN)  # 5 intermediates in 2 buffers
    assert plan.size >= scratch["dram"] + scratch["bytes"]
    for v, addr in plan.placements.items():
        assert addr % DRAM_ALIGN == 0 and addr + v.type.nbytes <= plan.size


def test_outputs_aliasing_inputs_and_constants_are_bound_to_their_bytes():
    def build(f):
        c = f.append(ConstantOp([], {"value": np.ones((2, 2), np.float32)})).result
        return [f.append(ReshapeOp([f.args[0]], {"shape": [32]})).result, c]

    m, f = _module(build)
    plan = plan_dram(m)
    assert plan.placements[f.outputs[0]] == plan.placements[f.args[0]]
    assert plan.placements[f.outputs[1]] == 0
    assert "output" not in [r["kind"] for r in plan.regions]


def test_sub_byte_tensors_are_stored_packed_low_nibble_first():
    i4 = DTYPES["i4"]
    w = np.array([[1, -2, 7], [-8, 0, 3], [5, -1, 2]], dtype=i4.np_dtype)  # 9 elements: 5 bytes
    f = Function("main", [TensorType((4, 7), i4)], ["q"])
    c = f.append(ConstantOp([], {"value": w}))
    f.append(ReturnOp([f.args[0], c.result]))
    f.result_names = ["y", "w"]
    m = Module("t")
    m.add_function(f)
    plan = plan_dram(m)
    const = next(b for b in plan.buffers if b["kind"] == "const")
    assert const["bytes"] == 5
    addr = plan.placements[c.result]
    assert list(plan.cnst[addr : addr + 5]) == [0xE1, 0x87, 0x30, 0xF5, 0x02]
    inp = next(r for r in plan.regions if r["kind"] == "input")
    assert inp["bytes"] == 14  # 28 nibbles
    assert plan.placements[f.outputs[0]] == plan.placements[f.args[0]]


def test_packed_constants_and_io_survive_mcpb_and_the_simulator(tmp_path):
    from mcpc.arch.mcpb import write_mcpb
    from mcpc.arch.target import load_target
    from mcpc.backend import compile_to_program
    from mcpc.sim.api import load_program, run_program

    u4, i4 = DTYPES["u4"], DTYPES["i4"]
    rng = np.random.default_rng(3)
    w = rng.integers(0, 16, (3, 5)).astype(u4.np_dtype)
    f = Function("main", [TensorType((7,), i4)], ["q"])
    c = f.append(ConstantOp([], {"value": w}))
    r = f.append(ReshapeOp([c.result], {"shape": [15]}))
    f.append(ReturnOp([f.args[0], r.result]))
    f.result_names = ["y", "w"]
    m = Module("t")
    m.add_function(f)
    prog = compile_to_program(m, load_target("mcp2026-edge"))
    write_mcpb(tmp_path / "p.mcpb", prog)
    q = np.array([-8, 7, 0, -1, 3, 2, -5], dtype=i4.np_dtype)
    out = run_program(load_program(tmp_path / "p.mcpb"), {"q": q}).outputs
    assert out["y"].dtype == i4.np_dtype and np.array_equal(out["y"], q)
    assert out["w"].dtype == u4.np_dtype and np.array_equal(out["w"], w.reshape(15))
