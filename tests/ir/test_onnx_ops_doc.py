"""docs/onnx-ops.md is generated from the importer's registry; this test keeps it in sync.

Whoever adds, removes or renames a handler or a check regenerates it, from the repository root:
    python -m mcpc.ir.onnx_ops_doc --write        (or: make docs)
"""

from __future__ import annotations

import difflib
import subprocess
import sys
from pathlib import Path

import onnx.defs
import pytest

from mcpc.ir import decoder_import  # noqa: F401  (registers mcpc.kv ops, which the doc leaves out)
from mcpc.ir.onnx_handlers import CHECKS, DOMAIN_CHECKS, DOMAIN_HANDLERS, HANDLERS
from mcpc.ir.onnx_import import MAX_OPSET
from mcpc.ir.onnx_ops_doc import COMMAND, first_sentence, onnx_versions, render

DOC = Path(__file__).resolve().parents[2] / "docs" / "onnx-ops.md"
# the op-versions column lists ONNX's schemas up to MAX_OPSET: an older onnx lacks the newest ones
needs_onnx = pytest.mark.skipif(
    onnx.defs.onnx_opset_version() < MAX_OPSET, reason=f"the installed onnx predates opset {MAX_OPSET}"
)


@needs_onnx
def test_committed_doc_equals_the_generated_one():
    """Against what the regenerating command prints, in a fresh interpreter: the registry as
    importing the importer fills it, whatever other tests of this session have imported."""
    proc = subprocess.run(
        [sys.executable, "-m", "mcpc.ir.onnx_ops_doc"], capture_output=True, text=True, check=True
    )
    committed, generated = DOC.read_text(encoding="utf-8"), proc.stdout
    if committed != generated:
        diff = difflib.unified_diff(
            committed.splitlines(), generated.splitlines(), "committed", "generated", lineterm="", n=0
        )
        pytest.fail(
            "docs/onnx-ops.md is stale (the importer's handlers or checks changed): regenerate it with "
            f"`{COMMAND}` run from the repository root (or `make docs`) and commit it.\n" + "\n".join(diff)
        )


def test_every_registered_op_has_one_row():
    text = render()
    for op_type in HANDLERS:
        assert sum(line.startswith(f"| {op_type} | ") for line in text.splitlines()) == 1, op_type
    for domain, op_type in DOMAIN_HANDLERS:
        assert (f"| {domain} | {op_type} | " in text) != domain.startswith("mcpc."), (domain, op_type)


def test_every_check_says_its_limit_in_its_docstring():
    """The static-limits column is the check functions' docstrings: a check without one would
    leave an op's limits undocumented."""
    for op_type, fn in CHECKS.items():
        assert first_sentence(fn.__doc__), (
            f"CHECKS['{op_type}'] ({fn.__module__}.{fn.__name__}) has no docstring"
        )
    for key, fn in DOMAIN_CHECKS.items():
        assert key in DOMAIN_HANDLERS, f"DOMAIN_CHECKS{key} checks an op no handler imports"
        assert first_sentence(fn.__doc__), (
            f"DOMAIN_CHECKS{key} ({fn.__module__}.{fn.__name__}) has no docstring"
        )


@needs_onnx
def test_a_new_handler_or_check_changes_the_doc(monkeypatch):
    before = render()
    monkeypatch.setitem(HANDLERS, "GatherND", HANDLERS["Gather"])
    assert "| GatherND | 13–28 | 13 |  |" in render()

    def check(node, attrs, opset, used):
        """batch_dims must be 0."""

    monkeypatch.setitem(CHECKS, "GatherND", check)
    assert "| GatherND | 13–28 | 13 | batch_dims must be 0. |" in render()
    monkeypatch.setitem(DOMAIN_HANDLERS, ("com.microsoft", "FastGelu"), HANDLERS["Gelu"])
    assert "| com.microsoft | FastGelu | " in render() and render() != before
    monkeypatch.setitem(DOMAIN_CHECKS, ("com.microsoft", "FastGelu"), check)
    (row,) = [line for line in render().splitlines() if line.startswith("| com.microsoft | FastGelu | ")]
    assert row.endswith(" | batch_dims must be 0. |")


@needs_onnx
def test_opsets_start_at_the_ops_first_version_in_the_window():
    assert onnx_versions("Gelu") == [20]  # introduced in opset 20
    assert onnx_versions("Split") == [13, 18]  # Split-13 in effect at 13, Split-18 later
    assert onnx_versions("Not") == [1]  # unchanged since opset 1
    assert onnx_versions("NoSuchOp") == []
    assert "| Gelu | 20–28 | 20 |" in render()


def test_first_sentence():
    assert first_sentence(None) == ""
    assert first_sentence("One ``x|y``. Two.\n\nThree.") == "One `x\\|y`."
    assert first_sentence("A line\n    wrapped. Next") == "A line wrapped."
