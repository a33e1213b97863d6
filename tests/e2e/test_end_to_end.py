"""Compile + simulate against ONNX Runtime on generated models, for every target and both builds.

The acceptance bounds of the back half of the spine: normalized max error ≤ 1e-4 (fp32 build) and
≤ 2e-2 (fp16 build); SRAM peak within the target; the binary is deterministic.
"""

from __future__ import annotations

import numpy as np
import pytest
from e2e_util import TARGETS, compile_and_run, norm_max_err

from mcpc.examples import causal_mask, decoder_block, encoder_block, mlp

BOUND = {"fp32.yaml": 1e-4, "fp16.yaml": 2e-2}


def _encoder_inputs(seq=64, hidden=256, seed=1):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((1, seq, hidden)).astype(np.float32), "mask": causal_mask(seq)}


@pytest.mark.parametrize("qat_config", ["fp32.yaml", "fp16.yaml"])
@pytest.mark.parametrize("target", TARGETS)
def test_encoder_block_matches_onnxruntime(tmp_path, target, qat_config):
    inputs = _encoder_inputs()
    y, profile, ref, _ = compile_and_run(tmp_path, encoder_block(), inputs, target, qat_config)
    err = norm_max_err(y["y"], ref["y"])
    assert err <= BOUND[qat_config], f"{target} {qat_config}: normalized max error {err:.3g}"
    assert 0 < profile["peak_sram_bytes"] <= profile["sram_size_bytes"]
    assert profile["cycles"] > 0 and profile["macs"] > 0
    assert profile["numeric"]["clean"], profile["numeric"]  # the -1e9 mask fill is no overflow


@pytest.mark.parametrize("target", TARGETS)
def test_mlp_matches_onnxruntime(tmp_path, target):
    x = np.random.default_rng(2).standard_normal((4, 256)).astype(np.float32)
    for cfg in ("fp32.yaml", "fp16.yaml"):
        y, _, ref, _ = compile_and_run(tmp_path, mlp(), {"x": x}, target, cfg, name=f"mlp_{cfg[:4]}")
        (name,) = ref
        assert norm_max_err(y[name], ref[name]) <= BOUND[cfg]


@pytest.mark.parametrize("target", TARGETS)
def test_decoder_block_with_causal_mask_matches_onnxruntime(tmp_path, target):
    x = np.random.default_rng(3).standard_normal((1, 32, 256)).astype(np.float32)
    for cfg in ("fp32.yaml", "fp16.yaml"):
        y, profile, ref, _ = compile_and_run(
            tmp_path, decoder_block(), {"x": x}, target, cfg, dims={"seq": 32}, name=f"dec_{cfg[:4]}"
        )
        assert norm_max_err(y["y"], ref["y"]) <= BOUND[cfg]
        assert profile["numeric"]["clean"], profile["numeric"]


def test_same_model_same_bytes(tmp_path):
    import onnx

    import mcpc

    path = tmp_path / "enc.onnx"
    onnx.save(encoder_block(), path)
    a, b = tmp_path / "a.mcpb", tmp_path / "b.mcpb"
    mcpc.compile(path, output=a)
    mcpc.compile(path, output=b)
    assert a.read_bytes() == b.read_bytes()


def test_edge_moves_more_dram_bytes_than_a100(tmp_path):
    inputs = _encoder_inputs()
    traffic = {}
    # with intermediates through DRAM: the smaller scratchpad re-reads more operand tiles (kept in
    # SRAM, the block's intermediates never reach DRAM on either target and both move the minimum)
    passes = "fold-constants,convert-precision{dtype=f16},dce,tile-matmul,npu-schedule{keep-in-sram=false}"
    for target in ("mcp2026-a100", "mcp2026-edge"):
        _, profile, _, _ = compile_and_run(tmp_path, encoder_block(), inputs, target, "fp16.yaml", passes)
        traffic[target] = profile["dram_read_bytes"] + profile["dram_write_bytes"]
    assert traffic["mcp2026-edge"] > traffic["mcp2026-a100"], traffic
