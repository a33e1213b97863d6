"""``mcpc sim serve``: the issue's minimal workload on an analytic cost file, the JSON keys, the
Chrome trace, the cost grid cache, a decoder program's shape from META, and user errors."""

from __future__ import annotations

import json

from click.testing import CliRunner
from serve_helpers import COST, DECODER_META, MINIMAL, decoder_program, runnable_decoder

from mcpc.cli import cli


def run(*args):
    return CliRunner().invoke(cli, ["sim", "serve", *map(str, args)], catch_exceptions=False)


def files(tmp_path):
    (tmp_path / "w.yaml").write_text(MINIMAL)
    (tmp_path / "c.yaml").write_text(COST)
    return tmp_path / "c.yaml", tmp_path / "w.yaml"


def test_minimal_workload_json_and_trace(tmp_path):
    cost, work = files(tmp_path)
    res = run(cost, "--workload", work, "--json", tmp_path / "r.json", "--trace", tmp_path / "t.json")
    assert res.exit_code == 0, res.output
    assert "TTFT (ms)" in res.output and "policy continuous" in res.output
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["requests"] == 1000 and r["policy"] == "continuous"
    for key in ("ttft_ms", "tpot_ms", "e2e_ms", "itl_ms"):
        assert set(r[key]) >= {"mean", "p50", "p90", "p99"}
        assert r[key]["p50"] <= r[key]["p90"] <= r[key]["p99"]
    span = r["duration_s"]
    assert r["throughput_tokens_per_s"] == 64_000 / span
    assert r["cost"]["mode"] == "analytic" and r["shape"]["max_batch"] == 16
    t = json.loads((tmp_path / "t.json").read_text())
    slices = [e for e in t["traceEvents"] if e["ph"] == "X"]
    assert len(slices) == r["npu"]["iterations"] and all(e["dur"] > 0 for e in slices)


def test_policy_file_and_slo(tmp_path):
    cost, work = files(tmp_path)
    work.write_text(MINIMAL + "slo: {ttft_ms: 100, tpot_ms: 5}\n")
    (tmp_path / "p.yaml").write_text("policy: static\nbatch_size: 8\n")
    res = run(cost, "--workload", work, "--policy", tmp_path / "p.yaml", "--json", tmp_path / "r.json")
    assert res.exit_code == 0, res.output
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["policy"] == "static" and "goodput" in r
    assert 0 <= r["goodput"]["requests_meeting_slo"] <= 1000 and r["goodput"]["slo"] == {
        "ttft_ms": 100,
        "tpot_ms": 5,
    }


def test_cost_grid_measured_once_then_cached(tmp_path):
    cost, work = files(tmp_path)
    work.write_text(MINIMAL.replace("requests: 1000", "requests: 150"))
    grid = tmp_path / "g.json"
    first = run(
        cost, "--workload", work, "--cost-grid", grid, "--grid-points", 4, "--json", tmp_path / "a.json"
    )
    assert first.exit_code == 0, first.output and grid.exists()
    assert "interpolation error" in first.output
    a = json.loads((tmp_path / "a.json").read_text())
    assert a["cost"]["mode"] == "grid" and a["cost"]["cached"] is False
    stamp = grid.stat().st_mtime_ns
    second = run(cost, "--workload", work, "--cost-grid", grid, "--json", tmp_path / "b.json")
    b = json.loads((tmp_path / "b.json").read_text())
    assert second.exit_code == 0 and b["cost"]["cached"] is True and grid.stat().st_mtime_ns == stamp
    assert b["ttft_ms"] == a["ttft_ms"]
    # a changed cost file invalidates the cache
    cost.write_text(COST.replace("base: 2000000", "base: 2500000"))
    third = run(cost, "--workload", work, "--cost-grid", grid, "--json", tmp_path / "c.json")
    assert third.exit_code == 0 and json.loads((tmp_path / "c.json").read_text())["cost"]["cached"] is False
    # the cached grid alone serves as a cost file
    fourth = run(grid, "--workload", work, "--json", tmp_path / "d.json")
    assert (
        fourth.exit_code == 0 and json.loads((tmp_path / "d.json").read_text())["cost"]["mode"] == "cost_grid"
    )


def test_decoder_program_measures_its_grid_once(tmp_path):
    """A decoder build: the shape from META, the grid measured by timing-only calls of its entries
    on the simulator (DecoderSession over a Session) and cached beside it; --exact runs too."""
    from mcpc.serve.program import served_shape
    from mcpc.sim.api import load_program

    _, work = files(tmp_path)
    work.write_text(MINIMAL.replace("requests: 1000", "requests: 40").replace("max: 512", "max: 120"))
    meta = dict(DECODER_META, max_batch=4, max_seq=256, kv_blocks=16, prefill_chunk=32, vocab=10)
    prog = runnable_decoder(tmp_path / "d.mcpb", meta)
    shape = served_shape(load_program(prog), "d.mcpb")
    assert (shape.max_batch, shape.kv_blocks, shape.kv_bytes_per_token) == (4, 16, 2 * 30 * 3 * 64 * 2)
    res = run(prog, "--workload", work, "--grid-points", 3, "--json", tmp_path / "a.json")
    assert res.exit_code == 0, res.output
    a = json.loads((tmp_path / "a.json").read_text())
    assert (
        a["cost"]["mode"] == "grid"
        and a["cost"]["cached"] is False
        and a["cost"]["file"] == "d.costgrid.json"
    )
    assert (tmp_path / "d.costgrid.json").exists() and a["requests"] == 40
    res = run(prog, "--workload", work, "--json", tmp_path / "b.json")
    assert res.exit_code == 0 and json.loads((tmp_path / "b.json").read_text())["cost"]["cached"] is True
    res = run(prog, "--workload", work, "--exact", "--json", tmp_path / "c.json")
    c = json.loads((tmp_path / "c.json").read_text())
    assert res.exit_code == 0 and c["cost"]["mode"] == "exact" and c["ttft_ms"]["mean"] > 0


def test_user_errors(tmp_path):
    cost, work = files(tmp_path)
    work.write_text(MINIMAL.replace("poisson", "lognormal"))
    res = run(cost, "--workload", work)
    assert res.exit_code == 3 and "arrival" in res.output and "w.yaml" in res.output
    work.write_text(MINIMAL)
    (tmp_path / "p.yaml").write_text("policy: continuous\ntoken_budget: 0\n")
    res = run(cost, "--workload", work, "--policy", tmp_path / "p.yaml")
    assert res.exit_code == 3 and "token_budget" in res.output
    (tmp_path / "p.yaml").write_text("batch_size: 4\n")
    res = run(cost, "--workload", work, "--policy", tmp_path / "p.yaml")
    assert res.exit_code == 3 and "policy: missing required key" in res.output
    plain = decoder_program(tmp_path / "plain.mcpb", None)
    res = run(plain, "--workload", work)
    assert res.exit_code == 2 and "not a decoder build" in res.output and "--max-seq" in res.output
    res = run(cost, "--workload", work, "--exact")
    assert res.exit_code == 2 and "--exact" in res.output
    work.write_text(MINIMAL.replace("max: 512", "max: 1000"))
    res = run(cost, "--workload", work)
    assert res.exit_code == 3 and "max_seq 1024" in res.output
