"""Cross-kernel prefetch on whole models: race-free, same bits as without it, fewer cycles."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import mcpc
from mcpc.backend import BackendOptions, compile_to_program
from mcpc.backend.compile import sram_regions
from mcpc.backend.schedule import check_hazards
from mcpc.driver import load_target
from mcpc.examples import causal_mask, decoder_block, encoder_block, mlp
from mcpc.sim.api import run_program
from mcpc.sim.loader import from_program

TARGETS = ["mcp2026-a100", "mcp2026-a10", "mcp2026-edge"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 64, 256)).astype(np.float32)
    out = []
    for name, model, inputs, dims in (
        ("mlp", mlp(), {"x": rng.standard_normal((4, 256)).astype(np.float32)}, None),
        ("encoder", encoder_block(), {"x": x, "mask": causal_mask(64)}, None),
        ("decoder", decoder_block(), {"x": x[:, :32]}, {"seq": 32}),
    ):
        path = tmp_path_factory.mktemp("prefetch") / f"{name}.onnx"
        onnx.save(model, path)
        out.append((name, path, inputs, dims))
    return out


def _entries(program):
    instrs = program.instructions()
    for e in program.entries:
        yield instrs[e["start"] : e["start"] + e["count"]]


@pytest.mark.parametrize("qat_config", ["fp32.yaml", "fp16.yaml"])
@pytest.mark.parametrize("target", TARGETS)
def test_prefetch_is_race_free_bit_identical_and_faster(models, target, qat_config):
    for name, path, inputs, dims in models:
        result = mcpc.compile(path, target=target, qat_config=qat_config, dims=dims)
        assert result.program.meta["prefetch"] is True  # on by default
        off = compile_to_program(result.module, load_target(target), BackendOptions(prefetch=False))
        runs = {}
        for label, program in (("on", result.program), ("off", off)):
            for entry in _entries(program):
                check_hazards(entry)  # every SRAM/DRAM conflict ordered, tokens balanced
            runs[label] = run_program(from_program(program), inputs)
        for out, want in runs["off"].outputs.items():
            got = runs["on"].outputs[out]
            assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), (name, out)
        on_c, off_c = runs["on"].profile["cycles"], runs["off"].profile["cycles"]
        assert on_c < off_c, f"{name} on {target} {qat_config}: {on_c} cycles with prefetch, {off_c} without"


def test_pass_option_turns_prefetch_off(models):
    _, path, _, _ = models[0]
    result = mcpc.compile(path, qat_config="fp32.yaml", passes="dce,tile-matmul,npu-schedule{prefetch=false}")
    assert result.module.attrs["prefetch"] is False and result.program.meta["prefetch"] is False


def test_sram_regions_alternate_halves_then_fall_back():
    size, align = 1 << 20, 128
    half = size // 2
    assert sram_regions(size, align, None) == [(0, half), (0, size)]
    assert sram_regions(size, align, (0, 1000)) == [(half, half), (1024, size - 1024), (0, size)]
    assert sram_regions(size, align, (half, half)) == [(0, half), (0, size)]
    assert sram_regions(size, align, (0, size)) == [(0, size)]
    for prev in [(0, 1000), (half, 7), (300 * 128, 9000)]:
        for base, n in sram_regions(size, align, prev)[:-1]:  # all but the whole-SRAM fallback
            assert base % align == 0 and base + n <= size
            assert base >= prev[0] + prev[1] or base + n <= prev[0]  # disjoint from the previous
