"""Shape lowerings (transpose, concat, slice, broadcast, gather) and the strided-DMA helpers:
compiled, simulated, equal to the interpreter byte for byte."""

from __future__ import annotations

import numpy as np
import pytest
from test_lower_vector import compile_check, mnemonics, module_of, random_inputs, single_op

from mcpc.arch.target import load_target
from mcpc.backend.emitter import Emitter
from mcpc.backend.lower_shape import Dim, coalesce, coalesce_joint, dma_nd, split_tiles
from mcpc.backend.lowering import LoweringContext
from mcpc.errors import SimTrap
from mcpc.ir import ops

DTYPES = ["f32", "f16", "i8", "i64"]


# -- helpers --------------------------------------------------------------------------------------
def _ctx() -> LoweringContext:
    t = load_target("mcp2026-edge")
    return LoweringContext(t, Emitter(t))


def _moved(instrs, mnemonic: str) -> set[tuple[int, int]]:
    """(DRAM byte, SRAM byte) pairs the DMA instructions move."""
    pairs = set()
    for i in instrs:
        assert i.op == mnemonic
        for r in range(i.rows):
            for b in range(i.row_bytes):
                pairs.add((i.dram + r * i.dram_stride + b, i.sram + r * i.sram_stride + b))
    return pairs


def test_coalesce_merges_contiguous_dims_and_drops_ones():
    assert coalesce([Dim(2, 48, 48), Dim(1, 7, 7), Dim(3, 16, 16), Dim(4, 4, 4)]) == [Dim(24, 4, 4)]
    assert coalesce([Dim(3, 4, 12), Dim(4, 12, 4)]) == [Dim(3, 4, 12), Dim(4, 12, 4)]
    assert coalesce_joint([2, 1, 3], [[3, 9, 1], [0, 0, 1]]) == ([2, 3], [[3, 1], [0, 1]])
    assert coalesce_joint([2, 0], [[1, 1]]) is None


def test_dma_nd_moves_exactly_the_view():
    ctx = _ctx()
    # a [3, 4] f32 view of a [3, 10] tensor reversed along both dims: negative strides
    dims = [Dim(3, -40, 16), Dim(4, -4, 4)]
    got = _moved(dma_nd(ctx, "load", 1000 + 2 * 40 + 3 * 4, 0, dims, 4), "load")
    want = {
        (1000 + (2 - r) * 40 + (3 - c) * 4 + b, r * 16 + c * 4 + b)
        for r in range(3)
        for c in range(4)
        for b in range(4)
    }
    assert got == want
    # contiguous rows collapse into one instruction
    assert len(dma_nd(ctx, "store", 0, 0, [Dim(8, 64, 64), Dim(16, 4, 4)], 4)) == 1
    # a broadcast (stride 0) row is re-read for each SRAM row: one instruction
    (bc,) = dma_nd(ctx, "load", 0, 0, [Dim(5, 0, 32), Dim(8, 4, 4)], 4)
    assert (bc.rows, bc.row_bytes, bc.dram_stride) == (5, 32, 0)


def test_split_tiles():
    assert split_tiles([4, 5, 6], 1000) == (0, 4)
    assert split_tiles([4, 5, 6], 60) == (0, 2)
    assert split_tiles([4, 5, 6], 12) == (1, 2)
    assert split_tiles([4, 5, 6], 4) == (2, 4)


# -- ops ------------------------------------------------------------------------------------------
PERMS = [((3, 4), [1, 0]), ((2, 3, 4), [0, 2, 1]), ((2, 3, 4, 5), [0, 2, 1, 3]), ((2, 3, 4, 5), [0, 2, 3, 1]),
         ((2, 3, 4, 5), [3, 2, 1, 0]), ((7,), [0]), ((2, 1, 5), [2, 1, 0])]  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES)
def test_transpose(dtype):
    for shape, perm in PERMS:
        _, instrs, _ = compile_check(single_op(ops.TransposeOp, [(shape, dtype)], {"perm": perm}))
        last_stays = perm[-1] == len(shape) - 1 or shape[perm[-1]] == 1
        assert ("transpose" in mnemonics(instrs)) == (not last_stays) or len(shape) == 1


@pytest.mark.parametrize("dtype", DTYPES)
def test_concat(dtype):
    compile_check(single_op(ops.ConcatOp, [((2, 3), dtype), ((2, 5), dtype), ((2, 1), dtype)], {"axis": 1}))
    compile_check(single_op(ops.ConcatOp, [((2, 3, 4), dtype), ((1, 3, 4), dtype)], {"axis": 0}))
    compile_check(single_op(ops.ConcatOp, [((2, 3, 4), dtype), ((2, 2, 4), dtype)], {"axis": -2}))


SLICES = [
    ((6, 8), [1, 0], [5, 8], [1, 2]), ((6, 8), [5, 7], [-1, -1], [-1, -1]),
    ((6, 8), [4, 6], [0, 1], [-2, -3]), ((3, 4, 5), [0, 3, 1], [3, -1, 5], [1, -1, 2]),
    ((4,), [3], [3], [-1]),
]  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES)
def test_slice_including_negative_steps(dtype):
    for shape, starts, ends, steps in SLICES:
        attrs = {"starts": starts, "ends": ends, "steps": steps}
        compile_check(single_op(ops.SliceOp, [(shape, dtype)], attrs))


@pytest.mark.parametrize("dtype", DTYPES)
def test_broadcast(dtype):
    for shape, to in [
        ((1, 4), [3, 4]),
        ((3, 1), [3, 5]),
        ((5,), [2, 3, 5]),
        ((2, 1, 3), [2, 4, 3]),
        ((1,), [7]),
    ]:
        compile_check(single_op(ops.BroadcastOp, [(shape, dtype)], {"shape": to}))


def _gather(dshape, ishape, idtype, axis, values):
    m = module_of([("d", dshape, "f16"), ("i", ishape, idtype)],
                  lambda fn, v: [fn.append(ops.GatherOp(list(v), {"axis": axis})).result])  # fmt: skip
    inputs = random_inputs(m)
    inputs["i"] = np.array(values, dtype=inputs["i"].dtype).reshape(ishape)
    return m, inputs


@pytest.mark.parametrize(
    "dshape,ishape,idtype,axis,values",
    [((10, 4), (3,), "i32", 0, [1, -1, 9]), ((10, 4), (2, 3), "i64", 0, [1, -1, 9, 0, -10, 5]),
     ((3, 10, 4), (2,), "i32", 1, [7, -2]), ((3, 10), (4,), "i32", 1, [7, -2, 0, 9]),
     ((10,), (), "i64", 0, [-3])],
)  # fmt: skip
def test_gather_normalises_negative_indices(dshape, ishape, idtype, axis, values):
    _, instrs, _ = compile_check(*_gather(dshape, ishape, idtype, axis, values))
    assert "gather" in mnemonics(instrs) and "vsel" in mnemonics(instrs)


def test_gather_index_out_of_range_traps():
    m, inputs = _gather((10, 4), (3,), "i32", 0, [1, 10, 9])
    with pytest.raises(SimTrap, match="gather index out of range"):
        compile_check(m, inputs)


@pytest.mark.parametrize("double_buffer", [True, False])
def test_shape_ops_tile_under_a_small_sram(double_buffer):
    kw = dict(double_buffer=double_buffer, overrides=["sram.size_bytes=4096"])
    for cls, shapes, attrs in [
        (ops.TransposeOp, [((40, 60), "f32")], {"perm": [1, 0]}),
        (ops.TransposeOp, [((2, 30, 4, 50), "f16")], {"perm": [0, 2, 3, 1]}),
        (ops.ConcatOp, [((20, 70), "f32"), ((20, 30), "f32")], {"axis": 1}),
        (ops.SliceOp, [((30, 90), "f32")], {"starts": [29, 88], "ends": [-1, 0], "steps": [-2, -1]}),
        (ops.BroadcastOp, [((1, 300), "f32")], {"shape": [20, 300]}),
    ]:
        _, instrs, _ = compile_check(single_op(cls, shapes, attrs), **kw)
        assert mnemonics(instrs).count("store") > 1
    m, inputs = _gather((50, 96), (40,), "i32", 0, list(range(-20, 20)))
    compile_check(m, inputs, **kw)
    m, inputs = _gather((10, 3000), (5,), "i64", 0, [1, -1, 9, 0, -10])  # rows larger than a slot
    _, instrs, _ = compile_check(m, inputs, **kw)
    assert mnemonics(instrs).count("gather") > 5


def test_reshape_aliases_without_code():
    m = module_of([("x", (4, 6), "f32")], lambda fn, v: [
        fn.append(ops.ExpOp([fn.append(ops.ReshapeOp([v[0]], {"shape": [2, 12]})).result])).result
    ])  # fmt: skip
    _, instrs, _ = compile_check(m)
    assert mnemonics(instrs).count("load") == 1
