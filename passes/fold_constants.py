"""``fold-constants``: evaluate ops whose operands are all ``mcp.constant``, and dedupe constants.

Assumes a valid module.  Guarantees a valid module computing the same values: every op whose
operands are all constants and whose results are small enough is replaced by ``mcp.constant`` ops
holding exactly what the reference interpreter's ``evaluate_op`` computes (one semantics
definition), and constants with identical dtype, shape and bytes (hash, then bytes compared) are
merged into the first one.  Constants it made dead are left for ``dce``.

Transposed weights are read, not copied: a ``mcp.matmul`` whose ``b`` is an ``mcp.transpose`` of a
constant swapping the last two dims (``MatMul(x, Transpose(W))``, the LM head of a tied
embedding), or a constant equal to another one transposed (the same, folded by the exporter),
reads that constant with ``trans_b`` toggled (``absorb_transposes``) — the interpreter and the
lowering read ``b`` transposed as a view, in the same order of sums, so the bits do not change.

Size budget: folding never grows constant storage past ``max-elements``: a result is folded when
its element count is at most ``max-elements`` or at most the total of the constant operands that
this op is the last user of (a transpose, cast or reshape of a weight used nowhere else replaces
it; of a weight still used elsewhere — a tied embedding's table — it would be a second copy, so
it stays a run-time op).  So folding never materialises a large broadcast or
``ConstantOfShape``-like tensor.  Results of dtype i64 are never folded: i64 lives only at the
I/O boundary, behind an explicit ``mcp.cast``.

Compressed weights stay compressed: an ``mcp.dequantize`` of constant codes whose result takes
more bytes than its codes (int4 codes dequantized to f16) is never folded, whatever the budget —
it exists so that the packed codes are what is stored and moved (the backend fuses it into the
consuming matmul).  Other quantize/dequantize ops of constants fold like any op.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from mcpc.errors import McpcError
from mcpc.ir.core import Function, Module, Operation, Value
from mcpc.ir.dtypes import I64
from mcpc.ir.interpreter import evaluate_op, has_impl
from mcpc.ir.ops_core import ConstantOp
from mcpc.ir.ops_nn import MatMulOp
from mcpc.ir.ops_quant import DequantizeOp
from mcpc.ir.ops_shape import TransposeOp
from mcpc.passes.manager import Pass, PassContext, register_pass


def _key(value: np.ndarray) -> tuple:
    raw = np.ascontiguousarray(value).tobytes()
    return (value.dtype.str, value.dtype.name, value.shape, hashlib.blake2b(raw, digest_size=16).digest())


def _raw(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


def _swaps_last_two(op) -> bool:
    """``op`` is an ``mcp.transpose`` exchanging its operand's last two dims, nothing else."""
    if not isinstance(op, TransposeOp):
        return False
    perm = [int(p) for p in op.attrs["perm"]]
    n = len(perm)
    return n >= 2 and perm == [*range(n - 2), n - 1, n - 2]


def absorb_transposes(func: Function) -> int:
    """Let matmuls read constant weights transposed rather than use a transposed copy; return how
    many were rewritten (what they no longer use is left for ``dce``).

    A ``mcp.matmul`` whose ``b`` is a last-two-dims ``mcp.transpose`` of a constant reads the
    constant with ``trans_b`` toggled.  One whose ``b`` is a constant that another constant,
    defined before the matmul, holds transposed (an exporter folded ``Transpose(W)`` into a second
    initializer: TorchScript's tied LM head) reads that one with ``trans_b`` toggled when it is
    preferred: used other than as a matmul ``b`` (it has to be stored anyway), else defined first.
    """
    index = {id(op.result): i for i, op in enumerate(func.ops) if isinstance(op, ConstantOp)}
    values = {id(op.result): op.value for op in func.ops if isinstance(op, ConstantOp)}
    needed = {
        id(v)
        for op in func.ops
        for i, v in enumerate(op.operands)
        if id(v) in index and not (isinstance(op, MatMulOp) and i == 1)
    }
    by_shape: dict[tuple, list[Value]] = {}
    for op in func.ops:
        if isinstance(op, ConstantOp) and op.value.ndim >= 2:
            by_shape.setdefault((op.value.dtype.name, op.value.shape), []).append(op.result)

    def preferred(v: Value) -> tuple:
        return (id(v) in needed, -index[id(v)])

    def transposed_twin(b: Value, before: int) -> Value | None:
        w = values[id(b)]
        twins = [
            v
            for v in by_shape.get((w.dtype.name, (*w.shape[:-2], w.shape[-1], w.shape[-2])), [])
            if v is not b and index[id(v)] < before and preferred(v) > preferred(b)
        ]
        if not twins:
            return None
        wt = np.swapaxes(w, -1, -2)
        for v in twins:  # a cheap look at one row first, then every byte
            other = values[id(v)]
            if _raw(other[..., :1, :]) == _raw(wt[..., :1, :]) and _raw(other) == _raw(wt):
                return v
        return None

    count = 0
    for pos, op in enumerate(func.ops):
        if not isinstance(op, MatMulOp):
            continue
        b = op.operands[1]
        t = b.owner
        if _swaps_last_two(t) and id(t.operands[0]) in index:
            source = t.operands[0]
        elif id(b) in index and b.type.rank >= 2:
            source = transposed_twin(b, pos)
        else:
            source = None
        if source is not None:
            op.operands = [op.operands[0], source]
            op.attrs["trans_b"] = not op.attrs["trans_b"]
            count += 1
    return count + _store_tables_transposed(func)


def _store_tables_transposed(func: Function) -> int:
    """The mirror of a tied LM head: a last-two-dims ``mcp.transpose`` of a constant ``W`` whose
    every other use is as a later matmul's ``b`` (the GenAI builder stores the tied table as the LM
    head's ``[hidden, vocab]`` weight and gathers embeddings from ``Transpose(W)``).  Those matmuls
    read the transpose's result with ``trans_b`` toggled, so the transpose is ``W``'s last user and
    folds into one stored constant ``Wᵀ`` (within the size budget: it replaces ``W``) instead of
    running every call.  Return how many matmuls were rewritten."""
    position = {id(op): i for i, op in enumerate(func.ops)}
    users: dict[int, list[tuple[Operation, int]]] = {}
    for op in func.ops:
        for i, v in enumerate(op.operands):
            users.setdefault(id(v), []).append((op, i))
    count = 0
    for t in func.ops:
        if not _swaps_last_two(t) or not isinstance(t.operands[0].owner, ConstantOp):
            continue
        others = [(op, i) for op, i in users.get(id(t.operands[0]), []) if op is not t]
        if not others or not all(
            isinstance(op, MatMulOp) and i == 1 and position[id(op)] > position[id(t)] for op, i in others
        ):
            continue
        for op, _ in others:
            op.operands = [op.operands[0], t.result]
            op.attrs["trans_b"] = not op.attrs["trans_b"]
            count += 1
    return count


def fold_function(func: Function, max_elements: int = 1 << 22) -> int:
    """Fold and dedupe constants of ``func`` in place; return how many ops were folded."""
    absorb_transposes(func)
    consts: dict[int, np.ndarray] = {}  # id(Value) -> value of a constant
    canonical: dict[tuple, list[Value]] = {}  # dedupe key -> the constants with that key
    rename: dict[int, Value] = {}  # id(old Value) -> Value that replaces it
    uses: Counter[int] = Counter(id(v) for op in func.ops for v in op.operands)  # by ops not folded
    new_ops, folded = [], 0

    def keep_constant(op: ConstantOp) -> Value:
        """Register ``op`` (appending it) unless an equal constant exists; return the value to use."""
        raw = np.ascontiguousarray(op.value).tobytes()
        same = canonical.setdefault(_key(op.value), [])
        for first in same:  # the hash matched: confirm the bytes
            if np.ascontiguousarray(consts[id(first)]).tobytes() == raw:
                return first
        same.append(op.result)
        consts[id(op.result)] = op.value
        new_ops.append(op)
        return op.result

    def replace(old: Value, new: Value) -> None:
        if new is not old:
            rename[id(old)] = new
            uses[id(new)] += uses.pop(id(old), 0)

    for op in func.ops:
        op.operands = [rename.get(id(v), v) for v in op.operands]
        if isinstance(op, ConstantOp):
            replace(op.result, keep_constant(op))
            continue
        if op.IS_TERMINATOR or not _foldable(op, consts, uses, max_elements):
            new_ops.append(op)
            continue
        try:
            values = evaluate_op(op, [consts[id(v)] for v in op.operands])
        except (McpcError, ValueError, IndexError):
            new_ops.append(op)  # a fault on these constants is the program's; keep it for run time
            continue
        for v in op.operands:
            uses[id(v)] -= 1
        for r, value in zip(op.results, values, strict=True):
            const = ConstantOp([], {"value": np.array(value, order="C")}, loc=op.loc)
            replace(r, keep_constant(const))
        folded += 1
    func.ops = new_ops
    return folded


def _foldable(op, consts: dict[int, np.ndarray], uses: Counter[int], max_elements: int) -> bool:
    """All operands constant, an interpreter impl, no i64 result, and within the size budget: the
    results are small, or no larger than the constants that die here, used by no op but ``op``
    (``uses`` counts the uses by every op not folded away)."""
    if getattr(op, "STATEFUL", False):  # reads or writes run state (globals, host registers)
        return False
    if not op.operands or any(id(v) not in consts for v in op.operands) or not has_impl(type(op)):
        return False
    if any(r.type.dtype == I64 for r in op.results):
        return False
    if isinstance(op, DequantizeOp) and _widens(op):
        return False
    out = sum(r.type.numel for r in op.results)
    mine = Counter(id(v) for v in op.operands)
    dying = {id(v): v.type.numel for v in op.operands if uses[id(v)] <= mine[id(v)]}
    return out <= max(max_elements, sum(dying.values()))


def _widens(op: DequantizeOp) -> bool:
    """Whether the dequantized result is stored in more bytes than the codes it reads."""
    return op.result.type.nbytes > op.operands[0].type.nbytes


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
