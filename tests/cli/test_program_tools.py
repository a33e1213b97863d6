"""compile --emit mcpb/asm, and the tools over a compiled program: check, disasm, inspect, sim run."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from mcpc.cli import cli


def run(args):
    return CliRunner().invoke(cli, args)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The bundled mlp compiled (fp32) with the real backend."""
    from mcpc import examples

    out = tmp_path_factory.mktemp("prog")
    examples.build_examples(out)
    result = run(["compile", str(out / "mlp.onnx"), "-c", "fp32", "--report-json", str(out / "r.json")])
    assert result.exit_code == 0, result.output
    return out


def test_compile_writes_mcpb_and_report(built):
    report = json.loads((built / "r.json").read_text())
    program = report["program"]
    assert program["instructions"] > 0 and program["weight_bytes"] > 0 and program["target"] == "mcp2026-a100"
    assert report["output"] == str(built / "mlp.mcpb") and (built / "mlp.mcpb").is_file()


def test_emit_asm_matches_disasm_and_parses(built):
    from mcpc.arch.asm import parse_asm
    from mcpc.arch.mcpb import read_mcpb

    model, asm_path = str(built / "mlp.onnx"), str(built / "a.s")
    result = run(["compile", model, "-c", "fp32", "--emit", "asm", "-o", asm_path])
    assert result.exit_code == 0, result.output
    asm = (built / "a.s").read_text()
    disasm = run(["disasm", str(built / "mlp.mcpb")])
    assert disasm.exit_code == 0 and disasm.output == asm
    assert parse_asm(asm) == read_mcpb(built / "mlp.mcpb").instructions()


def test_inspect_lists_sections_and_io(built):
    result = run(["inspect", str(built / "mlp.mcpb")])
    assert result.exit_code == 0, result.output
    for word in ("mcp2026-a100", "TEXT", "CNST", "META", "input", "output"):
        assert word in result.output


def test_check_passes_and_fails_with_exit_1(built):
    args = ["check", str(built / "mlp.onnx"), str(built / "mlp.mcpb"), "--inputs", str(built / "mlp.npz")]
    ok = run([*args, "--json", str(built / "c.json")])
    assert ok.exit_code == 0, ok.output
    report = json.loads((built / "c.json").read_text())
    assert report["passed"] and report["rtol"] == 1e-4 and report["atol"] == 1e-5
    strict = run([*args, "--min-cosine", "1.5"])
    assert strict.exit_code == 1 and "outside tolerance" in strict.output


def test_tools_refuse_a_corrupt_program(built):
    data = bytearray((built / "mlp.mcpb").read_bytes())
    data[300] ^= 0xFF
    bad = built / "bad.mcpb"
    bad.write_bytes(bytes(data))
    for command in (["disasm", str(bad)], ["inspect", str(bad)], ["sim", "run", str(bad), "--random-inputs"]):
        result = run(command)
        assert result.exit_code == 3, (command, result.output)
        assert "bad.mcpb" in result.output and "Traceback" not in result.output


def test_sim_run_writes_outputs_named_as_the_model(built):
    out = built / "y.npz"
    prog, inputs = str(built / "mlp.mcpb"), str(built / "mlp.npz")
    result = run(["sim", "run", prog, "--inputs", inputs, "--outputs", str(out)])
    assert result.exit_code == 0, result.output
    with np.load(out) as data:
        assert data.files == ["y"]
