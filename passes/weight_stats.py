"""Weight bytes of a module as stored: what every compile summary reports before and after the passes.

A MatMul/Gemm weight is the ``b`` operand (operand 1) of a matmul op (``mcp.matmul`` and the fused
quantized ``mcp.matmul_*`` ops, whose further constant operands are the weight's scales and zero
points) that is a constant, or a ``mcp.dequantize`` (or cast) of constants: its codes, scales and
zero points all count, each at its storage width (i4 packed two per byte).  A weight read by
several matmuls (a tied LM head) counts once, and so does a constant shared by several weights —
by content, so the functions of one module (a decoder's ``prefill`` and ``decode``) count their
shared weights once, as the program's constant pool stores them.  A constant read through a view
(an export's un-folded Transpose) counts as the weight it is.
"""

from __future__ import annotations

import hashlib

import numpy as np

from mcpc.ir.core import Module
from mcpc.ir.ops import CastOp, ConstantOp, DequantizeOp, ReshapeOp, TransposeOp


def _stored(op) -> list | None:
    """The constants that make up the weight of the matmul ``op``, or None when it is computed at
    run time."""
    owner = op.operands[1].owner
    if isinstance(owner, ConstantOp):
        return [v for v in op.operands[1:] if isinstance(v.owner, ConstantOp)]
    if isinstance(owner, (DequantizeOp, CastOp, TransposeOp, ReshapeOp)) and all(
        isinstance(v.owner, ConstantOp) for v in owner.operands[:1]
    ):  # a constant weight read through a view (an unfolded export's Transpose) or dequantized
        return [v for v in owner.operands if isinstance(v.owner, ConstantOp)]
    return None


def _key(v) -> tuple:
    """A constant's identity by content: the functions of one module (a decoder's prefill and
    decode) hold their own constant ops over the same weights, which the program stores once."""
    a = np.ascontiguousarray(v.owner.value)
    return (v.type.dtype.name, v.type.shape, hashlib.sha256(a.tobytes()).hexdigest())


def weight_stats(module: Module) -> dict:
    """``{"weights": count, "params": elements, "bytes": stored bytes, "bits_per_weight": ...}`` over
    every MatMul/Gemm weight of ``module`` (constant ``b`` operands, dequantized or not)."""
    seen_b: set = set()
    seen_const: set = set()
    params = nbytes = count = 0
    for op in module.walk():
        if not op.name.startswith("mcp.matmul") or len(op.operands) < 2:
            continue
        b = op.operands[1]
        parts = _stored(op)
        if parts is None:
            continue
        keys = [_key(v) for v in parts]
        if tuple(keys) in seen_b:
            continue
        seen_b.add(tuple(keys))
        count += 1
        params += b.type.numel
        for v, k in zip(parts, keys, strict=True):
            if k not in seen_const:
                seen_const.add(k)
                nbytes += v.type.nbytes
    return {
        "weights": count,
        "params": params,
        "bytes": nbytes,
        "bits_per_weight": 8.0 * nbytes / params if params else 0.0,
    }
