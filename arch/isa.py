"""MCP 2026 ISA v2: one spec per instruction kept as data, and the generic encoder/decoder driven by it.

The table lives in ``mcpc.arch.isa_table``; every public name of it is re-exported here.

Every instruction is a fixed-width 256-bit (32-byte) little-endian word.  Bits are packed
LSB-first: the common header ``opcode u8 | wait u3 | signal u3`` (bits 0..13), then the
instruction's fields in table order.  Bits above the last field must be zero.

Engines: 0 = LD (DMA in), 1 = EX (compute), 2 = ST (DMA out).  ``wait`` bit e pops one dependency
token sent by engine e to this instruction's engine before issue; ``signal`` bit e pushes one token
to engine e on completion (counting semaphores per ordered engine pair, as in VTA).  Bits for the
instruction's own engine must be zero.

Opcodes are numbered sequentially and never reused; reserved opcodes are in the table (so their
numbers are taken) but ``encode`` refuses them and ``decode`` reports them.  Opcode 0 is reserved
so that a zeroed word never executes.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from mcpc.errors import EncodeError, InputError

# The table is data in its own module; its names stay importable from here, where callers look.
from .isa_table import (  # noqa: F401
    ADDRESS_FIELDS,
    DTYPE_BITS,
    DTYPE_BYTES,
    DTYPE_CODES,
    DTYPE_NAMES,
    ENGINES,
    ENUM_BITS,
    ENUMS,
    EX,
    FIELD_DOCS,
    HEADER_BITS,
    INSTR_BITS,
    INSTR_BYTES,
    ISA,
    ISA_VERSION,
    LD,
    LIVE,
    N_REGS,
    OPCODES,
    SFU_FUNCS,
    ST,
    Access,
    InstrSpec,
    resolve,
    vattn_heat_offset,
)


def _normalise(spec: InstrSpec, name: str, kind: str, value: Any) -> Any:
    if kind == "f32":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise EncodeError(f"{spec.mnemonic}: field {name} must be a number, got {value!r}")
        try:  # round to float32 now so that decode(encode(i)) == i
            return struct.unpack("<f", struct.pack("<f", float(value)))[0]
        except OverflowError:
            return float(value)  # encode reports it with the field width
    if kind == "dtype":
        if value not in DTYPE_CODES:
            raise EncodeError(
                f"{spec.mnemonic}: field {name} = {value!r} is not a dtype ({', '.join(DTYPE_CODES)})"
            )
        return value
    if kind.startswith("enum:"):
        names = ENUMS[kind[5:]]
        if value not in names:
            raise EncodeError(f"{spec.mnemonic}: field {name} = {value!r} is not one of {', '.join(names)}")
        return value
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise EncodeError(f"{spec.mnemonic}: field {name} must be an integer, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class Instr:
    """One decoded instruction.  ``fields`` always holds every field of the mnemonic (missing ones
    are filled with defaults), so two instructions are equal iff they encode to the same word.

    Field values: int for u/s kinds, float (float32-exact) for f32, dtype name for dtype, enum
    name for enum.  ``wait``/``signal`` are 3-bit engine masks.  Fields read as attributes
    (``i.rows``).  Construction checks names and kinds (EncodeError); ``encode`` checks ranges.
    """

    op: str
    fields: Mapping[str, int | float | str]
    wait: int = 0
    signal: int = 0

    def __post_init__(self) -> None:
        spec = ISA.get(self.op)
        if spec is None:
            raise EncodeError(f"unknown instruction {self.op!r} (known: {', '.join(ISA)})")
        given = dict(self.fields)
        unknown = sorted(set(given) - set(spec.field_names))
        if unknown:
            raise EncodeError(
                f"{self.op}: unknown field(s) {', '.join(unknown)} (fields: {', '.join(spec.field_names)})"
            )
        full = spec.defaults()
        for name, _, kind in spec.fields:
            if name in given:
                full[name] = _normalise(spec, name, kind, given[name])
        object.__setattr__(self, "fields", full)

    def __hash__(self) -> int:
        return hash((self.op, tuple(self.fields.items()), self.wait, self.signal))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or "fields" not in self.__dict__:
            raise AttributeError(name)
        try:
            return self.__dict__["fields"][name]
        except KeyError:
            raise AttributeError(f"{self.op} has no field {name!r}") from None

    @property
    def spec(self) -> InstrSpec:
        return ISA[self.op]

    @property
    def engine(self) -> int:
        """Index into ENGINES of the queue that executes this instruction."""
        return ISA[self.op].engine

    def replace(self, **changes: Any) -> Instr:
        """A copy with some fields (or ``wait``/``signal``) changed."""
        wait = changes.pop("wait", self.wait)
        signal = changes.pop("signal", self.signal)
        return Instr(self.op, {**self.fields, **changes}, wait, signal)


def _check_tokens(instr: Instr) -> None:
    for label, mask in (("wait", instr.wait), ("signal", instr.signal)):
        if isinstance(mask, bool) or not isinstance(mask, int) or not 0 <= mask < 8:
            raise EncodeError(f"{instr.op}: {label}={mask!r} does not fit 3 bits (engine mask 0..7)")
        if mask & (1 << instr.engine):
            raise EncodeError(
                f"{instr.op}: {label} names its own engine {ENGINES[instr.engine]} "
                "(tokens only flow between different engines)"
            )


def encode(instr: Instr) -> bytes:
    """Encode one instruction into its 32-byte word.

    Raises EncodeError naming the mnemonic, field, value and width when a value does not fit, for a
    reserved opcode, for own-engine token bits and for a register field that must not be r0
    (``setr r0``, ``salu rd=0``).
    """
    spec = instr.spec
    if spec.reserved:
        raise EncodeError(
            f"{instr.op}: opcode {spec.opcode} is reserved in ISA v{ISA_VERSION} and cannot be encoded"
        )
    _check_tokens(instr)
    for name in spec.nonzero:
        if instr.fields[name] == 0:
            raise EncodeError(f"{instr.op}: {name}=r0 is hard-wired to 0 and cannot be set")
    word = spec.opcode | (instr.wait << 8) | (instr.signal << 11)
    pos = HEADER_BITS
    for name, bits, kind in spec.fields:
        word |= _field_bits(spec, name, bits, kind, instr.fields[name]) << pos
        pos += bits
    return word.to_bytes(INSTR_BYTES, "little")


def _field_bits(spec: InstrSpec, name: str, bits: int, kind: str, value: Any) -> int:
    def too_big(rng: str) -> EncodeError:
        return EncodeError(f"{spec.mnemonic}: field {name} = {value!r} does not fit {kind}{bits} ({rng})")

    if kind == "u":
        if not 0 <= value < 1 << bits:
            raise too_big(f"0..{(1 << bits) - 1}")
        return value
    if kind == "s":
        lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        if not lo <= value <= hi:
            raise too_big(f"{lo}..{hi}")
        return value & ((1 << bits) - 1)
    if kind == "f32":
        try:
            return struct.unpack("<I", struct.pack("<f", value))[0]
        except OverflowError:
            raise too_big("float32 range") from None
    if kind == "dtype":
        return DTYPE_CODES[value]
    return ENUMS[kind[5:]].index(value)


def _where(addr: int | None) -> str:
    return "instruction word" if addr is None else f"instruction {addr} (byte offset {addr * INSTR_BYTES:#x})"


def decode(word: bytes, addr: int | None = None) -> Instr:
    """Decode one 32-byte word.  Raises InputError naming ``addr`` (an instruction index) for a
    wrong length, an unknown or reserved opcode, a bad dtype/enum code, own-engine token bits or
    non-zero bits above the last field, or a register field that must not be r0."""
    if len(word) != INSTR_BYTES:
        raise InputError(f"{_where(addr)}: expected {INSTR_BYTES} bytes, got {len(word)}")
    bits_all = int.from_bytes(word, "little")
    opcode = bits_all & 0xFF
    spec = OPCODES.get(opcode)
    if spec is None or spec.reserved:
        state = "reserved" if spec is not None else "unknown"
        raise InputError(f"{_where(addr)}: {state} opcode {opcode} (0x{opcode:02x})")
    wait, signal = (bits_all >> 8) & 7, (bits_all >> 11) & 7
    if (wait | signal) & (1 << spec.engine):
        raise InputError(f"{_where(addr)}: {spec.mnemonic} has token bits for its own engine")
    values: dict[str, Any] = {}
    pos = HEADER_BITS
    for name, bits, kind in spec.fields:
        raw = (bits_all >> pos) & ((1 << bits) - 1)
        pos += bits
        if kind == "s" and raw >> (bits - 1):
            raw -= 1 << bits
        if kind == "f32":
            values[name] = struct.unpack("<f", struct.pack("<I", raw))[0]
        elif kind == "dtype":
            if raw not in DTYPE_NAMES:
                raise InputError(f"{_where(addr)}: {spec.mnemonic}.{name} has bad dtype code {raw}")
            values[name] = DTYPE_NAMES[raw]
        elif kind.startswith("enum:"):
            names = ENUMS[kind[5:]]
            if raw >= len(names):
                raise InputError(f"{_where(addr)}: {spec.mnemonic}.{name} has bad {kind[5:]} code {raw}")
            values[name] = names[raw]
        else:
            values[name] = raw
    if bits_all >> pos:
        raise InputError(f"{_where(addr)}: {spec.mnemonic} has non-zero reserved bits above bit {pos}")
    for name in spec.nonzero:
        if values[name] == 0:
            raise InputError(f"{_where(addr)}: {spec.mnemonic}.{name} targets r0, which is hard-wired to 0")
    return Instr(spec.mnemonic, values, wait, signal)


def encode_program(instrs: Iterable[Instr]) -> bytes:
    """Concatenate the words of ``instrs`` (EncodeError messages gain the instruction index)."""
    out = []
    for idx, instr in enumerate(instrs):
        try:
            out.append(encode(instr))
        except EncodeError as exc:
            raise EncodeError(f"instruction {idx}: {exc.message}") from None
    return b"".join(out)


def decode_program(data: bytes) -> list[Instr]:
    """Decode a TEXT section; InputError if its size is not a multiple of 32 or a word is bad."""
    if len(data) % INSTR_BYTES:
        raise InputError(f"instruction stream of {len(data)} bytes is not a multiple of {INSTR_BYTES}")
    view = memoryview(data)
    return [
        decode(bytes(view[i : i + INSTR_BYTES]), i // INSTR_BYTES) for i in range(0, len(data), INSTR_BYTES)
    ]
