"""The simulator-speed part of the benchmark on a tiny decoder step: the model is a valid decoder
with past K/V (ONNX Runtime and the simulator agree on it), and the record has the documented keys.
Timings are not checked (they belong to `make bench`)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import bench_cases  # noqa: E402
import bench_measure  # noqa: E402
import bench_report  # noqa: E402
from decoder_step import decoder_step  # noqa: E402


def test_decoder_step_shapes():
    model, inputs = decoder_step(hidden=32, layers=2, heads=4, kv_heads=2, mlp=48, vocab=64, context=5)
    assert inputs["past_key_1"].shape == (1, 2, 5, 8) and inputs["position_ids"].tolist() == [[5]]
    outs = {o.name: [d.dim_value for d in o.type.tensor_type.shape.dim] for o in model.graph.output}
    assert outs["logits"] == [1, 1, 64] and outs["present_value_0"] == [1, 2, 6, 8]


def test_sim_speed_record_on_a_tiny_decoder_step(tmp_path):
    def build(seed):
        return decoder_step(hidden=32, layers=2, heads=4, kv_heads=2, mlp=48, vocab=64, context=5, seed=seed)

    case = bench_cases.Case("decoder_step", "sim_speed", "tiny", build)
    r = bench_measure.measure_sim_speed(case, "mcp2026-edge", "fp32", tmp_path, repeats=1)
    for key in ("sim_s", "timing_only_s", "ort_s", "sim_over_ort", "timing_only_over_ort", "sim_first_run_s"):
        assert isinstance(r[key], float) and math.isfinite(r[key]) and r[key] > 0, key
    assert r["instructions"] > 0 and r["cycles"] > 0
    assert r["norm_max_err"] <= 1e-4  # fp32 build against ONNX Runtime on every output
    lines = bench_report.sim_speed_table([r])
    assert len(lines) == 3 and "| decoder_step | tiny | mcp2026-edge | fp32 |" in lines[2]
    assert not list(tmp_path.iterdir())  # the model and program files are removed
