"""The loader's fast decoder agrees with the ISA's definition on random words and instructions."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcpc.arch.isa import DTYPE_CODES, ENUMS, INSTR_BYTES, ISA, Instr, decode, encode
from mcpc.errors import InputError
from mcpc.sim.decode import fast_decode

LIVE = sorted(m for m, s in ISA.items() if not s.reserved)


@st.composite
def instructions(draw):
    op = draw(st.sampled_from(LIVE))
    spec = ISA[op]
    fields = {}
    for name, bits, kind in spec.fields:
        if kind == "u":
            fields[name] = draw(st.integers(1 if name in spec.nonzero else 0, (1 << bits) - 1))
        elif kind == "s":
            fields[name] = draw(st.integers(-(1 << (bits - 1)), (1 << (bits - 1)) - 1))
        elif kind == "f32":
            fields[name] = draw(st.floats(width=32, allow_nan=False))
        elif kind == "dtype":
            fields[name] = draw(st.sampled_from(sorted(DTYPE_CODES)))
        else:
            fields[name] = draw(st.sampled_from(ENUMS[kind[5:]]))
    others = [e for e in range(3) if e != spec.engine]
    masks = st.sets(st.sampled_from(others)).map(lambda s: sum(1 << e for e in s))
    return Instr(op, fields, draw(masks), draw(masks))


def _same(word: bytes) -> None:
    try:
        want = decode(word)
    except InputError as exc:
        with pytest.raises(InputError) as info:
            fast_decode(word)
        assert info.value.message == exc.message
        return
    got = fast_decode(word)
    assert (got.op, got.engine, got.wait, got.signal) == (want.op, want.engine, want.wait, want.signal)
    # repr: NaN immediates compare equal, and -0.0 differs from 0.0 (the bits matter)
    assert {k: repr(getattr(got, k)) for k in want.fields} == {k: repr(v) for k, v in want.fields.items()}


@settings(max_examples=300, deadline=None)
@given(instructions())
def test_fast_decode_matches_isa_on_instructions(instr):
    _same(encode(instr))


@settings(max_examples=300, deadline=None)
@given(instructions(), st.integers(0, INSTR_BYTES * 8 - 1))
def test_fast_decode_matches_isa_on_one_bit_flips(instr, bit):
    word = bytearray(encode(instr))
    word[bit // 8] ^= 1 << (bit % 8)
    _same(bytes(word))


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=INSTR_BYTES, max_size=INSTR_BYTES))
def test_fast_decode_matches_isa_on_random_words(word):
    _same(word)
