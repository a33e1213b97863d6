"""Weight bytes of a module as stored: what every compile summary reports before and after the passes.

A MatMul/Gemm weight is the ``b`` operand (operand 1) of a matmul op (``mcp.matmul`` and the fused
quantized ``mcp.matmul_*`` ops, whose further constant operands are the weight's scales and zero
points) that is a constant, or a ``mcp.dequantize`` (or cast) of constants: its codes, scales and
zero points all count, each at its storage width (i4 packed two per byte).  A weight read by
several matmuls (a tied LM head) counts once, and so does a constant shared by several weights.
"""

from __future__ import annotations

from mcpc.ir.core import Module
from mcpc.ir.ops import CastOp, ConstantOp, DequantizeOp


def _stored(op) -> list | None:
    """The constants that make up the weight of the matmul ``op``, or None when it is computed at
    run time."""
    owner = op.operands[1].owner
    if isinstance(owner, ConstantOp):
        return [v for v in op.operands[1:] if isinstance(v.owner, ConstantOp)]
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
        if not op.name.startswith("mcp.matmul") or len(op.operands) < 2:
            continue
        b = op.operands[1]
        parts = _stored(op)
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
