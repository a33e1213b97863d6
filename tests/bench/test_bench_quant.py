"""The weight quantization bench's machinery on a small two-layer model: every algorithm row and the
two ONNX Runtime rows are measured and rendered.  Timings are not checked."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import bench_quant  # noqa: E402
from bench_report import quant_table  # noqa: E402


def _model():
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((64, 96)).astype(np.float32)
    w1 = rng.standard_normal((48, 96)).astype(np.float32)  # Gemm with transB: (N, K) stored
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w0"], ["h"], name="mm"),
            helper.make_node("Relu", ["h"], ["r"]),
            helper.make_node("Gemm", ["r", "w1"], ["y"], name="gemm", transB=1),
        ],
        "two_layers",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 48])],
        [numpy_helper.from_array(w0, "w0"), numpy_helper.from_array(w1, "w1")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _inputs(model, batch, seq, seed):
    return {"x": np.random.default_rng(seed).standard_normal((batch * seq, 64)).astype(np.float32)}


def test_linear_weights_reads_matmul_and_gemm_transb():
    layers = bench_quant.linear_weights(_model())
    assert [(n, x, w.shape) for n, x, w in layers] == [("mm", "x", (64, 96)), ("gemm", "r", (96, 48))]


def test_measure_quant_rows_and_table():
    q = bench_quant.measure_quant(repeats=1, n_seq=16, seq=4, source=(_model(), _inputs))
    assert q["layers"] == 2 and q["weights"] == 64 * 96 + 96 * 48 and q["calibration_tokens"] == 64
    algos = [r["algorithm"] for r in q["rows"]]
    assert algos.count("ORT MatMulNBitsQuantizer") == 2
    assert {"rtn", "mse", "awq", "gptq", "gptq desc_act", "awq+gptq desc_act"} <= set(algos)
    assert q["eval_output"] == "y" and q["eval_samples"] == 16 * 4  # _inputs: batch * seq rows
    for r in q["rows"]:
        assert r["seconds"] >= 0 and r["cpu_seconds"] >= 0 and r["runs"] >= 1 and 0.9 < r["cosine"] < 1.0
        if not r["peer"]:
            assert r["over_ort"] > 0 and 4.0 < r["bits_per_weight"] < 5.2
    ours = {r["algorithm"]: r for r in q["rows"] if not r["peer"] and "f16" in r["spec"]}
    assert ours["rtn"]["output_error_vs_rtn"] == 1.0
    assert ours["gptq"]["output_error_vs_rtn"] < 1.0 and ours["awq"]["output_error_vs_rtn"] <= 1.0
    lines = quant_table(q)
    assert len(lines) == 2 + len(q["rows"]) and "| ORT MatMulNBitsQuantizer |" in lines[2]
    assert q["compile_passes"] == []  # the compile-pass rows are MiniLM's (measure_compile_passes)


def test_compile_pass_table_and_report_section():
    from bench_report import compile_pass_table, render_markdown

    rows = [
        {"algorithm": "rtn", "seconds": 0.16, "quantize_weights_s": 0.15, "runs": 3, "calibrated": False,
         "over_ort": 0.61},
        {"algorithm": "gptq", "seconds": 9.5, "quantize_weights_s": 9.4, "runs": 1, "calibrated": True,
         "over_ort": 36.0},
    ]  # fmt: skip
    lines = compile_pass_table(rows)
    assert lines[2] == "| rtn | no | 3 | 150.0 | 160.0 | 0.61× |"
    assert lines[3] == "| gptq | yes | 1 | 9400.0 | 9500.0 | 36.00× |"
    doc = json.loads((Path(bench_quant.__file__).parent / "results.json").read_text())  # a full report
    q = bench_quant.measure_quant(repeats=1, n_seq=16, seq=4, source=(_model(), _inputs))
    doc["quant"] = {**q, "compile_passes": rows}
    assert "| rtn | no | 3 | 150.0 | 160.0 | 0.61× |" in render_markdown(doc)
