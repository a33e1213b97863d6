"""Dims named by an expression (Optimum's ``past_sequence_length + sequence_length``, the dynamo
exporter's ``s0 + s70``) are derived from the names they read; names a shell would split are
printed quoted; the exporter family of a graph is named by its structure (ir/exporter_family.py)."""

from __future__ import annotations

import shlex

import numpy as np
import pytest
from conftest import make_model, vi
from onnx import helper

from mcpc.errors import InputError, UsageError
from mcpc.ir.exporter_family import exporter_family, register_family
from mcpc.ir.onnx_import import import_onnx
from mcpc.ir.onnx_shapes import binding_names, dim_expression, dim_line, input_dims


def mask_model():
    """Optimum's naming: ids [batch_size, sequence_length], past [batch_size, past_sequence_length],
    the mask over both, [batch_size, 'past_sequence_length + sequence_length']; y = mask's length
    reduced, so the bound mask shape is visible in the result."""
    nodes = [
        helper.make_node("Concat", ["past", "ids"], ["cat"], axis=1),
        helper.make_node("Add", ["cat", "mask"], ["y"]),
    ]
    return make_model(
        nodes,
        [
            vi("ids", ["batch_size", "sequence_length"]),
            vi("past", ["batch_size", "past_sequence_length"]),
            vi("mask", ["batch_size", "past_sequence_length + sequence_length"]),
        ],
        [vi("y", ["batch_size", "past_sequence_length + sequence_length"])],
    )


def test_an_expression_is_parsed_and_plain_or_opaque_names_are_not():
    assert dim_expression("past_sequence_length + sequence_length") is not None
    assert dim_expression("s0 + s70") is not None and dim_expression("2*(a+b)//3") is not None
    for name in ("batch", "s70", "Addpresent.0.key_dim_3", "a.b + c", "f(a)", "a ** 2", ""):
        assert dim_expression(name) is None, name


def test_the_dims_to_bind_are_the_names_an_expression_reads():
    found = input_dims(mask_model().graph)
    assert list(found) == [
        "batch_size",
        "sequence_length",
        "past_sequence_length",
        "past_sequence_length + sequence_length",
    ]
    assert binding_names(found) == ["batch_size", "sequence_length", "past_sequence_length"]


def test_a_name_a_shell_splits_is_quoted_and_survives_the_shell():
    line = dim_line(["batch", "past_sequence_length + sequence_length", "my dim(1)"], {"batch": 1})
    assert line == "--dim batch=1 --dim 'past_sequence_length + sequence_length=N' --dim 'my dim(1)=N'"
    assert shlex.split(line)[3] == "past_sequence_length + sequence_length=N"


def test_the_expression_dim_is_derived_from_its_names():
    m = import_onnx(mask_model(), dims={"batch_size": 2, "sequence_length": 3, "past_sequence_length": 4})
    assert [a.type.shape for a in m.main.args] == [(2, 3), (2, 4), (2, 7)]


@pytest.mark.parametrize(
    "dims",
    [
        # the expression bound as a whole (whitespace aside) gives its one unbound name
        {"batch_size": 2, "sequence_length": 3, "past_sequence_length+sequence_length": 7},
        {"batch_size": 2, "past_sequence_length": 4, "past_sequence_length + sequence_length": 7},
        # bound as a whole and consistent with its names
        {
            "batch_size": 2,
            "sequence_length": 3,
            "past_sequence_length": 4,
            "past_sequence_length + sequence_length": 7,
        },
    ],
)
def test_binding_the_expression_itself_is_accepted(dims):
    m = import_onnx(mask_model(), dims=dims)
    assert [a.type.shape for a in m.main.args] == [(2, 3), (2, 4), (2, 7)]
    from mcpc.ir.interpreter import interpret

    out = interpret(m, {"ids": np.ones((2, 3), np.float32), "past": np.zeros((2, 4), np.float32),
                        "mask": np.ones((2, 7), np.float32)})  # fmt: skip
    assert out["y"].shape == (2, 7)


def test_an_expression_bound_against_its_names_is_a_usage_error():
    dims = {
        "batch_size": 1,
        "sequence_length": 3,
        "past_sequence_length": 4,
        "past_sequence_length + sequence_length": 8,
    }
    with pytest.raises(UsageError, match=r"'past_sequence_length \+ sequence_length=8' disagrees with "
                       r"past_sequence_length=4, sequence_length=3, which give 7"):  # fmt: skip
        import_onnx(mask_model(), dims=dims)


def test_an_expression_giving_no_size_is_a_usage_error():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [vi("a", ["n", "m"]), vi("x", ["n - m"])],
                       [vi("y", ["n - m"])])  # fmt: skip
    with pytest.raises(UsageError, match=r"dim 'n - m' is -1 < 0 with n=2, m=3"):
        import_onnx(model, dims={"n": 2, "m": 3})
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [vi("a", ["n", "m"]), vi("x", ["n // m"])],
                       [vi("y", ["n // m"])])  # fmt: skip
    with pytest.raises(UsageError, match=r"dim 'n // m' divides by 0 with n=2, m=0"):
        import_onnx(model, dims={"n": 2, "m": 0})


def test_unbound_names_are_asked_for_and_the_expression_said_to_follow():
    with pytest.raises(InputError) as e:
        import_onnx(mask_model(), dims={"batch_size": 1})
    msg = e.value.message
    assert "2 symbolic dim(s) are unbound" in msg
    assert "bind them with --dim sequence_length=N --dim past_sequence_length=N" in msg
    assert "('past_sequence_length + sequence_length' follow from them)" in msg


def test_exporter_families_by_structure():
    m = mask_model()
    assert exporter_family(m)["family"].startswith("Hugging Face Optimum")
    dynamo = make_model(
        [helper.make_node("Relu", ["x"], ["y"])], [vi("x", ["s0", "s70"])], [vi("y", ["s0", "s70"])]
    )
    assert exporter_family(dynamo)["family"] == "torch.onnx.export, dynamo exporter"
    fused = make_model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [2])], [vi("y", [2])])
    fused.graph.node.append(helper.make_node("FastGelu", ["y"], ["z"], domain="com.microsoft"))
    assert exporter_family(fused) == {"family": "ONNX Runtime transformers optimizer",
                                      "evidence": "fused com.microsoft ops FastGelu"}  # fmt: skip
    gqa = make_model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", ["batch_size", "sequence_length"])],
                     [vi("y", ["batch_size", "sequence_length"])])  # fmt: skip
    gqa.graph.node.append(helper.make_node("GroupQueryAttention", ["y"], ["z"], domain="com.microsoft"))
    assert exporter_family(gqa)["family"] == "ONNX Runtime GenAI model builder"  # before Optimum's dims
    plain = make_model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [2])], [vi("y", [2])])
    assert exporter_family(plain)["family"] == "unknown"
    # a family plugs in with one call, tried in its order
    register_family("test family", lambda f: "a Relu" if f.has_op("Relu") else None, 0)
    try:
        assert exporter_family(plain) == {"family": "test family", "evidence": "a Relu"}
    finally:
        from mcpc.ir import exporter_family as ef

        ef._FAMILIES[:] = [f for f in ef._FAMILIES if f[1] != "test family"]


def test_inputs_read_inside_a_subgraph_are_not_taken_for_empty():
    """A merged decoder reads its inputs inside its If's branches only: those reads count."""
    from pathlib import Path

    import onnx

    from mcpc.ir.onnx_shapes import may_be_empty

    merged = onnx.load(str(Path(__file__).parents[1] / "exporters" / "optimum" / "llama-optimum-merged.onnx"))
    assert not may_be_empty(merged.graph, "input_ids", 0, 2)
    assert may_be_empty(merged.graph, "past_key_values.0.key", 2, 4)  # concatenated in both branches
