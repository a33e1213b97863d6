"""docs/isa.md's instruction sections are generated from the ISA specs; this test keeps them in sync.

Regenerate after a spec change with:  python -m mcpc.arch.isa_doc --write
"""

import re
import sys
from pathlib import Path

import pytest

from mcpc.arch.isa import ENUMS, ISA
from mcpc.arch.isa_doc import regenerate, render_spec

DOC = Path(__file__).resolve().parents[2] / "docs" / "isa.md"


def test_committed_doc_equals_the_generated_one():
    text = DOC.read_text(encoding="utf-8")
    stale = "docs/isa.md is stale: run python -m mcpc.arch.isa_doc --write"
    assert regenerate(text) == text, stale


def test_every_instruction_has_one_section_with_its_enum_codes():
    text = DOC.read_text(encoding="utf-8")
    assert sorted(re.findall(r"^### ([\w.]+)$", text, re.M)) == sorted(ISA)
    for name, values in ENUMS.items():
        assert all(f"`{v}`" in text for v in values), name


def test_a_changed_spec_changes_the_doc(monkeypatch):
    text = DOC.read_text(encoding="utf-8")
    spec = ISA["vun"]
    monkeypatch.setitem(ISA, "vun", type(spec)(**{**spec.__dict__, "doc": "Changed."}))
    assert "Opcode 10, engine EX. Changed." in render_spec(ISA["vun"])
    assert regenerate(text) != text


def test_a_doc_without_the_generated_block_is_refused():
    with pytest.raises(ValueError, match="generated:instructions"):
        regenerate("# no block\n")


if __name__ == "__main__" and "--write" in sys.argv:
    DOC.write_text(regenerate(DOC.read_text(encoding="utf-8")), encoding="utf-8")
