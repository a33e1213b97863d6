"""``fold-norm-gain``: fold a normalization's per-channel gain (RMSNorm's ``· g``, LayerNorm's
``scale`` and ``bias``) into the linear layers that consume it.

Assumes a valid module.  Guarantees a valid module computing the same function up to rounding
(the numbers below), in which a gain that only feeds linears is gone:

* ``mcp.mul(n, g)`` with ``g`` a constant vector along the last axis (shape ``[H]`` or ``[1, …, H]``,
  the written-out RMSNorm's gain) whose result is used only as the ``a`` of ``mcp.matmul``s with
  constant 2-D float weights ``W`` ([H, N], or [N, H] with ``trans_b``): each matmul reads ``n``
  and ``W' = diag(g) · W`` (column ``j`` of ``W`` scaled row-wise by ``g``), the mul disappears;
* ``mcp.layer_norm(x, γ, β)`` over the last axis used only that way: the norm keeps γ = 1, β = 0,
  each matmul reads ``W' = diag(γ) · W`` and, when β ≠ 0, adds the constant row ``β · W`` to its
  result (an ``mcp.add`` the backend fuses into the matmul's epilogue).

Exactness: ``(n ⊙ g) · W = n · (diag(g) W)`` and ``(n ⊙ γ + β) · W = n · (diag(γ) W) + β W`` are
identities of real arithmetic: every product ``n_k g_k W_kj`` is the same real number, summed in
the same order.  What changes is rounding: ``n_k g_k`` was rounded to the activation dtype before
the product, now ``g_k W_kj`` is rounded to the weight dtype (in f32 both are one f32 rounding per
product, relative 2^-24; in an f16 build one f16 rounding, 2^-11, on either side); ``β W`` is
computed in f64 and rounded once.  So the folded result differs from the unfused one by at most a
few units in the last place of the products' dtype: the test holds it within the seed's ±0.3 %.
Not folded: a gain whose result has any other consumer (it is then still needed), quantized
weights (their codes would have to be requantized), matmuls with batched weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from mcpc.arch import numerics as nx
from mcpc.ir.core import Function, Module, Operation, Value
from mcpc.ir.ops_core import ConstantOp
from mcpc.ir.ops_elementwise import AddOp, MulOp
from mcpc.ir.ops_nn import LayerNormOp, MatMulOp
from mcpc.passes.manager import Pass, PassContext, register_pass


def _constant(v: Value) -> np.ndarray | None:
    return v.owner.value if isinstance(v.owner, ConstantOp) else None


def _gain_vector(op: MulOp) -> tuple[Value, np.ndarray] | None:
    """(n, g) when ``op`` multiplies a value by a constant vector along the last axis."""
    for i in (0, 1):
        g, n = _constant(op.operands[i]), op.operands[1 - i]
        if g is None or _constant(n) is not None or not n.type.dtype.is_float:
            continue
        h = n.type.shape[-1] if n.type.rank else 0
        if (
            g.size == h
            and (g.ndim == 1 or all(d == 1 for d in g.shape[:-1]))
            and n.type.shape == op.result.type.shape
        ):
            return n, np.asarray(g, np.float32).reshape(h)
    return None


def _linear_users(value: Value, uses: dict[int, list[Operation]]) -> list[MatMulOp] | None:
    users = uses.get(id(value), [])
    ok = users and all(
        isinstance(u, MatMulOp)
        and u.operands[0] is value
        and u.operands[1] is not value
        and _constant(u.operands[1]) is not None
        and u.operands[1].type.rank == 2
        and u.operands[1].type.dtype.is_float
        for u in users
    )
    return users if ok else None


def _scaled_weight(mm: MatMulOp, g: np.ndarray) -> np.ndarray:
    w = _constant(mm.operands[1]).astype(np.float32)
    scaled = w * (g[None, :] if mm.attrs["trans_b"] else g[:, None])  # one f32 rounding per product
    return nx.cast(scaled, mm.operands[1].type.dtype.name)


def fold_function(func: Function) -> int:
    """Fold the gains of ``func`` in place; return how many were folded."""
    uses: dict[int, list[Operation]] = {}
    for op in func.ops:
        for v in op.operands:
            uses.setdefault(id(v), []).append(op)
    before: dict[int, list[Operation]] = {}  # id(op) -> ops to insert before it
    after: dict[int, list[Operation]] = {}
    count = 0
    for op in list(func.ops):
        if isinstance(op, MulOp):
            found = _gain_vector(op)
            users = _linear_users(op.result, uses) if found else None
            if not users:
                continue
            n, g = found
            for mm in users:
                const = ConstantOp([], {"value": _scaled_weight(mm, g)}, loc=mm.loc)
                before.setdefault(id(mm), []).append(const)
                mm.operands = [n, const.result]
            count += 1
        elif isinstance(op, LayerNormOp):
            x, gamma_v, beta_v = op.operands
            gamma, beta = _constant(gamma_v), _constant(beta_v)
            if (
                gamma is None
                or beta is None
                or gamma.ndim != 1
                or int(op.attrs["axis"]) % x.type.rank != x.type.rank - 1
            ):
                continue
            users = _linear_users(op.result, uses)
            if not users or (not gamma.any() and not beta.any()):
                continue
            if np.array_equal(gamma, np.ones_like(gamma)) and not beta.any():
                continue  # nothing to fold
            dt = x.type.dtype.name
            ones = ConstantOp([], {"value": nx.cast(np.ones(gamma.shape, np.float32), dt)}, loc=op.loc)
            zeros = ConstantOp([], {"value": nx.cast(np.zeros(gamma.shape, np.float32), dt)}, loc=op.loc)
            before.setdefault(id(op), []).extend([ones, zeros])
            op.operands = [x, ones.result, zeros.result]
            g = np.asarray(gamma, np.float32)
            for mm in users:
                const = ConstantOp([], {"value": _scaled_weight(mm, g)}, loc=mm.loc)
                before.setdefault(id(mm), []).append(const)
                w = _constant(mm.operands[1]).astype(np.float64)
                mm.operands = [op.result, const.result]
                if beta.any():
                    row = beta.astype(np.float64) @ (w.T if mm.attrs["trans_b"] else w)
                    out = mm.result.type.dtype.name
                    bias = ConstantOp([], {"value": nx.cast(row.astype(np.float32), out)}, loc=mm.loc)
                    old = mm.result
                    add = AddOp([old, bias.result], loc=mm.loc)
                    for u in uses.get(id(old), []):  # the return included
                        u.operands = [add.result if v is old else v for v in u.operands]
                    after.setdefault(id(mm), []).extend([bias, add])
            count += 1
    if count:
        new_ops: list[Operation] = []
        for op in func.ops:
            new_ops += before.get(id(op), [])
            new_ops.append(op)
            new_ops += after.get(id(op), [])
        func.ops = new_ops
    return count


@register_pass
@dataclass(frozen=True)
class FoldNormGainPass(Pass):
    """Fold RMSNorm / LayerNorm gains into the consuming linears' weights (module docstring).

    Assumes: a valid module.  Guarantees: a valid module computing the same function up to the
    rounding stated in the module docstring; run ``dce`` after it to drop the unused gains."""

    name: ClassVar[str] = "fold-norm-gain"

    def apply(self, module: Module, ctx: PassContext) -> Module:
        for func in module.functions.values():
            fold_function(func)
        return module
