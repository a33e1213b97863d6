"""The accuracy harness (mcpc.quant_eval) on a small two-layer model: per-sentence cosine, bits per
weight on the ONNX side (fp32, ONNX Runtime's MatMulNBits) and on the compiled IR, and one whole
``evaluate`` run (compile + simulate + ONNX Runtime's 4-bit peer)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from mcpc import driver
from mcpc.errors import InputError
from mcpc.quant_eval import (
    Build,
    evaluate,
    ir_weight_bits,
    onnx_weight_bits,
    ort_rtn,
    peer_of,
    render,
    sentence_cosines,
)

K, H, N = 64, 96, 16


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    """x [batch, K] -> MatMul W1 [K, H] -> Relu -> MatMul with Transpose(W2t [N, H]) -> y [batch, N]."""
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((K, H)).astype(np.float32) / 8
    w2t = rng.standard_normal((N, H)).astype(np.float32) / 10
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["a"], name="act"),
        helper.make_node("Transpose", ["w2t"], ["w2"], name="t", perm=[1, 0]),
        helper.make_node("MatMul", ["a", "w2"], ["y"], name="fc2"),
    ]
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", N])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2t, "w2t")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path_factory.mktemp("qe") / "mlp.onnx"
    onnx.save(model, str(path))
    x = rng.standard_normal((8, K)).astype(np.float32)
    return path, model, {"x": x}


def test_sentence_cosines_score_each_row():
    r = np.array([[1.0, 0.0], [0.0, 2.0], [0.0, 0.0], [1.0, 1.0]])
    y = np.array([[2.0, 0.0], [0.0, -1.0], [0.0, 0.0], [0.0, 0.0]])
    np.testing.assert_allclose(sentence_cosines(y, r), [1.0, -1.0, 1.0, 0.0])
    y3 = np.ones((2, 3, 4))  # rows are flattened over every trailing axis
    np.testing.assert_allclose(sentence_cosines(y3, 2 * y3), [1.0, 1.0])
    assert sentence_cosines(np.array([[np.nan, 1.0]]), np.array([[1.0, 1.0]]))[0] == 0.0
    with pytest.raises(InputError):
        sentence_cosines(np.ones((2, 3)), np.ones((3, 2)))


def test_onnx_bits_per_weight_fp32_and_matmulnbits(mlp):
    _, model, _ = mlp
    assert onnx_weight_bits(model) == (K * H + N * H, 4 * (K * H + N * H))
    for symmetric, zp_bits in ((True, 0), (False, 4)):
        q, _ = ort_rtn(model, symmetric)
        # the quantizer takes initializer weights only: fc2's Transpose(w2t) stays a float MatMul
        assert [n.op_type for n in q.graph.node if "MatMul" in n.op_type] == ["MatMulNBits", "MatMul"]
        w, b = onnx_weight_bits(q)
        assert w == K * H + H * N
        # fc1: 4-bit codes + one fp32 scale (and a 4-bit zero point when asymmetric) per block of 32
        assert 8 * b == pytest.approx(K * H * (4 + (32 + zp_bits) / 32) + 32 * H * N)
    assert sum(n.op_type == "MatMul" for n in model.graph.node) == 2  # the caller's model is untouched


def test_ir_bits_per_weight_follow_the_build(mlp):
    path, _, _ = mlp
    for config, bits in (("fp32", 32), ("fp16", 16)):
        result = driver.compile(str(path), qat_config=config, emit="ir", dims={"batch": 8})
        assert ir_weight_bits(result.module) == (K * H + H * N, bits // 8 * (K * H + H * N))


def test_evaluate_compiles_simulates_and_compares_with_the_peer(mlp):
    path, _, inputs = mlp
    report = evaluate(path, inputs, [Build("fp16"), "fp32"], target="mcp2026-edge")
    rows = {r["name"]: r for r in report["rows"]}
    assert list(rows) == ["onnx fp32", "ort-rtn-sym", "ort-rtn-asym", "fp16", "fp32"]
    assert report["output"] == "y" and report["sentences"] == 8
    assert rows["fp32"]["cosine"] > 1 - 1e-9 and rows["fp16"]["cosine"] > 0.9999
    assert rows["fp16"]["bits_per_weight"] == 16 and rows["fp32"]["bits_per_weight"] == 32
    for peer in ("ort-rtn-sym", "ort-rtn-asym"):
        assert 0.9 < rows[peer]["cosine"] < 1 - 1e-6  # 4-bit weights cost something, not everything
        assert rows["fp16"]["ratio"][peer] == pytest.approx(rows["fp16"]["error"] / rows[peer]["error"])
    assert rows["fp16"]["min_cosine"] <= rows["fp16"]["cosine"]
    assert peer_of(rows["fp16"], report) is None  # an fp16 build has no weight symmetry
    assert peer_of({"symmetric": False}, report)["name"] == "ort-rtn-asym"
    table = render(report)
    assert "| fp16 | simulator |" in table and "ort-rtn-asym" in table


def test_quantized_build_runs_where_it_can_and_says_where(mlp):
    path, _, inputs = mlp
    report = evaluate(path, inputs, [Build("qat_w4a16"), Build("fp16")], peers=(), engine="auto")
    rows = {r["name"]: r for r in report["rows"]}
    w4 = rows["qat_w4a16"]
    # the simulator when the backend lowers every op of the build, else the compiled IR on the
    # interpreter (which defines the simulator's results), with the backend's reason
    assert w4["detail"]["engine"] in ("simulator", "interpreter")
    assert (w4["detail"]["engine"] == "interpreter") == ("fallback" in w4["detail"])
    # int4 codes and one fp16 scale per group of 32 (+ int4 zero points where the build stores them)
    assert w4["bits_per_weight"] in (pytest.approx(4.5), pytest.approx(4.625))
    if "weights" in w4["detail"]:  # the compile's own figure agrees with ours
        assert w4["bits_per_weight"] == pytest.approx(w4["detail"]["weights"]["after"]["bits_per_weight"])
    assert 0.98 < w4["cosine"] < 1 - 1e-7 and w4["symmetric"] is True
    assert rows["fp16"]["detail"]["engine"] == "simulator"
    ir = evaluate(path, inputs, [Build("fp16")], peers=(), engine="ir")["rows"][-1]
    assert ir["detail"]["engine"] == "interpreter"
    assert ir["cosine"] == rows["fp16"]["cosine"]  # interpreter and simulator agree bit for bit
