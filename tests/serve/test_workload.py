"""Workload files: the issue's minimal file, each arrival process and length distribution, prefix
groups, trace replay, and errors naming the key path."""

from __future__ import annotations

import json

import numpy as np
import pytest
from serve_helpers import MINIMAL

from mcpc.errors import ConfigError
from mcpc.serve import WorkloadSpec, generate, load_workload


def spec(**data):
    return WorkloadSpec.model_validate(data)


def gaps(requests):
    return np.diff([0.0] + [r.arrival_s for r in requests])


def test_minimal_file_as_written(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text(MINIMAL)
    s, reqs = load_workload(path)
    assert len(reqs) == 1000 and s.seed == 1
    lens = np.array([r.prompt_len for r in reqs])
    assert lens.min() >= 32 and lens.max() <= 512 and len(set(lens)) > 200
    assert {r.output_len for r in reqs} == {64}
    times = np.array([r.arrival_s for r in reqs])
    assert np.all(np.diff(times) >= 0)
    assert 1000 / times[-1] == pytest.approx(20, rel=0.1)
    # the seed makes it reproducible, another seed changes it
    _, again = load_workload(path)
    assert [r.arrival_s for r in again] == list(times)
    assert all(np.array_equal(a.prompt, b.prompt) for a, b in zip(reqs, again, strict=True))
    path.write_text(MINIMAL.replace("seed: 1", "seed: 2"))
    _, other = load_workload(path)
    assert [r.arrival_s for r in other] != list(times)


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_interarrival_cv2_is_the_burstiness(burstiness):
    g = gaps(
        generate(
            spec(
                requests=20000,
                arrival={"process": "gamma", "rate_per_s": 50, "burstiness": burstiness},
                prompt_len={"dist": "fixed", "value": 4},
                output_len={"dist": "fixed", "value": 1},
            )
        )
    )
    assert g.mean() == pytest.approx(1 / 50, rel=0.05)
    assert g.var() / g.mean() ** 2 == pytest.approx(burstiness, rel=0.1)


def test_ar_poisson_follows_its_rate_and_schedule():
    fixed = dict(prompt_len={"dist": "fixed", "value": 4}, output_len={"dist": "fixed", "value": 1})
    reqs = generate(spec(requests=20000, arrival={"process": "ar_poisson", "rate_per_s": 100}, **fixed))
    assert 20000 / reqs[-1].arrival_s == pytest.approx(100, rel=0.05)
    sched = [{"at_s": 0, "rate_per_s": 10}, {"at_s": 20, "rate_per_s": 200}]
    reqs = generate(spec(requests=4000, arrival={"process": "ar_poisson", "rate_schedule": sched}, **fixed))
    t = np.array([r.arrival_s for r in reqs])
    assert np.sum(t < 20) == pytest.approx(200, rel=0.2)  # ~10/s for 20 s
    late = t[(t >= 25) & (t < 35)]  # the AR filter has caught up with 200/s after a few intervals
    assert late.size == pytest.approx(2000, rel=0.15)


def test_zipf_lengths_stay_in_range_and_favour_short():
    reqs = generate(
        spec(
            requests=5000,
            arrival={"process": "poisson", "rate_per_s": 10},
            prompt_len={"dist": "zipf", "a": 1.2, "min": 8, "max": 2000},
            output_len={"dist": "fixed", "value": 2},
        )
    )
    lens = np.array([r.prompt_len for r in reqs])
    assert lens.min() >= 8 and lens.max() <= 2000
    assert np.sum(lens == 8) > np.sum(lens == 9) > np.sum(lens == 20)


def test_prefix_groups_share_their_token_ids():
    reqs = generate(
        spec(
            requests=2000,
            arrival={"process": "poisson", "rate_per_s": 10},
            prompt_len={"dist": "fixed", "value": 10},
            output_len={"dist": "fixed", "value": 2},
            prefix_groups=[{"tokens": 128, "share": 0.5}, {"tokens": 64, "share": 0.25}],
        )
    )
    g0 = [r for r in reqs if r.prefix_group == 0]
    g1 = [r for r in reqs if r.prefix_group == 1]
    none = [r for r in reqs if r.prefix_group is None]
    assert len(g0) / 2000 == pytest.approx(0.5, abs=0.04) and len(g1) / 2000 == pytest.approx(0.25, abs=0.04)
    assert all(r.prompt_len == 138 and np.array_equal(r.prompt[:128], g0[0].prompt[:128]) for r in g0)
    assert all(r.prompt_len == 74 and np.array_equal(r.prompt[:64], g1[0].prompt[:64]) for r in g1)
    assert all(r.prompt_len == 10 for r in none)
    assert not np.array_equal(g0[0].prompt[128:], g0[1].prompt[128:])


def test_trace_replay(tmp_path):
    lines = [
        {"arrival_s": 0.5, "prompt_len": 7, "output_len": 3},
        {"arrival_s": 0.75, "prompt_tokens": [5, 6, 7, 8], "output_len": 1},
        {"arrival_s": 2.0, "prompt_len": 30, "output_len": 9},
    ]
    (tmp_path / "t.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    (tmp_path / "w.yaml").write_text("arrival: {process: trace, path: t.jsonl}\n")
    _, reqs = load_workload(tmp_path / "w.yaml")
    assert [r.arrival_s for r in reqs] == [0.5, 0.75, 2.0]
    assert [r.prompt_len for r in reqs] == [7, 4, 30] and [r.output_len for r in reqs] == [3, 1, 9]
    assert reqs[1].prompt.tolist() == [5, 6, 7, 8]
    # lengths may still come from a distribution; requests takes the first N lines
    (tmp_path / "w.yaml").write_text(
        "requests: 2\narrival: {process: trace, path: t.jsonl}\noutput_len: {dist: fixed, value: 5}\n"
    )
    _, reqs = load_workload(tmp_path / "w.yaml")
    assert len(reqs) == 2 and [r.output_len for r in reqs] == [5, 5]
    (tmp_path / "t.jsonl").write_text(
        '{"arrival_s": 0.5, "prompt_len": 7, "output_len": 3}\n{"arrival_s": "x"}\n'
    )
    with pytest.raises(ConfigError, match=r"t\.jsonl:2: arrival_s must be a number"):
        load_workload(tmp_path / "w.yaml")


@pytest.mark.parametrize(
    "text, match",
    [
        (MINIMAL.replace("rate_per_s: 20", "rate_per_s: -1"), r"arrival\.poisson\.rate_per_s"),
        (MINIMAL.replace("rate_per_s", "rate"), r"arrival\.poisson\.rate: unknown key"),
        (
            MINIMAL.replace("min: 32, max: 512", "min: 600, max: 512"),
            r"prompt_len\.uniform.*max 512 is below min 600",
        ),
        (MINIMAL.replace("requests: 1000\n", ""), r"requests: missing required key"),
        (MINIMAL.replace("dist: fixed", "dist: normal"), r"output_len"),
        (MINIMAL + "prefix_groups: [{tokens: 8, share: 0.7}, {tokens: 8, share: 0.7}]\n", r"shares add up"),
        ("seed: [1\n", r"w\.yaml:\d+:\d+: YAML syntax error"),
    ],
)
def test_bad_workloads_name_the_key(tmp_path, text, match):
    path = tmp_path / "w.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match) as info:
        load_workload(path)
    assert str(path) in info.value.message
