"""Step costs: the analytic formula, the measured grid (exact at its nodes, interpolation error
measured at the cell centres), its cache file, and malformed cost files."""

from __future__ import annotations

import json

import pytest
from serve_helpers import COST, analytic

from mcpc.errors import ConfigError
from mcpc.serve import CostGrid, ExactCost, load_cost_file


def test_analytic_formula():
    cost, shape = analytic()
    assert cost.clock_hz == 1e9
    assert cost.decode_cost(4, 1000) == 2e6 + 4 * 2e4 + 1000 * 300
    assert cost.prefill_cost(64, 100) == 1.5e6 + 64 * 3e4 + 20 * (64 * 100 + 64 * 65 / 2)
    assert (shape.max_batch, shape.max_seq, shape.prefill_chunk, shape.kv_blocks) == (16, 1024, 64, 16 * 16)


def test_grid_is_exact_at_nodes_and_reports_its_error():
    cost, shape = analytic()
    calls = []

    def measure(kind, x, y):
        calls.append((kind, x, y))
        return cost.measure(kind, x, y)

    grid = CostGrid.measure(measure, shape, cost.clock_hz, points=5)
    assert len(calls) == len(set(calls))  # every point measured once
    assert grid.decode_active == [1, 2, 4, 8, 16] and grid.decode_context[0] == 1
    assert grid.decode_context[-1] == 1024 and grid.prefill_past[-1] == 1024 - 64
    for a in grid.decode_active:
        for c in grid.decode_context:
            assert grid.decode_cost(a, a * c) == pytest.approx(cost.decode_cost(a, a * c), rel=1e-12)
    # decode is bilinear in (active, context): interpolation is exact; prefill is quadratic in the chunk
    assert grid.error["decode_max_rel"] < 1e-12
    worst = max(
        abs(grid.prefill_cost(c, p) - cost.prefill_cost(c, p)) / cost.prefill_cost(c, p)
        for (kind, c, p) in calls
        if kind == "prefill"
    )
    assert 0 < grid.error["prefill_max_rel"] <= worst + 1e-12
    assert grid.error["checked_points"] > 0


def test_grid_error_catches_a_staircase():
    """A cost with 64-token steps (whole KV blocks gathered) between coarse nodes shows its error."""
    cost, shape = analytic()

    def blocky(kind, x, y):
        return 1e6 + 1e4 * x * -(-y // 64) * 64 if kind == "decode" else cost.measure(kind, x, y)

    grid = CostGrid.measure(blocky, shape, cost.clock_hz, points=4)
    assert grid.error["decode_max_rel"] > 0.001


def test_grid_file_round_trip(tmp_path):
    cost, shape = analytic()
    grid = CostGrid.measure(cost.measure, shape, cost.clock_hz, points=4, source={"sha256": "ab"})
    grid.save(tmp_path / "g.json")
    back, back_shape = load_cost_file(tmp_path / "g.json")
    assert back_shape == shape and back.source == {"sha256": "ab"} and back.error == grid.error
    for a, kv in [(1, 5), (3, 700), (16, 16 * 1000)]:
        assert back.decode_cost(a, kv) == grid.decode_cost(a, kv)
    for c, p in [(1, 0), (33, 517), (64, 960)]:
        assert back.prefill_cost(c, p) == grid.prefill_cost(c, p)


def test_exact_cost_memoises():
    cost, _ = analytic()
    calls = []
    exact = ExactCost(lambda *k: calls.append(k) or cost.measure(*k), cost.clock_hz)
    assert exact.decode_cost(4, 400) == cost.decode_cost(4, 400)
    assert exact.decode_cost(4, 400) == cost.decode_cost(4, 400)
    assert exact.prefill_cost(10, 5) == cost.prefill_cost(10, 5)
    assert calls == [("decode", 4, 100), ("prefill", 10, 5)]


@pytest.mark.parametrize(
    "text, match",
    [
        (COST.replace("kind: analytic", "kind: magic"), r"kind: expected analytic or cost_grid"),
        (COST.replace("clock_mhz: 1000", "clock_mhz: 0"), r"clock_mhz"),
        (COST.replace("per_seq", "per_sequence"), r"decode\.per_sequence: unknown key"),
        (COST.replace("max_batch: 16\n", ""), r"max_batch: missing required key"),
    ],
)
def test_bad_cost_files(tmp_path, text, match):
    (tmp_path / "c.yaml").write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_cost_file(tmp_path / "c.yaml")


def test_bad_grid_file(tmp_path):
    cost, shape = analytic()
    doc = CostGrid.measure(cost.measure, shape, cost.clock_hz, points=3).to_json()
    doc["decode"]["cycles"] = doc["decode"]["cycles"][:-1]
    (tmp_path / "g.json").write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=r"decode\.cycles: expected \d+ rows"):
        load_cost_file(tmp_path / "g.json")
