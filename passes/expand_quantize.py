"""``expand-quantize``: the ``mcp.quantize`` / ``mcp.dequantize`` ops left after fusion, written as
the elementwise ops the vector unit runs — bit for bit what ``numerics.quantize`` /
``numerics.dequantize`` compute.

Assumes a valid module (run after ``fuse-dequantize-matmul``: what it fused is no longer here).
Guarantees a valid module with the same bits, without quantize or dequantize ops (dead ops are
removed first, as ``dce``), or
UnsupportedError (exit 4) naming the op and its ONNX node for what it cannot express.

With ``f`` the f32 form of a value (``mcp.cast``; constant qparams are converted here):

* ``dequantize(x, s, z) {out}`` = ``cast(mul(sub(f(x), f(z)), f(s)), out)``.  For 8-bit and f8
  codes ``f(x) - f(z)`` is exact in f32 (|x - z| < 2^24), as numerics' exact integer difference
  converted to f32; the product is f32, rounded once to ``out``.  i32 codes (a bias) need a zero
  zero point (``f(x)`` is then numerics' one rounding of the exact value) — refused otherwise.
* ``quantize(x, s, z)`` to f8e4m3fn (saturating) = ``cast(add(div(f(x), f(s)), f(z)), f8)``: the
  f32 quotient plus the zero point, rounded once with saturation to ±448 (``numerics.cast``).
* ``quantize(x, s, z)`` to i8/u8 = ``cast(min(max(select(eq(r, r), r, f(z)), lo), hi), q)`` with
  ``r = add(round(div(f(x), f(s))), f(z))``: the f32 quotient, rounded half to even (exact), the
  zero point added (exact below 2^24; anything larger clips to the same bound), NaN giving the
  zero point, clipped, then the integer-valued f32 converted exactly.
* Per-tensor qparams broadcast; per-axis ones are reshaped to broadcast along ``axis``; blocked
  ones too, with x reshaped to split ``axis`` into (blocks, block_size) — refused when the block
  size does not divide the axis.

A dequantize of integer codes blocked along their last axis (``ops_qmatmul.rows_dequantize``, e.g.
the gathered rows of a quantized embedding) is kept: the backend runs it as ``vdequant``.

Scales and zero points may be run-time values (reshaped and cast to f32 by ops, exactly).
Refused (exit 4): other 4-bit codes that do not feed a matmul (4-bit tensors are stored packed
and the elementwise lowering does not read them), quantize to 4-bit or to f8 with saturate=0,
i32 codes with a zero point that is not a constant zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from mcpc.arch import numerics as nx
from mcpc.errors import UnsupportedError
from mcpc.ir import ops
from mcpc.ir.core import Function, Module, Operation, Value
from mcpc.ir.dtypes import F32
from mcpc.ir.ops_qmatmul import rows_dequantize
from mcpc.passes.dce import dce_function
from mcpc.passes.manager import Pass, PassContext, register_pass


class _Builder:
    def __init__(self, loc):
        self.ops: list[Operation] = []
        self.loc = loc

    def op(self, cls, operands, attrs=None) -> Value:
        o = cls(operands, attrs or {}, loc=self.loc)
        self.ops.append(o)
        return o.result

    def const(self, arr: np.ndarray) -> Value:
        return self.op(ops.ConstantOp, [], {"value": np.ascontiguousarray(arr)})

    def f32(self, v: Value) -> Value:
        return v if v.type.dtype == F32 else self.op(ops.CastOp, [v], {"to": F32})

    def reshape(self, v: Value, shape) -> Value:
        shape = [int(d) for d in shape]
        return v if list(v.type.shape) == shape else self.op(ops.ReshapeOp, [v], {"shape": shape})


def _constant(v: Value) -> np.ndarray | None:
    return v.owner.value if isinstance(v.owner, ops.ConstantOp) else None


def _qparam_layout(op, x_shape) -> tuple[list[int] | None, list[int]]:
    """(x reshaped to, qparam reshaped to) so that the qparams broadcast over x; the first is None
    when x keeps its shape."""
    scale_t = op.operands[1].type
    axis, block = int(op.attrs["axis"]), int(op.attrs["block_size"])
    rank = len(x_shape)
    if scale_t.numel == 1 and block == 0:
        return None, [1] * max(rank, 1) if rank else []
    ax = axis % rank
    if block == 0:
        shape = [1] * rank
        shape[ax] = x_shape[ax]
        return None, shape
    if x_shape[ax] % block:
        raise UnsupportedError(
            f"{op.describe()}: blocked quantization with block_size {block} not dividing the axis "
            f"({x_shape[ax]}) is not lowered unless the dequantize feeds a matmul"
        )
    split = [*x_shape[:ax], x_shape[ax] // block, block, *x_shape[ax + 1 :]]
    qshape = [*x_shape[:ax], x_shape[ax] // block, 1, *x_shape[ax + 1 :]]
    return split, qshape


def _qparams_f32(b: _Builder, op, qshape) -> tuple[Value, Value, bool]:
    """The scale and zero point as f32 values shaped ``qshape``, and whether the zero point may be
    non-zero.  Constants are converted here; run-time qparams get a reshape and a cast (exact:
    f16/bf16 scales and 8-bit zero points are f32 values)."""
    scale, zp = _constant(op.operands[1]), _constant(op.operands[2])
    if scale is not None:
        s = b.const(np.asarray(nx.cast(np.asarray(scale).reshape(qshape), "f32")))
    else:
        s = b.f32(b.reshape(op.operands[1], qshape))
    if zp is not None:
        z = np.asarray(zp).reshape(qshape)
        zf = z.astype(np.float32) if z.dtype.kind in "iub" else nx.cast(z, "f32")
        return s, b.const(np.asarray(zf)), bool(z.astype(np.float32).any())
    return s, b.f32(b.reshape(op.operands[2], qshape)), True


def expand_dequantize(op: ops.DequantizeOp) -> tuple[list[Operation], Value]:
    x = op.operands[0]
    xt = x.type
    if xt.dtype.packed:
        raise UnsupportedError(
            f"{op.describe()}: {xt.dtype} codes that do not feed a matmul (fuse-dequantize-matmul) are "
            "not lowered: 4-bit tensors are stored packed and the vector lowering does not read them yet"
        )
    b = _Builder(op.loc)
    split, qshape = _qparam_layout(op, xt.shape)
    s, z, nonzero = _qparams_f32(b, op, qshape)
    if xt.dtype.name == "i32" and nonzero:
        raise UnsupportedError(f"{op.describe()}: i32 codes with a non-zero zero point are not lowered")
    xv = b.f32(b.reshape(x, split) if split else x)
    d = b.op(ops.SubOp, [xv, z]) if nonzero else xv
    y = b.op(ops.MulOp, [d, s])
    out = op.attrs["out"]
    if out != F32:
        y = b.op(ops.CastOp, [y], {"to": out})
    return b.ops, b.reshape(y, xt.shape) if split else y


def expand_quantize(op: ops.QuantizeOp) -> tuple[list[Operation], Value]:
    x = op.operands[0]
    xt, qt = x.type, op.result.type.dtype
    f8 = qt.name == "f8e4m3fn" and bool(op.attrs["saturate"])
    if qt.name not in ("i8", "u8") and not f8:
        raise UnsupportedError(
            f"{op.describe()}: quantizing to {qt} is not lowered (i8, u8 and saturating f8e4m3fn are; "
            "4-bit results are stored packed)"
        )
    b = _Builder(op.loc)
    split, qshape = _qparam_layout(op, xt.shape)
    s, z, _ = _qparams_f32(b, op, qshape)
    xv = b.f32(b.reshape(x, split) if split else x)
    if f8:  # x / s + z in f32, one saturating rounding to f8 (mcp.cast clamps to ±448, NaN stays)
        y = b.op(ops.CastOp, [b.op(ops.AddOp, [b.op(ops.DivOp, [xv, s]), z])], {"to": qt})
        return b.ops, b.reshape(y, xt.shape) if split else y
    r = b.op(ops.AddOp, [b.op(ops.RoundOp, [b.op(ops.DivOp, [xv, s])]), z])
    r = b.op(ops.SelectOp, [b.op(ops.EqualOp, [r, r]), r, z])  # NaN -> the zero point
    lo, hi = qt.range()
    r = b.op(ops.MaxOp, [r, b.const(np.array(lo, np.float32))])
    r = b.op(ops.MinOp, [r, b.const(np.array(hi, np.float32))])
    y = b.op(ops.CastOp, [r], {"to": qt})
    return b.ops, b.reshape(y, xt.shape) if split else y


def expand_function(func: Function) -> int:
    dce_function(func)  # a dequantize fused into its matmul is dead: nothing to lower
    new_ops: list[Operation] = []
    count = 0
    for op in func.ops:
        if isinstance(op, ops.DequantizeOp) and rows_dequantize(op):
            new_ops.append(op)  # the backend's vdequant computes it directly
            continue
        if isinstance(op, ops.DequantizeOp):
            made, result = expand_dequantize(op)
        elif isinstance(op, ops.QuantizeOp):
            made, result = expand_quantize(op)
        else:
            new_ops.append(op)
            continue
        new_ops += made
        func.replace_all_uses(op.result, result)
        count += 1
    func.ops = new_ops
    return count


@register_pass
@dataclass(frozen=True)
class ExpandQuantizePass(Pass):
    """Write the remaining quantize/dequantize ops as elementwise ops (see the module docstring).

    Assumes: a valid module.  Guarantees: a valid module with the same bits and no quantize or
    dequantize op, or UnsupportedError naming the op it cannot express.
    """

    name: ClassVar[str] = "expand-quantize"

    def apply(self, module: Module, ctx: PassContext) -> Module:
        for func in module.functions.values():
            expand_function(func)
        return module
