"""The ONNX backend node tests through mcpc, held to a committed expected-results file.

``expected_status.json`` lists every node test of the onnx version it was made with and its status
at level 1 (import + IR interpreter) and level 2 (fp32 build for mcp2026-a100 + simulator); tests
using op types the importer does not list are ``not_attempted``.  Any change of status — a pass
that breaks, an unsupported test that starts passing, an op newly listed — fails here and must be
acknowledged by regenerating the file:

    MCPC_UPDATE_CONFORMANCE=1 .venv/bin/pytest tests/conformance

With a different onnx version installed, tests known to both must keep their status and tests
new to this version must not fail or error.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from mcpc import conformance as conf

EXPECTED = Path(__file__).with_name("expected_status.json")
TARGET = "mcp2026-a100"


def _status(r: conf.CaseResult, level: str) -> str:
    return getattr(r, level) if r.attempted else "not_attempted"


@pytest.fixture(scope="module")
def results() -> list[conf.CaseResult]:
    return conf.run_conformance(target=TARGET)


def test_statuses_match_the_committed_expectations(results):
    import onnx

    current = {r.name: {lv: _status(r, lv) for lv in ("level1", "level2")} for r in results}
    if os.environ.get("MCPC_UPDATE_CONFORMANCE"):
        doc = {"onnx_version": onnx.__version__, "target": TARGET, "tests": current}
        EXPECTED.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    expected = json.loads(EXPECTED.read_text())["tests"]
    changed = [
        f"{name}: {lv} {expected[name][lv]} -> {st[lv]}"
        for name, st in current.items()
        if name in expected
        for lv in st
        if st[lv] != expected[name][lv]
    ]
    new_bad = [
        f"{name}: {lv} {st[lv]}"
        for name, st in current.items()
        if name not in expected
        for lv in st
        if st[lv] in ("fail", "error")
    ]
    details = {r.name: (r.level1_detail, r.level2_detail) for r in results}
    assert not changed and not new_bad, (
        "conformance status changed (regenerate expected_status.json with MCPC_UPDATE_CONFORMANCE=1 "
        "once the change is intended):\n"
        + "\n".join(
            f"{line}  [{' | '.join(details[line.split(':')[0]])[:200]}]" for line in changed + new_bad
        )
    )


def test_no_attempted_test_fails_or_errors(results):
    bad = [(r.name, r.level1, r.level1_detail, r.level2, r.level2_detail) for r in results if r.attempted]
    bad = [b for b in bad if {"fail", "error"} & {b[1], b[3]}]
    assert not bad


def test_the_yardstick_is_not_empty(results):
    # guards against a silently empty run (e.g. the onnx package no longer shipping the cases)
    s = conf.summarize(results)
    assert s["tests"] > 1000 and s["totals"]["level1"]["pass"] > 400 and s["totals"]["level2"]["pass"] > 400


@pytest.mark.slow
@pytest.mark.parametrize("target", ["mcp2026-edge", "mcp2026-a10"])
def test_other_targets_agree_with_a100(results, target):
    other = {r.name: r.level2 for r in conf.run_conformance(target=target)}
    assert {r.name: r.level2 for r in results} == other


# -- the runner's own pieces ---------------------------------------------------------------------
def test_compare_outputs_follows_onnx_backend_rules():
    r = np.array([1.0, np.nan, np.inf], dtype=np.float32)
    assert conf.compare_outputs([r.copy()], [r], 1e-3, 1e-7) is None
    assert "outside" in conf.compare_outputs([np.array([1.002, np.nan, np.inf], np.float32)], [r], 1e-3, 1e-7)
    assert "dtype" in conf.compare_outputs([r.astype(np.float16)], [r], 1e-3, 1e-7)
    assert "shape" in conf.compare_outputs([r[:2]], [r], 1e-3, 1e-7)
    assert "differ" in conf.compare_outputs([np.array([1, 3])], [np.array([1, 2])], 1e-3, 1e-7)
    mask = np.array([False, True])
    assert conf.compare_outputs([np.array([1, 3])], [np.array([1, 2])], 1e-3, 1e-7, [mask]) is None


def test_statuses_are_classified():
    by_name = {
        r.name: r for r in conf.run_conformance(names={"test_relu", "test_cast_FLOAT_to_FLOAT8E4M3FN"})
    }
    assert by_name["test_relu"].level1 == "pass"
    names = {"test_cast_FLOAT_to_DOUBLE", "test_mod_broadcast", "test_reduce_sum_keepdims_example"}
    got = {r.name: r for r in conf.run_conformance(names=names)}
    assert got["test_cast_FLOAT_to_DOUBLE"].level1 == "unsupported"  # f64 output: a clear UnsupportedError
    assert not got["test_mod_broadcast"].attempted and got["test_mod_broadcast"].missing_ops == ["Mod"]
    # axes arrive as a graph input: bound as a constant (mcpc compiles static graphs), and recorded
    assert got["test_reduce_sum_keepdims_example"].frozen_inputs == ["axes"]


def test_out_of_range_float_to_int_cast_is_not_compared():
    (case,) = conf.load_cases({"test_cast_FLOAT_to_INT4"})
    feeds = conf._feeds(case, case.data_sets[0][0])
    (mask,) = conf._undefined(case, feeds)
    x = case.data_sets[0][0][0]
    np.testing.assert_array_equal(mask, (x < -8) | (x > 7))
