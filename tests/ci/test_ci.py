"""``mcpc ci``: the issue's minimal checks file as written, budgets that fail with the measured value
and the limit, JUnit validated with junitparser, GitHub annotations, baselines, checks-file errors,
and the shipped examples/ci.yaml."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import junitparser
import pytest
from click.testing import CliRunner

from mcpc.ci import Build, compare_baseline, judge
from mcpc.cli import cli
from mcpc.measure import BuildSpec

REPO = Path(__file__).resolve().parents[2]

MINIMAL = """\
builds:
  - name: mlp-fp16
    model: example:mlp          # a bundled example by name, or an ONNX path relative to this file
    target: mcp2026-a100
    qat_config: fp16            # a shipped config name, or a path
    inputs: random              # or an .npz path
    budgets: {max_latency_us: 50, max_peak_memory_bytes: 8000000, max_mcpb_bytes: 4000000,
              min_cosine: 0.999, max_compile_s: 60}
"""


def _ci(*args: str):
    return CliRunner().invoke(cli, ["ci", *args], catch_exceptions=False)


@pytest.fixture(scope="module")
def minimal_run(tmp_path_factory):
    """The minimal file run once: (dir, result, json doc)."""
    d = tmp_path_factory.mktemp("ci")
    (d / "checks.yaml").write_text(MINIMAL)
    result = _ci(str(d / "checks.yaml"), "--json", str(d / "r.json"), "--junit", str(d / "r.xml"))
    return d, result, json.loads((d / "r.json").read_text())


def test_the_minimal_checks_file_passes_as_written(minimal_run):
    d, result, doc = minimal_run
    assert result.exit_code == 0, result.output
    (build,) = doc["builds"]
    assert build["name"] == "mlp-fp16" and build["status"] == "ok"
    m = build["metrics"]
    assert 0 < m["latency_us"] < 50 and m["cycles"] > 0
    assert 0 < m["peak_memory_bytes"] < 8_000_000 and 0 < m["mcpb_bytes"] < 4_000_000
    # the mlp's fp16 weights alone are 2 x 256 x 1024 x 2 bytes: memory and file hold at least them
    assert m["weight_bytes"] >= 2 * 256 * 1024 * 2 and m["mcpb_bytes"] > m["weight_bytes"]
    assert m["peak_memory_bytes"] >= m["weight_bytes"]
    assert m["min_cosine"] > 0.999 and build["memory"]["const"] == m["weight_bytes"]
    cases = {v["case"]: v["passed"] for v in build["budgets"]}
    assert cases == {k: True for k in ("max_latency_us", "max_peak_memory_bytes", "max_mcpb_bytes",
                                       "min_cosine", "max_compile_s", "numerics")}  # fmt: skip
    suite = junitparser.JUnitXml.fromfile(str(d / "r.xml"))
    assert suite.tests == 6 and suite.failures == 0


def test_a_tightened_budget_fails_naming_build_and_budget(minimal_run, tmp_path):
    _, _, doc = minimal_run
    latency = doc["builds"][0]["metrics"]["latency_us"]
    tight = latency * 0.5
    (tmp_path / "checks.yaml").write_text(MINIMAL.replace("max_latency_us: 50", f"max_latency_us: {tight}"))
    xml = tmp_path / "r.xml"
    result = _ci(str(tmp_path / "checks.yaml"), "--junit", str(xml), "--github")
    assert result.exit_code == 1, result.output
    assert "mlp-fp16" in result.output and "FAIL" in result.output and "max_latency_us" in result.output
    assert f"{tight:.7g}" in result.output  # the limit, and the measured value beside it
    assert "1 failed" in result.output
    # JUnit: validates, one case per budget + numerics, exactly the latency case failed
    junit = junitparser.JUnitXml.fromfile(str(xml))
    cases = {c.name: c for suite in junit for c in suite}
    assert len(cases) == 6 and junit.failures == 1
    failed = [name for name, c in cases.items() if not c.is_passed]
    assert failed == ["max_latency_us"]
    (failure,) = cases["max_latency_us"].result
    assert isinstance(failure, junitparser.Failure) and "latency_us" in failure.message
    # GitHub: one ::error annotation at the build's line of the checks file
    annotations = [line for line in result.output.splitlines() if line.startswith("::error")]
    assert len(annotations) == 1
    assert "line=2," in annotations[0] and "mlp-fp16" in annotations[0] and "max_latency_us" in annotations[0]


def test_baseline_update_then_regression(minimal_run, tmp_path):
    d, _, _ = minimal_run
    checks = tmp_path / "checks.yaml"
    checks.write_text("regression_pct: {latency_us: 5, mcpb_bytes: 1}\n" + MINIMAL)
    base = tmp_path / "base.json"
    result = _ci(str(checks), "--baseline", str(base), "--update-baseline")
    assert result.exit_code == 0, result.output
    assert base.is_file() and "wrote baseline" in result.output
    # the same build against its own baseline: no regression, the deltas are printed
    again = _ci(str(checks), "--baseline", str(base))
    assert again.exit_code == 0, again.output
    assert "against the baseline" in again.output and "REGRESSED" not in again.output
    # a baseline 20 % faster than this build: the latency regressed beyond 5 %
    doc = json.loads(base.read_text())
    doc["builds"][0]["metrics"]["latency_us"] /= 1.2
    base.write_text(json.dumps(doc))
    worse = _ci(str(checks), "--baseline", str(base), "--junit", str(tmp_path / "r.xml"))
    assert worse.exit_code == 1, worse.output
    assert "REGRESSED" in worse.output and "+20.00 %" in worse.output
    junit = junitparser.JUnitXml.fromfile(str(tmp_path / "r.xml"))
    failed = [c.name for suite in junit for c in suite if not c.is_passed]
    assert failed == ["regression:latency_us"]


def test_compare_baseline_directions():
    def row(**metrics):
        return {"name": "b", "status": "ok", "metrics": metrics}

    old = {"builds": [row(latency_us=100.0, min_cosine=0.999)]}
    pct = {"latency_us": 5.0, "min_cosine": 0.01}
    ok = compare_baseline([row(latency_us=104.0, min_cosine=0.999)], old, pct)
    assert [r["regressed"] for r in ok] == [False, False]
    bad = compare_baseline([row(latency_us=90.0, min_cosine=0.99)], old, pct)
    # faster is never a regression; a cosine lower by 0.9 % is (higher is better)
    assert [(r["metric"], r["regressed"]) for r in bad] == [("latency_us", False), ("min_cosine", True)]


def test_judge_a_failed_build_and_an_unmeasured_metric():
    build = Build(BuildSpec("b", "m.onnx"), {"max_latency_us": 10, "min_top1": 0.9}, 3)
    failed = judge(build, {"status": "error", "exit_code": 4, "reason": "op Foo is not supported"})
    assert all(not v["passed"] and "exit 4" in v["message"] and "Foo" in v["message"] for v in failed)
    assert [v["case"] for v in failed] == ["max_latency_us", "min_top1", "numerics"]
    ran = judge(build, {"status": "ok", "numeric": None, "metrics": {"latency_us": 5.0, "min_top1": None}})
    verdict = {v["case"]: v for v in ran}
    assert verdict["max_latency_us"]["passed"] and verdict["numerics"]["passed"]
    assert not verdict["min_top1"]["passed"] and "not measured" in verdict["min_top1"]["message"]
    nan = judge(build, {"status": "ok", "numeric": "NaN at 0x12 (node x)", "metrics": {"latency_us": 5.0}})
    assert not {v["case"]: v for v in nan}["numerics"]["passed"]


def test_a_build_that_cannot_compile_fails_its_budgets(tmp_path):
    (tmp_path / "c.yaml").write_text(
        "builds:\n  - name: dec\n    model: example:decoder_block\n    budgets: {max_latency_us: 1000}\n"
    )
    result = _ci(str(tmp_path / "c.yaml"), "--json", str(tmp_path / "r.json"))
    assert result.exit_code == 1, result.output
    doc = json.loads((tmp_path / "r.json").read_text())
    build = doc["builds"][0]
    assert build["status"] == "error" and build["exit_code"] == 3 and "seq" in build["reason"]
    assert "build failed (exit 3)" in build["budgets"][0]["message"]


@pytest.mark.parametrize(
    "body, words",
    [
        ("builds:\n  - name: a\n    model: example:mlp\n    budgets: {max_latncy_us: 5}\n",
         ["c.yaml:2", "max_latncy_us", "max_latency_us"]),
        ("builds:\n  - name: a\n    model: nothere.onnx\n", ["c.yaml:2", "'a'", "nothere.onnx"]),
        ("builds:\n  - name: a\n    model: example:nosuch\n", ["no such bundled example", "mlp"]),
        ("builds:\n  - name: a\n    model: example:mlp\n    colour: red\n",
         ["c.yaml:2", "colour", "unknown key"]),
        ("builds: []\n", ["builds"]),
        ("regression_pct: {speed: 3}\nbuilds:\n  - {name: a, model: example:mlp}\n", ["speed", "latency_us"]),
        ("builds:\n  - {name: a, model: example:mlp}\n  - {name: a, model: example:mlp}\n", ["second build"]),
        ("builds: [\n", ["YAML syntax error"]),
    ],
)  # fmt: skip
def test_checks_file_errors_name_file_line_and_key(tmp_path, body, words):
    (tmp_path / "c.yaml").write_text(body)
    result = CliRunner().invoke(cli, ["ci", str(tmp_path / "c.yaml")])
    assert result.exit_code == 3, result.output
    assert "Traceback" not in result.output
    for word in words:
        assert word in result.output, (word, result.output)


def test_calib_in_a_checks_file_is_never_ignored(tmp_path):
    """A build's calib: reaches the compiler, which refuses data a float config would ignore."""
    from mcpc.ci import load_checks

    (tmp_path / "calib.npz").write_bytes(b"")
    (tmp_path / "c.yaml").write_text("builds:\n  - {name: a, model: example:mlp, calib: calib.npz}\n")
    checks = load_checks(tmp_path / "c.yaml", tmp_path / "ex")
    assert checks.builds[0].spec.calib == str(tmp_path / "calib.npz")


def test_update_baseline_needs_a_path(tmp_path):
    (tmp_path / "c.yaml").write_text(MINIMAL)
    result = CliRunner().invoke(cli, ["ci", str(tmp_path / "c.yaml"), "--update-baseline"])
    assert result.exit_code == 2 and "--baseline" in result.output


def test_shipped_examples_ci_yaml_passes_after_building_the_examples(tmp_path):
    """examples/ci.yaml as on a fresh clone after `make demo` (the examples in out/ beside it)."""
    from mcpc.examples import build_examples

    (tmp_path / "examples").mkdir()
    for name in ("ci.yaml", "llama_tokens.npy"):
        shutil.copy(REPO / "examples" / name, tmp_path / "examples" / name)
    (tmp_path / "tests" / "llm").mkdir(parents=True)
    (tmp_path / "tests" / "llm" / "decoders").symlink_to(REPO / "tests" / "llm" / "decoders")
    build_examples(tmp_path / "out")
    result = _ci(str(tmp_path / "examples" / "ci.yaml"), "--json", str(tmp_path / "r.json"))
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "r.json").read_text())
    names = [b["name"] for b in doc["builds"]]
    assert len(names) == 9 and "encoder-block/mcp2026-edge/fp32" in names
    assert all(b["status"] == "ok" for b in doc["builds"])
    (dec,) = [b for b in doc["builds"] if b["name"] == "llama-decoder-fp16"]
    assert {v["case"] for v in dec["budgets"]} >= {"max_ppl_change_pct", "max_ppl"}
    assert abs(dec["metrics"]["ppl_change_pct"]) < 0.5
