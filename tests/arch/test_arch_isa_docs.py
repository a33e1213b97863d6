"""docs/isa.md field tables are generated from the ISA table; this test keeps them in sync.

Regenerate after a table change with:  python tests/arch/test_arch_isa_docs.py --write
"""

import re
import sys
from pathlib import Path

from mcpc.arch.isa import ENGINES, ENUMS, FIELD_DOCS, HEADER_BITS, ISA

DOC = Path(__file__).resolve().parents[2] / "docs" / "isa.md"
BLOCK = re.compile(r"(<!-- fields:(\w+) -->\n)(.*?)(<!-- /fields -->)", re.S)


def render(mnemonic: str) -> str:
    """The generated part of an instruction's section: opcode line and field table."""
    spec = ISA[mnemonic]
    lines = [f"Opcode {spec.opcode}, engine {ENGINES[spec.engine]}. {spec.doc}", ""]
    if spec.reserved:
        return "\n".join([*lines, "Reserved: `encode` refuses it, `decode` reports it.", ""])
    lines += ["| bits | field | kind | meaning |", "|---|---|---|---|"]
    lines.append("| 0..7 | opcode | u8 | |")
    lines.append("| 8..10 | wait | u3 | engine mask of tokens to pop before issue |")
    lines.append("| 11..13 | signal | u3 | engine mask of tokens to push on completion |")
    pos = HEADER_BITS
    enums = []
    for name, bits, kind in spec.fields:
        shown = f"{kind}{bits}" if kind in ("u", "s") else f"{kind} ({bits} bits)"
        lines.append(f"| {pos}..{pos + bits - 1} | {name} | {shown} | {FIELD_DOCS[name]} |")
        pos += bits
        if kind.startswith("enum:"):
            codes = ", ".join(f"{i} `{n}`" for i, n in enumerate(ENUMS[kind[5:]]))
            enums.append(f"`{name}` values: {codes}")
    lines.append(f"| {pos}..255 | — | zero | reserved, must be 0 |")
    return "\n".join([*lines, "", *enums, ""] if enums else [*lines, ""])


def regenerate(text: str) -> str:
    return BLOCK.sub(lambda m: m.group(1) + render(m.group(2)) + m.group(4), text)


def test_every_instruction_has_a_generated_section():
    text = DOC.read_text(encoding="utf-8")
    documented = [m.group(2) for m in BLOCK.finditer(text)]
    assert sorted(documented) == sorted(ISA), "docs/isa.md must have one fields block per mnemonic"


def test_field_tables_match_the_isa_table():
    text = DOC.read_text(encoding="utf-8")
    stale = "docs/isa.md is stale: run python tests/arch/test_arch_isa_docs.py --write"
    assert regenerate(text) == text, stale


if __name__ == "__main__" and "--write" in sys.argv:
    DOC.write_text(regenerate(DOC.read_text(encoding="utf-8")), encoding="utf-8")
