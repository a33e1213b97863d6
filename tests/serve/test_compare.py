"""``mcpc compare``: the headline table of two decoder builds of the small Llama fixture (fp16 +
static batching against W4A16 + INT8 KV + continuous batching), its JSON, the memory breakdown
adding up from the programs' memory maps and the KV manager's peak, and the exits on mismatched
programs and bad files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from serve_helpers import DECODER_META, decoder_program, runnable_decoder

import mcpc
from mcpc.cli import cli
from mcpc.ir.decoder_import import DecoderBuild
from mcpc.serve.compare import memory_breakdown

LLAMA = Path(__file__).parents[1] / "llm" / "decoders" / "llama-with-past.onnx"

WORKLOAD = """\
seed: 4
requests: 50
arrival: {process: poisson, rate_per_s: 3000}
prompt_len: {dist: uniform, min: 8, max: 90}
output_len: {dist: uniform, min: 2, max: 30}
"""


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    d = tmp_path_factory.mktemp("compare")
    base, opt = d / "fp16.mcpb", d / "w4kv8.mcpb"
    build = DecoderBuild(max_seq=128, max_batch=2)
    mcpc.compile(LLAMA, qat_config="fp16", decoder=build, output=base)
    mcpc.compile(LLAMA, qat_config="qat_w4a16_kv8", decoder=build, output=opt)
    (d / "w.yaml").write_text(WORKLOAD)
    (d / "static.yaml").write_text("policy: static\nbatch_size: 2\n")
    return d, base, opt


def run(*args):
    return CliRunner().invoke(cli, ["compare", *map(str, args)], catch_exceptions=False)


def test_headline_table_and_json(builds):
    d, base, opt = builds
    res = run(base, opt, "--workload", d / "w.yaml", "--policy-base", d / "static.yaml",
              "--json", d / "r.json", "--grid-points", 3)  # fmt: skip
    assert res.exit_code == 0, res.output
    for label in ("TTFT mean", "E2E latency p99", "peak NPU memory", "throughput (tokens/s)", "seed's claim"):
        assert label in res.output
    assert "fp16.mcpb (fp16, KV f16) + static" in res.output
    assert "w4kv8.mcpb (w4a16_kv8, KV int8) + continuous" in res.output
    r = json.loads((d / "r.json").read_text())
    assert set(r) >= {"base", "opt", "change", "seed_claims", "workload", "requests"}
    assert r["requests"] == 50 and r["base"]["policy"] == "static" and r["opt"]["policy"] == "continuous"
    b, o, ch = r["base"], r["opt"], r["change"]
    for side in (b, o):
        assert side["requests"] == 50 and side["cost"]["mode"] == "grid"
        for key in ("ttft_ms", "tpot_ms", "e2e_ms"):
            assert set(side[key]) >= {"mean", "p50", "p90", "p99"}
    # the change column is computed from the two runs: opt / base - 1, throughput opt / base
    assert ch["e2e_ms_p99"] == pytest.approx(o["e2e_ms"]["p99"] / b["e2e_ms"]["p99"] - 1)
    mem = o["memory"]["total_bytes"] / b["memory"]["total_bytes"]
    assert ch["memory_total_bytes"] == pytest.approx(mem - 1)
    assert ch["throughput_tokens_per_s_ratio"] == pytest.approx(
        o["throughput_tokens_per_s"] / b["throughput_tokens_per_s"]
    )
    # the seed's figures are reported as claims, apart from the measurements
    assert r["seed_claims"]["latency"]["change"] == "-62.8 %" and "not measured" in r["seed_claims"]["note"]


def test_memory_breakdown_adds_up(builds):
    from mcpc.sim.api import load_program

    d, base, opt = builds
    res = run(base, opt, "--workload", d / "w.yaml", "--json", d / "m.json", "--grid-points", 3)
    assert res.exit_code == 0, res.output
    r = json.loads((d / "m.json").read_text())
    for side, path in ((r["base"], base), (r["opt"], opt)):
        m = side["memory"]
        assert m["total_bytes"] == m["weights_bytes"] + m["kv_peak_bytes"] + m["activation_bytes"]
        loaded = load_program(path)
        assert m["weights_bytes"] == len(loaded.program.constants) > 0
        # the KV figure is the run's peak: blocks referenced at once x the bytes one block is stored in
        assert m["kv_peak_bytes"] == side["kv"]["peak_blocks"] * side["program"]["kv_block_bytes"] > 0
        assert m["activation_bytes"] > 0 and m["kv_pool_bytes"] > 0
        assert m["total_bytes"] <= m["dram_planned_bytes"] + m["kv_peak_bytes"]
    # fp16 KV: layers x K|V x kv heads x 64 tokens x head_dim x 2 bytes; INT8 KV stores 1 byte a value
    # plus a scale and zero point per head_dim values: smaller, though the program's cache globals
    # (what the entries read back) are the same f16 in both
    assert r["base"]["program"]["kv_block_bytes"] == 2 * 2 * 2 * 64 * 16 * 2
    assert r["opt"]["program"]["kv_block_bytes"] < 0.65 * r["base"]["program"]["kv_block_bytes"]
    # the compressing build reserves its plain cache globals (the block being filled is read from
    # them) plus the pool its full blocks are stored in, sized for the worst case, and its descriptors
    layout = load_program(opt).meta["decoder"]["kv_pool"]
    reserved = r["base"]["memory"]["kv_pool_bytes"] + layout["pool_bytes"] + layout["desc_bytes"]
    assert reserved <= r["opt"]["memory"]["kv_pool_bytes"] <= reserved + 64
    # int4 weights, the LM head kept f16 (on this small decoder a third of the weights)
    assert r["opt"]["memory"]["weights_bytes"] < 0.65 * r["base"]["memory"]["weights_bytes"]


def test_activation_regions_counted_once():
    """Regions sharing DRAM (entries whose scratch overlaps) count once; weights and the cache
    globals are apart."""

    class Loaded:
        memory_map = {
            "dram_size": 1000,
            "regions": [
                {"kind": "const", "dram": 0, "bytes": 100},
                {"kind": "persistent", "dram": 100, "bytes": 200},
                {"kind": "input", "dram": 300, "bytes": 50},
                {"kind": "scratch", "dram": 350, "bytes": 300},
                {"kind": "scratch", "dram": 400, "bytes": 100},  # inside the first scratch
                {"kind": "output", "dram": 600, "bytes": 100},  # overlaps it by 50
            ],
        }

    m = memory_breakdown(Loaded(), 40)
    assert (m["weights_bytes"], m["activation_bytes"], m["kv_pool_bytes"]) == (100, 400, 200)
    assert m["total_bytes"] == 540 and m["dram_planned_bytes"] == 1000


def test_mismatched_and_bad_programs(tmp_path):
    (tmp_path / "w.yaml").write_text(WORKLOAD)
    work = tmp_path / "w.yaml"
    meta = dict(DECODER_META, max_batch=2, max_seq=128, kv_blocks=4, prefill_chunk=32, vocab=10)
    a = runnable_decoder(tmp_path / "a.mcpb", meta)
    b = runnable_decoder(tmp_path / "b.mcpb", dict(meta, vocab=12))
    res = run(a, b, "--workload", work)
    assert res.exit_code == 2 and "not builds of the same model" in res.output
    assert "vocab 10 vs 12" in res.output
    c = runnable_decoder(tmp_path / "c.mcpb", dict(meta, layers=29, kv_heads=2))
    res = run(a, c, "--workload", work)
    assert res.exit_code == 2 and "layers 30 vs 29" in res.output and "kv_heads 3 vs 2" in res.output
    # not a decoder build
    plain = decoder_program(tmp_path / "plain.mcpb", None)
    res = run(a, plain, "--workload", work)
    assert res.exit_code == 2 and "plain.mcpb" in res.output and "--max-seq" in res.output
    # not a program at all
    (tmp_path / "junk.mcpb").write_bytes(b"not a program")
    res = run(a, tmp_path / "junk.mcpb", "--workload", work)
    assert res.exit_code == 3 and "junk.mcpb" in res.output and "Traceback" not in res.output
    # the same program under the same policy compares nothing
    res = run(a, a, "--workload", work)
    assert res.exit_code == 2 and "same program" in res.output
    # a bad workload: exit 3 naming the key
    (tmp_path / "bad.yaml").write_text(WORKLOAD + "arival: 3\n")
    b_ok = runnable_decoder(tmp_path / "b_ok.mcpb", dict(meta, max_batch=1))
    res = run(a, b_ok, "--workload", tmp_path / "bad.yaml")
    assert res.exit_code == 3 and "arival" in res.output
    # a workload longer than a build's max_seq: exit 3 before anything runs
    (tmp_path / "long.yaml").write_text(WORKLOAD.replace("max: 90", "max: 200"))
    res = run(a, b_ok, "--workload", tmp_path / "long.yaml")
    assert res.exit_code == 3 and "max_seq 128" in res.output


def test_shipped_headline_files_fit_the_build():
    """examples/serve/headline.yaml and its policies load and fit the bench's --max-seq 1024
    --max-batch 16 builds: 1000 requests of mixed lengths."""
    from mcpc.serve import ServedShape, load_policy, load_workload

    ex = Path(__file__).parents[2] / "examples" / "serve"
    spec, reqs = load_workload(ex / "headline.yaml")
    assert len(reqs) == 1000 and max(r.prompt_len + r.output_len for r in reqs) <= 1024
    prompts = sorted(r.prompt_len for r in reqs)
    assert prompts[0] < 64 and prompts[-1] > 512  # short and long prompts both
    shape = ServedShape(16, 1024, 64, 256)
    assert load_policy(ex / "headline_continuous.yaml", shape).max_seqs == 16
    assert load_policy(ex / "static16.yaml", shape).spec.batch_size == 16
