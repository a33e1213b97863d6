"""fold-constants and dce: golden IR (input text → expected text), the size budget, constant
dedupe, the i64 boundary rule, and semantics preserved on the example blocks."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import norm_max_err

from mcpc.errors import UsageError
from mcpc.examples import causal_mask, decoder_block, encoder_block
from mcpc.ir import parse_module, print_module
from mcpc.ir.interpreter import interpret
from mcpc.ir.onnx_import import import_onnx
from mcpc.passes import PassContext, PassManager, build_pipeline, load_all_passes

load_all_passes()


def run(text: str, pipeline: str) -> str:
    module = PassManager(build_pipeline(pipeline)).run(parse_module(text), PassContext())
    return print_module(module)


def golden(body: str, args: str = "%x: tensor<2xf32>", results: str = '"y": tensor<2xf32>') -> str:
    lines = "\n".join("    " + line.strip() for line in body.strip().splitlines())
    return f"module @m {{\n  func @main({args}) -> ({results}) {{\n{lines}\n  }}\n}}\n"


FOLDABLE = golden(
    """
    %0 = mcp.constant {value = dense<[1.0, 2.0]> : tensor<2xf32>} : () -> tensor<2xf32>
    %1 = mcp.constant {value = dense<[3.0, 4.0]> : tensor<2xf32>} : () -> tensor<2xf32>
    %2 = mcp.mul %0, %1 : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32> loc("mul_node")
    %3 = mcp.neg %2 : (tensor<2xf32>) -> tensor<2xf32>
    %4 = mcp.add %x, %3 : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
    %5 = mcp.constant {value = dense<[1.0, 2.0]> : tensor<2xf32>} : () -> tensor<2xf32>
    %6 = mcp.sub %4, %5 : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
    mcp.return %6 : (tensor<2xf32>) -> ()
    """
)


def test_fold_then_dce_golden():
    expected = golden(
        """
        %0 = mcp.constant {value = dense<[1.0, 2.0]> : tensor<2xf32>} : () -> tensor<2xf32>
        %1 = mcp.constant {value = dense<[-3.0, -8.0]> : tensor<2xf32>} : () -> tensor<2xf32>
        %2 = mcp.add %x, %1 : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
        %3 = mcp.sub %2, %0 : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
        mcp.return %3 : (tensor<2xf32>) -> ()
        """
    )
    assert run(FOLDABLE, "fold-constants,dce") == expected


def test_fold_alone_leaves_dead_constants_and_dce_alone_folds_nothing():
    folded = run(FOLDABLE, "fold-constants")
    assert "mcp.mul" not in folded and "mcp.neg" not in folded
    assert folded.count("mcp.constant") == 4  # 1, 3 (now dead), mul's and neg's results; the dup is merged
    assert run(FOLDABLE, "dce") == FOLDABLE  # nothing is dead before folding


def test_dce_removes_dead_chains_keeps_interface():
    text = golden(
        """
        %0 = mcp.exp %x : (tensor<2xf32>) -> tensor<2xf32>
        %1 = mcp.neg %0 : (tensor<2xf32>) -> tensor<2xf32>
        %2 = mcp.relu %x : (tensor<2xf32>) -> tensor<2xf32>
        mcp.return %2 : (tensor<2xf32>) -> ()
        """,
        args="%x: tensor<2xf32>, %unused: tensor<3xf32>",
    )
    out = run(text, "dce")
    assert "mcp.exp" not in out and "mcp.neg" not in out and "mcp.relu" in out
    assert "%unused: tensor<3xf32>" in out


def test_budget_keeps_large_broadcast_but_folds_same_size_transpose():
    text = golden(
        """
        %0 = mcp.constant {value = dense<[1.0]> : tensor<1xf32>} : () -> tensor<1xf32>
        %1 = mcp.broadcast %0 {shape = [64, 64]} : (tensor<1xf32>) -> tensor<64x64xf32>
        %2 = mcp.transpose %1 {perm = [1, 0]} : (tensor<64x64xf32>) -> tensor<64x64xf32>
        mcp.return %2 : (tensor<64x64xf32>) -> ()
        """,
        args="",
        results='"y": tensor<64x64xf32>',
    )
    small = run(text, "fold-constants{max-elements=100},dce")
    assert "mcp.broadcast" in small and "mcp.transpose" in small  # transpose input is not constant
    big = run(text, "fold-constants{max-elements=4096},dce")
    assert "mcp.broadcast" not in big and "mcp.transpose" not in big
    # a transpose of a constant never grows storage: folded whatever the budget
    w = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    text_w = text.replace(
        "%1 = mcp.broadcast %0 {shape = [64, 64]} : (tensor<1xf32>) -> tensor<64x64xf32>",
        f'%1 = mcp.constant {{value = dense<"0x{w.tobytes().hex().upper()}"> : tensor<64x64xf32>}} '
        ": () -> tensor<64x64xf32>",
    )
    folded = parse_module(run(text_w, "fold-constants{max-elements=0},dce"))
    (const,) = [op for op in folded.main.ops if op.name == "mcp.constant"]
    np.testing.assert_array_equal(const.value, w.T)


def test_i64_boundary_cast_is_not_folded():
    text = golden(
        """
        %0 = mcp.constant {value = dense<[1, 2]> : tensor<2xi32>} : () -> tensor<2xi32>
        %1 = mcp.cast %0 {to = i64} : (tensor<2xi32>) -> tensor<2xi64>
        mcp.return %1 : (tensor<2xi64>) -> ()
        """,
        args="",
        results='"y": tensor<2xi64>',
    )
    assert run(text, "fold-constants,dce") == text


def test_fold_is_stable():
    once = run(FOLDABLE, "fold-constants,dce")
    assert run(once, "fold-constants,dce") == once


def test_negative_budget_is_a_usage_error():
    with pytest.raises(UsageError, match="max-elements"):
        build_pipeline("fold-constants{max-elements=-1}")


@pytest.mark.parametrize("pipeline", ["fold-constants,dce", "fold-constants{max-elements=16},dce"])
def test_passes_preserve_example_semantics(pipeline):
    enc = import_onnx(encoder_block(hidden=64, heads=2, seq=8))
    feeds = {
        "x": np.random.default_rng(0).standard_normal((1, 8, 64)).astype(np.float32),
        "mask": causal_mask(8),
    }
    before = interpret(enc, feeds)["y"]
    after = interpret(PassManager(build_pipeline(pipeline)).run(enc), feeds)["y"]
    np.testing.assert_array_equal(after, before)  # folding uses the interpreter's own semantics
    dec = import_onnx(decoder_block(hidden=32, heads=2), dims={"seq": 6})
    x = np.random.default_rng(1).standard_normal((1, 6, 32)).astype(np.float32)
    ref = interpret(dec, {"x": x})["y"]
    out = PassManager(build_pipeline(pipeline)).run(dec)
    assert norm_max_err(interpret(out, {"x": x})["y"], ref) == 0.0


# -- weights read transposed, stored once ------------------------------------------------------------
def _tied(head: str):
    """A tied table ``w`` [16, 8]: gathered, and read by the head matmul as ``head`` says:
    ``transpose`` (``mcp.transpose`` of w), ``twin`` (a second constant holding w transposed),
    ``other`` (the transpose feeds an add, not a matmul)."""
    from mcpc.ir import Function, Module, TensorType
    from mcpc.ir.dtypes import F32, I32
    from mcpc.ir.ops import AddOp, ConstantOp, GatherOp, MatMulOp, ReturnOp, TransposeOp

    w = np.random.default_rng(3).standard_normal((16, 8)).astype(np.float32)
    f = Function("main", [TensorType((4,), I32), TensorType((4, 8), F32)], ["ids", "x"])
    table = f.append(ConstantOp([], {"value": w}, loc="table")).result
    emb = f.append(GatherOp([table, f.args[0]], {"axis": 0})).result
    if head == "twin":
        w_t = f.append(ConstantOp([], {"value": np.ascontiguousarray(w.T)}, loc="head_w")).result
    else:
        w_t = f.append(TransposeOp([table], {"perm": [1, 0]})).result
    if head == "other":
        out = f.append(AddOp([w_t, w_t])).result
    else:
        out = f.append(MatMulOp([f.append(AddOp([emb, f.args[1]])).result, w_t])).result
    f.append(ReturnOp([out]))
    f.result_names = ["y"]
    m = Module("tied")
    m.add_function(f)
    m.verify()
    feeds = {"ids": np.array([1, 5, 0, 15], np.int32), "x": np.ones((4, 8), np.float32)}
    return m, feeds


@pytest.mark.parametrize("head", ["transpose", "twin"])
def test_matmul_reads_a_transposed_weight_in_place(head):
    m, feeds = _tied(head)
    want = interpret(m, feeds)["y"]
    m = PassManager(build_pipeline("fold-constants,dce")).run(m, PassContext())
    ops = m.main.ops
    (const,) = [op for op in ops if op.name == "mcp.constant"]  # the table alone, once
    (mm,) = [op for op in ops if op.name == "mcp.matmul"]
    assert mm.attrs["trans_b"] and mm.operands[1] is const.result
    assert not any(op.name == "mcp.transpose" for op in ops)
    got = interpret(m, feeds)["y"]
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))  # the same bits


def test_a_transpose_of_a_weight_used_elsewhere_is_not_folded_into_a_copy():
    m, feeds = _tied("other")
    want = interpret(m, feeds)["y"]
    m = PassManager(build_pipeline("fold-constants{max-elements=0},dce")).run(m, PassContext())
    assert [op.name for op in m.main.ops].count("mcp.constant") == 1
    assert any(op.name == "mcp.transpose" for op in m.main.ops)  # computed at run time
    np.testing.assert_array_equal(interpret(m, feeds)["y"], want)


def test_a_table_gathered_through_a_transpose_of_the_head_weight_is_stored_once_transposed():
    """The GenAI builder's tied table: the LM head's weight ``w`` [8, 16] (hidden x vocab) is the
    matmul's ``b``, and embeddings are gathered from ``Transpose(w)``.  Even where the budget
    forbids a copy (max-elements=0), the head reads the transposed table with ``trans_b`` and the
    transpose folds into the one constant stored: no transpose runs, the bits are the same."""
    from mcpc.ir import Function, Module, TensorType
    from mcpc.ir.dtypes import F32, I32
    from mcpc.ir.ops import AddOp, ConstantOp, GatherOp, MatMulOp, ReturnOp, TransposeOp

    w = np.random.default_rng(4).standard_normal((8, 16)).astype(np.float32)
    f = Function("main", [TensorType((4,), I32), TensorType((4, 8), F32)], ["ids", "x"])
    head_w = f.append(ConstantOp([], {"value": w}, loc="lm_head.weight")).result
    table = f.append(TransposeOp([head_w], {"perm": [1, 0]})).result
    emb = f.append(GatherOp([table, f.args[0]], {"axis": 0})).result
    out = f.append(MatMulOp([f.append(AddOp([emb, f.args[1]])).result, head_w])).result
    f.append(ReturnOp([out]))
    f.result_names = ["y"]
    m = Module("tied_genai")
    m.add_function(f)
    m.verify()
    feeds = {"ids": np.array([1, 5, 0, 15], np.int32), "x": np.ones((4, 8), np.float32)}
    want = interpret(m, feeds)["y"]
    m = PassManager(build_pipeline("fold-constants{max-elements=0},dce")).run(m, PassContext())
    ops = m.main.ops
    (const,) = [op for op in ops if op.name == "mcp.constant"]
    assert const.value.shape == (16, 8)  # the table, stored once, transposed
    (mm,) = [op for op in ops if op.name == "mcp.matmul"]
    assert mm.attrs["trans_b"] and mm.operands[1] is const.result
    assert not any(op.name == "mcp.transpose" for op in ops)
    assert np.array_equal(interpret(m, feeds)["y"].view(np.uint32), want.view(np.uint32))


def test_dedupe_confirms_bytes_on_a_hash_match(monkeypatch):
    from mcpc.passes import fold_constants

    monkeypatch.setattr(fold_constants, "_key", lambda value: ("same",))
    out = run(FOLDABLE, "fold-constants,dce")
    module = parse_module(out)
    x = np.array([0.5, -1.0], np.float32)
    want = x - np.array([3, 8], np.float32) - np.array([1, 2], np.float32)
    np.testing.assert_array_equal(interpret(module, {"x": x})["y"], want)


def test_equal_bytes_of_different_sub_byte_dtypes_are_not_merged():
    """int4, uint4 and fp8 e4m3fn zeros are all numpy '<V1' with the same bytes: three constants."""
    import ml_dtypes

    from mcpc.ir import Function, Module
    from mcpc.ir.ops import ConstantOp, ReturnOp
    from mcpc.passes.fold_constants import fold_function

    module = Module("m")
    func = module.add_function(Function("main", [], []))
    values = [np.zeros((), t) for t in (ml_dtypes.int4, ml_dtypes.uint4, ml_dtypes.float8_e4m3fn)]
    results = [func.append(ConstantOp([], {"value": v})).result for v in values]
    func.append(ReturnOp(results))
    func.result_names = ["a", "b", "c"]
    fold_function(func)
    module.verify()
    assert [op.value.dtype for op in func.ops if isinstance(op, ConstantOp)] == [v.dtype for v in values]
