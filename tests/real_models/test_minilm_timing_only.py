"""Timing-only simulation of the real MiniLM export: exactly the functional run's cycles, profile
and trace (fp32 and fp16 builds, padded realistic inputs)."""

from __future__ import annotations

import sys
from pathlib import Path

import onnx
import pytest
from real_model import MINILM, dim_bindings, realistic_inputs

import mcpc
from mcpc.sim.api import from_program

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "sim"))
from timing_only_util import assert_timing_only_matches  # noqa: E402


@pytest.mark.parametrize("config", ["fp32", "fp16"])
def test_timing_only_equals_functional(config):
    try:
        path = MINILM.path()
    except LookupError as e:
        pytest.fail(str(e), pytrace=False)
    model = onnx.load(str(path), load_external_data=False)
    batch, seq = 2, 16
    result = mcpc.compile(
        path, target="mcp2026-edge", qat_config=config, dims=dim_bindings(model, batch, seq)
    )
    assert_timing_only_matches(from_program(result.program), realistic_inputs(model, batch, seq))
