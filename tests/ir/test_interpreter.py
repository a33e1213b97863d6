"""The reference interpreter against plain numpy: every op, f32 and f16, and the exact matmul order."""

import math

import ml_dtypes
import numpy as np
import pytest
from scipy import special

from mcpc.errors import InputError, McpcError, UnsupportedError
from mcpc.ir import OP_REGISTRY, Function, Module, Operation, TensorType, dtype_from_numpy
from mcpc.ir import ops as O
from mcpc.ir.dtypes import F32, I64
from mcpc.ir.interpreter import evaluate_op, has_impl, interpret

RNG = np.random.default_rng(1234)
FLOATS = [np.float32, np.float16]


def randn(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(np.float32).astype(dtype)


def build(cls, arrays, attrs=None):
    """A module applying one op of class ``cls`` to arguments shaped like ``arrays``."""
    module = Module("t")
    types = [TensorType(a.shape, dtype_from_numpy(a.dtype)) for a in arrays]
    func = module.add_function(Function("main", types, [f"in{i}" for i in range(len(arrays))]))
    op = func.append(cls(func.args, attrs or {}))
    func.append(O.ReturnOp(op.results))
    func.result_names = ["out"]
    return module


def run(cls, arrays, attrs=None):
    module = build(cls, arrays, attrs)
    inputs = {f"in{i}": a for i, a in enumerate(arrays)}
    out = interpret(module, inputs)["out"]
    assert out.shape == module.main.outputs[0].type.shape
    assert out.dtype == module.main.outputs[0].type.dtype.np_dtype
    return out


def assert_bits_equal(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes(), np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))


def close(got, want, dtype, atol_scale=1e-3):
    """Within one rounding of ``dtype`` of an f64 reference (plus f32 evaluation error).

    ``atol_scale`` is the magnitude absolute errors are measured against: results that are sums
    of larger terms (layer_norm's ``d * r * scale + bias``) can cancel to near zero while keeping
    the rounding error of those terms."""
    eps = float(np.finfo(dtype).eps) if dtype != ml_dtypes.bfloat16 else 2.0**-7
    atol = 2 * eps * atol_scale
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2 * eps + 1e-6, atol=atol)


def test_every_op_has_semantics():
    missing = [n for n, cls in OP_REGISTRY.items() if not cls.IS_TERMINATOR and not has_impl(cls)]
    assert not missing, f"ops without an interpreter handler: {missing}"


# -- elementwise ---------------------------------------------------------------------------------
BINARY = {
    O.AddOp: np.add,
    O.SubOp: np.subtract,
    O.MulOp: np.multiply,
    O.DivOp: np.divide,
    O.MaxOp: np.maximum,
    O.MinOp: np.minimum,
    O.EqualOp: np.equal,
    O.LessOp: np.less,
    O.GreaterOp: np.greater,
}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("cls", list(BINARY), ids=lambda c: c.name)
def test_binary_is_f32_op_rounded_once(cls, dtype):
    a, b = randn(3, 4, dtype=dtype), randn(4, dtype=dtype)
    b[1] = a[0, 1]  # some equal elements for the comparisons
    want = BINARY[cls](a.astype(np.float32), b.astype(np.float32))
    want = want if want.dtype == np.bool_ else want.astype(dtype)
    assert_bits_equal(run(cls, [a, b]), want)


@pytest.mark.parametrize("dtype", FLOATS)
def test_pow(dtype):
    a, b = np.abs(randn(5, dtype=dtype)) + dtype(0.5), randn(5, dtype=dtype)
    close(run(O.PowOp, [a, b]), np.power(a.astype(np.float64), b.astype(np.float64)), dtype)


def test_integer_binary_ops():
    a = np.array([-7, 7, -7, 7, 100, -(2**31)], dtype=np.int32)
    b = np.array([2, -2, -2, 2, 7, -1], dtype=np.int32)
    assert run(O.DivOp, [a, b]).tolist() == [-3, -3, 3, 3, 14, -(2**31)]  # truncation; i32 wraps
    assert run(O.AddOp, [a, b]).tolist() == [-5, 5, -9, 9, 107, 2**31 - 1]
    big = np.array([2**62 + 1], dtype=np.int64)
    assert run(O.DivOp, [big, np.array([3], dtype=np.int64)]).tolist() == [(2**62 + 1) // 3]


def test_mod_and_fmod():
    a = np.array([-7, 7, -7, 7, 5, -(2**31)], dtype=np.int32)
    b = np.array([2, -2, -2, 2, 0, -1], dtype=np.int32)
    assert run(O.ModOp, [a, b]).tolist() == [1, -1, -1, 1, 0, 0]  # sign of the divisor; x mod 0 = 0
    assert run(O.FmodOp, [a, b]).tolist() == [-1, 1, -1, 1, 0, 0]  # sign of the dividend
    big = np.array([2**62 + 5], dtype=np.int64)
    assert run(O.ModOp, [big, np.array([-3], dtype=np.int64)]).tolist() == [(2**62 + 5) % -3]
    x = np.array([-7.5, 7.5, -0.0, 1e30], dtype=np.float32)
    y = np.array([2.0, -2.0, 3.0, 7.0], dtype=np.float32)
    got = run(O.FmodOp, [x, y])
    assert got.tolist() == np.fmod(x, y).tolist() and np.signbit(got[2])


def test_log_softmax_close_to_f64():
    x = (np.random.default_rng(3).standard_normal((3, 4, 6)) * 5).astype(np.float32)
    for axis in (-1, 1):
        x64 = x.astype(np.float64)
        d = x64 - x64.max(axis=axis, keepdims=True)
        want = d - np.log(np.exp(d).sum(axis=axis, keepdims=True))
        np.testing.assert_allclose(run(O.LogSoftmaxOp, [x], {"axis": axis}), want, rtol=1e-5, atol=1e-5)


def test_floor_keeps_signed_zero_and_specials():
    x = np.array([-0.0, -0.5, 2.5, np.inf, -np.inf, np.nan, 3e9], dtype=np.float32)
    got = run(O.FloorOp, [x])
    np.testing.assert_array_equal(got, np.floor(x))
    assert np.signbit(got[0]) and got[1] == -1.0


def test_argmax_first_maximum_along_one_axis():
    x = np.array([[[1, 5, 5], [7, 0, 2]], [[3, 3, 3], [np.nan, 9, 1]]], dtype=np.float32)
    got = run(O.ArgMaxOp, [x], {"axes": [2], "keepdims": False})
    np.testing.assert_array_equal(got, [[1, 0], [0, 0]])
    assert got.dtype == np.int64
    np.testing.assert_array_equal(
        run(O.ArgMaxOp, [x], {"axes": [0], "keepdims": True}), [[[1, 0, 0], [1, 1, 0]]]
    )
    with pytest.raises(Exception, match="exactly one axis"):
        run(O.ArgMaxOp, [x], {"axes": [0, 1], "keepdims": True})


def test_round_is_half_to_even_and_keeps_signed_zero_and_specials():
    x = np.array(
        [0.5, 1.5, 2.5, -0.5, -2.5, -0.0, 0.49999997, np.inf, -np.inf, np.nan, 3e9], dtype=np.float32
    )
    got = run(O.RoundOp, [x])
    np.testing.assert_array_equal(got, [0, 2, 2, -0.0, -2, -0.0, 0, np.inf, -np.inf, np.nan, 3e9])
    assert np.signbit(got[3]) and np.signbit(got[5])


UNARY = {
    O.NegOp: np.negative,
    O.AbsOp: np.abs,
    O.ExpOp: np.exp,
    O.TanhOp: np.tanh,
    O.ErfOp: special.erf,
    O.SqrtOp: lambda x: np.sqrt(np.abs(x)),
    O.RsqrtOp: lambda x: 1 / np.sqrt(np.abs(x)),
    O.ReciprocalOp: lambda x: 1 / x,
    O.ReluOp: lambda x: np.maximum(x, 0),
    O.SigmoidOp: lambda x: 1 / (1 + np.exp(-x)),
    O.GeluOp: lambda x: 0.5 * x * (1 + special.erf(x / math.sqrt(2))),
}
# Kept apart with their own generator: drawing from RNG would change the data of later tests.
UNARY_LATER = {
    O.SinOp: np.sin,
    O.CosOp: np.cos,
    O.LogOp: lambda x: np.log(np.abs(x)),
    O.FloorOp: np.floor,
    O.RoundOp: np.rint,
    O.SiluOp: lambda x: x / (1 + np.exp(-x)),
}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("cls", list(UNARY_LATER), ids=lambda c: c.name)
def test_later_unary_close_to_f64(cls, dtype):
    x = (np.random.default_rng(7).standard_normal((4, 5)) * 4).astype(np.float32).astype(dtype)
    if cls is O.LogOp:
        x = np.abs(x)
    close(run(cls, [x]), UNARY_LATER[cls](x.astype(np.float64)), dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("cls", list(UNARY), ids=lambda c: c.name)
def test_unary_close_to_f64(cls, dtype):
    x = randn(4, 5, dtype=dtype)
    if cls in (O.SqrtOp, O.RsqrtOp):
        x = np.abs(x)
    close(run(cls, [x]), UNARY[cls](x.astype(np.float64)), dtype)


def test_rank0_elementwise_keeps_rank0():
    x = np.array(2.0, dtype=np.float32)
    assert run(O.AddOp, [x, x]).shape == () and run(O.ExpOp, [x]).shape == ()


def test_cast_and_select():
    x = np.array([1.5, -2.5, 0.1, 70000.0, -0.7], dtype=np.float32)
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)  # 70000 overflows to inf
    assert_bits_equal(run(O.CastOp, [x], {"to": dtype_from_numpy(np.float16)}), want)
    assert run(O.CastOp, [x], {"to": dtype_from_numpy(np.int32)}).tolist() == [1, -2, 0, 70000, 0]
    bf = run(O.CastOp, [x], {"to": dtype_from_numpy(ml_dtypes.bfloat16)})
    assert_bits_equal(bf, x.astype(ml_dtypes.bfloat16))
    cond = np.array([[True], [False]])
    a, b = randn(2, 5, dtype=np.float16), randn(5, dtype=np.float16)
    assert_bits_equal(run(O.SelectOp, [cond, a, b]), np.where(cond, a, b))


# -- matmul --------------------------------------------------------------------------------------
def manual_tiled(a, b, tm, tn, tk):
    """A plain f32 tiled loop: output tiles independent, K tiles accumulated in ascending order."""
    a, b = a.astype(np.float32), b.astype(np.float32)
    m, k = a.shape
    n = b.shape[1]
    tm, tn, tk = tm or m, tn or n, tk or k
    out = np.empty((m, n), dtype=np.float32)
    for i in range(0, m, tm):
        for j in range(0, n, tn):
            acc = None
            for kk in range(0, k, tk):
                part = np.ascontiguousarray(a[i : i + tm, kk : kk + tk]) @ np.ascontiguousarray(
                    b[kk : kk + tk, j : j + tn]
                )
                acc = part if acc is None else acc + part
            out[i : i + tm, j : j + tn] = acc
    return out


TILES = [[], [1, 1, 1], [2, 3, 4], [5, 0, 3], [16, 16, 16], [0, 0, 7], [64, 64, 64]]


@pytest.mark.parametrize("tile", TILES, ids=str)
@pytest.mark.parametrize("dtype", FLOATS)
def test_matmul_tile_order_is_bit_exact(tile, dtype):
    a, b = randn(13, 37, dtype=dtype), randn(37, 11, dtype=dtype)
    got = run(O.MatMulOp, [a, b], {"tile": tile, "out": F32})
    assert_bits_equal(got, manual_tiled(a, b, *(tile or (0, 0, 0))))
    # rounded once to the operand dtype when out is the default
    low = run(O.MatMulOp, [a, b], {"tile": tile})
    assert_bits_equal(low, manual_tiled(a, b, *(tile or (0, 0, 0))).astype(dtype))


def test_matmul_batched_broadcast_and_trans_b():
    a, b = randn(2, 1, 6, 20, dtype=np.float16), randn(3, 9, 20, dtype=np.float16)
    got = run(O.MatMulOp, [a, b], {"trans_b": True, "tile": [4, 4, 8], "out": F32})
    assert got.shape == (2, 3, 6, 9)
    for i in range(2):
        for j in range(3):
            assert_bits_equal(got[i, j], manual_tiled(a[i, 0], b[j].T, 4, 4, 8))
    ref = np.matmul(a.astype(np.float64), np.swapaxes(b, -1, -2).astype(np.float64))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_matmul_tile_changes_the_bits():
    a, b = randn(8, 512), randn(512, 8)
    whole, one_by_one = run(O.MatMulOp, [a, b]), run(O.MatMulOp, [a, b], {"tile": [0, 0, 1]})
    np.testing.assert_allclose(whole, one_by_one, rtol=1e-4, atol=1e-4)
    assert whole.tobytes() != one_by_one.tobytes()  # the tile is part of the semantics


# -- softmax, layer norm, reductions ---------------------------------------------------------------
def softmax64(x, axis):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax(axis, dtype):
    x = randn(3, 7, 5, dtype=dtype) * dtype(4)
    close(run(O.SoftmaxOp, [x], {"axis": axis}), softmax64(x, axis), dtype)


def test_softmax_is_shift_invariant_and_handles_large_values():
    x = np.array([[1000.0, 1001.0, -np.inf]], dtype=np.float32)
    np.testing.assert_allclose(run(O.SoftmaxOp, [x]), softmax64(x, -1), rtol=1e-6)


def layer_norm64(x, scale, bias, axis, eps):
    x = x.astype(np.float64)
    axes = tuple(range(axis % x.ndim, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * scale.astype(np.float64) + bias.astype(np.float64)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("axis", [-1, 1])
def test_layer_norm(axis, dtype):
    x = randn(2, 3, 16, dtype=dtype) * dtype(3) + dtype(1)
    shape = x.shape[axis:]
    scale, bias = randn(*shape, dtype=dtype), randn(*shape, dtype=dtype)
    got = run(O.LayerNormOp, [x, scale, bias], {"axis": axis, "epsilon": 1e-5})
    want = layer_norm64(x, scale, bias, axis, 1e-5)
    # the terms are O(|scale| * 3 + |bias|): an absolute error of a few eps of that, not of 1e-3
    close(got, want, dtype, atol_scale=4 * float(np.abs(want).max()))


REDUCE = {O.ReduceSumOp: np.sum, O.ReduceMeanOp: np.mean, O.ReduceMaxOp: np.max}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("axes", [[-1], [0, 2], [2, 0], [0, 1, 2]], ids=str)
@pytest.mark.parametrize("keepdims", [True, False])
@pytest.mark.parametrize("cls", list(REDUCE), ids=lambda c: c.name)
def test_reductions(cls, axes, keepdims, dtype):
    x = randn(3, 4, 5, dtype=dtype)
    got = run(cls, [x], {"axes": axes, "keepdims": keepdims})
    want = REDUCE[cls](x.astype(np.float64), axis=tuple(axes), keepdims=keepdims)
    if cls is O.ReduceMaxOp:
        assert_bits_equal(got, want.astype(dtype))
    else:
        close(got, want, dtype)


def test_integer_reductions():
    x = RNG.integers(-1000, 1000, size=(4, 6)).astype(np.int32)
    assert_bits_equal(
        run(O.ReduceSumOp, [x], {"axes": [1], "keepdims": False}), x.sum(axis=1).astype(np.int32)
    )
    assert_bits_equal(run(O.ReduceMaxOp, [x], {"axes": [0]}), x.max(axis=0, keepdims=True))


# -- shape ops -----------------------------------------------------------------------------------
def test_shape_ops_are_exact_data_movement():
    x = randn(2, 3, 4, dtype=np.float16)
    assert_bits_equal(run(O.ReshapeOp, [x], {"shape": [6, 1, 4]}), x.reshape(6, 1, 4))
    assert_bits_equal(run(O.TransposeOp, [x], {"perm": [2, 0, 1]}), x.transpose(2, 0, 1))
    y, z = randn(2, 1, 4, dtype=np.float16), randn(2, 0, 4, dtype=np.float16)
    assert_bits_equal(run(O.ConcatOp, [x, y, z], {"axis": -2}), np.concatenate([x, y, z], axis=1))
    assert_bits_equal(run(O.BroadcastOp, [y], {"shape": [3, 1, 1, 1]}), np.broadcast_to(y, (3, 2, 1, 4)))
    i4 = np.arange(-8, 8).astype(ml_dtypes.int4).reshape(4, 4)
    assert_bits_equal(run(O.TransposeOp, [i4], {"perm": [1, 0]}), i4.T.copy())


@pytest.mark.parametrize(
    "starts, ends, steps",
    [
        ([0, 0], [5, 6], [1, 1]),
        ([1, 4], [4, 1], [2, -1]),
        ([4, 5], [-1, -1], [-1, -2]),
        ([4, 2], [-1, 2], [-3, 1]),
        ([5, 0], [5, 6], [1, 4]),
        ([-1, 5], [-1, 0], [-1, -5]),
    ],
)
def test_slice_matches_range_semantics(starts, ends, steps):
    x = randn(5, 6)
    want = x[np.ix_(*[list(range(s, e, st)) for s, e, st in zip(starts, ends, steps, strict=True)])]
    assert_bits_equal(run(O.SliceOp, [x], {"starts": starts, "ends": ends, "steps": steps}), want)


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_gather_wraps_negative_indices(index_dtype):
    data = randn(4, 5, dtype=np.float16)
    idx = np.array([[0, -1], [3, -5]], dtype=index_dtype)
    want = np.take(data, idx % 5, axis=1)
    assert_bits_equal(run(O.GatherOp, [data, idx], {"axis": -1}), want)
    assert_bits_equal(run(O.GatherOp, [data, np.array(-4, dtype=index_dtype)]), data[0])


def test_gather_out_of_range_names_the_op():
    data, idx = randn(4, 5), np.array([4], dtype=np.int64)
    with pytest.raises(InputError, match=r"mcp.gather: index 4 out of range for axis 0 of size 4"):
        run(O.GatherOp, [data, idx])


# -- interpret(): inputs, outputs, unsupported ops -------------------------------------------------
def _module():
    return build(O.AddOp, [randn(2, 3), randn(3)])


def test_inputs_are_checked_by_name():
    m = _module()
    ok = {"in0": randn(2, 3), "in1": randn(3)}
    assert interpret(m, ok)["out"].shape == (2, 3)
    with pytest.raises(InputError, match="missing input\\(s\\) 'in1'"):
        interpret(m, {"in0": ok["in0"]})
    with pytest.raises(InputError, match="unknown input\\(s\\) 'extra'"):
        interpret(m, {**ok, "extra": ok["in1"]})
    with pytest.raises(InputError, match="input 'in1' is float64 with shape \\[3\\], expected float32"):
        interpret(m, {**ok, "in1": ok["in1"].astype(np.float64)})
    with pytest.raises(InputError, match="input 'in0' is float32 with shape \\[3, 2\\]"):
        interpret(m, {**ok, "in0": randn(3, 2)})
    with pytest.raises(InputError, match="no function @decode"):
        interpret(m, ok, func="decode")


def test_i64_argument_refuses_int32():
    data = randn(4, 5)
    m = build(O.GatherOp, [data, np.zeros(3, dtype=np.int64)])
    assert m.main.args[1].type.dtype is I64
    ids = np.array([1, 2, 3], dtype=np.int64)
    assert_bits_equal(interpret(m, {"in0": data, "in1": ids})["out"], data[ids])
    with pytest.raises(InputError, match="input 'in1' is int32"):
        interpret(m, {"in0": data, "in1": ids.astype(np.int32)})


def test_outputs_are_fresh_arrays():
    x = randn(2, 2)
    module = Module("m")
    func = module.add_function(Function("main", [TensorType((2, 2), F32)], ["x"]))
    func.append(O.ReturnOp([func.args[0]]))
    func.result_names = ["same"]
    out = interpret(module, {"x": x})["same"]
    out[0, 0] = 99.0
    assert x[0, 0] != 99.0


class _Unregistered(Operation):
    NUM_OPERANDS = 1

    @classmethod
    def infer_types(cls, operand_types, attrs):
        return list(operand_types)


_Unregistered.name = "test.unknown"  # set after class creation: not in OP_REGISTRY


class _AddVariant(O.AddOp):
    name = ""  # an empty name is not registered; the real one is set below


_AddVariant.name = "test.add_variant"


@pytest.mark.parametrize("cls", [_Unregistered, _AddVariant])
def test_op_without_handler_is_unsupported(cls):
    x = randn(3)
    args = [x] if cls is _Unregistered else [x, x]
    with pytest.raises(UnsupportedError, match=f"no semantics for {cls.name}"):
        run(cls, args)


def test_handler_result_type_is_checked():
    op = build(O.ExpOp, [randn(3)]).main.ops[0]
    op.results[0].type = TensorType((4,), F32)  # a broken declaration the handler cannot meet
    with pytest.raises(
        McpcError, match=r"mcp.exp produced float32\[3\] for result #0 declared tensor<4xf32>"
    ):
        evaluate_op(op, [randn(3)])


def test_small_mlp_block_matches_numpy():
    x, w1, b1, w2 = randn(4, 16), randn(16, 32) * 0.25, randn(32), randn(32, 8) * 0.25
    module = Module("mlp")
    types = [TensorType(a.shape, F32) for a in (x, w1, b1, w2)]
    f = module.add_function(Function("main", types, ["x", "w1", "b1", "w2"]))
    h = f.append(O.MatMulOp([f.args[0], f.args[1]])).result
    h = f.append(O.AddOp([h, f.args[2]])).result
    h = f.append(O.GeluOp([h])).result
    h = f.append(O.MatMulOp([h, f.args[3]], {"tile": [2, 4, 8]})).result
    y = f.append(O.SoftmaxOp([h])).result
    f.append(O.ReturnOp([y]))
    f.result_names = ["probs"]
    got = interpret(module, {"x": x, "w1": w1, "b1": b1, "w2": w2})["probs"]
    h64 = x.astype(np.float64) @ w1 + b1
    h64 = 0.5 * h64 * (1 + special.erf(h64 / math.sqrt(2)))
    np.testing.assert_allclose(got, softmax64(h64 @ w2, -1), rtol=1e-5, atol=1e-6)
