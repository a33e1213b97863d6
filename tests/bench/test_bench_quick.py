"""The benchmark's machinery on one tiny model: the JSON document has the documented schema and the
markdown report is written.  Timings are not checked (they belong to `make bench`, not to tests)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import bench_cases  # noqa: E402

_spec = importlib.util.spec_from_file_location("bench_run", BENCH / "run.py")
bench_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_run)

from mcpc.arch.target import load_target  # noqa: E402

TOOLCHAIN_KEYS = {
    "import_s",
    "passes_s",
    "backend_s",
    "sim_load_s",
    "sim_run_s",
    "compile_s",
    "sim_s",
    "sim_instructions_per_s",
}
SIM_KEYS = {
    "cycles",
    "latency_us",
    "instructions",
    "macs",
    "dram_bytes",
    "peak_sram_bytes",
    "mac_pct_of_peak",
    "dram_pct_of_peak",
    "roof_pct",
    "bound",
    "top_nodes",
}


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_quick_run_on_mlp_writes_schema(tmp_path):
    out = tmp_path / "r.json"
    argv = ["--quick", "--repeats", "1", "--targets", "mcp2026-edge", "--builds", "fp32", "--cases", "mlp"]
    assert bench_run.main([*argv, "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["schema"] == bench_run.SCHEMA and doc["repeats"] == 1 and doc["quick"] is True
    assert doc["command"].startswith("python bench/run.py --quick")
    assert len(doc["load_average"]["before"]) == len(doc["load_average"]["after"]) == 3
    facts = doc["facts"]
    for key in ("cpu_model", "usable_cores", "numpy", "onnxruntime", "blas", "env"):
        assert key in facts
    assert set(facts["env"]) >= {"OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"}

    (r,) = doc["results"]
    assert (r["case"], r["kind"], r["target"], r["build"]) == ("mlp", "model", "mcp2026-edge", "fp32")
    assert TOOLCHAIN_KEYS <= set(r["toolchain"]) and all(_positive(r["toolchain"][k]) for k in TOOLCHAIN_KEYS)
    assert all(len(v) == 1 for v in r["toolchain_samples"].values())
    assert _positive(r["ort"]["median_s"]) and r["ort"]["runs"] >= 1 and _positive(r["sim_over_ort"])
    sim = r["sim"]
    assert SIM_KEYS <= set(sim) and sim["bound"] in ("compute", "memory", "latency")
    assert sim["macs"] == 4 * 256 * 1024 + 4 * 1024 * 256  # the MLP's two layers, batch 4
    assert 0 < sim["roof_pct"] <= 100 and 0 < sim["peak_sram_bytes"] <= sim["sram_size_bytes"]
    # an fp32 build: tight agreement with ONNX Runtime
    assert r["accuracy"]["norm_max_err"] <= 1e-4 and r["accuracy"]["cosine"] > 0.9999
    assert r["accuracy"]["within_tolerance"] is True

    md = out.with_suffix(".md").read_text()
    assert md.count("| mlp | 4x256-1024-256 | mcp2026-edge | fp32 |") == 2  # roofline and speed tables
    assert facts["cpu_model"] in md and doc["command"] in md


def test_square_probe_size_fills_the_array():
    for name in ("mcp2026-a100", "mcp2026-a10", "mcp2026-edge"):
        t = load_target(name)
        n = bench_cases.square_size(t, 2048)
        assert n >= 2048 and n % t.mac.array_rows == 0 and n % t.mac.array_cols == 0


def test_unknown_case_is_a_usage_error(tmp_path, capsys):
    argv = ["--quick", "--targets", "mcp2026-edge", "--cases", "nope", "-o", str(tmp_path / "r.json")]
    assert bench_run.main(argv) == 2
    assert "no case matches --cases nope" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


def test_bad_repeats_is_rejected(tmp_path):
    with pytest.raises(SystemExit) as exc:
        bench_run.parse_args(["--repeats", "0", "-o", str(tmp_path / "r.json")])
    assert exc.value.code == 2
