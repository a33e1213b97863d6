"""Assembly printing and parsing round-trip."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_arch_isa import instrs

from mcpc.arch.asm import disassemble, format_instr, parse_asm
from mcpc.arch.isa import ISA, Instr, decode, encode, encode_program
from mcpc.errors import ParseError
from mcpc.sim.decode import fast_decode


def test_format_shows_addresses_in_hex_and_only_non_defaults():
    i = Instr(
        "matmul", {"a": 0x1000, "b": 0x2000, "m": 64, "n": 64, "k": 256, "in_dtype": "f16"}, wait=1, signal=4
    )
    line = format_instr(i, 7)
    assert line == "0007  matmul   a=0x1000 b=0x2000 c=0x0 m=64 n=64 k=256 in_dtype=f16 wait=LD signal=ST"
    assert format_instr(Instr("halt", {})) == "halt"
    assert "wait=LD|ST" in format_instr(Instr("nop", {}, wait=5))


def test_disassemble_with_debug_and_bytes():
    prog = [Instr("setr", {"reg": 2, "value": -3}), Instr("halt", {})]
    text = disassemble(prog, [{"ir_op": "mcp.add", "onnx_node": "/Add_1"}, None])
    first, second = text.splitlines()
    assert first.endswith("; /Add_1 (mcp.add)") and first.startswith("0000  setr")
    assert second == "0001  halt"
    assert disassemble(encode_program(prog)) == disassemble(prog)
    assert parse_asm(text) == prog


@settings(max_examples=300, deadline=None)
@given(prog=st.lists(instrs(), max_size=6))
def test_round_trip_random_programs(prog):
    text = disassemble(prog)
    assert parse_asm(text) == prog
    assert disassemble(parse_asm(text)) == text


def test_parser_accepts_hand_written_text():
    text = """
    ; a comment line
    load dram=4096 sram=0x0 rows=2 row_bytes=128 signal=EX
    vbini func=mul dst=0x100 src0=0 imm=0.5 rows=2 cols=32 wait=ld   ; scale
    """
    a, b = parse_asm(text)
    assert a.op == "load" and a.dram == 4096 and a.signal == 2
    assert b.imm == 0.5 and b.wait == 1 and b.func == "mul"


@pytest.mark.parametrize(
    "text, where, needle",
    [
        ("vfoo a=1", "<asm>:1:1", "unknown instruction"),
        ("nop\nload rows=0x100000", "<asm>:2:6", "does not fit u20"),
        ("vbin func=foo", "<asm>:1:6", "not one of"),
        ("load rows", "<asm>:1:6", "expected name=value"),
        ("load nrows=3", "<asm>:1:6", "has no field 'nrows'"),
        ("load rows=abc", "<asm>:1:11", "bad value for rows"),
        ("load wait=XX", "<asm>:1:11", "unknown engine"),
        ("store signal=ST", "<asm>:1:7", "own engine"),
    ],
)
def test_parse_errors_have_location_and_caret(text, where, needle):
    with pytest.raises(ParseError) as err:
        parse_asm(text)
    msg = str(err.value)
    assert msg.startswith(where) and needle in msg and "^" in msg


@pytest.mark.parametrize("mnemonic", sorted(m for m, s in ISA.items() if not s.reserved))
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_every_spec_round_trips_assembler_encoder_decoder_disassembler(mnemonic, data):
    instr = data.draw(instrs(mnemonic))
    text = format_instr(instr)
    parsed = parse_asm(text)
    assert parsed == [instr]
    word = encode(parsed[0])
    decoded = decode(word)
    assert decoded == instr and fast_decode(word).__dict__ == {
        **dict(decoded.fields), "op": decoded.op, "engine": decoded.engine,
        "wait": decoded.wait, "signal": decoded.signal,
    }  # fmt: skip
    assert format_instr(decoded) == text
