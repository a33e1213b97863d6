"""mcpc.sim.Session: persistent buffers kept from run to run, host registers by name, entries.

The ring-buffer program (tests/data/ring_buffer.mcpir) appends a row at a host-set position of a
persistent buffer; it is run more times than the buffer has rows (so the ring wraps) and every
run is compared with numpy and with the IR interpreter running the same module over its own state.
"""

from pathlib import Path

import numpy as np
import pytest

import mcpc
from mcpc.arch.isa import N_REGS
from mcpc.arch.mcpb import read_mcpb, write_mcpb
from mcpc.backend.compile import persistent_ranges
from mcpc.backend.hazards import check_hazards
from mcpc.errors import InputError, SimTrap
from mcpc.ir import parse_module
from mcpc.ir.interpreter import ModuleState, interpret
from mcpc.sim import Session
from mcpc.sim.api import load_program

RING = Path(__file__).parents[1] / "data" / "ring_buffer.mcpir"
ROWS = 8


def ring_module():
    return parse_module(RING.read_text(), str(RING))


@pytest.fixture(scope="module", params=["fp32", "fp16"])
def ring(request):
    module = ring_module()
    result = mcpc.compile(module, target="mcp2026-a100", qat_config=request.param)
    return request.param, module, result


def test_ring_buffer_matches_numpy_and_the_interpreter_over_many_runs(ring):
    precision, module, result = ring
    session = Session(result)
    state = ModuleState(module)  # the compiled module: its buffer is in the build's dtype
    dt = np.float32 if precision == "fp32" else np.float16
    ref = np.zeros((ROWS, 4), dt)
    rng = np.random.default_rng(1)
    for step in range(3 * ROWS + 3):  # the ring wraps three times
        row = rng.integers(-20, 20, (1, 4)).astype(np.float32)  # exact in f16 and in any sum order
        pos = step % ROWS
        out = session.run({"row": row}, entry="append", registers={"pos": pos})
        ref[pos] = row[0]
        total = ref.astype(np.float32).sum(axis=0, keepdims=True)
        np.testing.assert_array_equal(out["total"], total)
        np.testing.assert_array_equal(out["previous"], ref[max(pos - 1, 0)][None].astype(np.float32))
        interp = interpret(module, {"row": row}, "append", state, {"pos": pos})
        for name in out:
            np.testing.assert_array_equal(out[name], interp[name])
        np.testing.assert_array_equal(session.persistent_buffer("buf"), ref)
        assert session.last_profile["cycles"] > 0
    peek = session.run({}, entry="peek", registers={"pos": 5})
    np.testing.assert_array_equal(peek["row"], ref[5][None].astype(np.float32))


def test_timing_only_leaves_the_buffer_and_reset_zeroes_it(ring):
    _, _, result = ring
    session = Session(result)
    row = np.ones((1, 4), np.float32)
    session.run({"row": row}, entry="append", registers={"pos": 2})
    cycles = session.last_profile["cycles"]
    before = session.persistent_buffer("buf").copy()
    assert session.run({"row": 5 * row}, entry="append", registers={"pos": 3}, timing_only=True) == {}
    assert session.last_profile["cycles"] == cycles  # the same cycles as the functional run
    np.testing.assert_array_equal(session.persistent_buffer("buf"), before)
    session.reset()
    assert not session.persistent_buffer("buf").any()
    out = session.run({"row": row}, entry="append", registers={"pos": 0})
    np.testing.assert_array_equal(out["total"], row)


def test_session_takes_a_path_a_program_or_a_loaded_program(ring, tmp_path):
    _, _, result = ring
    path = tmp_path / "ring.mcpb"
    write_mcpb(path, result.program)
    assert read_mcpb(path) == result.program  # HREG and the persistent region round-trip
    for program in (path, str(path), read_mcpb(path), load_program(path)):
        session = Session(program)
        out = session.run({"row": np.ones((1, 4), np.float32)}, "append", {"pos": 7})
        np.testing.assert_array_equal(out["total"], np.ones((1, 4), np.float32))


def test_entries_and_registers_are_checked_by_name(ring):
    _, _, result = ring
    session = Session(result)
    row = {"row": np.zeros((1, 4), np.float32)}
    with pytest.raises(InputError, match=r"2 entry points \(append, peek\)"):
        session.run(row, registers={"pos": 1})
    with pytest.raises(InputError, match=r"no entry point 'main' \(entries: append, peek\)"):
        session.run(row, entry="main", registers={"pos": 1})
    with pytest.raises(InputError, match="reads host register\\(s\\) pos, which are not set"):
        session.run(row, entry="append")
    with pytest.raises(InputError, match=r"value 8 is outside its declared range \[0, 7\]"):
        session.run(row, entry="append", registers={"pos": 8})
    with pytest.raises(InputError, match=r"unknown host register 'len' \(declared: pos\)"):
        session.run(row, entry="append", registers={"pos": 1, "len": 2})


def test_every_entry_passes_the_hazard_check_with_host_registers_unknown(ring):
    _, _, result = ring
    program = result.program
    instrs = program.instructions()
    host = {h["reg"] for h in program.host_registers}
    regs = [None if r in host else 0 for r in range(N_REGS)]
    for e in program.entries:
        entry = instrs[e["start"] : e["start"] + e["count"] - 1]  # without the halt
        assert any(i.fields.get("dram_reg") for i in entry)  # register-offset DMA is emitted
        check_hazards(entry, regs=regs, regions=persistent_ranges(program.memory_map["regions"]))


def test_a_register_offset_store_cannot_leave_its_region(ring):
    """A hand-edited program whose host register range is wider than the buffer: the store that
    would run past the persistent region traps instead of writing the next bytes."""
    _, _, result = ring
    program = read_mcpb_copy(result.program)
    program.host_registers = [dict(h, max=100) for h in program.host_registers]
    session = Session(program)
    with pytest.raises(SimTrap, match="outside its region 'buf'"):
        session.run({"row": np.ones((1, 4), np.float32)}, "append", {"pos": 50})


def read_mcpb_copy(program):
    import copy

    return copy.deepcopy(program)


SHARED = """module @shared {{
  func @{a}(%x: tensor<4x{k}xf32>) -> ("y": tensor<4x{n}xf32>) {{
    %0 = mcp.constant {{value = {w}}} : () -> tensor<{k}x{n}xf32>
    %1 = mcp.matmul %x, %0 {{out = f32}} : (tensor<4x{k}xf32>, tensor<{k}x{n}xf32>) -> tensor<4x{n}xf32>
    mcp.return %1 : (tensor<4x{n}xf32>) -> ()
  }}
{second}}}
"""
SECOND = """  func @{b}(%x: tensor<1x{k}xf32>) -> ("y": tensor<1x{n}xf32>) {{
    %0 = mcp.constant {{value = {w}}} : () -> tensor<{k}x{n}xf32>
    %1 = mcp.matmul %x, %0 {{out = f32}} : (tensor<1x{k}xf32>, tensor<{k}x{n}xf32>) -> tensor<1x{n}xf32>
    %2 = mcp.relu %1 : (tensor<1x{n}xf32>) -> tensor<1x{n}xf32>
    mcp.return %2 : (tensor<1x{n}xf32>) -> ()
  }}
"""


def test_two_entries_over_shared_weights_cost_one_copy():
    from mcpc.arch.mcpb import program_bytes
    from mcpc.ir.printer import format_tensor

    k, n = 256, 512
    w = np.random.default_rng(0).integers(-4, 5, (k, n)).astype(np.float32)
    lit = format_tensor(w).replace("{", "{{").replace("}", "}}")
    fields = {"k": k, "n": n, "w": lit, "a": "prefill", "b": "decode"}
    one = SHARED.format(second="", **fields)
    two = SHARED.format(second=SECOND.format(**fields), **fields)
    progs = {}
    for name, text in (("one", one), ("two", two)):
        progs[name] = mcpc.compile(parse_module(text), qat_config="fp32").program
    weights = w.nbytes
    size_one, size_two = (len(program_bytes(progs[x])) for x in ("one", "two"))
    assert len(progs["two"].constants) == len(progs["one"].constants) == weights
    ratio = size_two / weights
    # the second entry adds its instructions and JSON, never a second copy of the weights
    assert size_two <= weights * 1.02 + (size_one - weights), (size_one, size_two, ratio)
    assert ratio < 1.02, ratio
    print(f"one entry {size_one} bytes, two entries {size_two} bytes, weights {weights}: {ratio:.4f}x")
    session = Session(progs["two"])
    x = np.random.default_rng(1).integers(-3, 4, (4, k)).astype(np.float32)
    np.testing.assert_array_equal(session.run({"x": x}, "prefill")["y"], x @ w)
    np.testing.assert_array_equal(session.run({"x": x[:1]}, "decode")["y"], np.maximum(x[:1] @ w, 0))


def test_run_program_checks_host_registers_by_number_too(ring):
    from mcpc.sim.api import from_program, run_program

    _, _, result = ring
    loaded = from_program(result.program)
    row = {"row": np.ones((1, 4), np.float32)}
    with pytest.raises(InputError, match=r"reads host register\(s\) pos \(r1\), which are not set"):
        run_program(loaded, row, "append")
    with pytest.raises(InputError, match=r"pos \(r1\) = 9 is outside its declared range \[0, 7\]"):
        run_program(loaded, row, "append", registers={1: 9})
    out = run_program(loaded, row, "append", registers={1: 6}).outputs  # one run: a zeroed buffer
    np.testing.assert_array_equal(out["total"], row["row"])
