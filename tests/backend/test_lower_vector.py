"""Elementwise lowerings (binary, comparison, unary, cast, select): compiled, simulated, and held
bit-exact to the IR interpreter, with broadcasting, scalar immediates and SRAM tiling.

Also home of ``compile_check``, the compile -> simulate -> compare harness the other kernel test
files import.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mcpc.arch.isa import decode_program
from mcpc.arch.target import load_target
from mcpc.backend import BackendOptions, compile_to_program
from mcpc.backend.schedule import check_hazards
from mcpc.errors import UnsupportedError
from mcpc.ir import Function, Module, TensorType, dtype_from_name, ops
from mcpc.ir.interpreter import interpret
from mcpc.sim.api import from_program, run_program

NP = {
    "f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16, "i32": np.int32,
    "i64": np.int64, "i8": np.int8, "u8": np.uint8, "i1": np.bool_,
}  # fmt: skip


def tensor(shape, dtype: str) -> TensorType:
    return TensorType(tuple(shape), dtype_from_name(dtype))


def module_of(args, body) -> Module:
    """A one-function module: ``args`` = [(name, shape, dtype)], ``body(fn, arg_values) -> results``."""
    fn = Function("main", [tensor(s, d) for _, s, d in args], [n for n, _, _ in args])
    outs = body(fn, fn.args)
    fn.append(ops.ReturnOp(outs))
    fn.result_names = [f"y{i}" for i in range(len(outs))]
    m = Module("kernels")
    m.add_function(fn)
    m.verify()
    return m


def single_op(op_cls, shapes, attrs=None, consts=None) -> Module:
    """A module applying one ``op_cls`` to arguments of ``shapes`` = [(shape, dtype)]; ``consts``
    maps an operand position to a numpy array fed through ``mcp.constant`` instead."""
    consts = consts or {}
    args = [(f"x{i}", s, d) for i, (s, d) in enumerate(shapes) if i not in consts]

    def body(fn, values):
        it = iter(values)
        operands = []
        for i in range(len(shapes)):
            if i in consts:
                operands.append(fn.append(ops.ConstantOp([], {"value": consts[i]})).result)
            else:
                operands.append(next(it))
        return [fn.append(op_cls(operands, attrs)).result]

    return module_of(args, body)


def random_inputs(module: Module, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for a in module.main.args:
        shape, d = a.type.shape, a.type.dtype.name
        if d == "i1":
            out[a.name] = rng.random(shape) < 0.5
        elif d in ("i32", "i64", "i8"):
            out[a.name] = rng.integers(-6, 7, size=shape).astype(NP[d])
        elif d == "u8":
            out[a.name] = rng.integers(0, 13, size=shape).astype(NP[d])
        else:
            out[a.name] = rng.standard_normal(shape).astype(NP[d])
    return out


def compile_check(module: Module, inputs=None, target="mcp2026-edge", double_buffer=True, overrides=()):
    """Compile, check the token schedule for races, simulate, and assert every output equals the
    interpreter's bit for bit.  Returns ``(sim result, decoded instructions, program)``."""
    inputs = random_inputs(module) if inputs is None else inputs
    tgt = load_target(target, list(overrides))
    program = compile_to_program(module, tgt, BackendOptions(double_buffer=double_buffer))
    instrs = decode_program(program.text)
    check_hazards(instrs)
    result = run_program(from_program(program), inputs)
    ref = interpret(module, inputs)
    for name, want in ref.items():
        got = result.outputs[name]
        assert got.shape == want.shape and got.dtype == want.dtype, (name, got.shape, want.shape)
        same = np.ascontiguousarray(got).view(np.uint8) == np.ascontiguousarray(want).view(np.uint8)
        assert same.all(), f"{name}: compiled result differs from the interpreter"
    assert program.memory_map["sram_peak_bytes"] <= tgt.sram.size_bytes
    assert result.profile["peak_sram_bytes"] <= tgt.sram.size_bytes
    return result, instrs, program


def mnemonics(instrs) -> list[str]:
    return [i.op for i in instrs]


# -- binary ---------------------------------------------------------------------------------------
BROADCASTS = [
    ((3, 4), (3, 4)),
    ((2, 3, 8), (8,)),  # bias over the last dim: row stride 0
    ((2, 3, 8), (3, 1)),  # one value per row: column broadcast bit
    ((4, 1, 8), (1, 5, 1)),  # general: an outer loop of 2-D tiles
    ((1,), (6, 7)),
    ((2, 1, 3, 1), (1, 4, 1, 5)),
]
ARITH = [ops.AddOp, ops.SubOp, ops.MulOp, ops.DivOp, ops.MaxOp, ops.MinOp]
COMPARE = [ops.EqualOp, ops.LessOp, ops.GreaterOp]


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "i32"])
@pytest.mark.parametrize("shapes", BROADCASTS, ids=str)
def test_binary_broadcasts_bit_exact(dtype, shapes):
    sa, sb = shapes
    for cls in ARITH + COMPARE:
        compile_check(single_op(cls, [(sa, dtype), (sb, dtype)]))


@pytest.mark.parametrize("dtype", ["i32", "i64", "i8", "f32", "f16"])
def test_mod_and_fmod_bit_exact(dtype):
    # random integers include zero divisors (defined as 0); float mod by 0 is NaN on both sides
    for cls in (ops.ModOp, ops.FmodOp):
        compile_check(single_op(cls, [((4, 9), dtype), ((9,), dtype)]))
        compile_check(single_op(cls, [((3, 1), dtype), ((1, 6), dtype)]))


def test_pow_and_i8_arithmetic():
    compile_check(single_op(ops.PowOp, [((4, 9), "f32"), ((9,), "f32")]))
    compile_check(single_op(ops.MulOp, [((4, 9), "i8"), ((4, 1), "i8")]))
    compile_check(single_op(ops.AddOp, [((4, 9), "u8"), ((9,), "u8")]))


@pytest.mark.parametrize("cls", [ops.SubOp, ops.DivOp, ops.LessOp, ops.MulOp])
@pytest.mark.parametrize("dtype", ["f32", "f16", "i32"])
def test_scalar_constant_becomes_immediate(cls, dtype):
    value = np.array(3, dtype=NP[dtype]).reshape(1, 1)
    for pos in (0, 1):
        _, instrs, _ = compile_check(single_op(cls, [((5, 6), dtype), ((1, 1), dtype)][:: 1 if pos else -1],
                                               consts={pos: value}))  # fmt: skip
        ops_ = mnemonics(instrs)
        assert "vbini" in ops_ and "vbin" not in ops_
        vbini = next(i for i in instrs if i.op == "vbini")
        assert vbini.imm == 3.0 and vbini.rev == (1 - pos)
        assert ops_.count("load") == 1  # the constant is not loaded


def test_constants_not_exact_in_f32_are_loaded():
    big = np.array([16777217], dtype=np.int64)  # 2**24 + 1: not an f32
    _, instrs, _ = compile_check(single_op(ops.AddOp, [((4,), "i64"), ((1,), "i64")], consts={1: big}))
    assert "vbini" not in mnemonics(instrs) and mnemonics(instrs).count("load") == 2
    nan = np.array([np.nan], dtype=np.float32)
    _, instrs, _ = compile_check(single_op(ops.MaxOp, [((4,), "f32"), ((1,), "f32")], consts={1: nan}))
    assert "vbini" not in mnemonics(instrs)


# -- unary, cast, select --------------------------------------------------------------------------
UNARY = [ops.NegOp, ops.AbsOp, ops.ExpOp, ops.TanhOp, ops.ErfOp, ops.SqrtOp, ops.RsqrtOp,
         ops.ReciprocalOp, ops.ReluOp, ops.SigmoidOp, ops.GeluOp, ops.SinOp, ops.CosOp, ops.LogOp,
         ops.FloorOp, ops.RoundOp, ops.SiluOp]  # fmt: skip


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_unary_bit_exact(dtype):
    for cls in UNARY:
        compile_check(single_op(cls, [((3, 17), dtype)]))


def test_integer_unary():
    for cls in (ops.NegOp, ops.AbsOp, ops.ReluOp):
        compile_check(single_op(cls, [((3, 5), "i32")]))


@pytest.mark.parametrize(
    "src,dst",
    [("f32", "f16"), ("f16", "f32"), ("f32", "bf16"), ("f32", "f8e4m3fn"), ("f32", "i32"),
     ("i32", "f32"), ("i64", "i32"), ("i32", "i1"), ("i1", "f32"), ("f32", "i8")],
)  # fmt: skip
def test_cast_bit_exact(src, dst):
    m = single_op(ops.CastOp, [((5, 9), src)], {"to": dtype_from_name(dst)})
    inputs = random_inputs(m)
    if src == "f32":  # exercise rounding ties and out-of-range values too
        inputs["x0"] = (inputs["x0"] * 300).astype(np.float32)
    _, instrs, _ = compile_check(m, inputs)
    assert [i.func for i in instrs if i.op == "vun"] == ["copy"]


@pytest.mark.parametrize("dtype", ["f32", "f16", "i32"])
@pytest.mark.parametrize(
    "shapes", [((3, 4), (3, 4), (3, 4)), ((1, 8), (4, 8), (1,)), ((4, 1), (4, 8), (8,)),
               ((2, 1, 4), (1, 3, 1), (2, 3, 4))], ids=str,
)  # fmt: skip
def test_select_bit_exact(dtype, shapes):
    sc, sa, sb = shapes
    compile_check(single_op(ops.SelectOp, [(sc, "i1"), (sa, dtype), (sb, dtype)]))


# -- tiling, targets, errors ----------------------------------------------------------------------
@pytest.mark.parametrize("double_buffer", [True, False])
def test_tiles_under_a_small_sram(double_buffer):
    small = ["sram.size_bytes=4096"]
    for cls, shapes in [
        (ops.AddOp, [((37, 300), "f32"), ((300,), "f32")]),  # row tiles
        (ops.MulOp, [((3, 1000), "f32"), ((3, 1), "f32")]),  # one row does not fit: column chunks
        (ops.SelectOp, [((1, 700), "i1"), ((9, 700), "f16"), ((1,), "f16")]),
        (ops.ExpOp, [((5000,), "f32")]),
    ]:
        _, instrs, _ = compile_check(single_op(cls, shapes), double_buffer=double_buffer, overrides=small)
        assert mnemonics(instrs).count("store") > 1


@pytest.mark.parametrize("target", ["mcp2026-a100", "mcp2026-a10", "mcp2026-edge"])
def test_every_target(target):
    compile_check(single_op(ops.AddOp, [((64, 256), "f16"), ((256,), "f16")]), target=target)


def test_large_elementwise_is_dram_bound_and_double_buffering_pays():
    m = single_op(ops.AddOp, [((512, 1024), "f32"), ((512, 1024), "f32")])
    inputs = random_inputs(m)
    tgt = load_target("mcp2026-edge")
    on, _, _ = compile_check(m, inputs, double_buffer=True)
    off, _, _ = compile_check(m, inputs, double_buffer=False)
    p = on.profile
    moved = p["dram_read_bytes"] + p["dram_write_bytes"]
    assert moved == 3 * 512 * 1024 * 4
    assert moved / p["cycles"] >= 0.9 * tgt.dram_bytes_per_cycle
    assert off.profile["cycles"] > p["cycles"]


def test_packed_int4_is_refused():
    m = single_op(ops.NegOp, [((4, 8), "i4")])
    with pytest.raises(UnsupportedError, match="i4"):
        compile_to_program(m, load_target("mcp2026-edge"))


@st.composite
def broadcast_pair(draw):
    rank = draw(st.integers(1, 4))
    out = draw(st.lists(st.integers(1, 5), min_size=rank, max_size=rank))
    a = [d if draw(st.booleans()) else 1 for d in out]
    b = [d if draw(st.booleans()) else 1 for d in out]
    return tuple(a[draw(st.integers(0, rank - 1)) :]), tuple(b)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes=broadcast_pair(), cls=st.sampled_from([ops.AddOp, ops.DivOp, ops.GreaterOp]))
def test_any_broadcast_is_bit_exact(shapes, cls):
    compile_check(
        single_op(cls, [(shapes[0], "f32"), (shapes[1], "f32")]), overrides=["sram.size_bytes=4096"]
    )
