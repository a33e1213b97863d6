"""``mcpc tune-batching``: the best setting meets the SLO at the highest throughput of those tried,
the written policy file loads in ``sim serve`` and reproduces the reported P99s, and exit 1 with a
message when no setting meets the SLO."""

from __future__ import annotations

import json

import yaml
from click.testing import CliRunner
from serve_helpers import COST

from mcpc.cli import cli
from mcpc.serve import Simulator, load_cost_file, load_policy, load_workload
from mcpc.serve.tune import p99_ms

WORK = """\
seed: 5
requests: 160
arrival: {process: poisson, rate_per_s: 30}
prompt_len: {dist: uniform, min: 16, max: 400}
output_len: {dist: uniform, min: 4, max: 24}
"""


def run(tmp_path, *args):
    (tmp_path / "c.yaml").write_text(COST)
    (tmp_path / "w.yaml").write_text(WORK)
    base = ["tune-batching", tmp_path / "c.yaml", "--workload", tmp_path / "w.yaml"]
    return CliRunner().invoke(cli, [str(a) for a in (*base, *args)], catch_exceptions=False)


def test_table_meets_slo_at_best_throughput_and_reproduces(tmp_path):
    res = run(tmp_path, "--slo-p99-ms", 290, "-o", tmp_path / "p.yaml", "--json", tmp_path / "t.json")
    assert res.exit_code == 0, res.output
    r = json.loads((tmp_path / "t.json").read_text())
    best = r["best"]
    assert best["feasible"] and best["p99_ms"] <= 290
    assert all(b is None or b <= 290 for b in best["bucket_p99_ms"])
    feasible = [t for t in r["trials"] if t["feasible"]]
    assert best["throughput_tokens_per_s"] == max(t["throughput_tokens_per_s"] for t in feasible)
    assert any(not t["feasible"] for t in r["trials"])  # the search saw settings that miss the SLO
    # the written file is a policy sim serve takes, and it reproduces the reported P99s
    written = yaml.safe_load((tmp_path / "p.yaml").read_text())
    assert written["policy"] == "seqlen_table"
    assert [b["batch"] for b in written["buckets"]] == [b["batch"] for b in best["policy"]["buckets"]]
    cost, shape = load_cost_file(tmp_path / "c.yaml")
    _, reqs = load_workload(tmp_path / "w.yaml")
    sim = Simulator(reqs, cost, shape, load_policy(tmp_path / "p.yaml", shape))
    sim.run()
    assert p99_ms(sim.finished, "e2e") == best["p99_ms"]
    bounds = [b.get("max_prompt") for b in written["buckets"]]
    for i, b in enumerate(written["buckets"]):
        lo = 0 if i == 0 else bounds[i - 1]
        members = [
            s
            for s in sim.finished
            if s.req.prompt_len > lo and (bounds[i] is None or s.req.prompt_len <= bounds[i])
        ]
        want = p99_ms(members, "e2e")
        assert b["p99_ms"] == (None if want is None else float(f"{want:.4g}"))
    args = ["sim", "serve", tmp_path / "c.yaml", "--workload", tmp_path / "w.yaml"]
    args += ["--policy", tmp_path / "p.yaml", "--json", tmp_path / "s.json"]
    serve = CliRunner().invoke(cli, [str(a) for a in args])
    assert serve.exit_code == 0, serve.output
    assert json.loads((tmp_path / "s.json").read_text())["e2e_ms"]["p99"] == best["p99_ms"]


def test_continuous_ttft(tmp_path):
    res = run(tmp_path, "--slo-p99-ms", 500, "--metric", "ttft", "--search", "continuous",
              "-o", tmp_path / "p.yaml", "--json", tmp_path / "t.json")  # fmt: skip
    assert res.exit_code == 0, res.output
    r = json.loads((tmp_path / "t.json").read_text())
    assert r["best"]["policy"]["policy"] == "continuous" and r["best"]["p99_ms"] <= 500
    cost, shape = load_cost_file(tmp_path / "c.yaml")
    _, reqs = load_workload(tmp_path / "w.yaml")
    sim = Simulator(reqs, cost, shape, load_policy(tmp_path / "p.yaml", shape))
    sim.run()
    assert p99_ms(sim.finished, "ttft") == r["best"]["p99_ms"]


def test_unreachable_slo_exits_1(tmp_path):
    res = run(tmp_path, "--slo-p99-ms", 0.5, "-o", tmp_path / "p.yaml")
    assert res.exit_code == 1
    assert "no setting of" in res.output and "meets P99 e2e <= 0.5 ms" in res.output
    assert not (tmp_path / "p.yaml").exists()
