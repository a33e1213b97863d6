"""Timing-only simulation of every PyTorch export fixture: exactly the functional run's cycles,
profile and trace (fp32 and fp16 builds)."""

from __future__ import annotations

import sys
from pathlib import Path

import onnx
import pytest
from test_torch_exports import NAMES, _path, dims_for, make_inputs

import mcpc
from mcpc.sim.api import from_program

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "sim"))
from timing_only_util import assert_timing_only_matches  # noqa: E402


@pytest.mark.parametrize("config", ["fp32", "fp16"])
@pytest.mark.parametrize("name", NAMES)
def test_timing_only_equals_functional(name, config):
    path = _path(name)
    dims = dims_for(name)
    result = mcpc.compile(path, target="mcp2026-a100", qat_config=config, dims=dims)
    assert_timing_only_matches(from_program(result.program), make_inputs(onnx.load(str(path)), dims, seed=3))
