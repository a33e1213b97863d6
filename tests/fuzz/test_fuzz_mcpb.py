"""Fuzzing the .mcpb door: files truncated at every section, bits flipped, other versions, and
well-formed containers (CRCs and digests recomputed) whose sections carry hostile content: I/O
bindings, memory maps, entry points, instruction words, debug and target JSON.  Loading and running
each one (with random inputs) succeeds or is refused as a user error, without allocating what a
hostile size asks for."""

from __future__ import annotations

import copy
import hashlib
import json
import struct
import zlib

import pytest
from fuzzlib import FUZZ, tiny_mlp, user_error_only
from hypothesis import given
from hypothesis import strategies as st

import mcpc
from mcpc.arch import mcpb
from mcpc.arch.isa import INSTR_BYTES
from mcpc.sim.api import random_inputs, run_program
from mcpc.sim.loader import load_program

HOSTILE = st.one_of(
    st.sampled_from([-1, 0, 1, 3, 2**31, 2**40, 2**63, -(2**63), 10**30, 0.5, None, "", "f16", "i4", [], {}]),
    st.integers(-(2**64), 2**64),
    st.lists(st.sampled_from([-1, 0, 1, 2, 2**31, 2**40]), max_size=5),
)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """The tiny MLP compiled in both builds: (Program, file bytes) per build."""
    model = tmp_path_factory.mktemp("mcpb") / "mlp.onnx"
    model.write_bytes(tiny_mlp().SerializeToString())
    out = {}
    for config in ("fp32", "fp16"):
        program = mcpc.compile(str(model), qat_config=config, dims={"batch": 2}).program
        out[config] = (program, mcpb.program_bytes(program))
    return out


def _load_and_run(path, what: str) -> None:
    with user_error_only(what):
        loaded = load_program(path)
        for entry in loaded.entries:
            run_program(loaded, random_inputs(loaded, entry), entry=entry)


def _with_header_field(data: bytes, major: int, minor: int) -> bytes:
    """``data`` with another version, the header CRC recomputed so only the version is wrong."""
    name_len = struct.unpack_from("<H", data, 16)[0]
    (count,) = struct.unpack_from("<I", data, 18 + name_len + 32)
    header_end = 18 + name_len + 32 + 4 + 28 * count
    head = bytearray(data[:header_end])
    struct.pack_into("<HH", head, 8, major, minor)
    return bytes(head) + struct.pack("<I", zlib.crc32(head)) + data[header_end + 4 :]


@FUZZ
@given(data=st.data(), build=st.sampled_from(["fp32", "fp16"]))
def test_corrupted_files_are_refused(base, tmp_path_factory, data, build):
    _, raw = base[build]
    how = data.draw(st.sampled_from(["truncate", "flip", "version", "append"]))
    if how == "truncate":
        raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
    elif how == "flip":
        buf = bytearray(raw)
        for pos in data.draw(st.lists(st.integers(0, len(raw) - 1), min_size=1, max_size=16, unique=True)):
            buf[pos] ^= 1 << data.draw(st.integers(0, 7))
        raw = bytes(buf)
    elif how == "version":
        major = data.draw(st.integers(0, 0xFFFF).filter(lambda v: v != mcpb.VERSION_MAJOR))
        raw = _with_header_field(raw, major, data.draw(st.integers(0, 0xFFFF)))
    else:
        raw = raw + data.draw(st.binary(min_size=1, max_size=64))
    path = tmp_path_factory.mktemp("bad") / "p.mcpb"
    path.write_bytes(raw)
    with pytest.raises(mcpc.errors.InputError):
        load_program(path)


def _set(container, data) -> None:
    """Replace one field somewhere inside a JSON-like ``container`` with a hostile value."""
    node = container
    while True:
        keys = list(node.keys()) if isinstance(node, dict) else list(range(len(node)))
        if not keys:
            return
        key = data.draw(st.sampled_from(keys))
        child = node[key]
        if isinstance(child, (dict, list)) and child and data.draw(st.booleans()):
            node = child
            continue
        node[key] = data.draw(HOSTILE)
        return


@FUZZ
@given(data=st.data(), build=st.sampled_from(["fp32", "fp16"]))
def test_hostile_sections_are_refused_or_run(base, tmp_path_factory, data, build):
    program = copy.deepcopy(base[build][0])
    section = data.draw(st.sampled_from(["io", "memory_map", "entries", "text", "debug", "meta", "target"]))
    if section == "text":
        n = len(program.text) // INSTR_BYTES
        buf = bytearray(program.text)
        for _ in range(data.draw(st.integers(1, 4))):
            i = data.draw(st.integers(0, n - 1))
            if data.draw(st.booleans()):
                buf[i * INSTR_BYTES : (i + 1) * INSTR_BYTES] = data.draw(
                    st.binary(min_size=INSTR_BYTES, max_size=INSTR_BYTES)
                )
            else:  # keep the opcode, scramble the fields
                pos = i * INSTR_BYTES + data.draw(st.integers(1, INSTR_BYTES - 1))
                buf[pos] = data.draw(st.integers(0, 255))
        program.text = bytes(buf)
    elif section == "target":
        target = json.loads(program.target_json)
        _set(target, data)
        program.target_json = json.dumps(target)
        program.target_digest = hashlib.sha256(program.target_json.encode()).hexdigest()
    else:
        container = getattr(program, section)
        if isinstance(container, (dict, list)) and container:
            _set(container, data)
        else:
            setattr(program, section, data.draw(HOSTILE))
    try:
        raw = mcpb.program_bytes(program)
    except mcpc.errors.EncodeError:
        return  # not representable as a file (e.g. a float where JSON allows none)
    path = tmp_path_factory.mktemp("hostile") / "p.mcpb"
    path.write_bytes(raw)
    _load_and_run(path, f"{section} mutated")


def test_a_good_file_still_runs(base, tmp_path):
    for build, (_, raw) in base.items():
        path = tmp_path / f"{build}.mcpb"
        path.write_bytes(raw)
        loaded = load_program(path)
        assert run_program(loaded, random_inputs(loaded, "main")).outputs["y"].shape == (2, 8)


@pytest.fixture(scope="module")
def stateful():
    """The ring-buffer program (persistent region, host register, two entries), fp32 build."""
    from pathlib import Path

    from mcpc.ir import parse_module

    text = (Path(__file__).parents[1] / "data" / "ring_buffer.mcpir").read_text()
    return mcpc.compile(parse_module(text), qat_config="fp32").program


@FUZZ
@given(data=st.data())
def test_hostile_state_sections_are_refused_or_run(stateful, tmp_path_factory, data):
    """HREG and the persistent regions of MMAP mutated: the file is refused, or every entry runs
    in a Session (registers at their declared bounds) or traps as a user error."""
    from mcpc.sim import Session

    program = copy.deepcopy(stateful)
    section = data.draw(st.sampled_from(["host_registers", "memory_map", "entries"]))
    container = getattr(program, section)
    if data.draw(st.booleans()):
        _set(container, data)
    else:
        setattr(program, section, data.draw(HOSTILE))
    try:
        raw = mcpb.program_bytes(program)
    except mcpc.errors.EncodeError:
        return
    path = tmp_path_factory.mktemp("state") / "p.mcpb"
    path.write_bytes(raw)
    with user_error_only(f"{section} mutated"):
        session = Session(path)
        for entry in session.entries:
            for bound in ("min", "max"):
                regs = {h["name"]: h[bound] for h in session.program.program.host_registers}
                session.run(random_inputs(session.program, entry), entry, regs)
