"""DRAM bandwidth utilisation: bytes per step from the cost (an analytic ``dram`` section, a grid's
measured bytes), utilisation = bytes / (step time x bandwidth), mean and time-weighted; the grid
file keeps the bytes (version 2) and a version-1 grid is refused as a cost file, measured again as
a cache."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from serve_helpers import COST, MINIMAL, analytic, serve, workload

from mcpc.cli import cli
from mcpc.errors import ConfigError
from mcpc.serve import CostGrid, load_cost_file, summarize

DRAM = {"gbps": 100, "weight_bytes": 150_000}


def test_step_bytes_and_utilisation():
    cost_shape = analytic(dram=DRAM)
    sim = serve(workload(requests=60), cost_shape, policy="continuous")
    kvb = cost_shape[1].kv_bytes_per_token
    for i in range(len(sim.iterations)):  # a decode-only step reads the weights and the KV it attends
        it = sim.iterations[i]
        if it["decode"] and not it["prefill"]:
            assert it["dram_bytes"] == DRAM["weight_bytes"] + it["kv_tokens"] * kvb
        assert it["dram_bytes"] >= DRAM["weight_bytes"]
    bw = summarize(sim)["bandwidth"]
    its = sim.iterations
    dur = its.column("end") - its.column("start")
    nbytes = its.column("dram_bytes")
    assert bw["dram_bytes_per_s"] == 100e9 and bw["dram_bytes"] == pytest.approx(nbytes.sum())
    assert bw["mean_utilisation"] == pytest.approx(np.mean(nbytes / dur / 100e9))
    assert bw["time_weighted_utilisation"] == pytest.approx(nbytes.sum() / dur.sum() / 100e9)
    assert 0 < bw["time_weighted_utilisation"] <= bw["peak_utilisation"]
    assert bw["mean_utilisation"] != bw["time_weighted_utilisation"]  # steps of different lengths


def test_no_bytes_no_figures():
    bw = summarize(serve(workload(requests=20), analytic(), policy="continuous"))["bandwidth"]
    assert bw["mean_utilisation"] is None and bw["dram_bytes"] is None


def test_roofline_example_is_under_the_roof():
    cost, shape = load_cost_file("examples/serve/smollm2_a100_roofline.yaml")
    assert cost.dram_bytes_per_s == 1555e9
    for active, ctx in ((1, 1), (16, 2048), (4, 700)):
        t = cost.decode_cost(active, active * ctx) / cost.clock_hz
        assert cost.decode_bytes(active, active * ctx) / t / cost.dram_bytes_per_s <= 1.0


def test_grid_keeps_bytes_and_refuses_version_1(tmp_path):
    cost, shape = analytic(dram=DRAM)
    grid = CostGrid.measure(
        cost.measure, shape, cost.clock_hz, points=4, dram_bytes_per_s=cost.dram_bytes_per_s
    )
    for a, c in ((1, 1), (16, 1024), (3, 100), (7, 555)):  # linear in the context: exact everywhere
        assert grid.decode_bytes(a, a * c) == pytest.approx(cost.decode_bytes(a, a * c))
    assert grid.prefill_bytes(64, 300) == pytest.approx(cost.prefill_bytes(64, 300))
    grid.save(tmp_path / "g.json")
    back, _ = load_cost_file(tmp_path / "g.json")
    assert back.dram_bytes_per_s == 100e9 and back.decode_bytes(5, 500) == grid.decode_bytes(5, 500)
    doc = json.loads((tmp_path / "g.json").read_text())
    doc["version"] = 1
    (tmp_path / "old.json").write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="version 1 cost grid"):
        load_cost_file(tmp_path / "old.json")


def test_cli_reports_bandwidth_and_remeasures_an_old_grid(tmp_path):
    (tmp_path / "c.yaml").write_text(COST + "dram: {gbps: 100, weight_bytes: 150000}\n")
    (tmp_path / "w.yaml").write_text(MINIMAL.replace("requests: 1000", "requests: 100"))
    cost, _ = load_cost_file(tmp_path / "c.yaml")
    from mcpc.serve.cost import file_digest

    _, shape = load_cost_file(tmp_path / "c.yaml")
    old = CostGrid.measure(
        cost.measure, shape, cost.clock_hz, points=3, source={"sha256": file_digest(tmp_path / "c.yaml")}
    )
    doc = old.to_json() | {"version": 1}
    (tmp_path / "g.json").write_text(json.dumps(doc))
    args = [
        "sim",
        "serve",
        tmp_path / "c.yaml",
        "--workload",
        tmp_path / "w.yaml",
        "--cost-grid",
        tmp_path / "g.json",
    ]
    res = CliRunner().invoke(
        cli, [str(a) for a in (*args, "--json", tmp_path / "r.json")], catch_exceptions=False
    )
    assert res.exit_code == 0, res.output
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["cost"]["cached"] is False and json.loads((tmp_path / "g.json").read_text())["version"] == 2
    assert "DRAM bandwidth utilisation" in res.output and 0 < r["bandwidth"]["time_weighted_utilisation"] <= 1
