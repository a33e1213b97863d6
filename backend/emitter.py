"""Instruction emission with a debug context: every instruction knows the IR op and ONNX node it serves.

Lowerings build instructions through one ``Emitter``; ``with em.node(op):`` sets the debug context
(``{"ir_op", "onnx_node", "op_type"}``) that the program's DBUG section records for everything
emitted inside, so the simulator can attribute every cycle to an ONNX node.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from mcpc.arch.isa import Instr, encode
from mcpc.errors import EncodeError, PassError

# Debug context of instructions emitted outside any ``node`` block (program epilogue, ``halt``).
NO_NODE: dict[str, str | None] = {"ir_op": None, "onnx_node": None, "op_type": None}


def debug_context(op: Any) -> dict[str, str | None]:
    """The DBUG record of an IR op: its mnemonic, its ONNX node name and the ONNX op type.

    ``op.loc`` is the ONNX node name (None for ops built directly); the op type is taken from
    ``op.attrs["onnx_op_type"]`` when the importer recorded it, else from the IR mnemonic.
    """
    op_type = None
    attrs = getattr(op, "attrs", None) or {}
    if isinstance(attrs.get("onnx_op_type"), str):
        op_type = attrs["onnx_op_type"]
    name = getattr(op, "name", None)
    if op_type is None and isinstance(name, str):
        op_type = name.removeprefix("mcp.")
    return {"ir_op": name, "onnx_node": getattr(op, "loc", None), "op_type": op_type}


class Emitter:
    """Builds ``Instr`` objects for one target and remembers the current debug context.

    Guarantees: every instruction returned by ``emit`` encodes (field ranges are checked at once,
    so an oversized tile is reported as a PassError naming the IR op and ONNX node instead of
    failing later without context).  ``counts`` tallies emitted mnemonics.
    """

    def __init__(self, target: Any):
        self.target = target
        self.context: dict[str, str | None] = dict(NO_NODE)
        self._op: Any = None
        self.counts: Counter[str] = Counter()

    def emit(self, mnemonic: str, **fields: Any) -> Instr:
        """A new instruction ``mnemonic`` with ``fields`` (wait/signal bits are left 0: the
        scheduler assigns them).  Raises PassError naming the current op if it does not encode."""
        try:
            instr = Instr(mnemonic, fields)
            encode(instr)
        except EncodeError as exc:
            where = self._op.describe() if self._op is not None else "program epilogue"
            raise PassError(f"backend: {where}: cannot emit {mnemonic}: {exc.message}") from None
        self.counts[mnemonic] += 1
        return instr

    @contextmanager
    def node(self, op: Any) -> Iterator[dict[str, str | None]]:
        """Set the debug context to ``op`` for the duration of the block (nests; restores after)."""
        saved, saved_op = self.context, self._op
        self.context, self._op = debug_context(op), op
        try:
            yield self.context
        finally:
            self.context, self._op = saved, saved_op
