"""``mcpc sim serve`` on a real decoder build (the small Llama of tests/llm/decoders, fp16,
``--max-seq 256 --max-batch 4``): the cost grid measured by timing-only calls of its entries, one
request with ``--exact`` costs reproducing ``mcpc sim generate``'s TTFT and TPOT, and a workload's
grid-mode latencies within the grid's reported interpolation error of ``--exact``'s."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import mcpc
from mcpc.cli import cli
from mcpc.ir.decoder_import import DecoderBuild

LLAMA = Path(__file__).parents[1] / "llm" / "decoders" / "llama-with-past.onnx"


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    out = tmp_path_factory.mktemp("serve") / "llama.mcpb"
    mcpc.compile(LLAMA, qat_config="fp16", decoder=DecoderBuild(max_seq=256, max_batch=4), output=out)
    return out


def run(*args):
    res = CliRunner().invoke(cli, [*map(str, args)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res


@pytest.mark.slow
def test_one_request_exact_is_generate(llama, tmp_path):
    prompt = np.arange(3, 43)
    np.save(tmp_path / "ids.npy", prompt)
    run("sim", "generate", llama, "--prompt-ids", tmp_path / "ids.npy", "--max-new-tokens", 6,
        "--json", tmp_path / "gen.json")  # fmt: skip
    line = {"arrival_s": 0.0, "prompt_tokens": prompt.tolist(), "output_len": 6}
    (tmp_path / "one.jsonl").write_text(json.dumps(line) + "\n")
    (tmp_path / "one.yaml").write_text("arrival: {process: trace, path: one.jsonl}\n")
    run("sim", "serve", llama, "--workload", tmp_path / "one.yaml", "--exact", "--json", tmp_path / "s.json")
    gen, served = (json.loads((tmp_path / f).read_text()) for f in ("gen.json", "s.json"))
    assert served["ttft_ms"]["mean"] == pytest.approx(gen["ttft_ms"], rel=1e-12)
    assert served["tpot_ms"]["mean"] == pytest.approx(gen["tpot_ms"], rel=1e-12)


@pytest.mark.slow
def test_grid_within_its_error_of_exact(llama, tmp_path):
    (tmp_path / "w.yaml").write_text(
        "seed: 2\nrequests: 120\narrival: {process: poisson, rate_per_s: 2000}\n"
        "prompt_len: {dist: uniform, min: 8, max: 120}\noutput_len: {dist: uniform, min: 4, max: 64}\n"
        "prefix_groups: [{tokens: 64, share: 0.5}]\nvocab: 100\n"
    )
    work, grid_path = tmp_path / "w.yaml", tmp_path / "g.json"
    run("sim", "serve", llama, "--workload", work, "--cost-grid", grid_path, "--grid-points", 5,
        "--json", tmp_path / "grid.json")  # fmt: skip
    run(
        "sim", "serve", llama, "--workload", tmp_path / "w.yaml", "--exact", "--json", tmp_path / "exact.json"
    )
    grid, exact = (json.loads((tmp_path / f).read_text()) for f in ("grid.json", "exact.json"))
    err = grid["cost"]["interpolation_error"]
    bound = max(err["decode_max_rel"], err["prefill_max_rel"])
    assert 0 < bound < 0.05 and err["checked_points"] > 0
    for key in ("ttft_ms", "tpot_ms", "e2e_ms"):
        # a schedule may shift by whole iterations where two costs nearly tie: compare the means
        assert grid[key]["mean"] == pytest.approx(exact[key]["mean"], rel=2 * bound)
