"""Fast, table-driven decoding of TEXT words for the loader.

``mcpc.arch.isa.decode`` is the definition; it builds a validated ``Instr`` per word, which is
the loader's main cost on large programs.  This module precomputes, from the same ISA table, one
list of ``(name, shift, mask, kind, enum names)`` per opcode and decodes a word into a light
``Decoded`` object with the same field values.  Any anomaly (unknown or reserved opcode, bad
dtype/enum code, token bits for the own engine, non-zero bits above the fields, ``setr r0``,
``salu rd=0``)
defers to ``isa.decode``, so error messages and edge cases are exactly the contract's; a
property test checks that both decoders agree.
"""

from __future__ import annotations

import struct

from mcpc.arch.isa import DTYPE_NAMES, ENUMS, HEADER_BITS, INSTR_BYTES, ISA, decode

_F32 = struct.Struct("<f")
_U32 = struct.Struct("<I")
_KIND_U, _KIND_S, _KIND_F32, _KIND_DTYPE, _KIND_ENUM = range(5)


class Decoded:
    """A decoded instruction: ``op``, ``engine``, ``wait``, ``signal`` and one attribute per field."""

    def __init__(self, op: str, engine: int, wait: int, signal: int, values: dict):
        self.__dict__.update(values)
        self.op, self.engine, self.wait, self.signal = op, engine, wait, signal


def _layouts() -> dict[int, tuple]:
    out = {}
    for spec in ISA.values():
        if spec.reserved:
            continue
        fields, pos = [], HEADER_BITS
        for name, bits, kind in spec.fields:
            if kind == "u":
                code, names = _KIND_U, None
            elif kind == "s":
                code, names = _KIND_S, None
            elif kind == "f32":
                code, names = _KIND_F32, None
            elif kind == "dtype":
                code, names = _KIND_DTYPE, DTYPE_NAMES
            else:
                code, names = _KIND_ENUM, ENUMS[kind[5:]]
            fields.append((name, pos, (1 << bits) - 1, code, names, bits))
            pos += bits
        out[spec.opcode] = (spec.mnemonic, spec.engine, tuple(fields), pos, spec.nonzero)
    return out


_LAYOUTS = _layouts()


def fast_decode(word: bytes) -> Decoded:
    """Decode one 32-byte word; raises InputError (from ``isa.decode``) for anything invalid."""
    if len(word) != INSTR_BYTES:
        decode(word)
    bits = int.from_bytes(word, "little")
    layout = _LAYOUTS.get(bits & 0xFF)
    if layout is None:
        decode(word)  # raises the contract's message (unknown or reserved opcode)
    op, engine, fields, top, nonzero = layout
    wait, signal = (bits >> 8) & 7, (bits >> 11) & 7
    ok = not ((wait | signal) >> engine & 1) and not bits >> top
    values = {}
    for name, shift, mask, code, names, nbits in fields:
        raw = (bits >> shift) & mask
        if code == _KIND_U:
            values[name] = raw
        elif code == _KIND_S:
            values[name] = raw - (1 << nbits) if raw >> (nbits - 1) else raw
        elif code == _KIND_F32:
            values[name] = _F32.unpack(_U32.pack(raw))[0]
        elif code == _KIND_DTYPE:
            v = names.get(raw)
            ok = ok and v is not None
            values[name] = v
        else:
            ok = ok and raw < len(names)
            values[name] = names[raw] if raw < len(names) else None
    if not ok or (nonzero and any(values[n] == 0 for n in nonzero)):
        instr = decode(word)  # raises; if it did not, trust the definition
        return Decoded(instr.op, instr.engine, instr.wait, instr.signal, dict(instr.fields))
    return Decoded(op, engine, wait, signal, values)
