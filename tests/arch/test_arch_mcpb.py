"""The .mcpb container: round trip, determinism and refusal of every corruption."""

import hashlib
import struct

import pytest

from mcpc.arch.isa import Instr, encode_program
from mcpc.arch.mcpb import SECTION_ORDER, Program, _pack, program_bytes, read_mcpb, section_table, write_mcpb
from mcpc.arch.target import load_target
from mcpc.errors import EncodeError, InputError


def _program(**over):
    target = load_target("mcp2026-edge")
    text = encode_program(
        [
            Instr("load", {"dram": 0x100, "rows": 4, "row_bytes": 64, "dram_stride": 64}, signal=2),
            Instr("vun", {"func": "exp", "rows": 4, "cols": 16, "dst": 0x400}, wait=1, signal=4),
            Instr("store", {"dram": 0x1000, "sram": 0x400, "rows": 4, "row_bytes": 64}, wait=2),
            Instr("halt", {}),
        ]
    )
    kw = dict(
        constants=bytes(range(256)) * 3,
        entries=[{"name": "main", "start": 0, "count": 4}],
        io={"main": {"inputs": [], "outputs": [{"name": "y", "dtype": "f32", "shape": [4, 16]}]}},
        memory_map={"dram_size": 8192, "regions": [], "sram_peak_bytes": 2048},
        debug=[{"ir_op": "mcp.exp", "onnx_node": "/Exp", "op_type": "Exp"}] * 4,
        meta={"compiler_version": "0.1.0", "precision": "fp32", "tolerances": {"rtol": 1e-5, "atol": 1e-6}},
    )
    kw.update(over)
    return Program.for_target(target, text, **kw)


def test_round_trip(tmp_path):
    prog = _program()
    path = tmp_path / "m.mcpb"
    write_mcpb(path, prog)
    back = read_mcpb(path)
    assert back == prog
    assert back.target() == load_target("mcp2026-edge")
    assert back.instructions()[1].func == "exp"
    assert [t for t, *_ in section_table(path)] == list(SECTION_ORDER)
    assert SECTION_ORDER == ("TEXT", "CNST", "ENTR", "IOBD", "MMAP", "DBUG", "TRGT", "META")
    assert all(off % 8 == 0 for _, off, _, _ in section_table(path))
    assert not [p for p in tmp_path.iterdir() if p.name != "m.mcpb"]  # no temp file left behind


def test_bytes_are_deterministic(tmp_path):
    a, b = tmp_path / "a.mcpb", tmp_path / "b.mcpb"
    write_mcpb(a, _program())
    # same content built in a different key order
    meta = {"tolerances": {"atol": 1e-6, "rtol": 1e-5}, "precision": "fp32", "compiler_version": "0.1.0"}
    write_mcpb(b, _program(meta=meta))
    assert a.read_bytes() == b.read_bytes() == program_bytes(_program())


def test_writer_refuses_inconsistent_programs():
    prog = _program()
    prog.target_digest = "0" * 64
    with pytest.raises(EncodeError, match="digest"):
        program_bytes(prog)
    with pytest.raises(EncodeError, match="multiple of 32"):
        program_bytes(Program.for_target(load_target("mcp2026-edge"), b"\0" * 33))
    with pytest.raises(EncodeError, match="section META"):
        program_bytes(_program(meta={"x": float("nan")}))


def _refused(tmp_path, data: bytes, needle: str):
    path = tmp_path / "bad.mcpb"
    path.write_bytes(data)
    with pytest.raises(InputError) as err:
        read_mcpb(path)
    assert "bad.mcpb" in str(err.value) and needle in str(err.value), str(err.value)


@pytest.mark.parametrize("tag", ["TEXT", "CNST", "ENTR", "IOBD", "MMAP", "DBUG", "TRGT", "META"])
def test_flipped_byte_in_each_section_is_refused(tmp_path, tag):
    data = bytearray(program_bytes(_program()))
    _, off, size, _ = next(row for row in section_table(bytes(data)) if row[0] == tag)
    data[off + size // 2] ^= 0x40
    _refused(tmp_path, bytes(data), f"section {tag} CRC mismatch: file is corrupt")


def test_header_corruptions(tmp_path):
    good = program_bytes(_program())
    _refused(tmp_path, b"PK\x03\x04" + good[4:], "not an .mcpb file")
    _refused(tmp_path, b"", "not an .mcpb file")
    _refused(tmp_path, good[:5], "truncated")
    _refused(tmp_path, good[:8] + struct.pack("<HH", 3, 0) + good[12:], "unsupported .mcpb version 3.0")
    # A version-1 file (ISA v1 words) is refused by its version, with the reason.
    v1 = good[:8] + struct.pack("<HH", 1, 0) + good[12:]
    _refused(tmp_path, v1, "unsupported .mcpb version 1.0 (this toolchain reads 2.x)")
    _refused(tmp_path, v1, "recompile the model")
    name_at = 8 + 8 + 2
    flipped = bytearray(good)
    flipped[name_at] ^= 0x01  # a byte of the target name
    _refused(tmp_path, bytes(flipped), "header CRC mismatch")
    for cut in (12, 60, 100, len(good) - 1):
        _refused(tmp_path, good[:cut], "truncated")
    _refused(tmp_path, good + b"\0" * 8, "unexpected bytes")


def _sections(prog: Program, **replace: bytes):
    data = program_bytes(prog)
    out = [(tag, data[off : off + size]) for tag, off, size, _ in section_table(data)]
    return [(tag, replace.get(tag, payload)) for tag, payload in out]


def test_digest_mismatch_is_refused(tmp_path):
    prog = _program()
    other = load_target("mcp2026-a100").canonical_json().encode()
    # a self-consistent file (all CRCs valid) whose header digest is not the TRGT digest
    blob = b"".join(_pack(prog.target_name, bytes.fromhex(prog.target_digest), _sections(prog, TRGT=other)))
    _refused(tmp_path, blob, "target digest in the header does not match")


def test_text_size_and_entries_are_checked(tmp_path):
    prog = _program()
    digest = bytes.fromhex(prog.target_digest)
    blob = b"".join(_pack(prog.target_name, digest, _sections(prog, TEXT=prog.text + b"\0" * 4)))
    _refused(tmp_path, blob, "not a multiple of 32")
    entr = b'[{"name":"x","start":2,"count":9}]'
    blob = b"".join(_pack(prog.target_name, digest, _sections(prog, ENTR=entr)))
    _refused(tmp_path, blob, "runs past the end of TEXT")
    blob = b"".join(_pack(prog.target_name, digest, [s for s in _sections(prog) if s[0] != "DBUG"]))
    _refused(tmp_path, blob, "missing section(s) DBUG")
    assert hashlib.sha256(prog.target_json.encode()).hexdigest() == prog.target_digest


def test_unreadable_path(tmp_path):
    with pytest.raises(InputError, match="cannot read"):
        read_mcpb(tmp_path / "missing.mcpb")


HREG = [{"name": "pos", "reg": 1, "min": 0, "max": 7, "entries": ["main"]}]


def test_host_registers_round_trip_in_an_optional_section(tmp_path):
    plain, with_regs = _program(), _program(host_registers=HREG)
    write_mcpb(tmp_path / "a.mcpb", plain)
    write_mcpb(tmp_path / "b.mcpb", with_regs)
    assert [t for t, *_ in section_table(tmp_path / "a.mcpb")] == list(SECTION_ORDER)
    assert [t for t, *_ in section_table(tmp_path / "b.mcpb")] == [*SECTION_ORDER, "HREG"]
    assert read_mcpb(tmp_path / "a.mcpb").host_registers == []
    assert read_mcpb(tmp_path / "b.mcpb") == with_regs


@pytest.mark.parametrize(
    "bad",
    [
        {"regs": "pos"},
        [dict(HREG[0], reg=0)],
        [dict(HREG[0], reg=16)],
        [dict(HREG[0], min=8)],
        [dict(HREG[0], entries=["decode"])],
        [HREG[0], dict(HREG[0], name="len")],  # two names on one register
        [HREG[0], dict(HREG[0], reg=2)],  # one name twice
        [dict(HREG[0], max=2**31)],
    ],
)
def test_malformed_host_registers_are_refused(tmp_path, bad):
    write_mcpb(tmp_path / "m.mcpb", _program(host_registers=bad))
    with pytest.raises(InputError, match="section HREG"):
        read_mcpb(tmp_path / "m.mcpb")


@pytest.mark.parametrize(
    "region, message",
    [
        ({"name": "kv", "dram": 0, "bytes": 64}, "overlaps a constant region"),
        ({"name": "kv", "dram": 4096, "bytes": 64, "dtype": "f32", "shape": [4, 4]}, None),
        ({"name": "kv", "dram": 4096, "bytes": 64, "dtype": "f32", "shape": [4, 5]}, "do not describe"),
        ({"name": "kv", "dram": 4096, "bytes": 64, "dtype": "q7", "shape": [4, 4]}, "do not describe"),
        ({"name": "", "dram": 4096, "bytes": 64}, "needs a unique name"),
    ],
)
def test_persistent_regions_are_checked_when_loaded(tmp_path, region, message):
    from mcpc.sim.api import load_program

    regions = [
        {"name": "constants", "kind": "const", "dram": 0, "bytes": 768},
        dict(region, kind="persistent"),
    ]
    mm = {"dram_size": 8192, "regions": regions, "sram_peak_bytes": 2048}
    write_mcpb(tmp_path / "m.mcpb", _program(memory_map=mm, io={"main": {"inputs": [], "outputs": []}}))
    if message is None:
        load_program(tmp_path / "m.mcpb")
    else:
        with pytest.raises(InputError, match=message):
            load_program(tmp_path / "m.mcpb")
