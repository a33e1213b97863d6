"""Replicas behind a router (``mcpc.serve.fleet``): one replica is the plain simulator, every request
served once by exactly one replica, each router's rule, fleet metrics and the CLI's JSON and trace."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from serve_helpers import COST, MINIMAL, analytic, policy, serve, workload

from mcpc.cli import cli
from mcpc.serve import summarize
from mcpc.serve.fleet import ROUTERS, Fleet


def fleet(reqs, replicas, router, check=True, **spec):
    cost, shape = analytic()
    spec = spec or {"policy": "continuous"}
    f = Fleet(reqs, cost, shape, lambda: policy(shape, **spec), replicas, router, check=check)
    f.run()
    return f


@pytest.mark.parametrize("router", ROUTERS)
def test_one_replica_is_the_simulator(router):
    reqs = workload(requests=150, arrival={"process": "poisson", "rate_per_s": 40})
    sim = serve(reqs, analytic(), policy="continuous")
    f = fleet(reqs, 1, router)
    want = {s.id: (s.first_token_s, s.finish_s, s.itl) for s in sim.finished}
    assert {s.id: (s.first_token_s, s.finish_s, s.itl) for s in f.finished} == want


@pytest.mark.parametrize("router", ROUTERS)
@pytest.mark.parametrize("spec", [{"policy": "continuous"}, {"policy": "static", "batch_size": 4}])
def test_every_request_once_on_one_replica(router, spec):
    reqs = workload(requests=120, arrival={"process": "poisson", "rate_per_s": 60},
                    prefix_groups=[{"tokens": 128, "share": 0.5}])  # fmt: skip
    f = fleet(reqs, 3, router, **spec)  # check=True: each replica's KV invariants after every iteration
    per = [sorted(s.id for s in r.finished) for r in f.replicas]
    assert sorted(i for ids in per for i in ids) == sorted(r.id for r in reqs)
    assert [len(ids) for ids in per] == f.assigned and sum(f.assigned) == len(reqs)
    for r in f.replicas:
        assert all(s.req.arrival_s <= s.admitted_s <= s.first_token_s <= s.finish_s for s in r.finished)


def test_round_robin_deals_in_turn():
    reqs = workload(requests=50)
    f = fleet(reqs, 4, "round_robin")
    order = sorted(reqs, key=lambda r: (r.arrival_s, r.id))
    for k, r in enumerate(f.replicas):
        assert sorted(s.id for s in r.finished) == sorted(q.id for q in order[k::4])


class _Watched(Fleet):
    """Records, at each routing decision, every replica's outstanding tokens and the choice."""

    def route(self, req, index):
        k = super().route(req, index)
        self.log = getattr(self, "log", []) + [([r.outstanding for r in self.replicas], k)]
        return k


def test_least_tokens_picks_the_least_loaded_and_beats_round_robin():
    cost, shape = analytic()
    reqs = workload(requests=300, arrival={"process": "poisson", "rate_per_s": 120},
                    prompt_len={"dist": "zipf", "a": 1.2, "min": 8, "max": 900})  # fmt: skip
    f = _Watched(reqs, cost, shape, lambda: policy(shape, policy="continuous"), 3, "least_tokens", check=True)
    f.run()
    assert len(f.log) == len(reqs)
    assert all(loads[k] == min(loads) for loads, k in f.log)
    assert len({k for _, k in f.log}) == 3
    rr = summarize(fleet(reqs, 3, "round_robin", check=False))
    lt = summarize(f)
    assert lt["e2e_ms"]["p99"] < rr["e2e_ms"]["p99"]


def test_prefix_affinity_keeps_a_group_together():
    groups = [{"tokens": 256, "share": 0.45}, {"tokens": 256, "share": 0.45}]
    reqs = workload(requests=240, arrival={"process": "poisson", "rate_per_s": 30}, prefix_groups=groups,
                    prompt_len={"dist": "uniform", "min": 8, "max": 64})  # fmt: skip
    aff, rr = fleet(reqs, 4, "prefix_affinity"), fleet(reqs, 4, "round_robin")
    assert aff.prefix_routed > 0
    for g in {r.prefix_group for r in reqs} - {None}:  # a group's requests mostly on one replica
        homes = [sum(1 for s in r.finished if s.req.prefix_group == g) for r in aff.replicas]
        assert max(homes) >= 0.8 * sum(homes)
    assert summarize(aff)["kv"]["prefix_hit_rate"] > summarize(rr)["kv"]["prefix_hit_rate"]


def test_fleet_metrics_add_up():
    reqs = workload(requests=200, arrival={"process": "poisson", "rate_per_s": 80})
    f = fleet(reqs, 3, "least_tokens")
    r = summarize(f)
    assert r["requests"] == 200 and r["fleet"] == {"replicas": 3, "router": "least_tokens",
                                                  "prefix_routed": 0}  # fmt: skip
    reps = r["replicas"]
    assert [x["replica"] for x in reps] == [0, 1, 2] and sum(x["requests"] for x in reps) == 200
    assert r["kv"]["blocks"] == sum(x["kv"]["blocks"] for x in reps)
    peaks = [x["kv"]["peak_blocks"] for x in reps]
    assert max(peaks) <= r["kv"]["peak_blocks"] <= sum(peaks)
    assert r["npu"]["iterations"] == sum(x["npu"]["iterations"] for x in reps)
    assert r["generated_tokens"] == sum(x["generated_tokens"] for x in reps)
    assert r["e2e_ms"]["max"] == max(x["e2e_ms"]["max"] for x in reps)


def test_idle_replica_reported():
    f = fleet(workload(requests=2), 4, "round_robin")
    assert [x["requests"] for x in summarize(f)["replicas"]] == [1, 1, 0, 0]


def test_cli_replicas_json_and_trace(tmp_path):
    (tmp_path / "w.yaml").write_text(MINIMAL.replace("requests: 1000", "requests: 200"))
    (tmp_path / "c.yaml").write_text(COST)
    args = ["sim", "serve", tmp_path / "c.yaml", "--workload", tmp_path / "w.yaml", "--replicas", "3"]
    args += ["--router", "round_robin", "--json", tmp_path / "r.json", "--trace", tmp_path / "t.json"]
    res = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "3 replicas, router round_robin" in res.output
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["requests"] == 200 and [x["requests"] for x in r["replicas"]] == [67, 67, 66]
    assert {"throughput_tokens_per_s", "ttft_ms", "tpot_ms", "e2e_ms"} <= set(r)
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {k: f"replica {k} (c.yaml)" for k in range(3)}
    slices = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in slices} == {0, 1, 2} and len(slices) == r["npu"]["iterations"]


def _scale(requests: int, replicas: int):
    """The roofline SmolLM2 costs, each replica at 20 requests/s of 32-512 token prompts, 64 out."""
    from mcpc.serve import load_cost_file, load_policy

    cost, shape = load_cost_file("examples/serve/smollm2_a100_roofline.yaml")
    reqs = workload(seed=1, requests=requests, arrival={"process": "poisson", "rate_per_s": 20 * replicas},
                    prompt_len={"dist": "uniform", "min": 32, "max": 512},
                    output_len={"dist": "fixed", "value": 64})  # fmt: skip
    f = Fleet(reqs, cost, shape, lambda: load_policy(None, shape), replicas, "least_tokens")
    f.run()
    r = summarize(f)
    assert r["requests"] == requests == sum(x["requests"] for x in r["replicas"])
    assert r["generated_tokens"] == 64 * requests
    assert all(x["requests"] > requests / replicas / 2 for x in r["replicas"])  # least tokens spreads
    assert 0 < r["bandwidth"]["time_weighted_utilisation"] <= 1
    return r


def test_fleet_at_scale_small():
    _scale(2000, 8)


@pytest.mark.slow
def test_fleet_at_scale_100k_requests_8_replicas():
    _scale(100_000, 8)
