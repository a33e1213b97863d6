"""Same program, same inputs -> the same output bits and the same cycles: across runs in one process
(nothing leaks from one run into the next) and across processes (no hash-order or time dependence)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

import mcpc
from mcpc.sim.api import load_program, run_program

_RUN = """
import json, sys
import numpy as np
from mcpc.sim.api import load_program, run_program
program = load_program(sys.argv[1])
result = run_program(program, dict(np.load(sys.argv[2])))
np.savez(sys.argv[3], **result.outputs)
print(json.dumps(result.profile["cycles"]))
"""


@pytest.fixture(scope="module")
def built(examples_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("det")
    for name in ("encoder_block.onnx", "encoder_block.npz"):
        shutil.copy(examples_dir / name, out / name)
    mcpc.compile(str(out / "encoder_block.onnx"), output=out / "encoder_block.mcpb")
    return out


def test_runs_repeat_bit_for_bit(built):
    program = load_program(built / "encoder_block.mcpb")
    inputs = dict(np.load(built / "encoder_block.npz"))
    first = run_program(program, inputs)
    other = {k: np.random.default_rng(1).standard_normal(v.shape).astype(v.dtype) for k, v in inputs.items()}
    run_program(program, other)  # a run on other data in between must leave no trace
    again = run_program(program, inputs)
    assert first.profile["cycles"] == again.profile["cycles"]
    for name, value in first.outputs.items():
        assert value.tobytes() == again.outputs[name].tobytes(), name

    proc = subprocess.run(
        [sys.executable, "-c", _RUN, str(built / "encoder_block.mcpb"), str(built / "encoder_block.npz"),
         str(built / "sub.npz")],
        capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    assert json.loads(proc.stdout) == first.profile["cycles"]
    sub = np.load(built / "sub.npz")
    for name, value in first.outputs.items():
        assert value.tobytes() == sub[name].tobytes(), name


def test_compiles_repeat_byte_for_byte(built, tmp_path):
    for config in ("fp16", "fp32"):
        a, b = tmp_path / f"a-{config}.mcpb", tmp_path / f"b-{config}.mcpb"
        for out in (a, b):
            mcpc.compile(str(built / "encoder_block.onnx"), qat_config=config, output=out)
        assert a.read_bytes() == b.read_bytes(), config


def test_max_cycles_stops_a_long_run_with_a_trap(built):
    from click.testing import CliRunner

    from mcpc.cli import cli

    prog = str(built / "encoder_block.mcpb")
    full = run_program(load_program(prog), dict(np.load(built / "encoder_block.npz"))).profile["cycles"]
    args = ["sim", "run", prog, "--inputs", str(built / "encoder_block.npz")]
    stopped = CliRunner().invoke(cli, [*args, "--max-cycles", str(full // 2)])
    assert stopped.exit_code == 5 and "cycle limit reached" in stopped.output, stopped.output
    assert CliRunner().invoke(cli, [*args, "--max-cycles", str(full)]).exit_code == 0
