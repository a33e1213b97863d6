"""Textual assembly for the ISA: a disassembler and a parser that round-trip.

One instruction per line::

    0007  matmul   a=0x1000 b=0x2000 c=0x0 m=64 n=64 k=256 in_dtype=f16 wait=LD signal=ST  ; node (mcp.matmul)

The leading decimal index is optional on input; ``;`` starts a comment.  Address fields are always
printed, in hex; every other field only when it differs from its default, so the text stays short
and ``parse_asm(disassemble(p)) == p``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from mcpc.errors import EncodeError, ParseError

from .isa import ADDRESS_FIELDS, ENGINES, ISA, Instr, decode_program, encode


def _mask_text(mask: int) -> str:
    return "|".join(ENGINES[e] for e in range(len(ENGINES)) if mask >> e & 1)


def _value_text(name: str, kind: str, value: Any) -> str:
    if name in ADDRESS_FIELDS:
        return f"{value:#x}"
    if kind == "f32":
        return repr(float(value))
    return str(value)


def format_instr(instr: Instr, addr: int | None = None) -> str:
    """One line of assembly for ``instr``, prefixed by its 4-digit index when ``addr`` is given."""
    spec = instr.spec
    parts = []
    for name, _, kind in spec.fields:
        value = instr.fields[name]
        if name in ADDRESS_FIELDS or value != spec.defaults()[name] or _negzero(kind, value):
            parts.append(f"{name}={_value_text(name, kind, value)}")
    if instr.wait:
        parts.append(f"wait={_mask_text(instr.wait)}")
    if instr.signal:
        parts.append(f"signal={_mask_text(instr.signal)}")
    head = f"{addr:04d}  " if addr is not None else ""
    return f"{head}{instr.op:<8} {' '.join(parts)}".rstrip()


def _negzero(kind: str, value: Any) -> bool:
    # -0.0 == 0.0 but encodes differently; print it so the round trip keeps the bits.
    return kind == "f32" and value == 0.0 and str(value).startswith("-")


def disassemble(instrs: Sequence[Instr] | bytes, debug: Sequence[dict | None] | None = None) -> str:
    """Assembly text for a program (a list of Instr or raw TEXT bytes), one numbered line each.

    ``debug`` (the DBUG section: one ``{"ir_op", "onnx_node", ...}`` per instruction) appends
    ``; onnx_node (ir_op)`` to each line that has an entry.
    """
    if isinstance(instrs, (bytes, bytearray, memoryview)):
        instrs = decode_program(bytes(instrs))
    lines = []
    for idx, instr in enumerate(instrs):
        line = format_instr(instr, idx)
        info = debug[idx] if debug is not None and idx < len(debug) else None
        if info:
            node, op = info.get("onnx_node") or "", info.get("ir_op") or ""
            note = f"{node} ({op})" if node and op else node or op
            if note:
                line = f"{line:<72}  ; {note}"
        lines.append(line)
    return "\n".join(lines) + ("\n" if lines else "")


_TOKEN = re.compile(r"\S+")


def _fail(filename: str, lineno: int, col: int, line: str, msg: str) -> ParseError:
    caret = " " * col + "^"
    return ParseError(f"{filename}:{lineno}:{col + 1}: {msg}\n  {line}\n  {caret}")


def _parse_mask(text: str) -> int:
    if text in ("-", "0", ""):
        return 0
    if text.isdigit():
        return int(text)
    mask = 0
    for name in text.split("|"):
        if name.upper() not in ENGINES:
            raise ValueError(f"unknown engine {name!r} (engines: {', '.join(ENGINES)})")
        mask |= 1 << ENGINES.index(name.upper())
    return mask


def _parse_value(kind: str, text: str) -> Any:
    if kind == "f32":
        return float(text)
    if kind == "dtype" or kind.startswith("enum:"):
        return text
    try:
        return int(text, 0)
    except ValueError:
        return int(text, 10)  # decimal with leading zeros, e.g. 007


def parse_asm(text: str, filename: str = "<asm>") -> list[Instr]:
    """Parse assembly into instructions, validating every field as ``encode`` would.

    Raises ParseError with ``file:line:col`` and a caret for an unknown mnemonic or field, a
    malformed value or a value that does not fit its field.
    """
    out: list[Instr] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split(";", 1)[0].rstrip()
        tokens = [(m.group(), m.start()) for m in _TOKEN.finditer(line)]
        if tokens and tokens[0][0].isdigit():
            tokens = tokens[1:]  # the instruction index printed by the disassembler
        if not tokens:
            continue
        op, op_col = tokens[0]
        spec = ISA.get(op)
        if spec is None:
            raise _fail(filename, lineno, op_col, raw, f"unknown instruction {op!r}")
        kinds = {name: kind for name, _, kind in spec.fields}
        fields: dict[str, Any] = {}
        cols: dict[str, int] = {}
        masks = {"wait": 0, "signal": 0}
        for tok, col in tokens[1:]:
            key, eq, val = tok.partition("=")
            if not eq:
                raise _fail(filename, lineno, col, raw, f"expected name=value, got {tok!r}")
            if key not in kinds and key not in masks:
                valid = ", ".join([*kinds, "wait", "signal"])
                raise _fail(filename, lineno, col, raw, f"{op} has no field {key!r} (fields: {valid})")
            cols[key] = col
            try:
                if key in masks:
                    masks[key] = _parse_mask(val)
                else:
                    fields[key] = _parse_value(kinds[key], val)
            except ValueError as exc:
                raise _fail(
                    filename, lineno, col + len(key) + 1, raw, f"bad value for {key}: {exc}"
                ) from None
        try:
            instr = Instr(op, fields, masks["wait"], masks["signal"])
            encode(instr)
        except EncodeError as exc:
            # Point the caret at the offending field when the message names one.
            col = next(
                (c for k, c in cols.items() if f" {k} " in exc.message or f"{k}=" in exc.message), op_col
            )
            raise _fail(filename, lineno, col, raw, exc.message) from None
        out.append(instr)
    return out
