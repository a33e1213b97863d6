"""The serving loop: conservation and KV invariants under every policy, queueing theory (M/D/1,
Little's law), and the behaviour each policy promises."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from serve_helpers import analytic, policy, serve, workload

from mcpc.errors import InputError
from mcpc.serve import Simulator, summarize

POLICY_SPECS = [
    {"policy": "static", "batch_size": 4},
    {"policy": "static", "batch_size": 8, "max_wait_ms": 30},
    {"policy": "seqlen_table"},
    {"policy": "dynamic", "preferred_batch_sizes": [2, 4], "max_queue_delay_ms": 5},
    {"policy": "adaptive"},
    {"policy": "continuous"},
    {"policy": "continuous", "token_budget": 40, "max_seqs": 6},
]


def check_conservation(sim, requests):
    ids = [s.id for s in sim.finished]
    assert sorted(ids) == sorted(r.id for r in requests)  # every request finishes exactly once
    for s in sim.finished:
        assert s.generated == s.req.output_len
        assert s.req.arrival_s <= s.admitted_s <= s.first_token_s <= s.finish_s
        assert len(s.itl) == s.req.output_len - 1 and all(g > 0 for g in s.itl)
    assert sim.kv.used_blocks == 0 and not sim.running and not sim.waiting
    for a, b in zip(sim.iterations, sim.iterations[1:], strict=False):
        assert a["end"] <= b["start"] + 1e-12  # one NPU: iterations never overlap
    assert max(i["kv_blocks_used"] for i in sim.iterations) <= sim.kv.num_blocks


@pytest.mark.parametrize("spec", POLICY_SPECS, ids=lambda s: "-".join(f"{v}" for v in s.values()))
def test_every_policy_conserves_requests(spec):
    reqs = workload(prefix_groups=[{"tokens": 128, "share": 0.5}])
    sim = serve(reqs, analytic(kv_blocks=40), **spec)  # check=True: pool invariants every iteration
    check_conservation(sim, reqs)
    r = summarize(sim)
    assert r["requests"] == 200 and r["ttft_ms"]["p99"] <= r["e2e_ms"]["p99"]
    assert r["generated_tokens"] == sum(q.output_len for q in reqs)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    rate=st.floats(1, 400),
    spec=st.sampled_from(POLICY_SPECS),
    blocks=st.integers(8, 64),
    share=st.floats(0.0, 1.0),
)
def test_conservation_property(seed, rate, spec, blocks, share):
    reqs = workload(
        seed=seed,
        requests=40,
        arrival={"process": "gamma", "rate_per_s": rate, "burstiness": 3},
        prefix_groups=[{"tokens": 70, "share": share}] if share > 0 else [],
    )
    sim = serve(reqs, analytic(kv_blocks=blocks, max_seq=512), **spec)
    check_conservation(sim, reqs)


def md1_cost():
    # one 64-token prompt and one output token: a single prefill of exactly 1 ms per request
    return analytic(clock_mhz=1000, max_batch=1, prefill={"base": 1e6}, decode={"base": 1e6})


def md1_wait(rho, n, seed):
    d = 1e-3
    reqs = workload(
        seed=seed,
        requests=n,
        arrival={"process": "poisson", "rate_per_s": rho / d},
        prompt_len={"dist": "fixed", "value": 64},
        output_len={"dist": "fixed", "value": 1},
    )
    sim = serve(reqs, md1_cost(), check=False, policy="static", batch_size=1)
    waits = np.array([s.admitted_s - s.req.arrival_s for s in sim.finished])
    assert np.allclose([s.finish_s - s.admitted_s for s in sim.finished], d)  # deterministic service
    return waits.mean(), rho / (2 * (1 / d) * (1 - rho)), sim


def test_md1_mean_wait_at_rho_half():
    measured, theory, _ = md1_wait(0.5, 20_000, seed=11)
    assert measured == pytest.approx(theory, rel=0.05)


@pytest.mark.slow
def test_md1_mean_wait_at_rho_0_8():
    measured, theory, _ = md1_wait(0.8, 400_000, seed=12)
    assert measured == pytest.approx(theory, rel=0.05)


def test_littles_law_in_steady_state():
    _, _, sim = md1_wait(0.7, 15_000, seed=5)
    done = sim.finished
    lo, hi = done[len(done) // 5].req.arrival_s, done[-len(done) // 5].req.arrival_s  # trim warm-up/drain
    arr = np.array([s.req.arrival_s for s in done])
    fin = np.array([s.finish_s for s in done])
    # time-average number in system over [lo, hi]: each request's overlap with the window
    in_system = (np.minimum(fin, hi) - np.maximum(arr, lo)).clip(min=0).sum() / (hi - lo)
    inside = (arr >= lo) & (arr < hi)
    lam, w = inside.sum() / (hi - lo), (fin - arr)[inside].mean()
    assert in_system == pytest.approx(lam * w, rel=0.05)


def test_static_waits_for_a_full_batch():
    reqs = workload(requests=12, arrival={"process": "poisson", "rate_per_s": 5})
    sim = serve(reqs, analytic(), policy="static", batch_size=4)
    assert sim.policy.batches == [4, 4, 4]
    first = sorted(sim.finished, key=lambda s: s.id)[:4]
    assert {s.admitted_s for s in first} == {reqs[3].arrival_s}  # started when the 4th arrived


def test_static_flushes_after_max_wait():
    reqs = workload(requests=3, arrival={"process": "poisson", "rate_per_s": 1})
    sim = serve(reqs, analytic(), policy="static", batch_size=8, max_wait_ms=10)
    s0 = min(sim.finished, key=lambda s: s.id)
    assert s0.admitted_s == pytest.approx(reqs[0].arrival_s + 0.010)


def test_dynamic_batcher_prefers_sizes_and_honours_the_delay():
    # a burst of 7 at once: preferred 4 goes first, then the other 3 once the delay expires
    reqs = workload(requests=7, arrival={"process": "gamma", "rate_per_s": 1e6, "burstiness": 1})
    reqs += workload(seed=9, requests=1, arrival={"process": "poisson", "rate_per_s": 1e-3})
    for i, r in enumerate(reqs):
        r.id = i
    sim = serve(reqs, analytic(), policy="dynamic", preferred_batch_sizes=[4], max_queue_delay_ms=1)
    assert sim.policy.batches[:2] == [4, 3]


def test_seqlen_table_never_mixes_buckets():
    reqs = workload(
        requests=300,
        prompt_len={"dist": "uniform", "min": 16, "max": 700},
        arrival={"process": "poisson", "rate_per_s": 200},
    )
    sim = Simulator(reqs, *analytic(), policy(analytic()[1], policy="seqlen_table"), check=True)
    seen = []
    orig = sim.policy._take

    def spy(s, chosen):
        seen.append({sim.policy._bucket(q) for q in chosen})
        return orig(s, chosen)

    sim.policy._take = spy
    sim.run()
    assert seen and all(len(b) == 1 for b in seen)
    assert max(sim.policy.batches) <= 16  # the table's 32 is capped at the program's max_batch


def test_adaptive_batch_grows_with_the_rate():
    sizes = {}
    for rate in (2, 200):
        reqs = workload(requests=300, arrival={"process": "poisson", "rate_per_s": rate})
        sim = serve(reqs, analytic(), policy="adaptive")
        sizes[rate] = np.median(sim.policy.chosen)
    assert sizes[2] == 1 and sizes[200] == 16  # 2/s x 250 ms -> 1; 200/s x 250 ms = 50 -> 16 (the top)


def test_continuous_respects_budget_chunk_and_max_seqs():
    reqs = workload(requests=150, arrival={"process": "poisson", "rate_per_s": 100})
    sim = serve(reqs, analytic(), policy="continuous", token_budget=48, max_seqs=5)
    for it in sim.iterations:
        assert it["decode"] + it["prefill_tokens"] <= 48
        assert it["decode"] <= 5 and it["prefill_tokens"] <= 64 * it["prefill"]
    assert any(it["decode"] and it["prefill"] for it in sim.iterations)  # mixed iterations happen


def test_continuous_preempts_when_kv_runs_out_and_still_finishes():
    reqs = workload(
        requests=60,
        arrival={"process": "poisson", "rate_per_s": 500},
        prompt_len={"dist": "fixed", "value": 60},
        output_len={"dist": "fixed", "value": 200},
    )
    sim = serve(reqs, analytic(kv_blocks=12), policy="continuous")
    assert sim.preemptions > 0
    check_conservation(sim, reqs)
    assert summarize(sim)["npu"]["recomputed_tokens"] > 0


def test_prefix_sharing_skips_prefill():
    reqs = workload(requests=100, prefix_groups=[{"tokens": 256, "share": 1.0}])
    sim = serve(reqs, analytic(), policy="continuous")
    r = summarize(sim)
    assert r["kv"]["prefix_hit_rate"] > 0.3
    assert r["npu"]["prefill_tokens"] < r["prompt_tokens"] - 90 * 256


def test_continuous_beats_static_under_load():
    reqs = workload(
        requests=400,
        arrival={"process": "poisson", "rate_per_s": 60},
        prompt_len={"dist": "uniform", "min": 16, "max": 600},
        output_len={"dist": "uniform", "min": 8, "max": 128},
    )
    cont = summarize(serve(reqs, analytic(), check=False, policy="continuous"))
    stat = summarize(serve(reqs, analytic(), check=False, policy="static", batch_size=16))
    assert cont["throughput_tokens_per_s"] > stat["throughput_tokens_per_s"]
    assert cont["e2e_ms"]["p99"] <= stat["e2e_ms"]["p99"]


def test_requests_longer_than_the_build_are_refused():
    reqs = workload(
        requests=5, prompt_len={"dist": "fixed", "value": 1000}, output_len={"dist": "fixed", "value": 30}
    )
    with pytest.raises(InputError, match=r"5 request\(s\) need more than the build's max_seq 1024"):
        serve(reqs, analytic(), policy="continuous")


def test_same_seed_same_run():
    a = summarize(serve(workload(), analytic(), policy="continuous"))
    b = summarize(serve(workload(), analytic(), policy="continuous"))
    assert a == b
