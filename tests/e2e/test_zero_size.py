"""Zero-size tensors against ONNX Runtime: one small graph per op with a dim bound to 0, run by
the importer + IR interpreter and by an fp32 build on the simulator.

An input with a 0 dim is bound with ``--dim e=0`` (the user's path), so it is a function argument of
0 bytes; every case keeps some output non-empty (a binding that empties every output is refused,
tests/cli/test_user_errors.py).  What ONNX leaves undefined (a Gather into an empty axis) is refused
naming the node, as ONNX Runtime fails on it too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import pytest
from conftest import make_model, vi
from onnx import TensorProto, helper, numpy_helper

import mcpc
from mcpc.errors import InputError, UsageError
from mcpc.ir.interpreter import interpret
from mcpc.ir.onnx_import import import_onnx
from mcpc.ir.onnx_shapes import may_be_empty
from mcpc.sim.api import load_program, run_program

_rng = np.random.default_rng(21)
I64 = TensorProto.INT64
_ELEM = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int64): I64, np.dtype(bool): TensorProto.BOOL}


def f(*shape):
    return _rng.standard_normal(shape).astype(np.float32)


def i64(*values):
    return np.array(values, dtype=np.int64)


@dataclass
class Case:
    """``nodes`` over graph inputs ``feeds`` (the arrays; an ``e`` in ``dims`` names the axis bound
    to 0) and initializers ``consts``; graph outputs ``outs`` as (name, shape, elem)."""

    id: str
    nodes: list
    feeds: dict
    dims: dict  # input name -> its declared dims (ints, or "e" for the axis bound to 0)
    outs: list
    consts: dict = field(default_factory=dict)
    opset: int = 17

    def model(self) -> onnx.ModelProto:
        inputs = [vi(k, self.dims.get(k, list(v.shape)), _ELEM[v.dtype]) for k, v in self.feeds.items()]
        outputs = [vi(n, s, e) for n, s, e in self.outs]
        inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in self.consts.items()]
        return make_model(self.nodes, inputs, outputs, inits, self.opset)


N = helper.make_node
E = ["e"]  # a dim bound to 0
F = TensorProto.FLOAT

CASES = [
    Case(
        "concat_one_input",  # the TorchScript Llama's identity Concat in front of the real one
        [N("Concat", ["p"], ["c"], axis=1), N("Concat", ["c", "x"], ["y"], axis=1)],
        {"p": f(2, 0, 3), "x": f(2, 4, 3)},
        {"p": [2, "e", 3]},
        [("y", [2, 4, 3], F)],
    ),
    Case(
        "concat_empty_in_the_middle",
        [N("Concat", ["x", "p", "x"], ["y"], axis=-2)],
        {"p": f(2, 0, 3), "x": f(2, 4, 3)},
        {"p": [2, "e", 3]},
        [("y", [2, 8, 3], F)],
    ),
    Case(
        "shape_and_size",
        [N("Shape", ["p"], ["s"]), N("Size", ["p"], ["n"]), N("Relu", ["x"], ["y"])],
        {"p": f(2, 0, 3), "x": f(3)},
        {"p": [2, "e", 3]},
        [("s", [3], I64), ("n", [], I64), ("y", [3], F)],
    ),
    Case(
        "matmul_k0_zeros",
        [N("MatMul", ["a", "b"], ["y"])],
        {"a": f(2, 3, 0), "b": f(0, 4)},
        {"a": [2, 3, "e"], "b": ["e", 4]},
        [("y", [2, 3, 4], F)],
    ),
    Case(
        "matmul_k0_plus_x",  # the zeros meet run-time values
        [N("MatMul", ["a", "b"], ["m"]), N("Add", ["m", "x"], ["y"])],
        {"a": f(3, 0), "b": f(0, 4), "x": f(3, 4)},
        {"a": [3, "e"], "b": ["e", 4]},
        [("y", [3, 4], F)],
    ),
    Case(
        "gemm_k0_alpha_beta_c",  # alpha·(A·B) + beta·C with K = 0: beta·C
        [N("Gemm", ["a", "b", "c"], ["y"], alpha=2.0, beta=0.5, transB=1)],
        {"a": f(3, 0), "b": f(4, 0), "c": f(4)},
        {"a": [3, "e"], "b": [4, "e"]},
        [("y", [3, 4], F)],
    ),
    *[
        Case(
            f"{op.lower()}_empty_axis_keepdims{keep}",
            [N(op, ["p", "axes"], ["y"], keepdims=keep), N("Relu", ["x"], ["z"])],
            {"p": f(2, 0, 3), "x": f(3)},
            {"p": [2, "e", 3]},
            [("y", [2, 1, 3] if keep else [2, 3], F), ("z", [3], F)],
            consts={"axes": i64(1)},
            opset=18,
        )
        for op in ("ReduceSum", "ReduceMean", "ReduceMax")
        for keep in (1, 0)
    ],
    Case(
        "reduce_sum_kept_axis_empty",  # reduces a non-empty axis: the result is empty
        [N("ReduceSum", ["p", "axes"], ["r"], keepdims=1), N("Concat", ["r", "x"], ["y"], axis=1)],
        {"p": f(2, 0, 3), "x": f(2, 2, 1)},
        {"p": [2, "e", 3]},
        [("y", [2, 2, 1], F)],
        consts={"axes": i64(2)},
        opset=18,
    ),
    Case(
        "slice_to_empty_then_concat",  # no input is empty: a Slice makes the empty tensor
        [N("Slice", ["x", "s", "t", "a"], ["e0"]), N("Concat", ["e0", "x"], ["y"], axis=0)],
        {"x": f(5, 6)},
        {},
        [("y", [5, 6], F)],
        consts={"s": i64(4), "t": i64(2), "a": i64(0)},
    ),
    Case(
        "reshape_transpose_expand_empty",
        [
            N("Reshape", ["p", "shape"], ["r"]),  # [2, 0, 3] -> [-1, 6]: [0, 6]
            N("Transpose", ["r"], ["t"], perm=[1, 0]),  # [6, 0]
            N("Expand", ["t", "to"], ["u"]),  # [2, 6, 0]
            N("Concat", ["u", "x"], ["y"], axis=2),
        ],
        {"p": f(2, 0, 3), "x": f(2, 6, 2)},
        {"p": [2, "e", 3]},
        [("y", [2, 6, 2], F)],
        consts={"shape": i64(-1, 6), "to": i64(2, 6, 0)},
    ),
    Case(
        "reshape_allowzero_empty",
        [N("Reshape", ["p", "shape"], ["r"], allowzero=1), N("Concat", ["r", "x"], ["y"], axis=0)],
        {"p": f(2, 0, 3), "x": f(2, 3)},
        {"p": [2, "e", 3]},
        [("y", [2, 3], F)],
        consts={"shape": i64(0, 3)},
        opset=18,
    ),
    Case(
        "gather_empty_indices",
        [N("Gather", ["x", "i"], ["g"]), N("Concat", ["g", "x"], ["y"], axis=0)],
        {"x": f(5, 4), "i": np.zeros((0,), np.int64)},
        {"i": ["e"]},
        [("y", [5, 4], F)],
    ),
    Case(
        "split_with_a_zero_part",
        [N("Split", ["x", "sizes"], ["y0", "y1"], axis=0)],
        {"x": f(5, 4)},
        {},
        [("y0", [0, 4], F), ("y1", [5, 4], F)],
        consts={"sizes": i64(0, 5)},
        opset=13,
    ),
    Case(
        "elementwise_broadcast_to_empty",
        [
            N("Add", ["p", "x"], ["a"]),
            N("Mul", ["a", "a"], ["m"]),
            N("Where", ["c", "m", "x"], ["w"]),
            N("Softmax", ["w"], ["s"], axis=1),
            N("Concat", ["s", "x2"], ["y"], axis=1),
        ],
        {"p": f(2, 0, 3), "x": f(3), "c": np.zeros((2, 0, 1), bool), "x2": f(2, 1, 3)},
        {"p": [2, "e", 3], "c": [2, "e", 1]},
        [("y", [2, 1, 3], F)],
    ),
    Case(
        "constant_of_shape_zero",
        [
            N(
                "ConstantOfShape",
                ["shape"],
                ["z"],
                value=numpy_helper.from_array(np.array([2.5], np.float32)),
            ),
            N("Concat", ["z", "x"], ["y"], axis=1),
        ],
        {"x": f(2, 3)},
        {},
        [("y", [2, 3], F)],
        consts={"shape": i64(2, 0)},
    ),
    Case(
        "int64_index_tensors",  # int64 is i32 inside the IR: empty index tensors meet both
        [
            N("Concat", ["ids", "pe"], ["y"], axis=1),  # an empty int64 input dropped
            N("Add", ["pe", "one"], ["z"]),  # an empty int64 output
            N("Slice", ["ids", "three", "three", "one"], ["s"]),  # empty, from a run-time value
            N("Concat", ["s", "k"], ["c"], axis=1),  # ... meets an int64 constant
            N("Slice", ["ids", "zero", "two", "one"], ["head"]),
            N("Add", ["c", "head"], ["w"]),
        ],
        {"ids": i64(4, 5, 6)[None], "pe": np.zeros((1, 0), np.int64)},
        {"pe": [1, "e"]},
        [("y", [1, 3], I64), ("z", [1, None], I64), ("w", [1, 2], I64)],
        consts={"one": i64(1), "three": i64(3), "zero": i64(0), "two": i64(2), "k": i64(7, 9)[None]},
    ),
    Case(
        "empty_output_beside_others",  # an empty graph output: a 0-byte program output
        [N("Neg", ["p"], ["n"]), N("Relu", ["x"], ["y"])],
        {"p": f(2, 0, 3), "x": f(4)},
        {"p": [2, "e", 3]},
        [("n", [2, None, 3], F), ("y", [4], F)],
    ),
    Case(
        "empty_input_returned_as_output",
        [N("Identity", ["p"], ["n"]), N("Relu", ["x"], ["y"])],
        {"p": f(2, 0, 3), "x": f(4)},
        {"p": [2, "e", 3]},
        [("n", [2, None, 3], F), ("y", [4], F)],
    ),
]


def _bind(case: Case) -> dict[str, int]:
    return {"e": 0} if any("e" in d for d in case.dims.values()) else {}


def _same(got: dict, ref: dict, what: str) -> None:
    assert set(got) == set(ref), what
    for name, r in ref.items():
        y = np.asarray(got[name])
        assert y.shape == r.shape and y.dtype == r.dtype, (
            f"{what} {name}: {y.dtype}{y.shape} vs {r.dtype}{r.shape}"
        )
        np.testing.assert_allclose(y, r, rtol=1e-6, atol=1e-6, err_msg=f"{what} {name}")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_zero_size_matches_onnxruntime_in_the_ir_and_on_the_simulator(case, tmp_path, ort_run):
    model = case.model()
    ref = ort_run(model, case.feeds)
    module = import_onnx(model, dims=_bind(case))
    for fn in module.functions.values():  # an empty tensor is never an op's operand or result
        returned = {id(v) for v in fn.outputs}  # an empty graph output is a 0-element constant
        for op in fn.ops:
            assert all(v.type.numel for v in op.operands if op.name != "mcp.return"), op.describe()
            assert all(v.type.numel or id(v) in returned for v in op.results), op.describe()
    _same(interpret(module, case.feeds), ref, "IR interpreter vs ONNX Runtime:")
    path = tmp_path / f"{case.id}.onnx"
    onnx.save(model, path)
    out = tmp_path / f"{case.id}.mcpb"
    mcpc.compile(path, target="mcp2026-a100", qat_config="fp32.yaml", output=out, dims=_bind(case))
    sim = run_program(load_program(out), case.feeds)
    _same(sim.outputs, ref, "simulator vs ONNX Runtime:")


@pytest.mark.parametrize("data_is_input", [True, False], ids=["empty_data_input", "empty_data_sliced"])
def test_gather_into_an_empty_axis_is_refused_naming_the_node(data_is_input, ort_run):
    """Indices into an axis of size 0 are out of range whatever they are: ONNX Runtime fails, and
    so does import, naming the node — with constant indices and with run-time ones."""
    nodes = [N("Gather", ["d", "i"], ["g"], name="the_gather"), N("Concat", ["g", "x"], ["y"], axis=0)]
    feeds = {"i": i64(0, 1), "x": f(2, 4)}
    if data_is_input:
        inputs = [vi("d", ["e", 4]), vi("i", [2], I64), vi("x", [2, 4])]
        feeds["d"] = np.zeros((0, 4), np.float32)
        dims = {"e": 0}
    else:  # the data is a slice of a run-time value that leaves no rows
        nodes.insert(0, N("Slice", ["x", "s", "t"], ["d"]))
        inputs = [vi("i", [2], I64), vi("x", [2, 4])]
        dims = {}
    inits = [numpy_helper.from_array(i64(1), "s"), numpy_helper.from_array(i64(1), "t")]
    model = make_model(nodes, inputs, [vi("y", [4, 4])], inits if not data_is_input else [])
    with pytest.raises(Exception, match="out of data bounds|out of range"):
        ort_run(model, feeds)
    with pytest.raises(InputError, match=r"node 'the_gather' \(op_type Gather, opset 17\)") as e:
        import_onnx(model, dims=dims)
    assert "empty" in e.value.message


def test_constant_indices_into_an_empty_axis_are_refused_too():
    nodes = [N("Gather", ["d", "i"], ["g"], name="g0"), N("Concat", ["g", "x"], ["y"], axis=0)]
    model = make_model(
        nodes, [vi("d", ["e", 4]), vi("x", [2, 4])], [vi("y", [3, 4])], [numpy_helper.from_array(i64(0), "i")]
    )
    with pytest.raises(InputError, match=r"node 'g0' .*index 0 out of range for axis 0 of size 0"):
        import_onnx(model, dims={"e": 0})


def test_every_output_empty_from_a_binding_is_refused_but_a_model_of_fixed_empty_shapes_imports():
    relu = [N("Relu", ["p"], ["y"])]
    with pytest.raises(UsageError, match=r"--dim e=0 makes every output empty \(y 2x0\)"):
        import_onnx(make_model(relu, [vi("p", [2, "e"])], [vi("y", [2, "e"])]), dims={"e": 0})
    fixed = import_onnx(make_model(relu, [vi("p", [2, 0])], [vi("y", [2, 0])]))
    assert interpret(fixed, {"p": np.zeros((2, 0), np.float32)})["y"].shape == (2, 0)


def test_one_input_concat_is_looked_through_by_the_kv_cache_hint():
    nodes = [
        N("Concat", ["p"], ["c"], axis=1),
        N("Concat", ["c", "x"], ["y"], axis=1),
        N("Shape", ["p"], ["s"]),
    ]
    graph = make_model(
        nodes, [vi("p", [1, "e", 3]), vi("x", [1, 2, 3])], [vi("y", [1, None, 3]), vi("s", [3], I64)]
    ).graph
    assert may_be_empty(graph, "p", 1, 3)
    assert not may_be_empty(graph, "p", 2, 3)


def test_cli_compiles_runs_and_checks_a_zero_size_input_and_output(tmp_path):
    """``mcp-compile --dim e=0``, ``mcpc sim run --inputs`` with a 0-element array in the .npz
    (a 0-byte program input) and ``--outputs`` holding the 0-element output; ``mcpc check`` agrees."""
    from click.testing import CliRunner

    from mcpc.cli import cli

    case = next(c for c in CASES if c.id == "empty_output_beside_others")
    model, npz, prog, outs = (tmp_path / n for n in ("m.onnx", "in.npz", "m.mcpb", "out.npz"))
    onnx.save(case.model(), model)
    np.savez(npz, **case.feeds)
    runner = CliRunner()
    for args in (
        ["compile", model, "--qat-config", "fp32.yaml", "--dim", "e=0", "-o", prog],
        ["sim", "run", prog, "--inputs", npz, "--outputs", outs],
        ["check", model, prog, "--inputs", npz],
    ):
        result = runner.invoke(cli, [str(a) for a in args])
        assert result.exit_code == 0, result.output
    got = np.load(outs)
    assert got["n"].shape == (2, 0, 3) and got["n"].dtype == np.float32
    np.testing.assert_array_equal(got["y"], np.maximum(case.feeds["x"], 0))


def test_a_model_with_a_type_error_is_still_invalid_under_a_zero_binding():
    """ONNX's inference failing under a 0 binding is not blamed on the model (the node the 0 breaks
    is named by import instead), but a real type error is still found: judged with the 0s as 1s."""
    nodes = [N("Relu", ["a"], ["y"]), N("Concat", ["y", "x"], ["z"], axis=0)]
    graph = helper.make_graph(nodes, "g", [vi("a", ["e", 3]), vi("x", [2, 3])], [vi("z", [None, 3], I64)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])  # z is float, not int64
    for e in (1, 0):
        with pytest.raises(InputError, match="not a valid ONNX model: .*elem type"):
            import_onnx(model, dims={"e": e})
