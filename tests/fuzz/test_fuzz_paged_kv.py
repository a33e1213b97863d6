"""Fuzzing the paged-KV instructions (scatter, vattn, gather with a run-time count): the compiled
paged step (tests/data/paged_step.mcpir) with one of them re-encoded with random field values, or
its word scrambled, is refused when it loads or runs in a Session, functional and timing-only, or
traps as a user error — never a Python exception or a wrong word accepted silently."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
from fuzzlib import FUZZ, user_error_only
from hypothesis import given
from hypothesis import strategies as st

import mcpc
from mcpc.arch import mcpb
from mcpc.arch.isa import INSTR_BYTES, ISA, Instr, encode
from mcpc.errors import EncodeError
from mcpc.ir import parse_module
from mcpc.sim import Session

STEP = (Path(__file__).parents[1] / "data" / "paged_step.mcpir").read_text()
TARGETS = ("scatter", "vattn", "gather")


@pytest.fixture(scope="module")
def paged():
    return mcpc.compile(parse_module(STEP), qat_config="fp32").program


def _inputs(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "q": rng.standard_normal((2, 4, 1, 8)).astype(np.float32),
        "kn": rng.standard_normal((2, 2, 1, 8)).astype(np.float32),
        "vn": rng.standard_normal((2, 2, 1, 8)).astype(np.float32),
        "slot": np.array([0, 4], np.int32), "gather": np.array([0, 1, 0, 0], np.int32),
        "start": np.array([0, 4], np.int32), "len": np.array([1, 1], np.int32),
    }  # fmt: skip


def _value(data, kind: str, bits: int):
    if kind == "u":
        return data.draw(st.one_of(st.integers(0, 64), st.integers(0, (1 << bits) - 1)))
    if kind == "s":
        return data.draw(st.integers(-(1 << (bits - 1)), (1 << (bits - 1)) - 1))
    if kind == "f32":
        return data.draw(st.floats(width=32, allow_nan=True))
    if kind == "dtype":
        return data.draw(st.sampled_from(["f32", "f16", "bf16", "i32", "i8", "i4", "u8", "f8e4m3fn"]))
    return None


@FUZZ
@given(data=st.data())
def test_mutated_paged_kv_instructions_are_refused_or_run(paged, tmp_path_factory, data):
    program = copy.deepcopy(paged)
    instrs = program.instructions()
    which = [i for i, x in enumerate(instrs) if x.op in TARGETS]
    idx = data.draw(st.sampled_from(which))
    buf = bytearray(program.text)
    if data.draw(st.booleans()):  # re-encode with random values of some fields
        spec = ISA[instrs[idx].op]
        changes = {}
        for name, bits, kind in data.draw(st.lists(st.sampled_from(spec.fields), min_size=1, max_size=3)):
            value = _value(data, kind, bits)
            if value is not None:
                changes[name] = value
        try:
            word = encode(Instr(instrs[idx].op, {**instrs[idx].fields, **changes}, instrs[idx].wait,
                                instrs[idx].signal))  # fmt: skip
        except EncodeError:
            return
    else:  # keep the opcode, scramble one byte of the fields
        word = bytearray(buf[idx * INSTR_BYTES : (idx + 1) * INSTR_BYTES])
        word[data.draw(st.integers(1, INSTR_BYTES - 1))] = data.draw(st.integers(0, 255))
    buf[idx * INSTR_BYTES : (idx + 1) * INSTR_BYTES] = word
    program.text = bytes(buf)
    path = tmp_path_factory.mktemp("paged") / "p.mcpb"
    path.write_bytes(mcpb.program_bytes(program))
    blocks = data.draw(st.integers(0, 4))
    timing_only = data.draw(st.booleans())
    with user_error_only(f"instruction {idx} ({instrs[idx].op}) mutated"):
        session = Session(path)
        for seed in range(2):  # twice: the second run takes fastpath's plan when it has one
            session.run(_inputs(np.random.default_rng(seed)), registers={"kv_blocks": blocks},
                        timing_only=timing_only)  # fmt: skip
