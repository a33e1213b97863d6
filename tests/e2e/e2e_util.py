"""Helpers for end-to-end tests: compile an ONNX model with the real driver and run the binary
in the real simulator, with ONNX Runtime as the reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

import mcpc
from mcpc.check import compare, run_onnxruntime
from mcpc.sim.api import load_program, run_program

TARGETS = ("mcp2026-a100", "mcp2026-a10", "mcp2026-edge")


def compile_and_run(
    tmp_path: Path,
    model: onnx.ModelProto,
    inputs,
    target="mcp2026-a100",
    qat_config="fp32.yaml",
    passes=None,
    overrides=(),
    dims=None,
    name="model",
):
    """(simulated outputs, profile, ONNX Runtime outputs, compile result) for ``model``."""
    onnx_path = tmp_path / f"{name}.onnx"
    onnx.save(model, onnx_path)
    out = tmp_path / f"{name}-{target}-{Path(qat_config).stem}.mcpb"
    result = mcpc.compile(
        onnx_path,
        target=target,
        qat_config=qat_config,
        passes=passes,
        output=out,
        overrides=overrides,
        dims=dims,
    )
    program = load_program(out)
    sim = run_program(program, inputs)
    ref = run_onnxruntime(onnx_path, inputs)
    return sim.outputs, sim.profile, ref, result


def norm_max_err(y: np.ndarray, r: np.ndarray) -> float:
    """max|y − r| / max|r|, the figure ``mcpc check`` reports."""
    return compare("y", y, r, rtol=0.0, atol=0.0).norm_max_err
