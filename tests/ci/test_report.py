"""``mcpc report`` and ``mcpc sim run --report``: each result kind recognised by its content and
drawn with its figures, the page self-contained; the Pareto front; unknown files refused."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import require_chromium

from mcpc.cli import cli
from mcpc.report_plots import kv_pool_bytes, pareto_front

LLAMA = Path(__file__).resolve().parents[1] / "llm" / "decoders" / "llama-with-past.onnx"
SERVE_COST = """\
kind: analytic
clock_mhz: 1000
max_batch: 16
max_seq: 1024
prefill_chunk: 64
kv_blocks: 64
kv_bytes_per_token: 1024
decode: {base: 2000000, per_seq: 20000, per_kv_token: 300}
prefill: {base: 1500000, per_token: 30000, per_attended: 20}
"""
SERVE_WORKLOAD = """\
seed: 1
requests: 200
arrival: {process: poisson, rate_per_s: 20}
prompt_len: {dist: uniform, min: 32, max: 512}
output_len: {dist: uniform, min: 1, max: 96}
"""


@pytest.fixture(scope="module")
def results(examples_dir, tmp_path_factory):
    """A profile JSON (sim run), a ci JSON and a sweep JSONL of the bundled examples."""
    d = tmp_path_factory.mktemp("report")
    r = CliRunner()
    enc = examples_dir / "encoder_block"
    assert r.invoke(cli, ["compile", "-o", str(d / "enc.mcpb"), f"{enc}.onnx"]).exit_code == 0
    run = r.invoke(cli, ["sim", "run", str(d / "enc.mcpb"), "--inputs", f"{enc}.npz", "--profile-json",
                         str(d / "profile.json"), "--report", str(d / "run.html")])  # fmt: skip
    assert run.exit_code == 0, run.output
    (d / "c.yaml").write_text(
        f"builds:\n  - name: enc\n    model: {enc}.onnx\n    inputs: {enc}.npz\n"
        "    target: [mcp2026-a100, mcp2026-edge]\n    budgets: {max_latency_us: 25, min_cosine: 0.999}\n"
    )
    ci = r.invoke(cli, ["ci", str(d / "c.yaml"), "--json", str(d / "ci.json")])
    assert ci.exit_code == 1, ci.output  # the edge build is slower than 25 µs (a100: about 15)
    sweep = r.invoke(cli, ["sweep", str(examples_dir / "mlp.onnx"), "--configs", "fp16,fp32,nope*.yaml",
                           "--targets", "mcp2026-a100,mcp2026-edge", "-o", str(d / "s.jsonl")])  # fmt: skip
    assert sweep.exit_code == 2  # a glob matching nothing is a usage error ...
    (d / "bad.yaml").write_text("schema: 1\nname: bad\nprecision: {weights: f16}\npipeline: fp16\n")
    configs = f"fp16,fp32,{d / 'bad.yaml'}"
    sweep = r.invoke(cli, ["sweep", str(examples_dir / "mlp.onnx"), "--configs", configs,
                           "--targets", "mcp2026-a100,mcp2026-edge", "-o", str(d / "s.jsonl")])  # fmt: skip
    assert sweep.exit_code == 0, sweep.output  # ... a config that does not load is a row with its reason
    # serving: an analytic cost file and a workload
    (d / "cost.yaml").write_text(SERVE_COST)
    (d / "w.yaml").write_text(SERVE_WORKLOAD)
    serve = r.invoke(cli, ["sim", "serve", str(d / "cost.yaml"), "--workload", str(d / "w.yaml"),
                           "--json", str(d / "serve.json")])  # fmt: skip
    assert serve.exit_code == 0, serve.output
    # a decoder build's decode step: its profile carries META decoder (the KV cache apart)
    dec = r.invoke(cli, ["compile", "-o", str(d / "dec.mcpb"), str(LLAMA), "--max-seq", "128",
                         "--max-batch", "2"])  # fmt: skip
    assert dec.exit_code == 0, dec.output
    run = r.invoke(cli, ["sim", "run", str(d / "dec.mcpb"), "--entry", "decode", "--random-inputs",
                         "--set-reg", "kv_blocks=2", "--profile-json", str(d / "dec_prof.json")])  # fmt: skip
    assert run.exit_code == 0, run.output
    return d


def _figures(page: str) -> list[str]:
    return re.findall(r'<figure class="plot" data-kind="([a-z-]+)"><svg', page)


def _self_contained(page: str) -> None:
    assert "<script" not in page and "<link" not in page and "<img" not in page
    # the only URLs are XML namespace names, which are never fetched
    urls = set(re.findall(r"https?://[^\"' )]+", page))
    assert urls <= {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}, urls


def test_sim_run_report_draws_the_run(results):
    page = (results / "run.html").read_text()
    assert _figures(page) == ["node-breakdown", "roofline", "memory"]
    _self_contained(page)
    profile = json.loads((results / "profile.json").read_text())
    assert f"{profile['cycles']:,} cycles" in page
    # the stacked bars are the node's engine cycles and idle time: they add up to what the profile says
    for node in profile["nodes"]:
        assert sum(node["engine_cycles"].values()) == node["cycles"]
        assert 0 <= node["idle"] <= node["span"]
    assert sum(n["macs"] for n in profile["nodes"]) == profile["macs"]
    assert (
        sum(n["dram_bytes"] for n in profile["nodes"])
        == profile["dram_read_bytes"] + profile["dram_write_bytes"]
    )
    mem = profile["memory"]
    assert mem["bytes_per_kind"]["const"] > 0 and mem["peak_bytes"] >= sum(mem["bytes_per_kind"].values())


def test_report_recognises_each_kind(results, tmp_path):
    out = tmp_path / "all.html"
    files = [str(results / n) for n in ("ci.json", "profile.json", "s.jsonl")]
    result = CliRunner().invoke(cli, ["report", *files, "-o", str(out)])
    assert result.exit_code == 0, result.output
    page = out.read_text()
    assert f"{out.stat().st_size:,} bytes" in result.output
    kinds = re.findall(r'<section class="source" data-kind="([a-z]+)"', page)
    assert kinds == ["ci", "profile", "sweep"]
    assert _figures(page) == ["budgets", "memory", "node-breakdown", "roofline", "memory", "pareto", "memory"]
    _self_contained(page)
    # the failed budget and the config that could not load are in the page, with their reasons
    assert "enc/mcp2026-edge/fp16" in page and "FAIL" in page
    assert "bad.yaml" in page and "missing required key" in page


def test_report_draws_serving_and_a_decoder_builds_memory(results, tmp_path):
    from mcpc.sim.api import load_program
    from mcpc.sim.decoder import DecoderMeta, block_bytes

    out = tmp_path / "serve.html"
    files = [str(results / n) for n in ("serve.json", "dec_prof.json")]
    result = CliRunner().invoke(cli, ["report", *files, "-o", str(out)])
    assert result.exit_code == 0, result.output
    page = out.read_text()
    assert re.findall(r'<section class="source" data-kind="([a-z]+)"', page) == ["serve", "profile"]
    assert _figures(page) == ["latency-cdf", "serving-timeline", "node-breakdown", "roofline", "memory"]
    _self_contained(page)
    serve = json.loads((results / "serve.json").read_text())
    assert f"{serve['requests']:,} requests" in page and len(serve["per_request"]) == 200
    # the KV cache of the memory figure: the pool META decoder describes, as the simulator sizes a block
    profile = json.loads((results / "dec_prof.json").read_text())
    meta = DecoderMeta.from_program(load_program(results / "dec.mcpb"))
    kv = kv_pool_bytes(profile["decoder"])
    assert kv == meta.kv_blocks * block_bytes(meta) == 4 * 2 * 2 * 2 * 64 * 16 * 2
    assert f"of which the KV cache {kv:,}" in page
    assert kv <= profile["memory"]["bytes_per_kind"]["persistent"]
    # a serving result without per-request records (an older file) says how to get the CDFs
    old = {k: v for k, v in serve.items() if k not in ("per_request", "timeline")}
    (tmp_path / "old.json").write_text(json.dumps(old))
    result = CliRunner().invoke(cli, ["report", str(tmp_path / "old.json"), "-o", str(tmp_path / "o.html")])
    assert result.exit_code == 0, result.output
    assert (
        _figures((tmp_path / "o.html").read_text()) == []
        and "run mcpc sim serve" in (tmp_path / "o.html").read_text()
    )


def test_report_refuses_what_it_does_not_know(tmp_path):
    (tmp_path / "x.json").write_text('{"hello": 1}')
    result = CliRunner().invoke(cli, ["report", str(tmp_path / "x.json"), "-o", str(tmp_path / "r.html")])
    assert result.exit_code == 3 and "x.json" in result.output and "profile-json" in result.output
    assert not (tmp_path / "r.html").exists()
    result = CliRunner().invoke(cli, ["report", str(tmp_path / "no.json"), "-o", str(tmp_path / "r.html")])
    assert result.exit_code == 3 and "no such file" in result.output


def test_pareto_front():
    pts = [(1.0, 5.0), (2.0, 3.0), (3.0, 3.0), (4.0, 1.0), (5.0, 2.0), (1.0, 6.0)]
    # (3,3) loses to (2,3); (5,2) to (4,1); (1,6) to (1,5)
    assert pareto_front(pts) == [0, 1, 3]
    assert pareto_front([(1.0, 1.0), (1.0, 1.0)]) == [0, 1]  # equal builds are both on the front


@pytest.mark.slow
@pytest.mark.browser
def test_report_renders_in_headless_chromium(results, tmp_path):
    """The report of every kind in a real browser: every figure drew, nothing on the console."""
    require_chromium()
    from chromium import render
    from PIL import Image

    page = tmp_path / "report.html"
    names = ("ci.json", "profile.json", "s.jsonl", "serve.json", "dec_prof.json")
    files = [str(results / n) for n in names]
    assert CliRunner().invoke(cli, ["report", *files, "-o", str(page)]).exit_code == 0
    shot = tmp_path / "report.png"
    seen = render(page, shot)
    assert seen["console_errors"] == [], seen["console"]
    kinds = _figures(page.read_text())
    assert [f["kind"] for f in seen["figures"]] == kinds and len(kinds) == 12
    assert {"latency-cdf", "serving-timeline", "pareto", "roofline", "budgets"} <= set(kinds)
    for f in seen["figures"]:
        assert f["width"] > 300 and f["height"] > 100, f
        assert f["drawn_paths"] > 10, f  # axes, ticks, bars or points: an empty svg draws none
    with Image.open(shot) as img:
        assert img.format == "PNG" and img.width == 1200 and img.height > 2000
        colors = img.convert("RGB").getcolors(maxcolors=1 << 20)
        assert colors is not None and len(colors) > 50  # a blank or failed page is a handful of colours
