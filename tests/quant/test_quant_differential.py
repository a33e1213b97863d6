"""Differential test of the quantized builds: small random ONNX models (MatMul, Gemm with transB,
a tied Gather + MatMul embedding / LM head; K below, at and off a multiple of the group size, odd
N, 1..5 batch rows) x every shipped quantizing config (calibration data generated here) x the
three targets.  Each build must compile (no internal error) and the simulator must compute the
compiled IR's bits: simulator outputs == IR interpreter outputs of the same compiled module, bit for
bit.  A quantized build that is silently wrong fails here."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import mcpc
from mcpc.ir.interpreter import interpret
from mcpc.sim.api import load_program, run_program

CONFIGS = ("qat_w4a16.yaml", "qat_gptq_g128.yaml", "qat_int4_fp8.yaml", "qat_mixed.yaml")
TARGETS = ("mcp2026-a100", "mcp2026-a10", "mcp2026-edge")
CALIB_SAMPLES = 16


def _model(nodes, inputs, outputs, inits) -> onnx.ModelProto:
    tensors = [numpy_helper.from_array(v, k) for k, v in inits.items()]
    graph = helper.make_graph(nodes, "g", inputs, outputs, tensors)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _f(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def linear(kind: str, rows: int, k: int, n: int, seed: int):
    """``x`` [rows, k] (calibration samples [k]) -> MatMul(x, W[k, n]) (``matmul``: the graph input
    read directly), or Gemm(x, W[n, k], transB=1) + bias (``gemm``), or MatMul -> Relu -> MatMul
    (``mlp``, second layer n -> n): the model, the input name, its per-sample shape and dtype."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    if kind == "matmul":
        nodes, inits = [helper.make_node("MatMul", ["x", "w"], ["y"])], {"w": w}
    elif kind == "gemm":
        b = (0.1 * rng.standard_normal(n)).astype(np.float32)
        nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)]
        inits = {"w": np.ascontiguousarray(w.T), "b": b}
    else:
        w2 = (rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32)
        nodes = [
            helper.make_node("MatMul", ["x", "w"], ["h"]),
            helper.make_node("Relu", ["h"], ["r"]),
            helper.make_node("MatMul", ["r", "w2"], ["y"]),
        ]
        inits = {"w": w, "w2": w2}
    model = _model(nodes, [_f("x", [rows, k])], [_f("y", [rows, n])], inits)
    return model, "x", (k,), np.float32


def tied_lm(rows: int, vocab: int, hidden: int, seed: int, gemm: bool = False):
    """``ids`` [1, rows] (calibration samples [rows]) -> Gather(E) -> MatMul W + b -> Relu ->
    + residual -> LM head tied to E (MatMul with Transpose(E), or Gemm(h, E, transB=1))."""
    rng = np.random.default_rng(seed)
    inits = {
        "E": (0.5 * rng.standard_normal((vocab, hidden))).astype(np.float32),
        "W": (rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float32),
        "b": (0.1 * rng.standard_normal(hidden)).astype(np.float32),
    }
    nodes = [
        helper.make_node("Gather", ["E", "ids"], ["h0"]),
        helper.make_node("MatMul", ["h0", "W"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["a"]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Add", ["h0", "r"], ["h1"]),
    ]
    if gemm:
        nodes += [
            helper.make_node("Reshape", ["h1", "shape2"], ["h2"]),
            helper.make_node("Gemm", ["h2", "E"], ["l2"], transB=1),
            helper.make_node("Reshape", ["l2", "shape3"], ["y"]),
        ]
        inits["shape2"] = np.array([rows, hidden], np.int64)
        inits["shape3"] = np.array([1, rows, vocab], np.int64)
    else:
        nodes += [
            helper.make_node("Transpose", ["E"], ["Et"], perm=[1, 0]),
            helper.make_node("MatMul", ["h1", "Et"], ["y"]),
        ]
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, [1, rows])
    return _model(nodes, [ids], [_f("y", [1, rows, vocab])], inits), "ids", (rows,), np.int64


def _data(shape, dtype, n: int, seed: int, high: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == np.int64:
        return rng.integers(0, high, size=(n, *shape)).astype(np.int64)
    return rng.standard_normal((n, *shape)).astype(np.float32)


def check_build(tmp_path, built, config: str, target: str, vocab: int = 0) -> None:
    """Compile ``built`` (a model builder's result) with ``config`` for ``target`` with generated
    calibration data; the simulator must equal the interpreter on the compiled IR bit for bit."""
    model, name, shape, dtype = built
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    calib = tmp_path / "calib.npz"
    np.savez(calib, **{name: _data(shape, dtype, CALIB_SAMPLES, 11, vocab)})
    out = tmp_path / "m.mcpb"
    result = mcpc.compile(path, target=target, qat_config=config, output=out, calib=calib)
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    feeds = {name: _data(dims[1:], dtype, dims[0], 12, vocab)}
    sim = run_program(load_program(out), feeds).outputs["y"]
    ref = interpret(result.module, feeds)["y"]
    assert sim.dtype == ref.dtype and sim.shape == ref.shape
    np.testing.assert_array_equal(sim, ref, err_msg=f"{config} on {target}: simulator != interpreter")
    assert np.all(np.isfinite(sim))


# (kind, rows, K, N): K below / at / off a multiple of the group (32; 128 for gptq_g128), odd N
LINEAR_CASES = [
    ("matmul", 4, 64, 48),
    ("matmul", 1, 24, 16),
    ("gemm", 3, 32, 40),
    ("gemm", 5, 40, 47),
    ("mlp", 2, 72, 31),
]


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("case", LINEAR_CASES, ids=lambda c: "-".join(map(str, c)))
def test_quantized_linear_simulator_equals_interpreter(tmp_path, config, case):
    kind, rows, k, n = case
    target = TARGETS[(CONFIGS.index(config) + LINEAR_CASES.index(case)) % len(TARGETS)]
    check_build(tmp_path, linear(kind, rows, k, n, seed=rows * k + n), config, target)


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("gemm", [False, True], ids=["matmul-head", "gemm-head"])
@pytest.mark.parametrize("rows, vocab, hidden", [(5, 50, 64), (3, 33, 33)])
def test_quantized_tied_lm_simulator_equals_interpreter(tmp_path, config, gemm, rows, vocab, hidden):
    """hidden 64: one group of gptq_g128 spans it; hidden 33: 4-bit rows of odd length."""
    target = TARGETS[CONFIGS.index(config) % len(TARGETS)]
    built = tied_lm(rows=rows, vocab=vocab, hidden=hidden, seed=3, gemm=gemm)
    check_build(tmp_path, built, config, target, vocab=vocab)


@pytest.mark.slow
@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("target", TARGETS)
def test_quantized_grid_simulator_equals_interpreter(tmp_path, config, target):
    """The larger sweep: every linear shape of the grid and tied LMs of several widths."""
    ks, ns = (7, 16, 32, 40, 63, 96, 130), (1, 8, 33, 48)
    shapes = itertools.product(("matmul", "gemm", "mlp"), (1, 3, 5), ks, ns)
    for i, (kind, rows, k, n) in enumerate(shapes):
        if i % 3:  # a third of the product, a different third per kind
            continue
        check_build(tmp_path, linear(kind, rows, k, n, seed=i), config, target)
    for rows, vocab, hidden in ((1, 37, 32), (4, 50, 64), (5, 64, 96), (3, 33, 33), (2, 31, 47)):
        for gemm in (False, True):
            built = tied_lm(rows, vocab, hidden, seed=rows, gemm=gemm)
            check_build(tmp_path, built, config, target, vocab=vocab)


@pytest.mark.slow
@pytest.mark.parametrize("config", CONFIGS)
def test_quantized_gpt_fixture_simulator_equals_interpreter(tmp_path, config):
    """The exported GPT-style decoder (tied embedding / LM head, RoPE, gated MLP) with every
    quantizing config: it compiles, and the simulator computes the compiled IR's bits."""
    from pathlib import Path

    fixture = Path(__file__).resolve().parents[1] / "torch_models" / "fixtures" / "gpt-torchscript-op17.onnx"
    calib = tmp_path / "calib.npz"
    np.savez(calib, input_ids=_data((8,), np.int64, CALIB_SAMPLES, 11, 256))
    out = tmp_path / "gpt.mcpb"
    dims = {"batch": 1, "seq": 8}
    result = mcpc.compile(fixture, "mcp2026-edge", config, output=out, calib=calib, dims=dims)
    feeds = {"input_ids": _data((8,), np.int64, 1, 12, 256)}
    sim = run_program(load_program(out), feeds).outputs["logits"]
    np.testing.assert_array_equal(sim, interpret(result.module, feeds)["logits"])


def test_cli_calibrates_a_matmul_reading_the_graph_input(tmp_path):
    """``mcp-compile --qat-config qat_gptq_g128.yaml --calib`` on a one-MatMul model (x [4, 64] @
    w [64, 48], calibration x [64, 64]) exits 0 (it died in quantize-weights with exit 70)."""
    from click.testing import CliRunner

    from mcpc.cli import cli

    model, _, _, _ = linear("matmul", 4, 64, 48, seed=0)
    onnx.save(model, tmp_path / "m.onnx")
    np.savez(tmp_path / "calib.npz", x=_data((64,), np.float32, 64, 1))
    args = ["compile", str(tmp_path / "m.onnx"), "--qat-config", "qat_gptq_g128.yaml"]
    args += ["--calib", str(tmp_path / "calib.npz"), "-o", str(tmp_path / "m.mcpb")]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    assert "by gptq" in res.output and "64 samples" in res.output
