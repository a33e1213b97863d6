"""mcp.quantize / mcp.dequantize: ONNX QuantizeLinear / DequantizeLinear semantics (ONNX Runtime is
the oracle, onnx.reference where ONNX Runtime cannot return the type), the verifier's qparam rules,
import, folding and the backend's clear refusal."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import onnx
import pytest
from conftest import make_model, vi
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from mcpc.arch import numerics as nx
from mcpc.errors import UnsupportedError, VerifyError
from mcpc.ir import Function, Module, TensorType, parse_module
from mcpc.ir.dtypes import BF16, F8E4M3FN, F16, F32, I4, I8, I32, U4, U8
from mcpc.ir.interpreter import evaluate_op, interpret
from mcpc.ir.onnx_import import import_onnx
from mcpc.ir.ops import ConstantOp, DequantizeOp, MatMulOp, QuantizeOp, ReturnOp
from mcpc.passes.fold_constants import fold_function

_rng = np.random.default_rng(7)
_ZP_RANGE = {T.INT8: (-5, 5), T.UINT8: (100, 150), T.INT4: (-2, 2), T.UINT4: (6, 9)}
QTYPES = [T.INT8, T.UINT8, T.INT4, T.UINT4, T.FLOAT8E4M3FN]
# (x shape, scale shape, axis, block_size)
GRANULARITIES = [
    pytest.param((4, 6), (), 1, 0, id="per-tensor"),
    pytest.param((4, 6), (1,), 1, 0, id="per-tensor-1d"),
    pytest.param((4, 6), (6,), 1, 0, id="per-axis-1"),
    pytest.param((2, 4, 6), (4,), -2, 0, id="per-axis-neg"),
    pytest.param((4, 6), (4, 2), 1, 3, id="blocked"),
    pytest.param((4, 7), (4, 2), 1, 4, id="blocked-short-last"),
    pytest.param((8, 6), (2, 6), 0, 4, id="blocked-axis0"),
]


def _qdq_model(qtype, shape, sshape, axis, block, *, with_zp=True, x_init=None):
    """x -> QuantizeLinear -> q -> DequantizeLinear -> d (opset 21), scale/zero point initializers."""
    x = (_rng.standard_normal(shape) * 6).astype(np.float32)
    # ties (per-tensor scale 1 hits them) and overflow (within int32: onnx.reference casts there)
    x.flat[:6] = [0.5, 1.5, 2.5, -0.5, -2.5, 1e6]
    s = _rng.uniform(0.05, 0.6, sshape).astype(np.float32)
    if sshape == ():
        s = np.array(1.0, np.float32)
    npq = helper.tensor_dtype_to_np_dtype(qtype)
    inits, ins = [numpy_helper.from_array(s, "s")], ["x", "s"]
    if with_zp:
        lo, hi = _ZP_RANGE.get(qtype, (0, 1))
        z = _rng.integers(lo, hi, sshape).astype(npq) if qtype != T.FLOAT8E4M3FN else np.zeros(sshape, npq)
        inits.append(numpy_helper.from_array(z, "z"))
        ins.append("z")
    attrs = {"axis": axis, **({"block_size": block} if block else {})}
    nodes = [
        helper.make_node("QuantizeLinear", ins, ["q"], **attrs),
        helper.make_node("DequantizeLinear", ["q", *ins[1:]], ["d"], **attrs),
    ]
    graph_in = []
    if x_init:
        inits.append(numpy_helper.from_array(x, "x"))
    else:
        graph_in = [vi("x", shape)]
    outs = [vi("q", shape, qtype if with_zp else T.UINT8), vi("d", shape)]
    return make_model(nodes, graph_in, outs, inits, opset=21), x


def _bits(a: np.ndarray) -> np.ndarray:
    """Comparable values: f8 by its bit pattern (ONNX Runtime returns f8 as uint8), ints as int64."""
    if a.dtype == ml_dtypes.float8_e4m3fn:
        return a.view(np.uint8)
    return a.astype(np.float64) if a.dtype.kind == "f" else a.astype(np.int64)


@pytest.mark.parametrize("shape, sshape, axis, block", GRANULARITIES)
@pytest.mark.parametrize("qtype", QTYPES, ids=lambda q: T.DataType.Name(q))
def test_matches_onnxruntime(qtype, shape, sshape, axis, block, ort_run):
    model, x = _qdq_model(qtype, shape, sshape, axis, block)
    module = import_onnx(model)
    assert [op.name for op in module.main.ops if op.name.endswith("quantize")] == [
        "mcp.quantize",
        "mcp.dequantize",
    ]
    ours = interpret(module, {"x": x})
    if qtype in (T.INT4, T.UINT4):  # ONNX Runtime cannot hand int4 to numpy: q from onnx.reference
        q_ref = ReferenceEvaluator(model).run(["q"], {"x": x})[0]
        d_only = onnx.ModelProto()
        d_only.CopyFrom(model)
        del d_only.graph.output[0]
        d_ref = ort_run(d_only, {"x": x})["d"]
    else:
        ref = ort_run(model, {"x": x})
        q_ref, d_ref = ref["q"], ref["d"]
    assert np.array_equal(_bits(ours["q"]), _bits(q_ref))
    assert np.array_equal(ours["d"], d_ref)
    # all-constant: the importer evaluates QuantizeLinear (the folding path) and keeps the widening
    # DequantizeLinear of the constant codes (compressed weights stay compressed), same bits
    folded, _ = _qdq_model(qtype, shape, sshape, axis, block, x_init=True)
    consts = import_onnx(folded)
    assert [op.name for op in consts.main.ops if op.name.endswith("quantize")] == ["mcp.dequantize"]
    np.testing.assert_allclose(interpret(consts, {})["d"], ReferenceEvaluator(folded).run(["d"], {})[0])


def test_without_zero_point_quantizes_to_uint8_opset13(ort_run):
    model, x = _qdq_model(T.UINT8, (3, 5), (), 1, 0, with_zp=False)
    model.opset_import[0].version = 13
    model.ir_version = helper.find_min_ir_version_for(list(model.opset_import))
    module = import_onnx(model)
    q = next(op for op in module.main.ops if isinstance(op, QuantizeOp))
    assert q.result.type.dtype == U8 and q.operands[2].type == TensorType((), U8)
    ours, ref = interpret(module, {"x": x}), ort_run(model, {"x": x})
    assert np.array_equal(ours["q"], ref["q"]) and np.array_equal(ours["d"], ref["d"])


def test_rounding_is_half_to_even_and_integers_saturate():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 126.5, 127.5, 1e30, -np.inf, np.inf], np.float32)
    one, zero = np.float32(1), np.int8(0)
    q = nx.quantize(x, one, zero, "i8")
    assert q.tolist() == [0, 2, 2, 0, -2, 126, 127, 127, -128, 127]
    assert nx.quantize(x[:5], one, np.uint8(3), "u8").tolist() == [3, 5, 5, 3, 1]
    z4 = np.zeros((), ml_dtypes.int4)
    q4 = nx.quantize(np.array([7.5, 8.0, -8.5, -9.0], np.float32), one, z4, "i4")
    assert q4.dtype == ml_dtypes.int4 and q4.astype(int).tolist() == [7, 7, -8, -8]
    u4 = nx.quantize(np.array([-1.0, 16.0, 2.5], np.float32), one, np.zeros((), ml_dtypes.uint4), "u4")
    assert u4.astype(int).tolist() == [0, 15, 2]


def test_f8_saturates_never_nan_unless_asked():
    x = np.array([500.0, -1e6, np.inf, -np.inf, 448.0, 0.0, np.nan], np.float32)
    z = np.zeros((), ml_dtypes.float8_e4m3fn)
    q = nx.quantize(x, np.float32(1), z, "f8e4m3fn").astype(np.float32)
    assert q[:6].tolist() == [448.0, -448.0, 448.0, -448.0, 448.0, 0.0] and np.isnan(q[6])
    raw = nx.quantize(x, np.float32(1), z, "f8e4m3fn", saturate=False).astype(np.float32)
    assert np.isnan(raw[[0, 1, 2, 3, 6]]).all() and raw[4] == 448.0
    ref = ReferenceEvaluator(
        make_model(
            [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], saturate=0)],
            [vi("x", [7])],
            [vi("q", [7], T.FLOAT8E4M3FN)],
            [numpy_helper.from_array(np.array(1, np.float32), "s"), numpy_helper.from_array(z, "z")],
            opset=21,
        )
    ).run(None, {"x": x})[0]
    assert np.array_equal(ref.astype(np.float32), raw, equal_nan=True)


def test_dequantize_i32_and_output_dtype():
    x = np.array([[-(2**31), 5], [2**31 - 1, 0]], np.int32)
    y = nx.dequantize(x, np.float32(0.5), np.int32(5), "f16")
    assert y.dtype == np.float16 and y[0, 1] == 0 and y[1, 1] == np.float16(-2.5)


# -- verifier -------------------------------------------------------------------------------------
def _build(cls, x, s, z, **attrs):
    module = Module("m")
    func = module.add_function(Function("main", [x, s, z], ["x", "s", "z"]))
    return cls(func.args, attrs)


def t(*shape, dtype=F32):
    return TensorType(shape, dtype)


@pytest.mark.parametrize(
    "cls, types, attrs, message",
    [
        (QuantizeOp, (t(4, 6), t(4, 3), t(4, 3, dtype=I8)), {"block_size": 4}, "ceil(6 / 4)"),
        (QuantizeOp, (t(4, 6), t(4, 2), t(4, 2, dtype=I8)), {"block_size": -1}, "block_size must be >= 0"),
        (QuantizeOp, (t(4, 6), t(4, 2), t(4, 2, dtype=I8)), {}, "blocked quantization needs block_size"),
        (QuantizeOp, (t(4, 6), t(2), t(2, dtype=I8)), {"axis": 1}, "x.shape[1] = 6"),
        (QuantizeOp, (t(4, 6), t(6), t(6, dtype=I8)), {"axis": 2}, "axis 2 out of range"),
        (QuantizeOp, (t(4, 6), t(2, 2), t(2, 2, dtype=I8)), {"block_size": 3}, "must have shape [4, 2]"),
        (QuantizeOp, (t(4, 6), t(6), t(6, dtype=I8)), {"block_size": 3}, "must have the rank of x"),
        (QuantizeOp, (t(4, 6), t(6), t(6, dtype=I32)), {}, "zero_point dtype i32"),
        (QuantizeOp, (t(4, 6), t(6), t(1, dtype=I8)), {}, "must have the scale's shape"),
        (QuantizeOp, (t(4, 6, dtype=I8), t(6), t(6, dtype=I8)), {}, "x must be a float tensor"),
        (QuantizeOp, (t(4, 6), t(6, dtype=I8), t(6, dtype=I8)), {}, "scale must be a float tensor"),
        (DequantizeOp, (t(4, 6, dtype=I8), t(6), t(6, dtype=U8)), {}, "must equal x's dtype i8"),
        (DequantizeOp, (t(4, 6), t(6), t(6)), {}, "dequantize reads quantized data"),
        (DequantizeOp, (t(4, 6, dtype=I4), t(6), t(6, dtype=I4)), {"out": I8}, "'out' must be a float"),
        (DequantizeOp, (t(4, 8, dtype=U4), t(4, 3), t(4, 3, dtype=U4)), {"block_size": 2}, "ceil(8 / 2)"),
    ],
)
def test_verifier_names_the_bad_qparam(cls, types, attrs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        _build(cls, *types, **attrs)


def test_verifier_error_from_text_names_the_op():
    text = """module @m {
  func @main(%x: tensor<4x6xf32>, %s: tensor<4x2xf32>, %z: tensor<4x2xi4>) -> ("y": tensor<4x6xi4>) {
    %0 = mcp.quantize %x, %s, %z {axis = 1, block_size = 4, saturate = true} : SIG loc("q0")
    mcp.return %0 : (tensor<4x6xi4>) -> ()
  }
}
""".replace("SIG", "(tensor<4x6xf32>, tensor<4x2xf32>, tensor<4x2xi4>) -> tensor<4x6xi4>")
    assert parse_module(text.replace("block_size = 4", "block_size = 3")).main.ops[0].name == "mcp.quantize"
    module = parse_module(text.replace("block_size = 4", "block_size = 2"), verify=False)
    with pytest.raises(VerifyError, match=r"mcp.quantize \(ONNX node 'q0'\).*blocked scale"):
        module.verify()


def test_matmul_mixed_dtypes_error_is_clear():
    func = Function("main", [t(2, 4), t(4, 3, dtype=I4)], ["a", "w"])
    with pytest.raises(ValueError, match="operand dtypes differ: f32 vs i4.*mcp.dequantize"):
        MatMulOp(func.args)
    func = Function("main", [t(2, 4, dtype=F16), t(4, 3, dtype=BF16)], ["a", "w"])
    with pytest.raises(ValueError, match="operand dtypes differ: f16 vs bf16.*mcp.cast"):
        MatMulOp(func.args)


# -- folding and the backend --------------------------------------------------------------------
def _const(func, arr):
    return func.append(ConstantOp([], {"value": arr})).result


def test_fold_constants_folds_quantize_but_keeps_widening_dequantize():
    """Quantizing a constant folds (it narrows); dequantizing constant int4 codes to f32 would store
    the weight 8x larger, so it stays a run-time op (the backend fuses it into its matmul)."""
    module = Module("m")
    func = module.add_function(Function("main", [], []))
    w = _rng.standard_normal((4, 6)).astype(np.float32)
    s = np.full((4, 2), 0.25, np.float32)
    z = np.zeros((4, 2), ml_dtypes.int4)
    q = func.append(QuantizeOp([_const(func, w), _const(func, s), _const(func, z)], {"block_size": 3}))
    d = func.append(DequantizeOp([q.result, func.ops[1].result, func.ops[2].result], {"block_size": 3}))
    func.append(ReturnOp([q.result, d.result]))
    func.result_names = ["q", "d"]
    expect = interpret(module, {})
    assert fold_function(func) == 1
    module.verify()
    assert not any(isinstance(op, QuantizeOp) for op in func.ops)
    assert [type(op) for op in func.ops if isinstance(op, DequantizeOp)] == [DequantizeOp]
    got = interpret(module, {})
    assert got["q"].dtype == ml_dtypes.int4 and np.array_equal(got["q"], expect["q"])
    assert np.array_equal(got["d"], expect["d"])
    assert np.array_equal(expect["d"], nx.dequantize(expect["q"], np.float32(0.25), z[0, 0], "f32"))


def test_fold_constants_folds_dequantize_that_does_not_widen():
    """An i32 bias dequantized to f32 (ONNX Runtime's quantize_static) takes the same bytes: folded."""
    module = Module("m")
    func = module.add_function(Function("main", [], []))
    b = np.arange(-3, 3, dtype=np.int32)
    s, z = _const(func, np.array(0.5, np.float32)), _const(func, np.array(0, np.int32))
    d = func.append(DequantizeOp([_const(func, b), s, z]))
    func.append(ReturnOp([d.result]))
    func.result_names = ["d"]
    assert fold_function(func) == 1
    assert interpret(module, {})["d"].tolist() == (b * 0.5).tolist()


def test_evaluate_op_matches_numerics_per_axis():
    module = Module("m")
    func = module.add_function(Function("main", [t(3, 4), t(3), t(3, dtype=U8)], ["x", "s", "z"]))
    op = QuantizeOp(func.args, {"axis": 0})
    x = _rng.standard_normal((3, 4)).astype(np.float32)
    s = np.array([0.1, 0.2, 0.3], np.float32)
    z = np.array([1, 128, 250], np.uint8)
    (q,) = evaluate_op(op, [x, s, z])
    expect = np.clip(np.rint(x / s[:, None]) + z[:, None].astype(np.int64), 0, 255).astype(np.uint8)
    assert np.array_equal(q, expect)


def test_import_refuses_what_the_ops_cannot_express_naming_the_node():
    inits = [numpy_helper.from_array(np.array(0.5, np.float32), "s")]
    node = helper.make_node("QuantizeLinear", ["x", "s"], ["q"], name="qnode", precision=T.FLOAT16)
    model = make_model([node], [vi("x", [2, 3])], [vi("q", [2, 3], T.UINT8)], inits, opset=23)
    with pytest.raises(UnsupportedError, match="node 'qnode'.*precision=f16"):
        import_onnx(model)
    # both problems listed in one message, before any conversion
    bad = [
        helper.make_node("QuantizeLinear", ["x", "s"], ["q"], name="qa", precision=T.FLOAT16),
        helper.make_node("QuantizeLinear", ["x", "s"], ["r"], name="qb", precision=T.BFLOAT16),
    ]
    outs = [vi("q", [2, 3], T.UINT8), vi("r", [2, 3], T.UINT8)]
    model = make_model(bad, [vi("x", [2, 3])], outs, inits, opset=23)
    both = "2 nodes cannot be imported, in 2 groups: .*'qa'.*precision=f16.*'qb'.*precision=bf16"
    with pytest.raises(UnsupportedError, match=both):
        import_onnx(model)
    node = helper.make_node("QuantizeLinear", ["x", "s"], ["q"], name="q16", output_dtype=T.INT16)
    model = make_model([node], [vi("x", [2, 3])], [vi("q", [2, 3], T.INT16)], inits, opset=21)
    with pytest.raises(UnsupportedError, match="INT16"):
        import_onnx(model)


def test_backend_refuses_quantize_naming_the_node(tmp_path):
    from mcpc.arch.target import load_target
    from mcpc.backend.compile import compile_to_program

    model, _ = _qdq_model(T.INT8, (4, 6), (6,), 1, 0)
    module = import_onnx(model)
    with pytest.raises(UnsupportedError, match=r"mcp.quantize \(ONNX node .*has no lowering"):
        compile_to_program(module, load_target("mcp2026-a100"))


def test_onnx_initializer_int4_is_read_unpacked():
    w = np.array([[1, -2, 7], [-8, 0, 3]], dtype=ml_dtypes.int4)
    proto = numpy_helper.from_array(w, "w")
    assert len(proto.raw_data) == 3  # packed by onnx: 6 nibbles
    model = make_model(
        [helper.make_node("DequantizeLinear", ["w", "s"], ["y"], axis=0)],
        [],
        [vi("y", [2, 3])],
        [proto, numpy_helper.from_array(np.array([0.5, 2.0], np.float32), "s")],
        opset=21,
    )
    module = import_onnx(model)
    y = interpret(module, {})["y"]
    assert y.tolist() == [[0.5, -1.0, 3.5], [-16.0, 0.0, 6.0]]
    assert onnx.numpy_helper.to_array(proto).tolist() == w.tolist()


def test_f8_and_f16_scales():
    x = np.linspace(-3, 3, 12, dtype=np.float16).reshape(3, 4)
    module = Module("m")
    func = module.add_function(Function("main", [t(3, 4, dtype=F16)], ["x"]))
    s = _const(func, np.array([0.5, 0.25, 1.0, 2.0], np.float16))
    z = _const(func, np.zeros(4, ml_dtypes.float8_e4m3fn))
    q = func.append(QuantizeOp([func.args[0], s, z], {"axis": 1}))
    d = func.append(DequantizeOp([q.result, s, z], {"axis": 1}))
    func.append(ReturnOp([d.result]))
    func.result_names = ["y"]
    assert d.result.type == t(3, 4, dtype=F16) and q.result.type.dtype == F8E4M3FN
    y = interpret(module, {"x": x})["y"]
    expect = (x.astype(np.float32) / [0.5, 0.25, 1.0, 2.0]).astype(ml_dtypes.float8_e4m3fn)
    assert np.array_equal(y, (expect.astype(np.float32) * [0.5, 0.25, 1.0, 2.0]).astype(np.float16))


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_random_granularities_match_onnx_reference(data):
    """Random shapes, axes and block sizes (short last blocks included) against onnx.reference on
    the integer types, where both define every bit (values kept inside int32 for its cast)."""
    rank = data.draw(st.integers(1, 3))
    shape = tuple(data.draw(st.lists(st.integers(1, 6), min_size=rank, max_size=rank)))
    axis = data.draw(st.integers(-rank, rank - 1))
    kind = data.draw(st.sampled_from(["tensor", "axis", "block"]))
    qtype = data.draw(st.sampled_from([T.INT8, T.UINT8, T.INT4, T.UINT4]))
    block = data.draw(st.integers(1, 4)) if kind == "block" else 0
    if kind == "tensor":
        sshape = data.draw(st.sampled_from([(), (1,)]))
    elif kind == "axis":
        sshape = (shape[axis],)
    else:
        sshape = tuple(-(-d // block) if i == axis % rank else d for i, d in enumerate(shape))
    seed = data.draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 20).astype(np.float32)
    s = rng.uniform(0.1, 2.0, sshape).astype(np.float32)
    npq = helper.tensor_dtype_to_np_dtype(qtype)
    lo, hi = _ZP_RANGE[qtype]
    z = rng.integers(lo, hi, sshape).astype(npq)
    attrs = {"axis": axis, **({"block_size": block} if block else {})}
    inits = [numpy_helper.from_array(s, "s"), numpy_helper.from_array(z, "z")]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], **attrs),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], **attrs),
    ]
    model = make_model(nodes, [vi("x", shape)], [vi("q", shape, qtype), vi("d", shape)], inits, opset=21)
    ours = interpret(import_onnx(model), {"x": x})
    q_ref, d_ref = ReferenceEvaluator(model).run(None, {"x": x})
    assert np.array_equal(ours["q"].astype(np.int64), q_ref.astype(np.int64))
    assert np.array_equal(ours["d"], d_ref)
