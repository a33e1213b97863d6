"""``fuse-dequantize-matmul``: fold a constant weight's ``mcp.dequantize`` into its ``mcp.matmul``.

Assumes a valid module.  Guarantees a valid module computing the same bits, in which every
``mcp.matmul(a, mcp.dequantize(codes, scale, zero_point))`` whose codes, scale and zero point are
constants — read directly or through an ``mcp.transpose`` of its two dims — is an
``mcp.matmul_w4a16(a, codes, scale', zero_point')`` when the weight fits the
instruction (the list below); the dequantize is left for ``dce`` (or for its other users, e.g.
the Gather of a tied embedding).  ``mcp.matmul_w4a16`` dequantizes exactly as ``mcp.dequantize``
does and rounds the weight to a's dtype, which the matmul's operand already was: so the fused op
computes the unfused pair's bits for the same tile.  The point is the bytes: the codes (int4 packed
two per byte, or int8), not the dequantized weight, are stored and streamed.

Fused when: the codes are 2-D ``i4``/``u4``/``i8``/``u8``; quantized per tensor, per output channel
(axis = the N axis) or blocked along K (axis = the K axis); 4-bit codes have an even number of
elements per stored row (each tile then starts on a byte), and a non-zero 4-bit zero point of
``[N, ceil(K/B)]`` (a transposed weight) has an even number of blocks.  Per-tensor and per-channel
qparams are rewritten to the instruction's layout, one entry per column (``[1, N]``, or ``[N, 1]``
when ``trans_b``), ``group_size`` 0.  Anything else stays unfused and runs as a dequantize
kernel followed by the float matmul — slower, same values.

A 4-bit zero point is stored packed like the codes, so a ``[rows, groups]`` zero-point tile read by
``vdequant`` or ``matmul_w4a16`` starts each row on a byte only when ``groups`` is even.  A
dequantize blocked along its last axis with an odd number of groups and a non-zero 4-bit zero
point (one group spanning K — ``group_size`` >= K — is the common case) is first rewritten with
smaller blocks — a divisor of the block size, or for one group ``ceil(K/2)`` — so the groups are
even in number, the scales and zero points repeated for each new block: every element keeps its
scale and zero point, the same bits.

4-bit codes blocked along an odd last axis (a table or ``[N, K]`` weight of odd K) are held in
8-bit containers (``i8``/``u8``, the same values) so their rows start on a byte.

The Gather of rows of a constant table quantized along its rows (a quantized embedding, tied to
the LM head or not) becomes the dequantize of the gathered rows: ``gather(dequantize(codes, s,
z) {axis 1}, ids) {axis 0}`` = ``dequantize(gather(codes, ids), gather(s, ids), gather(z, ids))
{axis -1}`` (dequantizing is elementwise, gathering moves elements: the same bits).  The packed
rows are what is gathered; ``vdequant`` dequantizes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from mcpc.ir.core import Function, Module, Operation
from mcpc.ir.ops_core import ConstantOp
from mcpc.ir.ops_nn import MatMulOp
from mcpc.ir.ops_qmatmul import WEIGHT_CODE_DTYPES, MatMulW4A16Op
from mcpc.ir.ops_quant import DequantizeOp, qparam_granularity
from mcpc.ir.ops_shape import GatherOp, TransposeOp
from mcpc.passes.manager import Pass, PassContext, register_pass


def _constant(value) -> np.ndarray | None:
    owner = value.owner
    return owner.value if isinstance(owner, ConstantOp) else None


def _even_group_block(k: int, block: int, groups: int) -> int | None:
    """A block size splitting each of the ``groups`` blocks (of ``block`` along an axis of ``k``)
    into whole smaller blocks so that their number is even, or None (module docstring)."""
    if groups == 1 and k >= 2:
        return -(-k // 2)
    for d in range(2, block + 1):
        b = block // d
        if block % d == 0 and -(-k // b) % 2 == 0:
            return b
    return None


def split_odd_zero_point_groups(op: DequantizeOp) -> list[Operation] | None:
    """``op`` rewritten with an even number of groups along its last axis (new constant scales and
    zero points, then the new dequantize) when its codes are 4-bit, blocked along the last axis,
    with an odd number of groups and a non-zero constant zero point; None when there is nothing to
    do or it cannot be done (then ``rows_dequantize`` refuses it rather than misread the tile)."""
    codes, scale_v, zp_v = op.operands
    ct = codes.type
    block = int(op.attrs["block_size"])
    if not ct.dtype.packed or ct.rank == 0 or block <= 0 or int(op.attrs["axis"]) % ct.rank != ct.rank - 1:
        return None
    scale, zp = _constant(scale_v), _constant(zp_v)
    if scale is None or zp is None or not zp.any() or zp.shape[-1] % 2 == 0:
        return None
    k = ct.shape[-1]
    b = _even_group_block(k, min(block, k), zp.shape[-1])
    if b is None:
        return None
    idx = np.arange(-(-k // b)) * b // min(block, k)
    made: list[Operation] = [
        ConstantOp([], {"value": np.ascontiguousarray(np.take(a, idx, axis=-1))}, loc=op.loc)
        for a in (scale, zp)
    ]
    attrs = {**op.attrs, "block_size": b}
    made.append(DequantizeOp([codes, made[0].result, made[1].result], attrs, loc=op.loc))
    return made


def widen_odd_rows(op: DequantizeOp) -> list[Operation] | None:
    """``op`` with its 4-bit constant codes (and zero point) held in 8-bit containers, the same
    values, when it is blocked along its last axis and that axis is odd (packed rows would not
    start on a byte: neither ``vdequant``, a Gather of its rows nor ``matmul_w4a16`` could read
    them); None otherwise."""
    codes_v, scale_v, zp_v = op.operands
    ct = codes_v.type
    if not ct.dtype.packed or ct.rank == 0 or ct.shape[-1] % 2 == 0:
        return None
    if int(op.attrs["block_size"]) <= 0 or int(op.attrs["axis"]) % ct.rank != ct.rank - 1:
        return None
    codes, zp = _constant(codes_v), _constant(zp_v)
    if codes is None or zp is None:
        return None
    wide = np.int8 if ct.dtype.name == "i4" else np.uint8
    made: list[Operation] = [ConstantOp([], {"value": a.astype(wide)}, loc=op.loc) for a in (codes, zp)]
    made.append(DequantizeOp([made[0].result, scale_v, made[1].result], dict(op.attrs), loc=op.loc))
    return made


def _weight_dequantize(op: MatMulOp) -> tuple[DequantizeOp, bool] | None:
    """The dequantize producing ``op``'s b — directly, or through a transpose of its two dims (a
    weight stored [N, K], as a tied LM head) — and the ``trans_b`` of reading its codes."""
    b = op.operands[1].owner
    trans_b = bool(op.attrs["trans_b"])
    if isinstance(b, TransposeOp) and [int(p) for p in b.attrs["perm"]] == [1, 0]:
        b, trans_b = b.operands[0].owner, not trans_b
    return (b, trans_b) if isinstance(b, DequantizeOp) else None


def fusable_weight(
    op: MatMulOp,
) -> tuple[DequantizeOp, bool, np.ndarray | None, np.ndarray, np.ndarray, int] | None:
    """``(dequantize, trans_b, codes, scale, zero_point, group_size)``, the qparams in
    ``mcp.matmul_w4a16``'s layout, when ``op``'s b is a fusable dequantize of constants (module
    docstring), else None.  ``codes`` is None when the dequantize's own codes are read, else the
    transposed codes to store (a 4-bit [K, N] weight of odd N and even K is stored [N, K])."""
    found = _weight_dequantize(op)
    if found is None:
        return None
    deq, trans_b = found
    codes, scale, zp = (_constant(v) for v in deq.operands)
    if codes is None or scale is None or zp is None:
        return None
    ct = deq.operands[0].type
    if ct.rank != 2 or ct.dtype.name not in WEIGHT_CODE_DTYPES:
        return None
    k_axis, n_axis = (1, 0) if trans_b else (0, 1)
    k, n = ct.shape[k_axis], ct.shape[n_axis]
    axis, block = int(deq.attrs["axis"]) % 2, int(deq.attrs["block_size"])
    kind = qparam_granularity(ct, deq.operands[1].type, axis, block)
    col_shape = (n, 1) if trans_b else (1, n)
    if kind == "tensor":
        scale, zp = (np.broadcast_to(x.reshape(1, 1), col_shape) for x in (scale, zp))
        group = 0
    elif kind == "axis" and axis == n_axis:
        scale, zp, group = scale.reshape(col_shape), zp.reshape(col_shape), 0
    elif kind == "block" and axis == k_axis:
        group = block if block < k else 0  # one block spanning K is per-channel
    else:
        return None
    packed = ct.dtype.packed
    stored = None
    if packed and not trans_b and n % 2 and k % 2 == 0:  # odd rows of [K, N]: store [N, K] instead
        stored, scale, zp, trans_b = codes.T, scale.T, zp.T, True
    elif packed and ct.shape[1] % 2:  # K and N odd: the codes are held in 8-bit containers
        wide = np.int8 if ct.dtype.name == "i4" else np.uint8
        stored, zp, packed = codes.astype(wide), zp.astype(wide), False
    if packed and trans_b and zp.any() and zp.shape[1] % 2:
        b = _even_group_block(k, group or k, zp.shape[1])
        if b is None:
            return None
        idx = np.arange(-(-k // b)) * b // (group or k)
        scale, zp, group = np.take(scale, idx, axis=1), np.take(zp, idx, axis=1), b
    arrays = (stored, scale, zp)
    return deq, trans_b, *(None if a is None else np.ascontiguousarray(a) for a in arrays), group


def _gathered_rows(op: GatherOp) -> list[Operation] | None:
    """``gather(dequantize(codes, s, z) {axis 1, blocked}, idx) {axis 0}`` — a quantized embedding
    table's rows — as ``dequantize(gather(codes), gather(s), gather(z)) {axis -1}``: the packed
    rows are gathered, only they are dequantized.  None when ``op`` is not that pattern."""
    deq = op.operands[0].owner
    if not isinstance(deq, DequantizeOp) or int(op.attrs["axis"]) != 0:
        return None
    codes, scale, zp = deq.operands
    ct = codes.type
    if ct.rank != 2 or int(deq.attrs["axis"]) % 2 != 1 or int(deq.attrs["block_size"]) <= 0:
        return None
    if ct.dtype.packed and ct.shape[1] % 2:
        return None
    idx = op.operands[1]
    made: list[Operation] = []

    def gather(v):
        g = GatherOp([v, idx], {"axis": 0}, loc=op.loc)
        made.append(g)
        return g.result

    zarr = _constant(zp)
    if zarr is not None and not zarr.any():  # symmetric: zeros of the gathered shape, not a gather
        shape = (*idx.type.shape, zp.type.shape[1])
        z = ConstantOp([], {"value": np.zeros(shape, zarr.dtype)}, loc=op.loc)
        made.append(z)
        zg = z.result
    elif zp.type.dtype.packed and zp.type.shape[1] % 2:
        return None
    else:
        zg = gather(zp)
    attrs = {"axis": -1, "block_size": deq.attrs["block_size"], "out": deq.attrs["out"]}
    made.append(DequantizeOp([gather(codes), gather(scale), zg], attrs, loc=op.loc))
    return made


def fuse_function(func: Function) -> int:
    """Rewrite the fusable matmuls (and quantized-table gathers) of ``func`` in place; return how
    many."""
    new_ops: list[Operation] = []
    for op in func.ops:
        split = None
        if isinstance(op, DequantizeOp):
            split = widen_odd_rows(op) or split_odd_zero_point_groups(op)
        new_ops += split or [op]
        if split:
            func.replace_all_uses(op.result, split[-1].result)
    func.ops, new_ops = new_ops, []
    count = 0
    for op in func.ops:
        rows = _gathered_rows(op) if isinstance(op, GatherOp) else None
        if rows is not None:
            new_ops += rows
            func.replace_all_uses(op.result, rows[-1].result)
            count += 1
            continue
        fused = fusable_weight(op) if isinstance(op, MatMulOp) else None
        if fused is None:
            new_ops.append(op)
            continue
        deq, trans_b, codes, scale, zp, group = fused
        qparams = []
        if codes is not None:
            const = ConstantOp([], {"value": codes}, loc=deq.loc)
            new_ops.append(const)
        qparams.append(deq.operands[0] if codes is None else const.result)
        for arr, value in ((scale, deq.operands[1]), (zp, deq.operands[2])):
            if arr.shape == value.type.shape and codes is None:
                qparams.append(value)
            else:
                const = ConstantOp([], {"value": arr}, loc=deq.loc)
                new_ops.append(const)
                qparams.append(const.result)
        attrs = {"out": op.attrs["out"], "trans_b": trans_b, "group_size": group}
        fused_op = MatMulW4A16Op([op.operands[0], *qparams], attrs, loc=op.loc)
        new_ops.append(fused_op)
        func.replace_all_uses(op.result, fused_op.result)
        count += 1
    func.ops = new_ops
    return count


@register_pass
@dataclass(frozen=True)
class FuseDequantizeMatmulPass(Pass):
    """Fold the dequantize of a constant quantized weight into its matmul (``mcp.matmul_w4a16``).

    Assumes: a valid module.  Guarantees: a valid module with the same bits; see the module
    docstring for which weights fuse.  Run ``dce`` after it to drop dequantizes left unused.
    """

    name: ClassVar[str] = "fuse-dequantize-matmul"

    def apply(self, module: Module, ctx: PassContext) -> Module:
        for func in module.functions.values():
            fuse_function(func)
        return module
