"""The .mcpb container: a compiled program for one target, self-describing and CRC-protected.

Layout (all integers little-endian; docs/mcpb.md is the reference)::

    magic        8 bytes  b"MCPB\\0\\r\\n\\x1a"
    version      u16 major (=2), u16 minor (=0)
    flags        u32 (reserved, written 0, ignored by 2.x readers)
    target name  u16 length + utf-8 bytes
    target hash  32 bytes: sha256 of the TRGT payload (the target's canonical JSON)
    sections     u32 count, then count x (tag 4 bytes, u64 offset, u64 size, u32 crc32)
    header crc   u32 crc32 (zlib) of every byte above
    payloads     each starting at an 8-byte aligned file offset, zero padding between

Sections are always written in the order of ``SECTION_ORDER`` and JSON is serialised with sorted
keys and no whitespace, so the same Program always gives byte-identical files.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mcpc.errors import EncodeError, InputError
from mcpc.fileio import write_atomic

from .isa import INSTR_BYTES, ISA_VERSION, Instr, decode_program

MAGIC = b"MCPB\0\r\n\x1a"
VERSION_MAJOR = 2  # TEXT holds ISA v2 words (mcpc.arch.isa.ISA_VERSION)
VERSION_MINOR = 1  # 2.1: the optional HREG section (host registers), MMAP kind "persistent"
SECTION_ORDER = ("TEXT", "CNST", "ENTR", "IOBD", "MMAP", "DBUG", "TRGT", "META")
# Optional sections: written after the required ones, only when the program has what they hold.
OPTIONAL_SECTIONS = {"HREG": "host_registers"}
_JSON_SECTIONS = {"ENTR": "entries", "IOBD": "io", "MMAP": "memory_map", "DBUG": "debug", "META": "meta"}
_FIXED = struct.Struct("<8sHHI")  # magic, major, minor, flags
_ENTRY = struct.Struct("<4sQQI")  # tag, offset, size, crc32
_ALIGN = 8


@dataclass
class Program:
    """Everything a .mcpb holds.  JSON sections are plain Python objects (lists/dicts).

    ``entries``: ``[{"name", "start", "count"}]`` (instruction indices into ``text``);
    ``io``: ``{entry: {"inputs": [...], "outputs": [...]}}`` with ``{name, dtype, shape, dram,
    bytes, onnx_dtype}`` per tensor; ``memory_map``: ``{dram_size, regions, sram_peak_bytes}``;
    ``debug``: one ``{ir_op, onnx_node, op_type}`` per instruction; ``meta``: compiler version,
    precision, tolerances, passes, source model basename.  ``target_digest`` is sha256 hex of
    ``target_json``.  ``host_registers``: ``[{name, reg, min, max, entries}]``, the scalar registers
    the host sets by name for each run (section HREG, written only when there are some).
    """

    target_json: str
    target_name: str
    target_digest: str
    text: bytes
    constants: bytes = b""
    entries: list = field(default_factory=list)
    io: dict = field(default_factory=dict)
    memory_map: dict = field(default_factory=dict)
    debug: list = field(default_factory=list)
    meta: dict = field(default_factory=dict)
    host_registers: list = field(default_factory=list)

    @classmethod
    def for_target(cls, target: Any, text: bytes, **sections: Any) -> Program:
        """A Program whose target fields come from a ``mcpc.arch.target.Target``."""
        return cls(target.canonical_json(), target.name, target.digest(), text, **sections)

    def instructions(self) -> list[Instr]:
        """The decoded TEXT section."""
        return decode_program(self.text)

    def target(self):
        """The embedded target description as a validated Target."""
        from .target import Target

        return Target.from_canonical_json(self.target_json, source=f"TRGT section of {self.target_name}")


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "tolist"):  # numpy scalars and arrays
        return obj.tolist()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def _json_bytes(tag: str, obj: Any) -> bytes:
    try:
        text = json.dumps(
            obj,
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
            allow_nan=False,
            default=_json_default,
        )
    except (TypeError, ValueError) as exc:
        raise EncodeError(f"section {tag}: cannot serialise to JSON: {exc}") from None
    return text.encode("utf-8")


def _pad(n: int) -> int:
    return -n % _ALIGN


def _pack(target_name: str, digest: bytes, sections: list[tuple[str, bytes]]) -> list[bytes]:
    """Header + table + padded payloads as a list of chunks (no validation: the writer checks)."""
    name = target_name.encode("utf-8")
    head_len = _FIXED.size + 2 + len(name) + 32 + 4 + _ENTRY.size * len(sections) + 4
    offset = head_len + _pad(head_len)
    table = []
    for tag, payload in sections:
        table.append(_ENTRY.pack(tag.encode("ascii"), offset, len(payload), zlib.crc32(payload)))
        offset += len(payload) + _pad(len(payload))
    header = b"".join(
        [
            _FIXED.pack(MAGIC, VERSION_MAJOR, VERSION_MINOR, 0),
            struct.pack("<H", len(name)),
            name,
            digest,
            struct.pack("<I", len(sections)),
            *table,
        ]
    )
    header += struct.pack("<I", zlib.crc32(header))
    chunks = [header, bytes(_pad(len(header)))]
    for i, (_, payload) in enumerate(sections):
        chunks.append(payload)
        if i + 1 < len(sections):  # no padding after the last payload: the file ends with it
            chunks.append(bytes(_pad(len(payload))))
    return chunks


def _chunks(program: Program) -> list[bytes]:
    if len(program.text) % INSTR_BYTES:
        raise EncodeError(f"TEXT section of {len(program.text)} bytes is not a multiple of {INSTR_BYTES}")
    trgt = program.target_json.encode("utf-8")
    digest = hashlib.sha256(trgt).digest()
    if digest.hex() != program.target_digest:
        raise EncodeError(
            f"target digest {program.target_digest} does not match the sha256 of target_json "
            f"({digest.hex()}); build the Program with Program.for_target"
        )
    payloads = {"TEXT": bytes(program.text), "CNST": bytes(program.constants), "TRGT": trgt}
    for tag, attr in _JSON_SECTIONS.items():
        payloads[tag] = _json_bytes(tag, getattr(program, attr))
    order = list(SECTION_ORDER)
    for tag, attr in OPTIONAL_SECTIONS.items():
        if getattr(program, attr):
            payloads[tag] = _json_bytes(tag, getattr(program, attr))
            order.append(tag)
    return _pack(program.target_name, digest, [(tag, payloads[tag]) for tag in order])


def program_bytes(program: Program) -> bytes:
    """The exact bytes ``write_mcpb`` would write (EncodeError if the Program is inconsistent)."""
    return b"".join(_chunks(program))


def write_mcpb(path: str | os.PathLike, program: Program) -> None:
    """Write ``program`` atomically: a temp file in the same folder, then os.replace."""
    write_atomic(path, _chunks(program))


class _Reader:
    """Bounds-checked cursor over the file bytes; every short read is reported as truncation."""

    def __init__(self, data: bytes, source: str):
        self.data, self.source, self.pos = data, source, 0

    def take(self, n: int, what: str) -> bytes:
        if self.pos + n > len(self.data):
            raise InputError(f"{self.source}: truncated file (ends inside the {what})")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out


def read_mcpb(path: str | os.PathLike) -> Program:
    """Read and fully verify a .mcpb file.

    Raises InputError naming the file and the reason for: unreadable file, wrong magic, an
    unsupported major version, truncation, a header or section CRC mismatch, a missing or duplicate
    section, a target digest that does not match the embedded TRGT JSON, a TEXT size that is not a
    multiple of 32, malformed JSON or entry points outside TEXT.
    """
    source = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise InputError(f"{source}: cannot read: {exc.strerror or exc}") from None
    return _parse(data, source)


def _parse(data: bytes, source: str) -> Program:
    if data[: len(MAGIC)] != MAGIC:
        if len(data) < len(MAGIC) and MAGIC.startswith(data) and data:
            raise InputError(f"{source}: truncated file (ends inside the magic)")
        raise InputError(f"{source}: not an .mcpb file (bad magic)")
    rd = _Reader(data, source)
    _, major, minor, _flags = _FIXED.unpack(rd.take(_FIXED.size, "header"))
    if major != VERSION_MAJOR:
        why = (
            f": version {major} files hold ISA v{major} instructions, whose encoding ISA v{ISA_VERSION} "
            "changed; recompile the model with this toolchain"
            if major < VERSION_MAJOR
            else ""
        )
        raise InputError(
            f"{source}: unsupported .mcpb version {major}.{minor} (this toolchain reads "
            f"{VERSION_MAJOR}.x){why}"
        )
    (name_len,) = struct.unpack("<H", rd.take(2, "header"))
    name_bytes = rd.take(name_len, "header")
    digest = rd.take(32, "header")
    (count,) = struct.unpack("<I", rd.take(4, "header"))
    if count > 1 << 16:  # a corrupt count; do not try to read billions of table rows
        raise InputError(f"{source}: header is corrupt (section count {count})")
    table = [_ENTRY.unpack(rd.take(_ENTRY.size, "section table")) for _ in range(count)]
    header_end = rd.pos
    (crc,) = struct.unpack("<I", rd.take(4, "header"))
    if zlib.crc32(data[:header_end]) != crc:
        raise InputError(f"{source}: header CRC mismatch: file is corrupt")
    try:
        target_name = name_bytes.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{source}: target name is not valid UTF-8") from None
    payloads: dict[str, bytes] = {}
    end = rd.pos
    for raw_tag, offset, size, sec_crc in table:
        tag = raw_tag.decode("ascii", errors="replace")
        if tag in payloads:
            raise InputError(f"{source}: duplicate section {tag}")
        if offset + size > len(data):
            raise InputError(
                f"{source}: truncated file (section {tag} ends at byte {offset + size}, file has {len(data)})"
            )
        payload = data[offset : offset + size]
        if zlib.crc32(payload) != sec_crc:
            raise InputError(f"{source}: section {tag} CRC mismatch: file is corrupt")
        payloads[tag] = payload
        end = max(end, offset + size)
    if len(data) > end:
        raise InputError(f"{source}: {len(data) - end} unexpected bytes after the last section")
    _check_padding(data, rd.pos, table, source)
    missing = [t for t in SECTION_ORDER if t not in payloads]
    if missing:
        raise InputError(f"{source}: missing section(s) {', '.join(missing)}")
    if hashlib.sha256(payloads["TRGT"]).digest() != digest:
        raise InputError(
            f"{source}: target digest in the header does not match the embedded TRGT description"
        )
    if len(payloads["TEXT"]) % INSTR_BYTES:
        raise InputError(
            f"{source}: TEXT section of {len(payloads['TEXT'])} bytes is not a multiple of {INSTR_BYTES}"
        )
    sections = {attr: _load_json(source, tag, payloads[tag]) for tag, attr in _JSON_SECTIONS.items()}
    for tag, attr in OPTIONAL_SECTIONS.items():
        if tag in payloads:
            sections[attr] = _load_json(source, tag, payloads[tag])
    program = Program(
        target_json=payloads["TRGT"].decode("utf-8", errors="replace"),
        target_name=target_name,
        target_digest=digest.hex(),
        text=payloads["TEXT"],
        constants=payloads["CNST"],
        **sections,
    )
    _check_entries(source, program)
    _check_host_registers(source, program)
    return program


def _check_padding(data: bytes, header_end: int, table: list, source: str) -> None:
    """Bytes outside the header and the sections (alignment padding) must be zero: no CRC covers
    them, so a flipped bit there is found here."""
    covered = sorted([(0, header_end)] + [(offset, offset + size) for _, offset, size, _ in table])
    pos = 0
    for start, stop in covered:
        if start > pos and data[pos:start].strip(b"\0"):
            raise InputError(f"{source}: non-zero padding bytes at offset {pos}: file is corrupt")
        pos = max(pos, stop)


def _load_json(source: str, tag: str, payload: bytes) -> Any:
    try:
        return json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{source}: section {tag} is not valid JSON: {exc}") from None


def _check_entries(source: str, program: Program) -> None:
    n_instr = len(program.text) // INSTR_BYTES
    entries = program.entries
    if not isinstance(entries, list):
        raise InputError(f"{source}: section ENTR must be a list of entry points")
    for e in entries:
        ok = isinstance(e, dict) and isinstance(e.get("name"), str)
        ok = ok and all(isinstance(e.get(k), int) and e[k] >= 0 for k in ("start", "count"))
        if not ok:
            raise InputError(f"{source}: section ENTR: malformed entry point {e!r} (need name, start, count)")
        if e["start"] + e["count"] > n_instr:
            raise InputError(
                f"{source}: entry point {e['name']!r} (start {e['start']}, count {e['count']}) "
                f"runs past the end of TEXT ({n_instr} instructions)"
            )


def _check_host_registers(source: str, program: Program) -> None:
    """HREG: a list of ``{name, reg, min, max, entries}`` with distinct names and registers
    r1..r15, ``min <= max`` within s32, and ``entries`` naming entry points."""
    regs = program.host_registers
    if not isinstance(regs, list):
        raise InputError(f"{source}: section HREG must be a list of host registers")
    entries = {e["name"] for e in program.entries}
    names, numbers = set(), set()

    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    for r in regs:
        ok = isinstance(r, dict) and isinstance(r.get("name"), str) and r["name"] != ""
        ok = ok and all(is_int(r.get(k)) for k in ("reg", "min", "max"))
        ok = ok and isinstance(r.get("entries"), list) and all(e in entries for e in r["entries"])
        ok = ok and 0 < r["reg"] < 16 and -(1 << 31) <= r["min"] <= r["max"] < 1 << 31
        if not ok or r["name"] in names or r["reg"] in numbers:
            raise InputError(
                f"{source}: section HREG: malformed host register {r!r} (need a unique name, a unique "
                "reg in 1..15, s32 min <= max and the entries that read it)"
            )
        names.add(r["name"])
        numbers.add(r["reg"])


def section_table(path_or_bytes: str | os.PathLike | bytes) -> list[tuple[str, int, int, int]]:
    """(tag, offset, size, crc32) of every section, for inspection tools; the file is verified first."""
    data = path_or_bytes if isinstance(path_or_bytes, bytes) else Path(path_or_bytes).read_bytes()
    _parse(data, "<bytes>" if isinstance(path_or_bytes, bytes) else str(path_or_bytes))
    rd = _Reader(data, "")
    rd.take(_FIXED.size, "")
    (name_len,) = struct.unpack("<H", rd.take(2, ""))
    rd.take(name_len + 32, "")
    (count,) = struct.unpack("<I", rd.take(4, ""))
    rows: Iterable = (_ENTRY.unpack(rd.take(_ENTRY.size, "")) for _ in range(count))
    return [(t.decode("ascii"), o, s, c) for t, o, s, c in rows]
