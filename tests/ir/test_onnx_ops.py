"""Every supported ONNX op, as a single-node model with attribute variants: the imported module run
by the IR interpreter matches ONNX Runtime (normalized max error ≤ 1e-5, exact for ints/bools) and,
where it implements the op, onnx.reference.ReferenceEvaluator.

Each case runs twice: with its data inputs as graph inputs (ops land in the IR) and with every
input an initializer (the node is evaluated at import by ``evaluate_op``: the folding path).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import pytest
from conftest import make_model, norm_max_err, vi
from onnx import TensorProto, helper, numpy_helper

from mcpc.errors import UnsupportedError
from mcpc.ir.interpreter import interpret
from mcpc.ir.onnx_import import import_onnx

TOL = 1e-5
_rng = np.random.default_rng(1234)
_ELEM = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(np.int64): TensorProto.INT64,
    np.dtype(np.int32): TensorProto.INT32,
    np.dtype(np.bool_): TensorProto.BOOL,
}


def f(*shape, lo=None):
    """Random f32 data; ``lo`` shifts uniform data away from zero (for Div, Sqrt, Pow)."""
    if lo is not None:
        return _rng.uniform(lo, lo + 2.0, shape).astype(np.float32)
    return _rng.standard_normal(shape).astype(np.float32)


def i64(*values):
    return np.array(values, dtype=np.int64)


@dataclass
class Case:
    id: str
    op: str
    data: dict  # graph inputs (name -> array); become initializers in the folded variant
    consts: dict = field(default_factory=dict)  # always initializers (shape/axes/... inputs)
    attrs: dict = field(default_factory=dict)
    opset: int = 17
    order: list | None = None  # node input order (names; "" = omitted); default data then consts
    n_out: int = 1
    ref: bool = True  # also check onnx.reference

    def model(self, folded: bool) -> onnx.ModelProto:
        order = self.order if self.order is not None else [*self.data, *self.consts]
        outs = [f"y{i}" for i in range(self.n_out)]
        node = helper.make_node(self.op, order, outs, name=f"{self.op.lower()}_node", **self.attrs)
        consts = {**self.consts, **(self.data if folded else {})}
        inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()]
        data = {} if folded else self.data
        inputs = [helper.make_tensor_value_info(k, _ELEM[v.dtype], v.shape) for k, v in data.items()]
        return make_model(
            [node], inputs, _typed_outputs([node], inputs, inits, self.opset), inits, self.opset
        )


def _typed_outputs(nodes, inputs, inits, opset):
    """Graph outputs typed as ONNX infers them (exporters write types; the checker wants them)."""
    graph = helper.make_graph(nodes, "g", inputs, [], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    known = {
        vi.name: vi for vi in onnx.shape_inference.infer_shapes(model, strict_mode=True).graph.value_info
    }
    return [known[o] for o in nodes[-1].output]


CASES = [
    # elementwise binary, with broadcasting
    Case("add_bcast", "Add", {"a": f(2, 3, 4), "b": f(4)}),
    Case("sub_bcast", "Sub", {"a": f(2, 1, 4), "b": f(3, 1)}),
    Case("mul", "Mul", {"a": f(2, 3), "b": f(2, 3)}),
    Case("div", "Div", {"a": f(3, 4), "b": f(1, 4, lo=0.5)}),
    Case("div_int", "Div", {"a": np.array([7, -7, 9, -9], np.int32), "b": np.array([2, 2, -4, 4], np.int32)}),
    Case("add_int64", "Add", {"a": i64(1, 2, 3), "b": i64(10)}),
    Case("pow_float", "Pow", {"a": f(3, 4, lo=0.2), "b": f(4, lo=0.5)}),
    Case("pow_int_exponent", "Pow", {"a": f(3, 4)}, {"e": np.array(2, np.int64)}),
    Case("max2", "Max", {"a": f(2, 3), "b": f(3)}),
    Case("min2", "Min", {"a": f(2, 3), "b": f(2, 1)}),
    Case("max3", "Max", {"a": f(2, 3), "b": f(3), "c": f(2, 3)}),
    Case("sum3", "Sum", {"a": f(2, 3), "b": f(3), "c": f(2, 3)}),
    Case("clip", "Clip", {"x": f(3, 4)}, {"lo": np.float32(-0.5), "hi": np.float32(0.5)}),
    Case("clip_min_only", "Clip", {"x": f(3, 4)}, {"lo": np.float32(1e-9)}, order=["x", "lo"]),
    Case("clip_max_only", "Clip", {"x": f(3, 4)}, {"hi": np.float32(0.1)}, order=["x", "", "hi"]),
    Case("clip_none", "Clip", {"x": f(3, 4)}, order=["x"]),
    Case("clip_lo_above_hi", "Clip", {"x": f(3, 4)}, {"lo": np.float32(1.0), "hi": np.float32(-1.0)}),
    Case(
        "clip_bounds_as_inputs",
        "Clip",
        {"x": f(3, 4), "lo": np.array(-0.2, np.float32), "hi": np.array(0.3, np.float32)},
    ),
    Case("clip_int64", "Clip", {"x": i64(-9, -1, 0, 4, 12)}, {"lo": np.int64(-2), "hi": np.int64(5)}),
    Case("clip_f16", "Clip", {"x": f(3, 4).astype(np.float16)}, {"lo": np.float16(-1), "hi": np.float16(1)}),
    Case(
        "equal_float", "Equal", {"a": np.array([1, 2, 3], np.float32), "b": np.array([1, 0, 3], np.float32)}
    ),
    Case("equal_int64", "Equal", {"a": i64(1, 2, 3), "b": i64(3, 2, 1)}),
    Case("less", "Less", {"a": f(3, 4), "b": f(4)}),
    Case("greater", "Greater", {"a": f(3, 4), "b": f(3, 1)}),
    Case(
        "less_equal",
        "LessOrEqual",
        {"a": np.array([1, 2, 3], np.float32), "b": np.array([2, 2, 2], np.float32)},
    ),
    Case("greater_equal", "GreaterOrEqual", {"a": i64(1, 2, 3), "b": i64(2, 2, 2)}),
    Case("not", "Not", {"a": np.array([True, False])}),
    Case(
        "and", "And", {"a": np.array([True, True, False, False]), "b": np.array([True, False, True, False])}
    ),
    Case("or", "Or", {"a": np.array([True, True, False, False]), "b": np.array([True, False, True, False])}),
    # unary
    Case("sqrt", "Sqrt", {"x": f(3, 5, lo=0.01)}),
    Case("reciprocal", "Reciprocal", {"x": f(3, 5, lo=0.5)}),
    Case("neg", "Neg", {"x": f(3, 5)}),
    Case("neg_int", "Neg", {"x": np.array([1, -2, 3], np.int32)}),
    Case("abs", "Abs", {"x": f(3, 5)}),
    Case("exp", "Exp", {"x": f(3, 5)}),
    Case("tanh", "Tanh", {"x": f(3, 5)}),
    Case("erf", "Erf", {"x": f(3, 5)}),
    Case("relu", "Relu", {"x": f(3, 5)}),
    Case("sigmoid", "Sigmoid", {"x": f(3, 5)}),
    Case("gelu", "Gelu", {"x": f(3, 5)}, opset=20),
    Case("gelu_tanh", "Gelu", {"x": f(3, 5)}, attrs={"approximate": "tanh"}, opset=20),
    Case("sin", "Sin", {"x": f(3, 5) * 4}),
    Case("cos", "Cos", {"x": f(3, 5) * 4}),
    Case("log", "Log", {"x": f(3, 5, lo=0.01)}),
    Case("floor", "Floor", {"x": f(3, 5) * 3}),
    Case("ceil", "Ceil", {"x": f(3, 5) * 3}),
    Case("round", "Round", {"x": f(3, 5) * 3}),
    Case("identity", "Identity", {"x": f(2, 3)}),
    Case("dropout", "Dropout", {"x": f(2, 3)}),
    # casts
    Case("cast_f16", "Cast", {"x": f(3, 4)}, attrs={"to": TensorProto.FLOAT16}),
    Case("cast_to_int32", "Cast", {"x": f(3, 4) * 5}, attrs={"to": TensorProto.INT32}),
    Case("cast_int64_to_float", "Cast", {"x": i64(-3, 0, 5)}, attrs={"to": TensorProto.FLOAT}),
    Case("cast_bool_to_float", "Cast", {"x": np.array([True, False])}, attrs={"to": TensorProto.FLOAT}),
    Case(
        "cast_float_to_bool",
        "Cast",
        {"x": np.array([0.0, 1.5, -2.0], np.float32)},
        attrs={"to": TensorProto.BOOL},
    ),
    Case("cast_like", "CastLike", {"x": f(3)}, {"t": np.zeros(1, np.float16)}),
    # nn
    Case("matmul_2d", "MatMul", {"a": f(3, 4), "b": f(4, 5)}),
    Case("matmul_3d_2d", "MatMul", {"a": f(2, 3, 4), "b": f(4, 5)}),
    Case("matmul_batch_bcast", "MatMul", {"a": f(2, 1, 3, 4), "b": f(5, 4, 6)}),
    Case("matmul_vec_mat", "MatMul", {"a": f(4), "b": f(2, 4, 5)}),
    Case("matmul_mat_vec", "MatMul", {"a": f(2, 3, 4), "b": f(4)}),
    Case("matmul_vec_vec", "MatMul", {"a": f(4), "b": f(4)}),
    Case("gemm", "Gemm", {"a": f(3, 4), "b": f(4, 5)}),
    Case("gemm_transb_const_c", "Gemm", {"a": f(3, 4)}, {"w": f(5, 4), "c": f(5)}, attrs={"transB": 1}),
    Case("gemm_transb_input", "Gemm", {"a": f(3, 4), "w": f(5, 4), "c": f(3, 5)}, attrs={"transB": 1}),
    Case(
        "gemm_alpha_beta_transa",
        "Gemm",
        {"a": f(4, 3), "b": f(4, 5), "c": f(1, 5)},
        attrs={"transA": 1, "alpha": 0.5, "beta": 2.0},
    ),
    Case("gemm_alpha_const_b", "Gemm", {"a": f(3, 4)}, {"b": f(4, 5)}, attrs={"alpha": 0.25}),
    Case("softmax_last", "Softmax", {"x": f(2, 3, 5)}),
    Case("softmax_axis1", "Softmax", {"x": f(2, 3, 5)}, attrs={"axis": 1}),
    Case("softmax_axis0_opset13", "Softmax", {"x": f(4, 3)}, attrs={"axis": 0}, opset=13),
    Case("log_softmax_last", "LogSoftmax", {"x": f(2, 3, 5) * 4}),
    Case("log_softmax_axis1", "LogSoftmax", {"x": f(2, 3, 5)}, attrs={"axis": 1}),
    Case("layernorm", "LayerNormalization", {"x": f(2, 3, 8), "g": f(8), "b": f(8)}),
    Case(
        "layernorm_axis1_nobias",
        "LayerNormalization",
        {"x": f(2, 3, 4), "g": f(3, 4)},
        attrs={"axis": 1, "epsilon": 1e-3},
    ),
    Case("layernorm_bcast_scale", "LayerNormalization", {"x": f(2, 3, 4), "g": f(1, 4)}, attrs={"axis": -2}),
    Case("reduce_mean_attr", "ReduceMean", {"x": f(2, 3, 4)}, attrs={"axes": [-1]}),
    Case("reduce_mean_attr_nokeep", "ReduceMean", {"x": f(2, 3, 4)}, attrs={"axes": [0, 2], "keepdims": 0}),
    Case("reduce_mean_all", "ReduceMean", {"x": f(2, 3, 4)}, attrs={"keepdims": 0}),
    Case("reduce_mean_input18", "ReduceMean", {"x": f(2, 3, 4)}, {"axes": i64(1)}, opset=18),
    Case(
        "reduce_mean_noop18",
        "ReduceMean",
        {"x": f(2, 3)},
        attrs={"noop_with_empty_axes": 1},
        opset=18,
    ),
    Case(
        "reduce_sum13", "ReduceSum", {"x": f(2, 3, 4)}, {"axes": i64(-1, 0)}, attrs={"keepdims": 0}, opset=13
    ),
    Case("reduce_sum_int", "ReduceSum", {"x": np.arange(12, dtype=np.int32).reshape(3, 4)}, {"axes": i64(1)}),
    Case("reduce_max17", "ReduceMax", {"x": f(2, 3, 4)}, attrs={"axes": [1]}),
    Case("reduce_max18", "ReduceMax", {"x": f(2, 3, 4)}, {"axes": i64(2)}, attrs={"keepdims": 0}, opset=18),
    # shape
    Case("reshape_zero_minus1", "Reshape", {"x": f(2, 3, 4)}, {"s": i64(0, -1)}),
    Case(
        "reshape_allowzero",
        "Reshape",
        {"x": f(2, 3, 4)},
        {"s": i64(4, 3, 2)},
        attrs={"allowzero": 1},
        opset=14,
    ),
    Case("reshape_minus1_first", "Reshape", {"x": f(2, 3, 4)}, {"s": i64(-1, 2, 2)}),
    Case("flatten_default", "Flatten", {"x": f(2, 3, 4)}),
    Case("flatten_axis0", "Flatten", {"x": f(2, 3, 4)}, attrs={"axis": 0}),
    Case("flatten_neg", "Flatten", {"x": f(2, 3, 4)}, attrs={"axis": -1}),
    Case("transpose_default", "Transpose", {"x": f(2, 3, 4)}),
    Case("transpose_perm", "Transpose", {"x": f(2, 3, 4)}, attrs={"perm": [1, 0, 2]}),
    Case("unsqueeze", "Unsqueeze", {"x": f(3, 4)}, {"axes": i64(0, -1)}),
    Case("unsqueeze_middle", "Unsqueeze", {"x": f(3, 4)}, {"axes": i64(1)}),
    Case("squeeze_axes", "Squeeze", {"x": f(1, 3, 1, 4)}, {"axes": i64(-2)}),
    Case("squeeze_all", "Squeeze", {"x": f(1, 3, 1, 4)}),
    Case("concat", "Concat", {"a": f(2, 3), "b": f(2, 1)}, {"c": f(2, 2)}, attrs={"axis": 1}),
    Case("concat_neg_axis", "Concat", {"a": f(2, 3), "b": f(1, 3)}, attrs={"axis": -2}),
    Case("concat_int64", "Concat", {"a": i64(1, 2)}, {"b": i64(3)}, attrs={"axis": 0}),
    Case("slice_basic", "Slice", {"x": f(5, 6)}, {"s": i64(1, 2), "e": i64(4, 5)}),
    Case("slice_axes_steps", "Slice", {"x": f(5, 6)}, {"s": i64(0), "e": i64(6), "a": i64(1), "st": i64(2)}),
    Case("slice_negative", "Slice", {"x": f(5, 6)}, {"s": i64(-3), "e": i64(-1), "a": i64(0)}),
    Case(
        "slice_negative_step",
        "Slice",
        {"x": f(5, 6)},
        {"s": i64(-1, 4), "e": i64(-(2**63), 0), "a": i64(1, 0), "st": i64(-1, -2)},
    ),
    Case("slice_clamp", "Slice", {"x": f(5, 6)}, {"s": i64(-100), "e": i64(2**63 - 1), "a": i64(-1)}),
    Case("slice_empty", "Slice", {"x": f(5, 6)}, {"s": i64(4), "e": i64(2), "a": i64(0)}),
    Case("gather_dynamic_idx", "Gather", {"x": f(10, 4), "i": i64([0, 9], [3, -1])}),
    Case("gather_axis1_const_idx", "Gather", {"x": f(3, 5)}, {"i": i64(-1, 0, 2)}, attrs={"axis": 1}),
    Case("gather_scalar", "Gather", {"x": f(3, 5)}, {"i": np.array(1, np.int64)}, attrs={"axis": 0}),
    Case("split_input", "Split", {"x": f(6, 4)}, {"sp": i64(2, 4)}, n_out=2),
    Case("split_equal", "Split", {"x": f(2, 6)}, attrs={"axis": 1}, n_out=3),
    Case("split_num_outputs", "Split", {"x": f(7, 2)}, attrs={"num_outputs": 3}, n_out=3, opset=18),
    Case("split_attr13_neg_axis", "Split", {"x": f(2, 5)}, {"sp": i64(1, 4)}, attrs={"axis": -1}, n_out=2),
    Case("where", "Where", {"c": _rng.random((3, 4)) > 0.5, "a": f(3, 4), "b": f(4)}),
    Case("expand", "Expand", {"x": f(3, 1)}, {"s": i64(2, 1, 4)}),
    Case("expand_smaller_shape", "Expand", {"x": f(2, 3, 1)}, {"s": i64(3, 5)}),
    Case("shape", "Shape", {"x": f(2, 3, 4)}),
    Case("shape_start_end", "Shape", {"x": f(2, 3, 4)}, attrs={"start": 1, "end": -1}, opset=15),
    Case("size", "Size", {"x": f(2, 3, 4)}),
    Case("trilu_upper", "Trilu", {"x": f(4, 5)}),
    Case("trilu_lower_k", "Trilu", {"x": f(2, 4, 5)}, {"k": np.array(-1, np.int64)}, attrs={"upper": 0}),
    # GatherND: indices are initializers (known at import, as the dynamo exporter's causal mask has them)
    Case("gathernd_full_rows", "GatherND", {"x": f(3, 4)}, {"i": i64(0, 3, 2, -1, -3, 0).reshape(3, 2)}),
    Case("gathernd_partial", "GatherND", {"x": f(3, 4, 5)}, {"i": i64(2, 0, -1).reshape(3, 1)}),
    Case("gathernd_nested_idx", "GatherND", {"x": f(4, 3, 2)}, {"i": i64(*range(8)).reshape(2, 2, 2) % 3}),
    Case(
        "gathernd_batch1",
        "GatherND",
        {"x": f(2, 3, 4)},
        {"i": i64(1, 3, 0, -4, 2, 1, 0, 2).reshape(2, 2, 2)},
        attrs={"batch_dims": 1},
    ),
    Case(
        "gathernd_batch2",
        "GatherND",
        {"x": f(2, 3, 4, 5)},
        {"i": (np.arange(12, dtype=np.int64) % 4).reshape(2, 3, 2, 1)},
        attrs={"batch_dims": 2},
    ),
    Case(
        "gathernd_bool_mask",
        "GatherND",  # the dynamo exporter's padding-mask lookup: mask[b, kv]
        {"x": _rng.integers(0, 2, (2, 5)).astype(np.bool_)},
        {
            "i": np.stack(
                np.broadcast_arrays(
                    np.arange(2)[:, None, None], np.arange(5)[None, None, :] * np.ones((1, 3, 1), np.int64)
                ),
                -1,
            ).astype(np.int64)
        },
        opset=18,
    ),
    Case(
        "gathernd_int64",
        "GatherND",
        {"x": _rng.integers(-9, 9, (4, 3)).astype(np.int64)},
        {"i": i64(3, 0, 1).reshape(3, 1)},
    ),
    Case("argmax_axis1", "ArgMax", {"x": f(3, 7, 2)}, attrs={"axis": 1}),
    Case("argmax_last_nokeep", "ArgMax", {"x": f(4, 9)}, attrs={"axis": -1, "keepdims": 0}),
    Case("topk_last", "TopK", {"x": f(3, 7)}, {"k": i64(3)}, n_out=2),
    Case("topk_min", "TopK", {"x": f(2, 5, 4)}, {"k": i64(2)}, attrs={"axis": 1, "largest": 0}, n_out=2),
    Case("topk_axis0_all", "TopK", {"x": f(6, 3)}, {"k": i64(6)}, attrs={"axis": -2}, n_out=2),
    Case(
        "topk_int_ties",  # equal values: the lower index first
        "TopK",
        {"x": np.array([[3, 1, 3, 2, 1, 3], [0, 0, 0, 0, 0, 0]], np.int32)},
        {"k": i64(4)},
        n_out=2,
    ),
    Case(
        "topk_int_ties_smallest",
        "TopK",
        {"x": np.array([[3, 1, 3, 2, 1, 3]], np.int64)},
        {"k": i64(3)},
        attrs={"largest": 0},
        n_out=2,
    ),
]

CONSTANT_CASES = [
    ("constant_value", helper.make_node("Constant", [], ["y0"], value=numpy_helper.from_array(f(2, 3)))),
    ("constant_value_float", helper.make_node("Constant", [], ["y0"], value_float=1.5)),
    ("constant_value_floats", helper.make_node("Constant", [], ["y0"], value_floats=[1.0, -2.0])),
    ("constant_value_int", helper.make_node("Constant", [], ["y0"], value_int=7)),
    ("constant_value_ints", helper.make_node("Constant", [], ["y0"], value_ints=[1, 2, 3])),
]


def _compare(y: dict, r: dict, what: str) -> None:
    assert set(y) == set(r)
    for name in r:
        ref = np.asarray(r[name])
        assert y[name].dtype == ref.dtype, f"{what} {name}: dtype {y[name].dtype} vs {ref.dtype}"
        if ref.dtype.kind in "fc":
            assert norm_max_err(y[name], ref) <= TOL, f"{what} {name}: error {norm_max_err(y[name], ref)}"
        else:
            np.testing.assert_array_equal(y[name], ref, err_msg=f"{what} {name}")


@pytest.mark.parametrize("folded", [False, True], ids=["ir", "folded"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_op_matches_onnxruntime_and_reference(case: Case, folded: bool, ort_run, ref_run):
    model = case.model(folded)
    feeds = {} if folded else case.data
    module = import_onnx(model)
    got = interpret(module, feeds)
    if folded:  # everything was known at import: only constants (and boundary casts) remain
        assert {op.name for op in module.main.ops} <= {"mcp.constant", "mcp.cast", "mcp.return"}
    _compare(got, ort_run(model, feeds), "onnxruntime")
    if case.ref:
        _compare(got, ref_run(model, feeds), "reference")


@pytest.mark.parametrize("node", [n for _, n in CONSTANT_CASES], ids=[i for i, _ in CONSTANT_CASES])
def test_constant_outputs(node, ort_run, ref_run):
    """A Constant node straight to a graph output (an output that is a constant)."""
    model = make_model([node], [], _typed_outputs([node], [], [], 17))
    got = interpret(import_onnx(model), {})
    _compare(got, ort_run(model, {}), "onnxruntime")
    _compare(got, ref_run(model, {}), "reference")


def test_range_constant_of_shape_fold(ort_run):
    """Range and ConstantOfShape on constants (shape subgraphs) fold at import."""
    nodes = [
        helper.make_node("Range", ["start", "limit", "delta"], ["r"]),
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node(
            "ConstantOfShape", ["s"], ["z"], value=numpy_helper.from_array(np.full(1, 2.5, np.float32))
        ),
        helper.make_node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["x", "rf"], ["xr"]),
        helper.make_node("Mul", ["xr", "z"], ["y"]),
    ]
    bounds = (("start", 1), ("limit", 8), ("delta", 2))
    inits = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in bounds]
    model = make_model(
        nodes,
        [vi("x", [2, 4])],
        [vi("y", [2, 4])],
        inits,
    )
    x = f(2, 4)
    module = import_onnx(model)
    names = sorted(op.name for op in module.main.ops)
    assert names == ["mcp.add", "mcp.constant", "mcp.constant", "mcp.mul", "mcp.return"]
    _compare(interpret(module, {"x": x}), ort_run(model, {"x": x}), "onnxruntime")


def test_dropout_mask_output_is_unsupported():
    node = helper.make_node("Dropout", ["x"], ["y", "mask"], name="drop")
    model = make_model(
        [node],
        [vi("x", [2])],
        [vi("y", [2]), vi("mask", [2], TensorProto.BOOL)],
    )
    with pytest.raises(UnsupportedError, match="node 'drop'.*mask output"):
        import_onnx(model)


def test_gathernd_with_run_time_indices_is_refused_naming_why():
    node = helper.make_node("GatherND", ["x", "i"], ["y"], name="gnd")
    model = make_model([node], [vi("x", [3, 4]), vi("i", [2, 2], TensorProto.INT64)], [vi("y", [2])])
    with pytest.raises(UnsupportedError, match="node 'gnd'.*indices are computed at run time"):
        import_onnx(model)


def test_gathernd_out_of_range_index_is_an_input_error():
    from mcpc.errors import InputError

    node = helper.make_node("GatherND", ["x", "i"], ["y"], name="gnd")
    inits = [numpy_helper.from_array(i64(0, 4).reshape(1, 2), "i")]
    model = make_model([node], [vi("x", [3, 4])], [vi("y", [1])], inits)
    with pytest.raises(InputError, match="node 'gnd'.*index 4 .*out of range"):
        import_onnx(model)
