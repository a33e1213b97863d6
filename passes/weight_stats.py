"""Weight bytes of a module as stored: what every compile summary reports before and after the passes.

A MatMul/Gemm weight is a matmul's ``b`` that is a constant, or a ``mcp.dequantize`` (or cast) of
constants: its codes, scales and zero points all count, each at its storage width (i4 packed two
per byte).  A weight read by several matmuls (a tied LM head) counts once.
"""

from __future__ import annotations

from mcpc.ir.core import Module
from mcpc.ir.ops import CastOp, ConstantOp, DequantizeOp, MatMulOp


def _stored(value) -> list | None:
    """The constants that make up ``value`` (a weight), or None when it is computed at run time."""
    owner = value.owner
    if isinstance(owner, ConstantOp):
        return [value]
    if isinstance(owner, (DequantizeOp, CastOp)) and all(
        isinstance(v.owner, ConstantOp) for v in owner.operands
    ):
        return list(owner.operands)
    return None


def weight_stats(module: Module) -> dict:
    """``{"weights": count, "params": elements, "bytes": stored bytes, "bits_per_weight": ...}`` over
    every MatMul/Gemm weight of ``module`` (constant ``b`` operands, dequantized or not)."""
    seen_b: set[int] = set()
    seen_const: set[int] = set()
    params = nbytes = count = 0
    for op in module.walk():
        if not isinstance(op, MatMulOp):
            continue
        b = op.operands[1]
        parts = _stored(b)
        if parts is None or id(b) in seen_b:
            continue
        seen_b.add(id(b))
        count += 1
        params += b.type.numel
        for v in parts:
            if id(v) not in seen_const:
                seen_const.add(id(v))
                nbytes += v.type.nbytes
    return {
        "weights": count,
        "params": params,
        "bytes": nbytes,
        "bits_per_weight": 8.0 * nbytes / params if params else 0.0,
    }
