"""``dce``: remove ops whose results are never used.

Assumes a valid module.  Guarantees a valid module with the same results, in which every op
other than ``mcp.return`` has at least one used result (transitively: an op used only by dead ops
is dead too).  Function arguments are the model's interface and are never removed.  An op class
may set ``HAS_SIDE_EFFECTS = True`` to be kept regardless.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mcpc.ir.core import Function, Module
from mcpc.passes.manager import Pass, PassContext, register_pass


def dce_function(func: Function) -> int:
    """Remove dead ops of ``func`` in place (one backward sweep); return how many were removed."""
    live_values: set[int] = set()
    kept = []
    for op in reversed(func.ops):
        keep = (
            op.IS_TERMINATOR
            or getattr(op, "HAS_SIDE_EFFECTS", False)
            or any(id(r) in live_values for r in op.results)
        )
        if keep:
            kept.append(op)
            live_values.update(id(v) for v in op.operands)
    removed = len(func.ops) - len(kept)
    func.ops = kept[::-1]
    return removed


@register_pass
@dataclass(frozen=True)
class DcePass(Pass):
    """Dead code elimination.  Assumes: a valid module.  Guarantees: same results, no dead ops."""

    name: ClassVar[str] = "dce"

    def apply(self, module: Module, ctx: PassContext) -> Module:
        for func in module.functions.values():
            dce_function(func)
        return module
