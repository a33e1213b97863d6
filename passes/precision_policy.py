"""The precision policy of reduced-precision builds: which computations stay f32 (``f32 islands``).

fp16 holds values up to 65504 and keeps 11 significant bits.  Most of a transformer is fine in it,
but a few computations overflow or lose everything there, whatever the model's weights:

* ``norm_stats`` — the statistics of a normalization written out with elementwise ops: the square
  (``Pow(v, 2)`` or ``Mul(v, v)``) feeding a ``ReduceMean``/``ReduceSum``, and what follows it on
  the way to the normalized value (``Add eps``, scaling by a constant, ``Sqrt``, ``Rsqrt``,
  ``Reciprocal``, and the final ``Div``/``Mul``/``Sub`` with the value being normalized).  This is
  RMSNorm as PyTorch exports it for Llama models (Pow → ReduceMean → Add → Sqrt → Div or
  Reciprocal → Mul), LayerNorm as older exporters spell it out, and any variance.  An activation
  of |x| ≈ 256 already squares to infinity in fp16.
* ``softmax_sum`` — a softmax or log-softmax written out: ``Exp`` feeding a ``ReduceSum``, and
  what follows the sum (``Div`` of the exponentials by it, ``Log`` of it and the final ``Sub``).

Recognition is structural (op kinds, a constant exponent of 2, the same value squared), never by
node names.  An island starts where its f32 value is first needed: the square's (or exp's)
operand is cast to f32 once (and that cast is shared with the final normalizing op), constants
used inside the island keep their f32 value, and the island's results are cast to the build dtype
only where something outside it uses them — after the normalization, whose result is bounded.

The fused ops (``mcp.layer_norm``, ``mcp.softmax``, ``mcp.log_softmax``, reductions) compute
every step in f32 and round once by their definition, so they need no island.
"""

from __future__ import annotations

import numpy as np

from mcpc.ir.core import Function, Operation, Value
from mcpc.ir.ops_core import ConstantOp
from mcpc.ir.ops_elementwise import (
    AddOp,
    DivOp,
    ExpOp,
    LogOp,
    MulOp,
    PowOp,
    ReciprocalOp,
    RsqrtOp,
    SqrtOp,
    SubOp,
)
from mcpc.ir.ops_nn import ReduceMeanOp, ReduceSumOp

ISLAND_KINDS: dict[str, str] = {
    "norm_stats": "square -> mean/sum -> eps, sqrt/rsqrt/reciprocal -> normalizing div/mul (norms, variance)",
    "softmax_sum": "exp -> sum -> div or log -> sub (softmax and log-softmax written out)",
}

_CHAIN_UNARY = (SqrtOp, RsqrtOp, ReciprocalOp, LogOp)
_ARITH = (AddOp, SubOp, MulOp, DivOp)
_NORMALIZING = (DivOp, MulOp, SubOp)


def parse_island_kinds(text: str) -> tuple[str, ...]:
    """``all``, ``none`` or kinds joined by ``+`` → the kinds; ValueError naming the valid ones."""
    text = text.strip()
    if text == "all":
        return tuple(ISLAND_KINDS)
    if text in ("none", ""):
        return ()
    kinds = tuple(k.strip() for k in text.split("+"))
    check_island_kinds(kinds)
    return kinds


def check_island_kinds(kinds) -> None:
    """ValueError for an unknown kind or a repeat, listing the known kinds."""
    seen = set()
    for k in kinds:
        if k not in ISLAND_KINDS:
            raise ValueError(f"unknown f32 island kind {k!r} (expected any of {', '.join(ISLAND_KINDS)})")
        if k in seen:
            raise ValueError(f"f32 island kind {k!r} is listed twice")
        seen.add(k)


def _is_const(v: Value) -> bool:
    return isinstance(v.owner, ConstantOp)


def _is_square(op: Operation) -> bool:
    if isinstance(op, MulOp):
        return op.operands[0] is op.operands[1]
    if isinstance(op, PowOp):
        exp = op.operands[1]
        return _is_const(exp) and exp.owner.value.size > 0 and bool(np.all(exp.owner.value == 2))
    return False


def find_islands(func: Function, kinds) -> dict[int, str]:
    """``id(op) -> kind`` for every f32 op of ``func`` the policy keeps in f32 (``kinds`` enabled)."""
    kinds = set(kinds)
    if not kinds:
        return {}
    uses = func.uses()
    island: dict[int, str] = {}
    for op in func.ops:
        if not isinstance(op, (ReduceMeanOp, ReduceSumOp)) or op.result.type.dtype.name != "f32":
            continue
        src = op.operands[0].owner
        if not isinstance(src, Operation) or id(op) in island:
            continue
        if "norm_stats" in kinds and _is_square(src):
            kind = "norm_stats"
        elif "softmax_sum" in kinds and isinstance(src, ExpOp) and isinstance(op, ReduceSumOp):
            kind = "softmax_sum"
        else:
            continue
        island.setdefault(id(src), kind)
        island[id(op)] = kind
        _grow(op.result, kind, uses, island)
    return island


def _grow(start: Value, kind: str, uses: dict, island: dict[int, str]) -> None:
    """Add the consumers of ``start`` that carry the island on to the normalized value."""
    work = [start]
    while work:
        v = work.pop()
        for user in uses.get(v, []):
            if id(user) in island:
                continue
            if isinstance(user, _CHAIN_UNARY):
                island[id(user)] = kind
                work.append(user.result)
            elif isinstance(user, _ARITH):
                others = [o for o in user.operands if o is not v]
                if all(_is_const(o) for o in others):
                    island[id(user)] = kind  # eps, 1/N: the chain goes on
                    work.append(user.result)
                elif all(id(o.owner) in island or _is_const(o) for o in others) or isinstance(
                    user, _NORMALIZING
                ):
                    island[id(user)] = kind  # the normalization itself: its result is bounded
