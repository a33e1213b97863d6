"""ISA v2 table invariants and encode/decode round trips (hypothesis)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcpc.arch.isa import (
    DTYPE_CODES,
    ENUMS,
    HEADER_BITS,
    INSTR_BITS,
    INSTR_BYTES,
    ISA,
    OPCODES,
    Instr,
    decode,
    decode_program,
    encode,
    encode_program,
)
from mcpc.errors import EncodeError, InputError

LIVE = sorted(m for m, s in ISA.items() if not s.reserved)
RESERVED = sorted(m for m, s in ISA.items() if s.reserved)


def _value(kind: str, bits: int):
    if kind == "u":
        return st.integers(0, (1 << bits) - 1)
    if kind == "s":
        return st.integers(-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    if kind == "f32":
        return st.floats(width=32, allow_nan=False)
    if kind == "dtype":
        return st.sampled_from(sorted(DTYPE_CODES))
    return st.sampled_from(ENUMS[kind[5:]])


@st.composite
def instrs(draw, mnemonic=None):
    op = draw(st.sampled_from(LIVE)) if mnemonic is None else mnemonic
    spec = ISA[op]
    fields = {name: draw(_value(kind, bits)) for name, bits, kind in spec.fields}
    for name in spec.nonzero:  # setr r0, salu rd=0 are refused by the encoder
        fields[name] = fields[name] or 1
    own = 1 << spec.engine
    wait = draw(st.integers(0, 7)) & ~own
    signal = draw(st.integers(0, 7)) & ~own
    return Instr(op, fields, wait, signal)


def test_table_is_consistent():
    assert sorted(OPCODES) == list(range(len(ISA)))
    for spec in ISA.values():
        assert HEADER_BITS + sum(b for _, b, _ in spec.fields) <= INSTR_BITS
    assert "kvcomp" in LIVE and "kvdecomp" in LIVE and "entry" in RESERVED
    assert {"setq", "salu", "vtopk"} <= set(LIVE)
    assert DTYPE_CODES == {
        "f32": 0, "f16": 1, "bf16": 2, "i32": 3, "i8": 4, "u8": 5,
        "i4": 6, "u4": 7, "f8e4m3fn": 8, "i1": 9, "i64": 10,
    }  # fmt: skip


@pytest.mark.parametrize("mnemonic", LIVE)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_round_trip_every_mnemonic(mnemonic, data):
    instr = data.draw(instrs(mnemonic))
    word = encode(instr)
    assert len(word) == INSTR_BYTES
    back = decode(word)
    assert back == instr
    assert encode(back) == word


@settings(max_examples=300, deadline=None)
@given(instr=instrs(), bit=st.integers(0, 7))
def test_opcode_bit_flip_never_aliases(instr, bit):
    word = bytearray(encode(instr))
    word[0] ^= 1 << bit
    try:
        other = decode(bytes(word))
    except InputError:
        return
    assert other.op != instr.op


def test_defaults_and_attribute_access():
    i = Instr("matmul", {"m": 4})
    assert i.m == 4 and i.n == 0 and i.in_dtype == "f32" and i.acc == 0
    assert Instr("vun", {}).func == "copy"
    assert i.engine == 1 and i.spec.mnemonic == "matmul"
    assert i == Instr("matmul", {"m": 4, "in_dtype": "f32"})
    assert hash(i) == hash(Instr("matmul", {"m": 4}))
    with pytest.raises(AttributeError):
        _ = i.rows


def test_f32_immediate_is_rounded_to_float32():
    i = Instr("vbini", {"imm": 0.1})
    assert decode(encode(i)) == i
    assert i.imm != 0.1 and abs(i.imm - 0.1) < 1e-8


@pytest.mark.parametrize(
    "instr, needle",
    [
        (Instr("load", {"rows": 1 << 20}), "rows"),
        (Instr("load", {"dram": 1 << 40}), "dram"),
        (Instr("setr", {"reg": 1, "value": 1 << 31}), "value"),
        (Instr("matmul", {"m": -1}), "m"),
        (Instr("vbini", {"imm": 1e39}), "imm"),
        (Instr("setr", {"reg": 0, "value": 3}), "r0"),
        (Instr("load", {}, wait=1), "own engine"),
        (Instr("matmul", {}, signal=2), "own engine"),
        (Instr("nop", {}, wait=8), "wait"),
        (Instr("entry", {}), "reserved"),
    ],
)
def test_encode_rejects(instr, needle):
    with pytest.raises(EncodeError, match=needle) as err:
        encode(instr)
    assert instr.op in str(err.value)


@pytest.mark.parametrize(
    "fields, needle",
    [({"bogus": 1}, "unknown field"), ({"in_dtype": "f17"}, "not a dtype"), ({"m": 1.5}, "integer")],
)
def test_construction_rejects(fields, needle):
    with pytest.raises(EncodeError, match=needle):
        Instr("matmul", fields)
    with pytest.raises(EncodeError, match="unknown instruction"):
        Instr("vfoo", {})


def _word(bits: int) -> bytes:
    return bits.to_bytes(INSTR_BYTES, "little")


def test_decode_rejects_bad_words():
    with pytest.raises(InputError, match="instruction 3 .*opcode 0"):
        decode(bytes(INSTR_BYTES), 3)
    with pytest.raises(InputError, match="reserved opcode"):
        decode(_word(ISA["entry"].opcode))
    with pytest.raises(InputError, match="unknown opcode 200"):
        decode(_word(200), 0)
    with pytest.raises(InputError, match="reserved bits"):
        decode(_word(ISA["nop"].opcode | 1 << 200))
    with pytest.raises(InputError, match="own engine"):
        decode(_word(ISA["load"].opcode | 1 << 8))  # wait bit for LD on an LD instruction
    with pytest.raises(InputError, match="32 bytes"):
        decode(b"\x01" * 31)
    # matmul in_dtype sits after a,b,c (96) + m,n,k (48) + strides (60)
    with pytest.raises(InputError, match="bad dtype code 15"):
        decode(_word(ISA["matmul"].opcode | 15 << (HEADER_BITS + 204)))
    with pytest.raises(InputError, match="bad vbin code 12"):
        decode(_word(ISA["vbin"].opcode | 12 << HEADER_BITS))
    with pytest.raises(InputError, match="r0"):
        decode(_word(ISA["setr"].opcode))


def test_program_round_trip_and_errors():
    prog = [Instr("load", {"rows": 2, "row_bytes": 64}, signal=2), Instr("halt", {}, wait=1)]
    blob = encode_program(prog)
    assert decode_program(blob) == prog
    with pytest.raises(InputError, match="multiple of 32"):
        decode_program(blob[:-1])
    with pytest.raises(EncodeError, match="instruction 1: load"):
        encode_program([Instr("nop", {}), Instr("load", {"rows": -1})])
