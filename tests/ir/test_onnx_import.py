"""ONNX import end to end: the example blocks against ONNX Runtime, dim binding, error reporting,
I/O boundary dtypes, module structure and the ONNX-vs-IR shape cross-check."""

from __future__ import annotations

import re
import time

import numpy as np
import onnx
import pytest
from conftest import make_model, norm_max_err, vi
from onnx import TensorProto, helper, numpy_helper

from mcpc.errors import InputError, UnsupportedError, UsageError
from mcpc.examples import build_examples, causal_mask, decoder_block, encoder_block, mlp
from mcpc.ir import onnx_import as onnx_import_module
from mcpc.ir import parse_module, print_module
from mcpc.ir.interpreter import interpret
from mcpc.ir.onnx_import import ImporterBug, import_onnx

rng = np.random.default_rng(7)


def _randn(*shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("opset", [17, 13, 18, 21, 28])
def test_encoder_block_matches_onnxruntime(opset, ort_run):
    """The acceptance block: opset 17, hidden 256, 4 heads, seq 64, causal mask input (≤ 1e-5).
    Smaller blocks check the other opsets (13 spells LayerNorm out, 18+ moves ReduceMean axes)."""
    size = dict(hidden=256, heads=4, seq=64) if opset == 17 else dict(hidden=64, heads=2, seq=16)
    model = encoder_block(opset=opset, **size)
    feeds = {"x": _randn(1, size["seq"], size["hidden"]), "mask": causal_mask(size["seq"])}
    start = time.perf_counter()
    module = import_onnx(model)
    imported = time.perf_counter()
    got = interpret(module, feeds)["y"]
    done = time.perf_counter()
    ref = ort_run(model, feeds)["y"]
    assert norm_max_err(got, ref) <= 1e-5
    assert module.main.arg_names == ["x", "mask"] and module.main.result_names == ["y"]
    assert module.main.args[1].type.dtype.name == "i1"
    print(f"encoder opset {opset}: import {imported - start:.4f} s, interpret {done - imported:.4f} s")


def test_encoder_mask_matters(ort_run):
    """The mask input really masks: a full mask gives another result, and still matches ORT."""
    model = encoder_block(hidden=64, heads=2, seq=8)
    x = _randn(1, 8, 64)
    full = {"x": x, "mask": np.ones((1, 1, 8, 8), bool)}
    causal = {"x": x, "mask": causal_mask(8)}
    module = import_onnx(model)
    y_full, y_causal = interpret(module, full)["y"], interpret(module, causal)["y"]
    assert norm_max_err(y_full, y_causal) > 1e-3
    assert norm_max_err(y_full, ort_run(model, full)["y"]) <= 1e-5


def test_decoder_block_with_dim_binding(ort_run):
    model = decoder_block(hidden=64, heads=2)
    x = _randn(1, 24, 64)
    module = import_onnx(model, dims={"seq": 24})
    # the in-graph causal mask and reshape targets folded away: no shape ops, no int64 left
    names = {op.name for op in module.main.ops}
    assert "mcp.gather" not in names and "mcp.concat" not in names
    assert all(v.type.dtype.name != "i64" for op in module.main.ops for v in op.results)
    assert norm_max_err(interpret(module, {"x": x})["y"], ort_run(model, {"x": x})["y"]) <= 1e-5


def test_whole_input_shape_binding_teaches_dim_params():
    model = decoder_block(hidden=32, heads=2)
    module = import_onnx(model, shapes={"x": (1, 5, 32)})
    assert module.main.args[0].type.shape == (1, 5, 32)
    assert module.main.outputs[0].type.shape == (1, 5, 32)


def test_unbound_dim_is_a_clear_error():
    with pytest.raises(InputError) as e:
        import_onnx(decoder_block(hidden=32, heads=2))
    msg = str(e.value)
    assert "'seq' (input 'x' dim 1)" in msg and "--dim seq=N or --shape x=1xNx32" in msg


def test_binding_errors():
    model = decoder_block(hidden=32, heads=2)
    with pytest.raises(UsageError, match=r"'ids' is not an input \(inputs: \['x'\]\)"):
        import_onnx(model, shapes={"ids": (1, 4)})
    with pytest.raises(UsageError, match="dim 0 is fixed to 1"):
        import_onnx(model, shapes={"x": (2, 4, 32)})
    with pytest.raises(UsageError, match="rank 2"):
        import_onnx(model, shapes={"x": (4, 32)})
    with pytest.raises(UsageError, match="'seq' is bound to both 8 and 4"):
        import_onnx(model, shapes={"x": (1, 4, 32)}, dims={"seq": 8})


def test_bound_dims_the_model_cannot_take_are_an_input_error():
    # a position table of 4 rows sliced to seq and expanded like an exported BERT's position ids:
    # binding seq beyond the table is the user's mistake, named at the node, never an internal error
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Expand", ["pos", "s"], ["y"], name="/embeddings/Expand"),
    ]
    pos = numpy_helper.from_array(np.arange(4, dtype=np.int64).reshape(1, 4), "pos")
    model = make_model(
        nodes, [vi("x", [1, "seq"], TensorProto.INT64)], [vi("y", [1, "seq"], TensorProto.INT64)], [pos]
    )
    assert import_onnx(model, dims={"seq": 4}).functions["main"] is not None
    with pytest.raises(InputError, match=r"'/embeddings/Expand' \(op_type Expand.*do not broadcast.*x=1x6"):
        import_onnx(model, dims={"seq": 6})


def test_unsupported_nodes_are_said_once_grouped_by_op_opset_and_reason():
    """Every refused node in one message: grouped by (domain, op type, opset, reason) in graph order,
    each group with its count and first node; a handled op type whose nodes fail its check for
    different reasons makes one group per reason; input dtypes are still listed one by one."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="ok")]
    outs = []
    for i in range(3):
        nodes.append(
            helper.make_node("CDist", ["a", "a"], [f"fm{i}"], name=f"ms_{i}", domain="com.microsoft")
        )
        outs.append(vi(f"fm{i}", [4, 4]))
    nodes += [
        helper.make_node("NonZero", ["a"], ["nz"], name="nonzero_1"),
        helper.make_node("Hardmax", ["a"], ["v"], name="hardmax_1"),
        helper.make_node("Hardmax", ["a"], ["v2"]),  # unnamed: counted, not first
        helper.make_node("Gelu", ["a"], ["g"], name="gelu_bad", approximate="erf"),
        helper.make_node("Gelu", ["a"], ["g2"], name="gelu_worse", approximate="cubic"),
        helper.make_node("MyOp", ["a"], ["y"], name="mine", domain="com.example"),
    ]
    outs += [vi("nz", [2, "n"], TensorProto.INT64), vi("v", [4, 4]), vi("v2", [4, 4])]
    outs += [vi("g", [4, 4]), vi("g2", [4, 4]), vi("y", [4, 4])]
    graph = helper.make_graph(nodes, "g", [vi("x", [4, 4])], outs + [vi("d", [2], TensorProto.DOUBLE)])
    graph.node.append(helper.make_node("Cast", ["a"], ["d"], name="to_double", to=TensorProto.DOUBLE))
    opsets = [helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)]
    opsets.append(helper.make_opsetid("com.example", 3))
    model = helper.make_model(graph, opset_imports=opsets)
    with pytest.raises(UnsupportedError) as e:
        import_onnx(model)
    assert e.value.exit_code == 4
    msg = str(e.value)
    assert msg.startswith("model 'g': output 'd': element type DOUBLE is not supported")
    groups = [
        "CDist (com.microsoft opset 1), 3 nodes, first 'ms_0': not imported",
        "NonZero (ai.onnx opset 20), 1 node 'nonzero_1': not imported",
        "Hardmax (ai.onnx opset 20), 2 nodes, first 'hardmax_1': not imported",
        "Gelu (ai.onnx opset 20), 1 node 'gelu_bad': approximate='erf' is not defined",
        "Gelu (ai.onnx opset 20), 1 node 'gelu_worse': approximate='cubic' is not defined",
        "MyOp (com.example opset 3), 1 node 'mine': domain com.example is not imported",
    ]
    assert "9 nodes cannot be imported, in 6 groups: " + groups[0] in msg
    positions = [msg.index(g) for g in groups]
    assert positions == sorted(positions), msg
    assert re.search(r"\. From com\.microsoft mcpc imports only [\w, ]*MatMulNBits[\w, ]*\. ", msg), msg
    assert msg.endswith("docs/onnx-ops.md lists every op mcpc imports.")
    assert "'ok'" not in msg and "ms_1" not in msg and "\n" not in msg


def test_float64_input_and_old_opset_are_unsupported():
    node = helper.make_node("Relu", ["x"], ["y"])
    model = make_model([node], [vi("x", [2], TensorProto.DOUBLE)], [vi("y", [2], TensorProto.DOUBLE)])
    with pytest.raises(UnsupportedError, match="input 'x'.*DOUBLE.*float32"):
        import_onnx(model)
    model = make_model([node], [vi("x", [2])], [vi("y", [2])], opset=11)
    with pytest.raises(UnsupportedError, match="opset 11 is not supported"):
        import_onnx(model)


def test_float64_constants_become_f32(ort_run):
    nodes = [
        helper.make_node("Cast", ["w"], ["wf"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["x", "wf"], ["y"]),
    ]
    w = numpy_helper.from_array(np.array([0.1, 0.2], np.float64), "w")
    model = make_model(nodes, [vi("x", [2])], [vi("y", [2])], [w])
    x = _randn(2)
    assert norm_max_err(interpret(import_onnx(model), {"x": x})["y"], ort_run(model, {"x": x})["y"]) <= 1e-7


def test_truncated_and_missing_files(tmp_path):
    path = tmp_path / "block.onnx"
    onnx.save(encoder_block(hidden=32, heads=2, seq=4), path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match="block.onnx"):
        import_onnx(path)
    with pytest.raises(InputError, match="no such ONNX file"):
        import_onnx(tmp_path / "missing.onnx")
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x00\xff" * 100)
    with pytest.raises(InputError, match="garbage.onnx"):
        import_onnx(garbage)


def test_checker_failure_is_input_error():
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph([node, node], "g", [vi("x", [2])], [vi("y", [2])])  # y defined twice
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(InputError, match="not a valid ONNX model"):
        import_onnx(model)


def test_int64_io_boundary(ort_run):
    """int64 inputs/outputs stay i64 only at the function boundary, with casts right after/before."""
    emb = numpy_helper.from_array(_randn(10, 4), "emb")
    nodes = [
        helper.make_node("Gather", ["emb", "ids"], ["e"], name="embed"),
        helper.make_node("Add", ["ids", "one"], ["ids_next"], name="next_ids"),
    ]
    one = numpy_helper.from_array(np.array(1, np.int64), "one")
    model = make_model(
        nodes,
        [vi("ids", [2, 3], TensorProto.INT64)],
        [vi("e", [2, 3, 4]), vi("ids_next", [2, 3], TensorProto.INT64)],
        [emb, one],
    )
    module = import_onnx(model)
    func = module.main
    assert func.args[0].type.dtype.name == "i64"
    assert func.ops[0].name == "mcp.cast" and func.ops[0].result.type.dtype.name == "i32"
    assert [v.type.dtype.name for v in func.outputs] == ["f32", "i64"]
    inner = [v for op in func.ops[1:-2] for v in op.results]
    assert all(v.type.dtype.name != "i64" for v in inner)
    ids = np.array([[0, 9, 3], [1, 2, 8]], np.int64)
    got, ref = interpret(module, {"ids": ids}), ort_run(model, {"ids": ids})
    np.testing.assert_array_equal(got["ids_next"], ref["ids_next"])
    assert got["ids_next"].dtype == np.int64
    assert norm_max_err(got["e"], ref["e"]) == 0.0


def test_outputs_that_are_inputs_or_constants(ort_run):
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu")]
    c = numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "c")
    model = make_model(nodes, [vi("x", [2])], [vi("x", [2]), vi("r", [2]), vi("c", [2])], [c])
    x = _randn(2)
    module = import_onnx(model)
    assert module.main.result_names == ["x", "r", "c"]
    got, ref = interpret(module, {"x": x}), ort_run(model, {"x": x})
    for name in ref:
        np.testing.assert_array_equal(got[name], ref[name])


def test_module_structure_and_text_round_trip(tmp_path):
    path = tmp_path / "tiny_block.onnx"
    onnx.save(encoder_block(hidden=32, heads=2, seq=4), path)
    module = import_onnx(path)
    assert module.name == "tiny_block" and list(module.functions) == ["main"]
    locs = {op.loc for op in module.main.ops if op.name != "mcp.return"}
    assert {"ln1", "softmax", "apply_mask", "q_proj.matmul"} <= locs
    text = print_module(module)
    assert print_module(parse_module(text)) == text


def test_unnamed_nodes_get_op_type_index_locs():
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["y"])]
    module = import_onnx(make_model(nodes, [vi("x", [2])], [vi("y", [2])]))
    assert [op.loc for op in module.main.ops[:-1]] == ["Relu_0", "Neg_1"]


def test_initializer_listed_as_input_is_a_constant():
    w = numpy_helper.from_array(np.ones((2,), np.float32), "w")
    model = make_model(
        [helper.make_node("Add", ["x", "w"], ["y"])], [vi("x", [2]), vi("w", [2])], [vi("y", [2])], [w]
    )
    assert import_onnx(model).main.arg_names == ["x"]


def test_external_data_is_loaded_relative_to_the_model(tmp_path, ort_run):
    model = mlp(batch=2, d_in=32, d_hidden=64, d_out=16)
    sub = tmp_path / "m"
    sub.mkdir()
    on_disk = onnx.ModelProto()
    on_disk.CopyFrom(model)  # saving with external data rewrites the proto it is given
    onnx.save(on_disk, sub / "mlp.onnx", save_as_external_data=True, location="mlp.bin", size_threshold=0)
    assert (sub / "mlp.bin").exists()
    module = import_onnx(sub / "mlp.onnx")
    x = _randn(2, 32)
    assert norm_max_err(interpret(module, {"x": x})["y"], ort_run(model, {"x": x})["y"]) <= 1e-5


def test_shape_cross_check_reports_importer_bugs(monkeypatch):
    """If ONNX's inferred shape disagrees with ours, the importer reports an internal error."""
    model = make_model(
        [helper.make_node("Relu", ["x"], ["y"], name="r")], [vi("x", [2, 3])], [vi("y", [2, 3])]
    )
    monkeypatch.setattr(onnx_import_module, "_onnx_shapes", lambda proto, bound, label: {"y": [3, 2]})
    with pytest.raises(ImporterBug, match=r"node 'r'.*\[2, 3\].*\[3, 2\]") as e:
        import_onnx(model)
    assert e.value.exit_code == 70


def test_build_examples(tmp_path, ort_run):
    paths = build_examples(tmp_path)
    names = sorted(p.name for p in paths)
    assert names == sorted(
        f"{m}.{ext}" for m in ("mlp", "encoder_block", "decoder_block") for ext in ("onnx", "npz")
    )
    assert not list(tmp_path.glob(".*tmp"))
    for stem, kw in (("mlp", {}), ("encoder_block", {}), ("decoder_block", {"dims": {"seq": 32}})):
        feeds = dict(np.load(tmp_path / f"{stem}.npz"))
        model = onnx.load(tmp_path / f"{stem}.onnx")
        got = interpret(import_onnx(tmp_path / f"{stem}.onnx", **kw), feeds)["y"]
        assert norm_max_err(got, ort_run(model, feeds)["y"]) <= 1e-5
    # deterministic for a seed
    again = build_examples(tmp_path / "again")
    assert (tmp_path / "again" / "encoder_block.onnx").read_bytes() == (
        tmp_path / "encoder_block.onnx"
    ).read_bytes()
    assert len(again) == len(paths)


def test_com_microsoft_gelu_is_mapped(ort_run):
    node = helper.make_node("Gelu", ["x"], ["y"], name="ms_gelu", domain="com.microsoft")
    graph = helper.make_graph([node], "g", [vi("x", [3, 4])], [vi("y", [3, 4])])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = helper.find_min_ir_version_for(opsets[:1])
    x = _randn(3, 4)
    module = import_onnx(model)
    assert [op.name for op in module.main.ops] == ["mcp.gelu", "mcp.return"]
    assert norm_max_err(interpret(module, {"x": x})["y"], ort_run(model, {"x": x})["y"]) <= 1e-5


@pytest.mark.parametrize("pattern", ["gemm", "matmul_transpose"])
def test_transposed_weights_are_not_copied_at_import(pattern, ort_run):
    """Gemm transB=1 keeps trans_b on the weight as stored; a Transpose of a weight is left as an
    op (fold-constants, seeing every use, decides whether a matmul reads it in place)."""
    w = numpy_helper.from_array(_randn(96, 64), "w")  # 6144 elements: a weight, not a shape tensor
    if pattern == "gemm":
        nodes = [helper.make_node("Gemm", ["x", "w"], ["y"], name="head", transB=1)]
    else:
        nodes = [
            helper.make_node("Transpose", ["w"], ["wt"], name="t", perm=[1, 0]),
            helper.make_node("MatMul", ["x", "wt"], ["y"], name="head"),
        ]
    model = make_model(nodes, [vi("x", [3, 64])], [vi("y", [3, 96])], [w])
    module = import_onnx(model)
    (const,) = [op for op in module.main.ops if op.name == "mcp.constant"]
    assert const.result.type.shape == (96, 64)
    (mm,) = [op for op in module.main.ops if op.name == "mcp.matmul"]
    assert mm.attrs["trans_b"] == (pattern == "gemm")
    assert any(op.name == "mcp.transpose" for op in module.main.ops) == (pattern != "gemm")
    x = _randn(3, 64)
    got, ref = interpret(module, {"x": x})["y"], ort_run(model, {"x": x})["y"]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
