"""``sim run``: summary, outputs/profile/trace files, exit codes, and no file left behind on errors."""

from __future__ import annotations

import json

import numpy as np
from click.testing import CliRunner
from simprog import IO, add_program, build, x_input

from mcpc.arch.mcpb import write_mcpb
from mcpc.sim.cli import sim_group


def _write(tmp_path, program=None):
    path = tmp_path / "p.mcpb"
    write_mcpb(path, program or add_program())
    return path


def _run(*args):
    return CliRunner().invoke(sim_group, ["run", *map(str, args)])


def test_run_writes_outputs_profile_and_trace(tmp_path):
    prog = _write(tmp_path)
    np.savez(tmp_path / "in.npz", **x_input())
    out, prof, trace = tmp_path / "out.npz", tmp_path / "p.json", tmp_path / "t.json"
    res = _run(
        prog, "--inputs", tmp_path / "in.npz", "--outputs", out, "--profile-json", prof, "--trace", trace
    )
    assert res.exit_code == 0, res.output
    assert "cycles" in res.output and "engines" in res.output and "top 10 ONNX nodes" in res.output
    x = x_input()["x"]
    with np.load(out) as data:
        np.testing.assert_array_equal(data["y"], np.exp((x + x).astype(np.float64)).astype(np.float16))
    p = json.loads(prof.read_text())
    for key in (
        "target",
        "entry",
        "cycles",
        "latency_us",
        "instructions",
        "macs",
        "dram_read_bytes",
        "dram_write_bytes",
        "peak_sram_bytes",
        "sram_size_bytes",
        "engines",
        "nodes",
        "roofline",
    ):
        assert key in p, key
    assert p["dram_read_bytes"] == 128 and p["dram_write_bytes"] == 64 and p["instructions"] == 5
    assert set(p["engines"]) == {"LD", "EX", "ST"}
    assert {"name", "op_type", "cycles", "span"} <= set(p["nodes"][0])
    doc = json.loads(trace.read_text())
    threads = {e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"}
    assert threads == {"LD", "EX", "ST"}
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert [s["name"] for s in slices if s["tid"] == 1] == ["vbin", "vun", "halt"]
    assert all({"node", "ir_op", "addr"} <= set(s["args"]) for s in slices)


def test_random_inputs_are_reproducible(tmp_path):
    prog = _write(tmp_path)
    outs = []
    for name in ("a.npz", "b.npz"):
        res = _run(prog, "--random-inputs", "--seed", 7, "--outputs", tmp_path / name)
        assert res.exit_code == 0, res.output
        with np.load(tmp_path / name) as data:
            outs.append(data["y"])
    np.testing.assert_array_equal(*outs)


def test_bad_inputs_exit_3_and_write_nothing(tmp_path):
    prog = _write(tmp_path)
    out = tmp_path / "out.npz"
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    res = _run(prog, "--inputs", tmp_path / "bad.npz", "--outputs", out)
    assert res.exit_code == 3 and "not a readable .npz" in res.output
    np.savez(tmp_path / "other.npz", z=np.zeros(3))
    res = _run(prog, "--inputs", tmp_path / "other.npz", "--outputs", out)
    assert res.exit_code == 3 and "missing x" in res.output
    (tmp_path / "junk.mcpb").write_bytes(b"junk" * 20)
    res = _run(tmp_path / "junk.mcpb", "--random-inputs", "--outputs", out)
    assert res.exit_code == 3 and "not an .mcpb file" in res.output
    res = _run(prog, "--inputs", tmp_path / "other.npz", "--random-inputs")
    assert res.exit_code == 2
    assert not out.exists()


def test_trap_exits_5_and_writes_nothing(tmp_path):
    program, _ = build("load dram=0 sram=0 rows=1 row_bytes=4 wait=EX\nhalt", **IO)
    prog = _write(tmp_path, program)
    out = tmp_path / "out.npz"
    res = _run(prog, "--random-inputs", "--outputs", out, "--profile-json", tmp_path / "p.json")
    assert res.exit_code == 5 and "token deadlock" in res.output and "instruction 0 (0x0) load" in res.output
    assert not out.exists() and not (tmp_path / "p.json").exists()
