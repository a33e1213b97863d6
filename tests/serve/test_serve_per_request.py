"""``mcpc sim serve --json``'s per-request records and timeline (what ``mcpc report`` plots): they
agree with the summary statistics of the same run."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from serve_helpers import COST, MINIMAL

from mcpc.cli import cli


def test_per_request_and_timeline_agree_with_the_summary(tmp_path):
    (tmp_path / "w.yaml").write_text(MINIMAL.replace("requests: 1000", "requests: 300"))
    (tmp_path / "c.yaml").write_text(COST)
    res = CliRunner().invoke(
        cli,
        ["sim", "serve", str(tmp_path / "c.yaml"), "--workload", str(tmp_path / "w.yaml"),
         "--json", str(tmp_path / "r.json")],
        catch_exceptions=False,
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    r = json.loads((tmp_path / "r.json").read_text())
    reqs = r["per_request"]
    assert [q["id"] for q in reqs] == sorted(q["id"] for q in reqs) and len(reqs) == r["requests"] == 300
    for key in ("ttft_ms", "e2e_ms", "queue_ms", "tpot_ms"):
        values = np.array([q[key] for q in reqs if q[key] is not None])
        assert values.size == r[key]["count"]
        assert np.percentile(values, 90) == pytest.approx(r[key]["p90"], rel=1e-12)
        assert values.mean() == pytest.approx(r[key]["mean"], rel=1e-12)
    for q in reqs:
        assert q["arrival_s"] <= q["first_token_s"] <= q["finish_s"]
        assert q["e2e_ms"] >= q["ttft_ms"] >= q["queue_ms"] >= 0
    assert sum(q["output_tokens"] for q in reqs) == r["generated_tokens"]
    t = r["timeline"]
    n = r["npu"]["iterations"]
    assert all(len(t[k]) == n for k in ("t_s", "tokens", "kv_blocks_used", "decode_batch", "waiting"))
    assert np.all(np.diff(t["t_s"]) > 0)
    # every generated token is counted once, in the iteration that emitted it
    assert sum(t["tokens"]) == r["generated_tokens"]
    assert all(tok >= d for tok, d in zip(t["tokens"], t["decode_batch"], strict=True))
    assert max(t["kv_blocks_used"]) == r["kv"]["peak_blocks"]
    assert t["t_s"][-1] == max(q["finish_s"] for q in reqs)


def test_a_fleet_has_per_request_records_and_one_timeline_over_its_replicas(tmp_path):
    (tmp_path / "w.yaml").write_text(MINIMAL.replace("requests: 1000", "requests: 300"))
    (tmp_path / "c.yaml").write_text(COST)
    res = CliRunner().invoke(
        cli,
        ["sim", "serve", str(tmp_path / "c.yaml"), "--workload", str(tmp_path / "w.yaml"),
         "--replicas", "3", "--json", str(tmp_path / "r.json")],
        catch_exceptions=False,
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    r = json.loads((tmp_path / "r.json").read_text())
    assert len(r["per_request"]) == r["requests"] == 300
    t = r["timeline"]
    assert len(t["t_s"]) == sum(rep["npu"]["iterations"] for rep in r["replicas"])
    assert np.all(np.diff(t["t_s"]) >= 0) and sum(t["tokens"]) == r["generated_tokens"]
    # the fleet's KV in use at any time is the replicas' sum: at least each replica's own peak
    assert max(t["kv_blocks_used"]) >= max(rep["kv"]["peak_blocks"] for rep in r["replicas"])
    assert max(t["decode_batch"]) <= 3 * r["shape"]["max_batch"]
