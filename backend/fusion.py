"""Epilogue fusion: which elementwise ops the backend computes on their producer's SRAM tile.

A backend grouping step over one function's ops; the IR is not changed, so the interpreter stays
the definition of every op.  A *group* is a head op (today ``mcp.matmul``) followed by an
*epilogue*: a chain of elementwise ops, each consuming the previous value of the chain, which has
exactly one use in the function (not a function output).  The head's kernel then applies the
epilogue to every finished output tile in SRAM and stores only the chain's last value: no store
and reload of the intermediates, one kernel instead of several.

An epilogue op is a unary op (``mcp.gelu``, ``relu``, ``sigmoid``, ``tanh``, ``exp``, ``erf``,
``neg``, ``abs``, ``sqrt``, ``rsqrt``, ``reciprocal``, ``cast``) or a binary op (``add sub mul
div max min``) whose other operand is a tensor already in DRAM when the head runs (a constant —
a scalar exact in f32 becomes an immediate —, a function input, or the result of an op the head
follows) and broadcasts to the chain value's shape (a bias row, a scale, a per-row value or a
full residual tensor).  Chain values and results keep one shape and a float dtype.

Every op of a group is executed at the head's place in the function, so the group's other
operands must be defined before the head; ``positions`` gives the DRAM planner that execution
order (every member of a group at its head's index), so liveness stays exact.  The numerics are
the unfused ones: each op of the chain reads its operands in their dtypes, computes in f32 and
rounds to its result dtype, exactly as its own kernel would (see ``lower_matmul``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mcpc.backend.memory import ALIAS_OPS
from mcpc.ir import ops

# Elementwise ops an epilogue may hold (comparisons and select are left out: bool results).
EPILOGUE_BINARY = (ops.AddOp, ops.SubOp, ops.MulOp, ops.DivOp, ops.MaxOp, ops.MinOp)
EPILOGUE_UNARY = (
    ops.GeluOp, ops.ReluOp, ops.SigmoidOp, ops.TanhOp, ops.ExpOp, ops.ErfOp, ops.NegOp, ops.AbsOp,
    ops.SqrtOp, ops.RsqrtOp, ops.ReciprocalOp, ops.CastOp,
)  # fmt: skip
FLOATS = frozenset({"f32", "f16", "bf16"})


@dataclass(frozen=True)
class EpilogueOp:
    """One op of an epilogue: ``op`` reads the chain value as operand ``chain_index``; ``other``
    is the other operand of a binary op (None for a unary op)."""

    op: Any
    chain_index: int = 0
    other: Any = None

    @property
    def func(self) -> str:
        """The vector function: the op's ``func`` (``copy`` for a cast)."""
        return "copy" if isinstance(self.op, ops.CastOp) else self.op.func


@dataclass(frozen=True)
class FusionGroup:
    """A head op and the epilogue computed on its output tiles; ``result`` is what is stored."""

    head: Any
    epilogue: tuple[EpilogueOp, ...]

    @property
    def ops(self) -> tuple[Any, ...]:
        return (self.head, *(e.op for e in self.epilogue))

    @property
    def result(self) -> Any:
        return self.epilogue[-1].op.result if self.epilogue else self.head.result


@dataclass
class FusionPlan:
    """The groups of one function (by head op) and the DRAM-planning position of every op."""

    groups: dict[Any, FusionGroup] = field(default_factory=dict)
    absorbed: set = field(default_factory=set)  # epilogue ops: lowered with their head
    positions: dict[Any, int] = field(default_factory=dict)


def _root(value: Any) -> Any:
    """The value owning ``value``'s DRAM bytes (through reshapes, which alias their operand)."""
    while isinstance(value.owner, ALIAS_OPS):
        value = value.owner.operands[0]
    return value


def _broadcasts_to(shape: tuple[int, ...], out: tuple[int, ...]) -> bool:
    if len(shape) > len(out):
        return False
    return all(s in (1, o) for s, o in zip(reversed(shape), reversed(out), strict=False))


def plan_fusion(fn: Any, heads: Callable[[Any], bool], fits: Callable[[FusionGroup], bool]) -> FusionPlan:
    """Greedy epilogue groups of ``fn`` (see module doc).

    ``heads(op)`` says whether ``op`` may head a group; ``fits(group)`` whether the head's fused
    kernel can be built (e.g. fits SRAM) — a chain grows one op at a time while it does.
    Guarantees: groups are disjoint; every epilogue op's other operand is defined before its
    head in ``positions`` order; ``positions`` is non-decreasing along the order of execution
    (ops in function order, each group's epilogue right after its head).
    """
    plan = FusionPlan()
    index = {op: i for i, op in enumerate(fn.ops)}
    uses: Counter = Counter()
    users: dict[Any, Any] = {}
    for op in fn.ops:
        for v in op.operands:
            uses[v] += 1
            users[v] = op
    for v in fn.outputs:
        uses[v] += 1  # a function output must be stored

    def ready(value: Any, head_pos: int) -> bool:
        r = _root(value)
        if r.is_argument or isinstance(r.owner, ops.ConstantOp):
            return True
        return r.owner in plan.positions and plan.positions[r.owner] < head_pos

    for op in fn.ops:
        if op in plan.absorbed:
            continue
        pos = plan.positions[op] = index[op]
        if not heads(op) or len(op.results) != 1:
            continue
        chain: list[EpilogueOp] = []
        cur = op.result
        while uses[cur] == 1 and cur.type.dtype.name in FLOATS:
            nxt = _epilogue_op(users[cur], cur, pos, ready)
            if nxt is None or not fits(FusionGroup(op, (*chain, nxt))):
                break
            chain.append(nxt)
            cur = nxt.op.result
        if chain:
            plan.groups[op] = FusionGroup(op, tuple(chain))
            for e in chain:
                plan.absorbed.add(e.op)
                plan.positions[e.op] = pos
    return plan


def _epilogue_op(user: Any, cur: Any, head_pos: int, ready: Callable[[Any, int], bool]) -> EpilogueOp | None:
    """``user`` as the next epilogue op of a chain whose value is ``cur``, or None."""
    res = user.results[0] if len(user.results) == 1 else None
    if res is None or res.type.shape != cur.type.shape or res.type.dtype.name not in FLOATS:
        return None
    if isinstance(user, EPILOGUE_UNARY):
        return EpilogueOp(user)
    if not isinstance(user, EPILOGUE_BINARY):
        return None
    idx = 0 if user.operands[0] is cur else 1
    other = user.operands[1 - idx]
    if other is cur or other.type.dtype.name != cur.type.dtype.name:
        return None
    if not _broadcasts_to(other.type.shape, cur.type.shape) or not ready(other, head_pos):
        return None
    return EpilogueOp(user, idx, other)
