"""The CLI over a program with state: ``inspect`` lists entries, persistent buffers and host
registers; ``sim run --entry NAME --set-reg NAME=VALUE`` with exit 2 for a bad name or value."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import mcpc
from mcpc.arch.mcpb import write_mcpb
from mcpc.cli import cli
from mcpc.ir import parse_module

RING = Path(__file__).parents[1] / "data" / "ring_buffer.mcpir"


def run(args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def ring(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ring")
    write_mcpb(folder / "ring.mcpb", mcpc.compile(parse_module(RING.read_text()), qat_config="fp32").program)
    np.savez(folder / "row.npz", row=np.full((1, 4), 2.0, np.float32))
    return folder


def test_inspect_lists_entries_persistent_buffers_and_host_registers(ring):
    result = run(["inspect", ring / "ring.mcpb"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "entries: append (instructions 0.." in out and ", peek (instructions" in out
    assert "persistent buffers" in out and "│ buf " in out and "│ f32 " in out and "8x4" in out
    assert "host registers" in out and "│ pos " in out and "│ r1 " in out and "append, peek" in out
    assert "HREG" in out  # the section table


def test_sim_run_sets_host_registers_by_name(ring, tmp_path):
    out = tmp_path / "out.npz"
    args = ["sim", "run", ring / "ring.mcpb", "--inputs", ring / "row.npz", "--entry", "append"]
    result = run([*args, "--set-reg", "pos=3", "--outputs", out])
    assert result.exit_code == 0, result.output
    with np.load(out) as data:  # one run from a zeroed buffer: the row alone
        np.testing.assert_array_equal(data["total"], np.full((1, 4), 2.0, np.float32))


@pytest.mark.parametrize(
    "extra, code, message",
    [
        (["--entry", "append"], 2, "reads host register(s) pos, which are not set"),
        (["--entry", "append", "--set-reg", "pos=8"], 2, "value 8 is outside its declared range [0, 7]"),
        (["--entry", "append", "--set-reg", "size=1"], 2, "unknown host register 'size' (declared: pos)"),
        (["--entry", "append", "--set-reg", "pos"], 2, "expected NAME=VALUE with an integer VALUE"),
        (["--set-reg", "pos=1"], 2, "has 2 entry points (append, peek): choose one with --entry NAME"),
        (["--entry", "main", "--set-reg", "pos=1"], 3, "no entry point 'main' (entries: append, peek)"),
    ],
)
def test_sim_run_refuses_bad_entries_and_registers(ring, extra, code, message):
    result = run(["sim", "run", ring / "ring.mcpb", "--inputs", ring / "row.npz", *extra])
    assert result.exit_code == code, result.output
    assert message in " ".join(result.output.split())


def test_mcp_compile_takes_ir_text(tmp_path):
    out = tmp_path / "ring.mcpb"
    result = run(["compile", RING, "-c", "fp32", "-o", out])
    assert result.exit_code == 0, result.output
    result = run(["inspect", out])
    assert "host registers" in result.output
    bad = tmp_path / "bad.mcpir"
    bad.write_text(RING.read_text().replace("{max = 7, min = 0}", "{max = 8, min = 0}"))
    result = run(["compile", bad, "-c", "fp32", "-o", tmp_path / "bad.mcpb"])
    assert result.exit_code == 3, result.output
    assert "can reach outside global @buf" in " ".join(result.output.split())
