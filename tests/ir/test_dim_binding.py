"""Binding symbolic dims at import: every unbound dim at once, and bad --dim/--shape values as usage
errors (exit 2) that list the model's dims; a zero is a size like any other, refused only when it
empties every output."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_model, vi
from onnx import TensorProto, helper, numpy_helper

from mcpc.errors import EXIT_BAD_INPUT, EXIT_USAGE, InputError, UsageError
from mcpc.examples import decoder_block
from mcpc.ir.interpreter import interpret
from mcpc.ir.onnx_import import import_onnx
from mcpc.ir.onnx_shapes import input_dims, may_be_empty


def kv_model(via_cast: bool = False, shape_output: bool = True):
    """ids [batch, seq] gathered from a table; past [batch, past_seq, 4] concatenated with the new
    rows along axis 1 (-2 here, to exercise negative axes); the Shape of past is read as well (an
    output unless ``shape_output`` is false)."""
    table = numpy_helper.from_array(np.arange(40, dtype=np.float32).reshape(10, 4), "table")
    nodes = [helper.make_node("Gather", ["table", "ids"], ["emb"], name="embed")]
    past = "past"
    if via_cast:
        nodes.append(helper.make_node("Cast", ["past"], ["past32"], to=TensorProto.FLOAT, name="cast"))
        past = "past32"
    nodes += [
        helper.make_node("Concat", [past, "emb"], ["kv"], axis=-2, name="cat"),
        helper.make_node("Shape", ["past"], ["past_shape"], name="shape"),
    ]
    outputs = [vi("kv", ["batch", "total", 4])]
    if shape_output:
        outputs.append(vi("past_shape", [3], TensorProto.INT64))
    return make_model(
        nodes,
        [vi("ids", ["batch", "seq"], TensorProto.INT64), vi("past", ["batch", "past_seq", 4])],
        outputs,
        [table],
    )


def test_every_unbound_dim_is_listed_with_a_dim_line():
    with pytest.raises(InputError) as e:
        import_onnx(kv_model())
    msg = e.value.message
    assert e.value.exit_code == EXIT_BAD_INPUT
    assert "3 symbolic dim(s) are unbound" in msg
    assert (
        "'batch' (input 'ids' dim 0, input 'past' dim 0)" in msg and "'past_seq' (input 'past' dim 1)" in msg
    )
    assert "--dim batch=N --dim seq=N --dim past_seq=N" in msg
    with pytest.raises(InputError) as e:
        import_onnx(kv_model(), dims={"batch": 1})
    assert "2 symbolic dim(s)" in e.value.message and "--dim seq=N --dim past_seq=N" in e.value.message
    assert "\n" not in e.value.message


def test_unnamed_symbolic_dim_gets_a_shape_hint():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [None, 8])], [vi("y", [None, 8])])
    with pytest.raises(
        InputError, match=r"input 'x' dim 0 is symbolic \(unnamed\): bind it with --shape x=Nx8"
    ):
        import_onnx(model)


@pytest.mark.parametrize(
    "shapes, dims, fragment",
    [
        (
            {},
            {"batch": 1, "seq": 2, "past_seq": 3, "sequence": 4},
            "--dim sequence=4: the model has no input dim",
        ),
        ({}, {"batch": 1, "seq": -2, "past_seq": 3}, "--dim seq=-2: a size must be >= 0"),
        ({"ids": (1, -2)}, {"past_seq": 3}, "--shape ids=1x-2: sizes must be >= 0"),
        ({"idz": (1, 2)}, {"past_seq": 3}, "'idz' is not an input"),
        ({}, {"batch": 1, "seq": 0, "past_seq": 0}, "--dim seq=0 --dim past_seq=0 makes every output empty"),
        ({"ids": (1, 0)}, {"past_seq": 0}, "--dim past_seq=0 --shape ids=1x0 makes every output empty"),
    ],
)
def test_bad_bindings_are_usage_errors_listing_the_dims(shapes, dims, fragment):
    with pytest.raises(UsageError) as e:
        import_onnx(kv_model(shape_output=False), shapes=shapes, dims=dims)
    msg = e.value.message
    assert e.value.exit_code == EXIT_USAGE
    assert fragment in msg
    assert (
        "the model's symbolic dims: batch (ids dim 0, past dim 0); seq (ids dim 1); past_seq (past dim 1)"
        in msg
    )


@pytest.mark.parametrize("via_cast", [False, True])
def test_zero_past_seq_is_a_prefill(via_cast):
    module = import_onnx(kv_model(via_cast), dims={"batch": 1, "seq": 2, "past_seq": 0})
    ids = np.array([[3, 7]], dtype=np.int64)
    out = interpret(module, {"ids": ids, "past": np.zeros((1, 0, 4), np.float32)})
    np.testing.assert_array_equal(out["kv"], np.arange(40, dtype=np.float32).reshape(10, 4)[ids])
    np.testing.assert_array_equal(out["past_shape"], [1, 0, 4])


@pytest.mark.parametrize(
    "shapes, dims",
    [
        ({}, {"batch": 1, "seq": 0, "past_seq": 3}),  # no new rows: kv is the past
        ({"ids": (1, 0)}, {"past_seq": 3}),
        ({}, {"batch": 0, "seq": 2, "past_seq": 3}),  # kv empty, past_shape still [0, 3, 4]
    ],
)
def test_a_zero_anywhere_is_a_value_as_onnx_defines_it(shapes, dims):
    module = import_onnx(kv_model(), shapes=shapes, dims=dims)
    batch = dims.get("batch", 1)
    ids = np.zeros((batch, dims.get("seq", 0)), np.int64)
    past = np.arange(batch * 12, dtype=np.float32).reshape(batch, 3, 4)
    out = interpret(module, {"ids": ids, "past": past})
    table = np.arange(40, dtype=np.float32).reshape(10, 4)
    np.testing.assert_array_equal(out["kv"], np.concatenate([past, table[ids]], axis=1))
    np.testing.assert_array_equal(out["past_shape"], [batch, 3, 4])


def test_may_be_empty_follows_the_kv_cache_pattern_only():
    graph = kv_model().graph
    assert may_be_empty(graph, "past", 1, 3)  # Concat along that axis, and a Shape
    assert not may_be_empty(graph, "past", 2, 3)  # the Concat is along another axis
    assert not may_be_empty(graph, "ids", 1, 2)  # gathered: computed on
    assert list(input_dims(graph)) == ["batch", "seq", "past_seq"]


def test_fixed_zero_in_the_model_is_left_alone():
    model = make_model(
        [helper.make_node("Concat", ["a", "b"], ["y"], axis=0)],
        [vi("a", [0, 2]), vi("b", [3, 2])],
        [vi("y", [3, 2])],
    )
    assert import_onnx(model).main.args[0].type.shape == (0, 2)


def test_decoder_binding_still_imports():
    assert import_onnx(decoder_block(hidden=32, heads=2), dims={"seq": 3}).main.args[0].type.shape == (
        1,
        3,
        32,
    )


def test_reshape_copy_zero_past_the_input_rank_is_an_input_error():
    # ONNX Reshape (allowzero=0) copies the input's dim for a 0: a 0 beyond the input's rank (what a
    # dim bound to 0 produces in an exported reshape target) is named at the node, not an IndexError
    shape = numpy_helper.from_array(np.array([1, 4, 0], dtype=np.int64), "shape")
    model = make_model(
        [helper.make_node("Reshape", ["x", "shape"], ["y"], name="/attn/Reshape")],
        [vi("x", [4, 1])],
        [vi("y", [1, 4, 1])],
        [shape],
    )
    with pytest.raises(
        InputError, match=r"'/attn/Reshape' \(op_type Reshape.*has a 0 at a position the input of rank 2"
    ):
        import_onnx(model)
