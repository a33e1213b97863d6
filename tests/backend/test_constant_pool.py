"""The program's constant pool: equal constants (dtype, shape, bytes) stored once across every
function, a hash match confirmed byte for byte, distinct constants never aliased."""

from __future__ import annotations

import numpy as np

from mcpc.backend import constant_pool
from mcpc.backend.constant_pool import ConstantPool
from mcpc.backend.memory import DRAM_ALIGN, plan_dram
from mcpc.ir import Function, Module, TensorType
from mcpc.ir.dtypes import F32
from mcpc.ir.ops import AddOp, ConstantOp, ReturnOp


def test_equal_constants_share_one_entry_and_distinct_ones_do_not():
    pool = ConstantPool(64)
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    a = pool.add(w, "f:a")
    assert pool.add(w.copy(), "g:b") == a
    other_shape = pool.add(w.reshape(4, 3), "f:c")  # same bytes, another tensor
    other_dtype = pool.add(w.view(np.int32), "f:d")
    other_bytes = pool.add(w + 1, "f:e")
    offsets = [a, other_shape, other_dtype, other_bytes]
    assert len(set(offsets)) == 4 and all(o % 64 == 0 for o in offsets)
    assert len(pool.entries) == 4 and pool.references == 5
    assert pool.entries[0].users == ["f:a", "g:b"]
    blob = pool.blob()
    assert len(blob) % 64 == 0
    for entry in pool.entries:
        assert blob[entry.offset : entry.offset + entry.array.nbytes] == entry.array.tobytes()


def test_a_hash_collision_never_aliases_different_bytes(monkeypatch):
    monkeypatch.setattr(constant_pool, "content_key", lambda arr: ("same",))
    pool = ConstantPool(64)
    x, y = np.zeros(4, np.float32), np.ones(4, np.float32)
    assert pool.add(x, "a") != pool.add(y, "b")
    assert pool.add(y.copy(), "c") == pool.entries[1].offset
    assert len(pool.entries) == 2


def _function(name: str, w: np.ndarray) -> Function:
    f = Function(name, [TensorType(w.shape, F32)], ["x"])
    c = f.append(ConstantOp([], {"value": w}, loc=f"{name}.w")).result
    f.append(ReturnOp([f.append(AddOp([f.args[0], c])).result]))
    f.result_names = ["y"]
    return f


def test_constants_belong_to_the_program_not_the_function():
    """Two entry points over the same weight: one copy in CNST, both functions read it."""
    w = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    m = Module("two_entries")
    prefill, decode = m.add_function(_function("prefill", w)), m.add_function(_function("decode", w.copy()))
    m.verify()
    plan = plan_dram(m)
    a, b = prefill.ops[0].result, decode.ops[0].result
    assert plan.placements[a] == plan.placements[b] == 0
    assert len(plan.cnst) == -(-w.nbytes // DRAM_ALIGN) * DRAM_ALIGN
    (const,) = [r for r in plan.buffers if r["kind"] == "const"]
    assert const["users"] == ["prefill:prefill.w", "decode:decode.w"]
    assert plan.regions[0] == {"name": "constants", "kind": "const", "dram": 0, "bytes": len(plan.cnst)}


def test_two_entry_points_over_one_weight_compile_and_run():
    from mcpc.arch.target import load_target
    from mcpc.backend import compile_to_program
    from mcpc.ir.interpreter import interpret
    from mcpc.sim.api import from_program, run_program

    w = np.random.default_rng(1).standard_normal((8, 16)).astype(np.float32)
    m = Module("two_entries")
    m.add_function(_function("prefill", w))
    m.add_function(_function("decode", w.copy()))
    prog = compile_to_program(m, load_target("mcp2026-edge"))
    assert len(prog.constants) == w.nbytes  # 512 bytes: a multiple of the alignment
    loaded = from_program(prog)
    x = np.random.default_rng(2).standard_normal(w.shape).astype(np.float32)
    for entry in ("prefill", "decode"):
        got = run_program(loaded, {"x": x}, entry=entry).outputs["y"]
        np.testing.assert_array_equal(got, interpret(m, {"x": x}, func=entry)["y"])
        np.testing.assert_array_equal(got, x + w)
