"""Timing-only simulation (``run_program(timing_only=True)``, ``mcpc sim run --timing-only``):
exactly the cycles, profile and trace of the functional run on every shipped example, both builds;
no outputs; static traps still raised; the CLI refuses ``--outputs`` with it."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from simprog import add_program, build, x_input
from timing_only_util import assert_timing_only_matches

import mcpc
from mcpc.arch.mcpb import write_mcpb
from mcpc.errors import InputError, SimTrap
from mcpc.sim.api import from_program, load_program, run_program
from mcpc.sim.cli import sim_group

EXAMPLES = ("mlp", "encoder_block", "decoder_block")


@pytest.mark.parametrize("target", ["mcp2026-a100", "mcp2026-edge"])
@pytest.mark.parametrize("config", ["fp32", "fp16"])
@pytest.mark.parametrize("name", EXAMPLES)
def test_timing_only_equals_functional_on_every_example(examples_dir, name, config, target):
    dims = {"seq": 32} if name == "decoder_block" else None
    result = mcpc.compile(examples_dir / f"{name}.onnx", target=target, qat_config=config, dims=dims)
    with np.load(examples_dir / f"{name}.npz") as data:
        inputs = dict(data)
    assert_timing_only_matches(from_program(result.program), inputs)


def test_timing_only_still_checks_inputs_and_static_traps():
    with pytest.raises(InputError, match="missing x"):
        run_program(from_program(add_program()), {}, timing_only=True)
    # a DMA past the end of DRAM through a register traps in both modes (addresses do not depend
    # on data), as does an SRAM overflow found at load time
    for code in (
        "setr reg=2 value=1000000 signal=LD\nload dram=0 dram_reg=2 sram=0 rows=1 row_bytes=4 wait=EX",
        "nop\nvun func=copy dst=0x1ffffc src=0 rows=1 cols=4 dst_stride=4 src_stride=4\nhalt",
    ):
        program = from_program(build(code, target="mcp2026-edge")[0])
        with pytest.raises(SimTrap) as functional:
            run_program(program, {})
        with pytest.raises(SimTrap) as timing:
            run_program(program, {}, timing_only=True)
        assert str(timing.value) == str(functional.value)


def test_cli_timing_only(tmp_path):
    prog = tmp_path / "p.mcpb"
    write_mcpb(prog, add_program())
    np.savez(tmp_path / "in.npz", **x_input())
    profs = []
    for extra in ([], ["--timing-only"]):
        prof = tmp_path / f"p{len(extra)}.json"
        res = CliRunner().invoke(
            sim_group,
            ["run", str(prog), "--inputs", str(tmp_path / "in.npz"), "--profile-json", str(prof), *extra],
        )
        assert res.exit_code == 0, res.output
        profs.append(json.loads(prof.read_text()))
    assert profs[0]["numeric"]["clean"] and profs[1]["numeric"] is None  # no values, no numeric check
    assert {**profs[0], "numeric": None} == profs[1]
    res = CliRunner().invoke(
        sim_group,
        ["run", str(prog), "--random-inputs", "--timing-only", "--outputs", str(tmp_path / "o.npz")],
    )
    assert res.exit_code == 2 and "--timing-only" in res.output
    assert not (tmp_path / "o.npz").exists()
    assert load_program(prog).program.text  # the file is untouched
