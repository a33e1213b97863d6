"""Shared pieces of the fuzzers: the example budget, the "user error, never our bug" property and
small seed models.

``MCPC_FUZZ_EXAMPLES`` sets the number of hypothesis examples per fuzz test (default: a short slice
for the default test run; ``make fuzz`` sets 10 000 per door).  Each door's property is the same:
whatever the mutated input, the toolchain either accepts it or raises an ``McpcError`` whose exit
code is not 70 (internal error), fast and without exhausting memory.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import numpy as np
from hypothesis import HealthCheck, settings
from onnx import TensorProto, helper, numpy_helper

from mcpc.errors import EXIT_INTERNAL, McpcError

EXAMPLES = int(os.environ.get("MCPC_FUZZ_EXAMPLES", "40"))

FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=EXAMPLES <= 100,  # the CI slice is reproducible; make fuzz explores
    suppress_health_check=list(HealthCheck),
    database=None,
)


class InternalFailure(AssertionError):
    """The toolchain treated a user's input as its own bug (exit 70) or raised a raw exception."""


@contextmanager
def user_error_only(what: str):
    """Accept success or a user-facing McpcError; anything else fails the property."""
    try:
        yield
    except McpcError as err:
        if err.exit_code == EXIT_INTERNAL:
            raise InternalFailure(f"{what}: exit 70 for a user input: {err.message}") from err
    except RecursionError as err:  # pragma: no cover - reported with the input that caused it
        raise InternalFailure(f"{what}: RecursionError") from err


def tiny_mlp(opset: int = 17):
    """x[b, 16] -> MatMul -> Add -> Relu -> MatMul -> y[b, 8], with a symbolic batch."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((32, 8)).astype(np.float32), "w2")
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h0"], name="mm1"),
        helper.make_node("Add", ["h0", "b1"], ["h1"], name="add1"),
        helper.make_node("Relu", ["h1"], ["h2"], name="relu"),
        helper.make_node("MatMul", ["h2", "w2"], ["y"], name="mm2"),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
        [w1, b1, w2],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def tiny_attention(opset: int = 17):
    """A one-head attention over x[1, seq, 16] with Softmax, Transpose, Reshape and a mask."""
    rng = np.random.default_rng(1)
    inits = [
        numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), n)
        for n in ("wq", "wk", "wv")
    ]
    inits.append(numpy_helper.from_array(np.array(0.25, dtype=np.float32), "scale"))
    inits.append(numpy_helper.from_array(np.array([1, -1, 16], dtype=np.int64), "shape3"))
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"], name="q"),
        helper.make_node("MatMul", ["x", "wk"], ["k"], name="k"),
        helper.make_node("MatMul", ["x", "wv"], ["v"], name="v"),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1], name="kt"),
        helper.make_node("MatMul", ["q", "kt"], ["s0"], name="scores"),
        helper.make_node("Mul", ["s0", "scale"], ["s1"], name="scaled"),
        helper.make_node("Add", ["s1", "mask"], ["s2"], name="masked"),
        helper.make_node("Softmax", ["s2"], ["p"], axis=-1, name="softmax"),
        helper.make_node("MatMul", ["p", "v"], ["o"], name="context"),
        helper.make_node("Reshape", ["o", "shape3"], ["y"], name="reshape"),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_attention",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seq", 16]),
            helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, "seq", "seq"]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "seq", 16])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


SEED_MODELS = {"tiny_mlp": (tiny_mlp, {"batch": 2}), "tiny_attention": (tiny_attention, {"seq": 4})}
