"""``convert-precision{dtype=f16}``: the fp16 (or bf16) build of an f32 module.

Assumes a valid module whose float tensors are f32.  Guarantees a valid module with the same
interface (argument and result types unchanged) in which:

* f32 constants become ``dtype`` constants (round half to even; finite values beyond the dtype's
  range saturate to its largest finite value, so a ``-1e9`` attention mask fill stays finite);
* every f32 argument is cast to ``dtype`` right after the function entry, and every result whose
  dtype changed is cast back to its declared dtype right before ``mcp.return``;
* every other op is rebuilt on the converted operands with each dtype attribute equal to f32
  rewritten to ``dtype`` (``mcp.cast {to}``, ``mcp.matmul {out}``), its result types re-inferred.
  So a matmul takes and produces ``dtype`` while still accumulating in f32, and softmax /
  layer_norm / reductions compute in f32 internally and round once to ``dtype`` — the
  interpreter's semantics of each op, nothing approximated here;
* f32 globals (persistent buffers) become ``dtype`` globals, and their loads and stores follow;
* an op that does not accept the converted operand types (its ``infer_types`` refuses them, or it
  would not produce ``dtype`` where it produced f32) is left exactly as it was, in f32: an island
  with casts to f32 before it and casts of its f32 results to ``dtype`` after it, so everything
  downstream stays in ``dtype``.  Integer and bool tensors are never touched;
* the computations the precision policy keeps in f32 (``mcpc.passes.precision_policy``: a norm's
  square, mean and rsqrt up to the normalization; a written-out softmax's exp, sum and division)
  stay f32 with minimal casts: one cast to f32 of the value entering the island, and a cast to
  ``dtype`` of an island result only where an op outside the island uses it.  The ``islands``
  option picks the kinds: ``config`` (the QAT config's ``precision.f32_islands``, every kind when
  it has none), ``all``, ``none``, or kinds joined by ``+`` (``norm_stats+softmax_sum``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from mcpc.arch import numerics as nx
from mcpc.errors import VerifyError
from mcpc.ir.core import Function, GlobalDecl, Module, Operation, Value
from mcpc.ir.dtypes import F32, DType, dtype_from_name
from mcpc.ir.ops_core import ConstantOp
from mcpc.ir.ops_elementwise import CastOp
from mcpc.ir.ops_state import GlobalLoadOp
from mcpc.passes.manager import Pass, PassContext, register_pass
from mcpc.passes.precision_policy import ISLAND_KINDS, find_islands, parse_island_kinds

TARGETS = ("f16", "bf16")


def convert_constant(value: np.ndarray, target: DType) -> np.ndarray:
    """``value`` (f32) rounded to ``target``, finite values saturating at the largest finite one."""
    big = float(np.finfo(target.np_dtype).max)
    with np.errstate(invalid="ignore"):
        clipped = np.where(np.isfinite(value), np.clip(value, -big, big), value).astype(np.float32)
    return nx.cast(clipped, target.name)


def convert_function(func: Function, target: DType, islands: tuple[str, ...] = ()) -> None:
    """Convert ``func`` in place (see the module docstring); ``islands`` are the policy kinds
    (``precision_policy.ISLAND_KINDS``) whose ops stay f32."""
    keep = find_islands(func, islands)
    new_ops: list[Operation] = []
    vmap: dict[int, Value] = {}
    f32_of: dict[int, Value] = {}  # original f32 value -> its f32 form in the new function
    to_target: dict[int, Value] = {}  # island result -> its cast to ``target`` (made when used)
    constants: dict[int, ConstantOp] = {}  # original f32 constants, re-added when an island uses them

    def cast(v: Value, to: DType, loc) -> Value:
        op = CastOp([v], {"to": to}, loc=loc)
        new_ops.append(op)
        return op.result

    def lookup(v: Value, loc) -> Value:
        if id(v) in to_target or id(v.owner) not in keep or v.type.dtype != F32:
            return to_target.get(id(v)) or vmap.get(id(v), v)
        to_target[id(v)] = cast(v, target, v.owner.loc)  # leaving an island: cast where first used
        return to_target[id(v)]

    def as_f32(v: Value, loc) -> Value:
        if v.type.dtype != F32:
            return vmap.get(id(v), v)
        if id(v.owner) in keep or v.is_argument:
            return v  # still defined in f32 (island results, arguments)
        if id(v) not in f32_of:
            if isinstance(v.owner, ConstantOp):
                new_ops.append(constants.setdefault(id(v.owner), v.owner))
                f32_of[id(v)] = v
            else:
                f32_of[id(v)] = cast(vmap.get(id(v), v), F32, loc)
        return f32_of[id(v)]

    for arg in func.args:
        if arg.type.dtype == F32:
            vmap[id(arg)] = cast(arg, target, arg.name)
    for op in func.ops:
        if id(op) in keep:  # a policy island: the op as it was, on f32 operands
            op.operands = [as_f32(v, op.loc) for v in op.operands]
            new_ops.append(op)
            continue
        if op.IS_TERMINATOR:  # casts back to the declared result types, named after the outputs
            operands = [v if id(v.owner) in keep else lookup(v, op.loc) for v in op.operands]
            op.operands = [
                n if n.type.dtype == o.type.dtype else cast(n, o.type.dtype, op.loc or name)
                for n, o, name in zip(operands, op.operands, func.result_names, strict=True)
            ]
            new_ops.append(op)
            continue
        operands = [lookup(v, op.loc) for v in op.operands]
        if isinstance(op, ConstantOp):
            if op.value.dtype == np.float32:
                new = ConstantOp([], {"value": convert_constant(op.value, target)}, loc=op.loc)
                _carry(op, new, vmap, new_ops)
            else:
                new_ops.append(op)
            continue
        new = _rebuilt(op, operands, target)
        if new is None:  # an f32 island: operands back to what it had, f32 results on to ``target``
            op.operands = [
                n if n.type.dtype == o.type.dtype else cast(n, o.type.dtype, op.loc)
                for n, o in zip(operands, op.operands, strict=True)
            ]
            new_ops.append(op)
            for r in op.results:
                if r.type.dtype == F32:
                    vmap[id(r)] = cast(r, target, op.loc)
                    f32_of[id(r)] = r  # a policy island reading it takes the f32 value itself
        elif isinstance(new, CastOp) and new.operands[0].type == new.result.type:
            vmap[id(op.result)] = new.operands[0]  # a cast that became a no-op
        else:
            _carry(op, new, vmap, new_ops)
    func.ops = new_ops


def _rebuilt(op: Operation, operands: list[Value], target: DType) -> Operation | None:
    """``op`` on ``operands`` with f32 dtype attributes → ``target``; None when that is not valid."""
    unchanged = all(n is o for n, o in zip(operands, op.operands, strict=True))
    if unchanged and not _has_f32_attr(op) and all(r.type.dtype != F32 for r in op.results):
        return op  # no float involved (integer and bool ops)
    attrs = {k: (target if isinstance(v, DType) and v == F32 else v) for k, v in op.attrs.items()}
    result_types = None
    if isinstance(op, GlobalLoadOp):  # its type comes from the global, which converts too
        result_types = [r.type.with_dtype(target) if r.type.dtype == F32 else r.type for r in op.results]
    try:
        new = type(op)(operands, attrs, result_types=result_types, loc=op.loc)
        new.verify()
    except (ValueError, TypeError, IndexError, KeyError, VerifyError):
        return None
    for old_r, new_r in zip(op.results, new.results, strict=True):
        want = target if old_r.type.dtype == F32 else old_r.type.dtype
        if new_r.type != old_r.type.with_dtype(want):
            return None
    return new


def _has_f32_attr(op: Operation) -> bool:
    return any(isinstance(v, DType) and v == F32 for v in op.attrs.values())


def _carry(old: Operation, new: Operation, vmap: dict[int, Value], new_ops: list[Operation]) -> None:
    """Append ``new`` in place of ``old``, mapping old results to new ones."""
    for o, n in zip(old.results, new.results, strict=True):
        if n is not o:
            vmap[id(o)] = n
    new_ops.append(new)


@register_pass
@dataclass(frozen=True)
class ConvertPrecisionPass(Pass):
    """Convert f32 weights and activations to ``dtype`` (f16 or bf16), f32 accumulation kept.

    Assumes: a valid module.  Guarantees: a valid module with unchanged argument and result types;
    see the module docstring for what converts and what stays f32.
    """

    name: ClassVar[str] = "convert-precision"
    dtype: str = "f16"
    islands: str = "config"

    def __post_init__(self):
        if self.dtype not in TARGETS:
            raise ValueError(f"dtype must be one of {', '.join(TARGETS)}, got {self.dtype!r}")
        if self.islands != "config":
            try:
                parse_island_kinds(self.islands)
            except ValueError as exc:
                raise ValueError(f"islands: {exc} (or config, all, none)") from None

    def island_kinds(self, ctx: PassContext) -> tuple[str, ...]:
        """The policy kinds kept in f32: from the option, else from the config, else all of them."""
        if self.islands != "config":
            return parse_island_kinds(self.islands)
        precision = getattr(ctx.config, "precision", None)
        chosen = getattr(precision, "f32_islands", None)
        return tuple(ISLAND_KINDS) if chosen is None else tuple(chosen)

    def apply(self, module: Module, ctx: PassContext) -> Module:
        target = dtype_from_name(self.dtype)
        kinds = self.island_kinds(ctx)
        for func in module.functions.values():
            convert_function(func, target, kinds)
        # persistent buffers are stored in the build's dtype, except the attention heat that
        # mcp.paged_attention writes (f32 by definition, ir/ops_kv.py)
        heat = {op.attrs.get("heat_global") for f in module.functions.values() for op in f.ops}
        for name, g in module.globals.items():
            if g.type.dtype == F32 and name not in heat:
                module.globals[name] = GlobalDecl(name, g.type.with_dtype(target))
        return module
