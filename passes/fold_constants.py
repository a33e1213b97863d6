"""``fold-constants``: evaluate ops whose operands are all ``mcp.constant``, and dedupe constants.

Assumes a valid module.  Guarantees a valid module computing the same values: every op whose
operands are all constants and whose results are small enough is replaced by ``mcp.constant`` ops
holding exactly what the reference interpreter's ``evaluate_op`` computes (one semantics
definition), and constants with identical dtype, shape and bytes are merged into the first one.
Constants it made dead are left for ``dce``.

Size budget: a result is folded when its element count is at most ``max-elements`` or at most
the operands' total (a transpose, cast or reshape of a weight does not grow constant storage), so
folding never materialises a large broadcast or ``ConstantOfShape``-like tensor.  Results of dtype
i64 are never folded: i64 lives only at the I/O boundary, behind an explicit ``mcp.cast``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from mcpc.errors import McpcError
from mcpc.ir.core import Function, Module, Value
from mcpc.ir.dtypes import I64
from mcpc.ir.interpreter import evaluate_op, has_impl
from mcpc.ir.ops_core import ConstantOp
from mcpc.passes.manager import Pass, PassContext, register_pass


def _key(value: np.ndarray) -> tuple:
    raw = np.ascontiguousarray(value).tobytes()
    return (value.dtype.str, value.shape, hashlib.blake2b(raw, digest_size=16).digest())


def fold_function(func: Function, max_elements: int = 1 << 22) -> int:
    """Fold and dedupe constants of ``func`` in place; return how many ops were folded."""
    consts: dict[int, np.ndarray] = {}  # id(Value) -> value of a constant
    canonical: dict[tuple, Value] = {}  # dedupe key -> the first constant with that content
    rename: dict[int, Value] = {}  # id(old Value) -> Value that replaces it
    new_ops, folded = [], 0

    def keep_constant(op: ConstantOp) -> Value:
        """Register ``op`` (appending it) unless an equal constant exists; return the value to use."""
        key = _key(op.value)
        first = canonical.get(key)
        if first is not None:
            return first
        canonical.setdefault(key, op.result)
        consts[id(op.result)] = op.value
        new_ops.append(op)
        return op.result

    for op in func.ops:
        op.operands = [rename.get(id(v), v) for v in op.operands]
        if isinstance(op, ConstantOp):
            v = keep_constant(op)
            if v is not op.result:
                rename[id(op.result)] = v
            continue
        if op.IS_TERMINATOR or not _foldable(op, consts, max_elements):
            new_ops.append(op)
            continue
        try:
            values = evaluate_op(op, [consts[id(v)] for v in op.operands])
        except (McpcError, ValueError, IndexError):
            new_ops.append(op)  # a fault on these constants is the program's; keep it for run time
            continue
        for r, value in zip(op.results, values, strict=True):
            const = ConstantOp([], {"value": np.array(value, order="C")}, loc=op.loc)
            rename[id(r)] = keep_constant(const)
        folded += 1
    func.ops = new_ops
    return folded


def _foldable(op, consts: dict[int, np.ndarray], max_elements: int) -> bool:
    if not op.operands or any(id(v) not in consts for v in op.operands) or not has_impl(type(op)):
        return False
    if any(r.type.dtype == I64 for r in op.results):
        return False
    out = sum(r.type.numel for r in op.results)
    return out <= max(max_elements, sum(v.type.numel for v in op.operands))


@register_pass
@dataclass(frozen=True)
class FoldConstantsPass(Pass):
    """Evaluate constant subexpressions with the reference interpreter and merge equal constants.

    Assumes: a valid module.  Guarantees: a valid module with the same results; see the module
    docstring for the size budget (``max-elements``).
    """

    name: ClassVar[str] = "fold-constants"
    max_elements: int = 1 << 22

    def __post_init__(self):
        if self.max_elements < 0:
            raise ValueError(f"max-elements must be >= 0, got {self.max_elements}")

    def apply(self, module: Module, ctx: PassContext) -> Module:
        for func in module.functions.values():
            fold_function(func, self.max_elements)
        return module
