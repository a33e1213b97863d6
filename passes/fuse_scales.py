"""``fuse-scales``: scale fusion of quantized-activation matmuls (``mcp.matmul_qa``).

Assumes a valid module.  A matmul whose operands are an activation quantize→dequantize pair
(per tensor, int4 / int8 / uint8, the same scale and zero point on both sides — a QAT export or
ONNX Runtime ``quantize_static`` QDQ model) and the dequantize of constant weight codes (int8,
int4 or fp8 e4m3fn with zero point 0, per tensor or per output channel, read directly or through a
transpose) becomes ``mcp.matmul_qa(x, codes, fused, za) {scale_a}``: the activation codes are
made inside the instruction (``vmmul.q4f8`` for int4 × fp8, ``matmul_i8`` otherwise), the products
are exact, and the two dequantizations are replaced by one multiplication of the accumulated
product by the fused scale ``f32(scale_a · scale_w)`` per column (``numerics.fused_scale``) —
the scale_a × scale_w fold.  The quantize and both dequantizes are left for ``dce``.

Guarantees a valid module computing the QDQ model's quantized math: the activation codes are
those of the unfused ``mcp.quantize`` (same kernel); the unfused pair rounds ``(qa − za)·scale_a``
and ``w·scale_w`` each to the matmul dtype and sums f32 products, the fused op sums exactly and
rounds once — so the two differ by float rounding only (relative ~1e-7 in f32, an f16 build's
unfused weights are the less accurate side).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from mcpc.arch import numerics as nx
from mcpc.ir.core import Function, Module, Operation
from mcpc.ir.ops_core import ConstantOp
from mcpc.ir.ops_nn import MatMulOp
from mcpc.ir.ops_qmatmul import ACTIVATION_CODE_DTYPES, QA_WEIGHT_DTYPES, MatMulQAOp
from mcpc.ir.ops_quant import DequantizeOp, QuantizeOp, qparam_granularity
from mcpc.passes.fuse_dequantize import _constant, _weight_dequantize
from mcpc.passes.manager import Pass, PassContext, register_pass


def _per_tensor(op) -> tuple[float, np.ndarray] | None:
    s, z = _constant(op.operands[1]), _constant(op.operands[2])
    if s is None or z is None or s.size != 1:
        return None
    return float(np.asarray(s, np.float32).reshape(())), np.asarray(z).reshape(1)


def _activation(op: MatMulOp):
    """(x, scale_a, za) when ``op``'s a is dequantize(quantize(x)) with equal per-tensor qparams."""
    deq = op.operands[0].owner
    if not isinstance(deq, DequantizeOp):
        return None
    q = deq.operands[0].owner
    if not isinstance(q, QuantizeOp) or q.result.type.dtype.name not in ACTIVATION_CODE_DTYPES:
        return None
    a, b = _per_tensor(q), _per_tensor(deq)
    if a is None or b is None or a[0] != b[0] or a[1].tobytes() != b[1].tobytes() or not a[0] > 0:
        return None
    return q.operands[0], a[0], a[1]


def _weight(op: MatMulOp):
    """(codes, trans_b, scale_w [N] or [1] f32) of a constant weight dequantize with zero point 0."""
    found = _weight_dequantize(op)
    if found is None:
        return None
    deq, trans_b = found
    codes, scale, zp = (_constant(v) for v in deq.operands)
    ct = deq.operands[0].type
    if codes is None or scale is None or zp is None or ct.rank != 2 or ct.dtype.name not in QA_WEIGHT_DTYPES:
        return None
    if np.asarray(zp, np.float32).any() or (ct.dtype.packed and ct.shape[1] % 2):
        return None  # a weight zero point, or packed rows not starting on a byte
    n_axis = 0 if trans_b else 1
    axis, block = int(deq.attrs["axis"]) % 2, int(deq.attrs["block_size"])
    kind = qparam_granularity(ct, deq.operands[1].type, axis, block)
    one_block = kind == "block" and axis != n_axis and block >= ct.shape[axis]  # a block spanning K
    if kind == "tensor" or (kind == "axis" and axis == n_axis) or one_block:
        return deq.operands[0], trans_b, np.asarray(scale, np.float32).reshape(-1)
    return None


def fuse_function(func: Function) -> int:
    """Rewrite the fusable matmuls of ``func`` in place; return how many."""
    new_ops: list[Operation] = []
    count = 0
    for op in func.ops:
        act = _activation(op) if isinstance(op, MatMulOp) else None
        w = _weight(op) if act is not None else None
        if w is None:
            new_ops.append(op)
            continue
        x, scale_a, za = act
        codes, trans_b, scale_w = w
        if x.type.dtype != op.operands[0].type.dtype:
            new_ops.append(op)
            continue
        fused = ConstantOp(
            [], {"value": np.asarray(nx.fused_scale(scale_a, scale_w), np.float32)}, loc=op.loc
        )
        zpc = ConstantOp([], {"value": za}, loc=op.loc)
        attrs = {"scale_a": scale_a, "trans_b": trans_b, "out": op.attrs["out"]}
        qa = MatMulQAOp([x, codes, fused.result, zpc.result], attrs, loc=op.loc)
        new_ops += [fused, zpc, qa]
        func.replace_all_uses(op.result, qa.result)
        count += 1
    func.ops = new_ops
    return count


@register_pass
@dataclass(frozen=True)
class FuseScalesPass(Pass):
    """Fold activation QDQ + weight dequantize around a matmul into ``mcp.matmul_qa`` with one
    fused scale per column (module docstring).  Run ``dce`` after it."""

    name: ClassVar[str] = "fuse-scales"

    def apply(self, module: Module, ctx: PassContext) -> Module:
        for func in module.functions.values():
            fuse_function(func)
        return module
