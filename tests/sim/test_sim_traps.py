"""Traps name address, mnemonic and node; corrupt or altered binaries are refused or change behaviour."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from simprog import add_program, build, loaded, x_input

from mcpc.arch.isa import INSTR_BYTES, ISA
from mcpc.arch.mcpb import write_mcpb
from mcpc.errors import InputError, SimTrap
from mcpc.sim.api import load_program, random_inputs, run_program


def test_program_runs_and_matches_numpy():
    res = run_program(loaded(add_program()), x_input())
    x = x_input()["x"]
    np.testing.assert_array_equal(res.outputs["y"], np.exp((x + x).astype(np.float64)).astype(np.float16))


def _trap(code: str, **kw) -> str:
    with pytest.raises(SimTrap) as info:
        run_program(loaded(build(code, node_of=lambda i: f"/block/node{i}", **kw)[0]), {})
    return str(info.value)


def test_sram_overflow_trap_names_instruction_and_node():
    code = "nop\nvun func=copy dst=0x1ffffc src=0 rows=1 cols=4 dst_stride=4 src_stride=4\nhalt"
    msg = _trap(code, target="mcp2026-edge")  # 2 MiB of SRAM
    assert "instruction 1 (0x20) vun" in msg and "/block/node1" in msg and "SRAM overflow" in msg


def test_dram_out_of_range_through_a_register():
    # set on EX, read on LD: the token orders them (without it LD would go first)
    msg = _trap(
        "setr reg=2 value=1000000 signal=LD\nload dram=0 dram_reg=2 sram=0 rows=1 row_bytes=4 wait=EX"
    )
    assert "instruction 1 (0x20) load" in msg and "/block/node1" in msg and "DRAM address out of range" in msg


def test_gather_index_out_of_range():
    msg = _trap("gather dram=0 sram_idx=0 count=1 row_bytes=4 sram=0x40 limit=0\nhalt")
    assert "instruction 0 (0x0) gather" in msg and "gather index out of range" in msg


def test_deadlock_when_no_token_ever_arrives():
    msg = _trap("load dram=0 sram=0 rows=1 row_bytes=4 wait=EX\nhalt")
    assert "token deadlock" in msg and "instruction 0 (0x0) load" in msg
    assert "waits for a token from EX" in msg


def test_illegal_word_traps_only_when_executed():
    program = add_program()
    reserved = ISA["entry"].opcode.to_bytes(1, "little") + bytes(INSTR_BYTES - 1)
    program.text = program.text + reserved  # after halt: never dispatched
    program.entries = [{"name": "main", "start": 0, "count": 6}]
    run_program(loaded(program), x_input())
    program.text = reserved + program.text[INSTR_BYTES:]
    expect = r"instruction 0 \(0x0\) illegal\(opcode 18\).*: illegal instruction: reserved opcode 18"
    with pytest.raises(SimTrap, match=expect):
        run_program(loaded(program), x_input())


def test_corrupt_file_is_refused(tmp_path):
    path = tmp_path / "p.mcpb"
    write_mcpb(path, add_program())
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # inside the last section (META)
    path.write_bytes(bytes(data))
    with pytest.raises(InputError, match="CRC mismatch"):
        load_program(path)
    path.write_bytes(b"ELF\0" + bytes(60))
    with pytest.raises(InputError, match="not an .mcpb file"):
        load_program(path)


def _flipped(program, idx: int, word: bytes):
    text = bytearray(program.text)
    text[idx * INSTR_BYTES : (idx + 1) * INSTR_BYTES] = word
    program.text = bytes(text)  # written by write_mcpb with fresh CRCs, as a compiler would
    return program


@pytest.mark.parametrize("idx", range(5))
@pytest.mark.parametrize("how", ["invert", "opcode-bit0", "opcode-bit1", "first-field-bit"])
def test_altered_instruction_word_changes_outputs_or_traps(tmp_path, idx, how):
    reference = run_program(loaded(add_program()), x_input()).outputs["y"]
    program = add_program()
    word = bytearray(program.text[idx * INSTR_BYTES : (idx + 1) * INSTR_BYTES])
    if how == "invert":
        word = bytearray(b ^ 0xFF for b in word)
    elif how.startswith("opcode"):
        word[0] ^= 1 << int(how[-1])
    else:
        word[1] ^= 1 << 6  # bit 14: the lowest bit of the first field
    path = tmp_path / "p.mcpb"
    write_mcpb(path, _flipped(program, idx, bytes(word)))
    try:
        got = run_program(load_program(path), x_input()).outputs["y"]
    except SimTrap:
        return
    assert not np.array_equal(got, reference, equal_nan=True)


def test_random_inputs_follow_the_bindings():
    p = loaded(add_program())
    a, b = random_inputs(p, "main", seed=5), random_inputs(p, "main", seed=5)
    assert a["x"].dtype == np.float32 and a["x"].shape == (4, 8)
    np.testing.assert_array_equal(a["x"], b["x"])


def test_input_errors_name_the_input():
    p = loaded(add_program())
    with pytest.raises(InputError, match="missing x"):
        run_program(p, {})
    with pytest.raises(InputError, match=r"input 'x': shape \(4,\)"):
        run_program(p, {"x": np.zeros(4, np.float32)})
    with pytest.raises(InputError, match="input 'x': dtype float64 cannot be converted losslessly"):
        run_program(p, {"x": np.full((4, 8), 0.1)})
    run_program(p, {"x": np.zeros((4, 8))})  # exact float64 zeros are accepted
    with pytest.raises(InputError, match="no entry point 'decode'"):
        run_program(p, {}, entry="decode")


def test_simulator_imports_no_compiler_and_no_onnx():
    code = (
        "import mcpc.sim.api, mcpc.sim.cli, sys; "
        "bad = [m for m in sys.modules if m.startswith(('onnx', 'mcpc.ir', 'mcpc.passes', 'mcpc.backend'))]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
