"""Softmax, layer_norm and reductions lowered as whole-row kernels: bit-exact with the interpreter
for every axis pattern, dtype, SRAM size and target."""

from __future__ import annotations

import numpy as np
import pytest
from test_lower_vector import compile_check, mnemonics, module_of, single_op

from mcpc.arch.target import load_target
from mcpc.backend import compile_to_program
from mcpc.backend.lower_nn import RowLayout
from mcpc.errors import PassError, UnsupportedError
from mcpc.ir import ops


def test_row_layout_blocks():
    last = RowLayout.of((2, 3, 4), [2])
    assert (last.outer, last.nk, last.rblocks, last.transposed) == ([], 6, [(4, 1)], False)
    mid = RowLayout.of((2, 3, 4), [1])
    assert (mid.outer, mid.nk, mid.sk, mid.rblocks, mid.transposed) == ([(2, 12)], 4, 1, [(3, 4)], True)
    split = RowLayout.of((2, 3, 4, 5), [1, 3])
    assert (split.outer, split.nk, split.rblocks, split.c) == ([(2, 60)], 4, [(3, 20), (5, 1)], 15)
    everything = RowLayout.of((3, 1, 4), [0, 1, 2])
    assert (everything.nk, everything.c, everything.transposed) == (1, 12, False)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize(
    "shape,axis", [((4, 16), -1), ((2, 5, 7), 1), ((3, 4, 5), 0), ((6,), 0), ((2, 3, 4, 5), 2)]
)
def test_softmax(dtype, shape, axis):
    _, instrs, _ = compile_check(single_op(ops.SoftmaxOp, [(shape, dtype)], {"axis": axis}))
    seq = [i.op + (f".{i.func}" if "func" in i.fields else "") for i in instrs if i.engine == 1]
    steps = [s for s in seq if s not in ("transpose", "nop", "vun.copy")]
    assert steps[:5] == ["vred.max", "vbin.sub", "vun.exp", "vred.sum", "vbin.div"]
    assert ("transpose" in mnemonics(instrs)) == (axis % len(shape) != len(shape) - 1 and len(shape) > 1)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("shape,axis", [((4, 16), -1), ((2, 5, 7), 1), ((3, 4, 5), 0), ((2, 3, 4, 5), 2)])
def test_log_softmax(dtype, shape, axis):
    _, instrs, _ = compile_check(single_op(ops.LogSoftmaxOp, [(shape, dtype)], {"axis": axis}))
    seq = [i.op + (f".{i.func}" if "func" in i.fields else "") for i in instrs if i.engine == 1]
    steps = [s for s in seq if s not in ("transpose", "nop", "vun.copy")]
    assert steps[:6] == ["vred.max", "vbin.sub", "vun.exp", "vred.sum", "vun.log", "vbin.sub"]


@pytest.mark.parametrize("dtype", ["f32", "f16"])
@pytest.mark.parametrize("shape,axis", [((4, 16), -1), ((2, 5, 7), 1), ((3, 4, 5), 0)])
def test_layer_norm(dtype, shape, axis):
    norm = shape[axis % len(shape) :]
    attrs = {"axis": axis, "epsilon": 1e-5}
    _, instrs, _ = compile_check(
        single_op(ops.LayerNormOp, [(shape, dtype), (norm, dtype), (norm, dtype)], attrs)
    )
    seq = [i.op + (f".{i.func}" if "func" in i.fields else "") for i in instrs if i.engine == 1]
    tile = seq[seq.index("vred.sum") :]
    assert tile[:11] == [
        "vred.sum", "vbini.div", "vbin.sub", "vbin.mul", "vred.sum", "vbini.div", "vbini.add",
        "vun.rsqrt", "vbin.mul", "vbin.mul", "vbin.add",
    ]  # fmt: skip


REDUCTIONS = [
    ((4, 16), [-1], True), ((2, 5, 7), [1], False), ((3, 4, 5), [0, 2], True), ((3, 4, 5), [0, 1], False),
    ((2, 3, 4, 5), [1, 3], True), ((2, 3), [0, 1], False),
]  # fmt: skip


@pytest.mark.parametrize("dtype", ["f32", "f16", "i32"])
@pytest.mark.parametrize("cls", [ops.ReduceSumOp, ops.ReduceMeanOp, ops.ReduceMaxOp])
def test_reductions(dtype, cls):
    if cls is ops.ReduceMeanOp and dtype == "i32":
        return  # reduce_mean is float-only
    for shape, axes, keepdims in REDUCTIONS:
        compile_check(single_op(cls, [(shape, dtype)], {"axes": axes, "keepdims": keepdims}))


@pytest.mark.parametrize("double_buffer", [True, False])
def test_rows_tile_under_a_small_sram(double_buffer):
    kw = dict(double_buffer=double_buffer, overrides=["sram.size_bytes=4096"])
    for cls, shapes, attrs in [
        (ops.SoftmaxOp, [((50, 64), "f32")], {"axis": -1}),
        (ops.SoftmaxOp, [((3, 20, 40), "f16")], {"axis": 1}),
        (ops.LayerNormOp, [((40, 96), "f32"), ((96,), "f32"), ((96,), "f32")], {"axis": -1, "epsilon": 1e-5}),
        (ops.ReduceMeanOp, [((4, 30, 50), "f32")], {"axes": [1], "keepdims": True}),
    ]:
        _, instrs, _ = compile_check(single_op(cls, shapes, attrs), **kw)
        assert mnemonics(instrs).count("store") > 1


@pytest.mark.parametrize("target", ["mcp2026-a100", "mcp2026-a10", "mcp2026-edge"])
def test_every_target(target):
    compile_check(single_op(ops.SoftmaxOp, [((64, 64), "f32")], {"axis": -1}), target=target)
    shapes = [((64, 256), "f16"), ((256,), "f16"), ((256,), "f16")]
    compile_check(single_op(ops.LayerNormOp, shapes, {"axis": -1, "epsilon": 1e-5}), target=target)


def test_row_too_long_for_sram_is_a_pass_error():
    m = single_op(ops.SoftmaxOp, [((2, 4096), "f32")], {"axis": -1})
    with pytest.raises(PassError, match="mcp.softmax"):
        compile_to_program(m, load_target("mcp2026-edge", ["sram.size_bytes=16384"]))


def test_reduction_over_an_empty_axis_is_refused():
    m = single_op(ops.ReduceSumOp, [((3, 0), "f32")], {"axes": [1], "keepdims": False})
    with pytest.raises(UnsupportedError, match="zero elements"):
        compile_to_program(m, load_target("mcp2026-edge"))


def test_compiling_twice_gives_identical_bytes():
    shapes = [((3, 20, 40), "f16")]
    a = compile_to_program(single_op(ops.SoftmaxOp, shapes, {"axis": 1}), load_target("mcp2026-edge"))
    b = compile_to_program(single_op(ops.SoftmaxOp, shapes, {"axis": 1}), load_target("mcp2026-edge"))
    assert a.text == b.text and a.memory_map == b.memory_map and a.debug == b.debug


@pytest.mark.parametrize("dtype", ["f32", "f16", "i32"])
def test_argmax_over_one_axis(dtype):
    for shape, axes, keepdims in [((4, 16), [-1], True), ((2, 5, 7), [1], False), ((6, 3), [0], True)]:
        _, instrs, _ = compile_check(
            single_op(ops.ArgMaxOp, [(shape, dtype)], {"axes": axes, "keepdims": keepdims})
        )
        assert [i.func for i in instrs if i.op == "vred"] and all(
            i.func == "argmax" for i in instrs if i.op == "vred"
        )
    # Many rows under a small SRAM: the index stays the row's (whole rows per tile).
    m = single_op(ops.ArgMaxOp, [((40, 96), dtype)], {"axes": [1], "keepdims": False})
    compile_check(m, overrides=["sram.size_bytes=4096"])


def _topk_module(shape, dtype, attrs):
    return module_of([("x", shape, dtype)], lambda fn, args: fn.append(ops.TopKOp(args, attrs)).results)


@pytest.mark.parametrize("dtype", ["f32", "f16", "i32"])
@pytest.mark.parametrize(
    "shape,attrs",
    [
        ((4, 16), {"k": 3}),
        ((2, 5, 7), {"k": 7, "largest": False}),
        ((6, 1), {"axis": 0, "k": 2}),  # the innermost dim of size > 1
        ((33,), {"k": 1}),
    ],
)
def test_topk_along_rows(dtype, shape, attrs):
    _, instrs, _ = compile_check(_topk_module(shape, dtype, attrs))
    assert "vtopk" in mnemonics(instrs)
    assert all(i.topk_k == attrs["k"] for i in instrs if i.op == "vtopk")


def test_topk_ties_nan_and_small_sram():
    """Equal values keep ascending index order and NaN counts as the largest, on the simulator as
    in the interpreter (compile_check compares bits), with many row tiles under a small SRAM."""
    x = np.tile(np.array([1.0, np.nan, 3.0, 3.0, -np.inf, 1.0, 0.0, 3.0], np.float32), (40, 1))
    module = _topk_module((40, 8), "f32", {"k": 4})
    result, instrs, _ = compile_check(module, {"x": x}, overrides=["sram.size_bytes=4096"])
    assert result.outputs["y1"][0].tolist() == [1, 2, 3, 7]
    assert sum(i.op == "vtopk" for i in instrs) > 1


def test_topk_along_an_outer_axis_is_refused_naming_the_op():
    with pytest.raises(UnsupportedError, match="mcp.topk.*axis 0"):
        compile_to_program(_topk_module((5, 4), "f32", {"axis": 0, "k": 2}), load_target("mcp2026-edge"))
