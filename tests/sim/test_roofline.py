"""The profile's roofline (sim/roofline.py): the bound comes from the compulsory DRAM bytes (weights
once + inputs + outputs + KV in use) and the MACs, never from the bytes the program moved; ``bound``
says compute, memory or latency with the top reason; a decode step's compulsory bytes are its
``decode_roofline_cycles`` × bandwidth; the compile summary warns past 2× the roofline, naming
nodes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper
from simprog import build, loaded

import mcpc
from mcpc.arch.mcpb import read_mcpb
from mcpc.cli import compile_command
from mcpc.examples import mlp
from mcpc.sim.api import random_inputs, run_program
from mcpc.sim.roofline import LATENCY_FACTOR, classify

CHUNK, COUNT = 64 * 1024, 24  # 1.5 MiB in 64 KiB chunks


def _copy_through_scratch(passes: int):
    """x -> (passes - 1) scratch copies -> y, each pass streamed in COUNT chunks through four SRAM
    slots (a load of step i waits for the store of step i - 4, which the ST engine completes after
    every earlier store, so each pass reads what the previous one wrote)."""
    io = {"inputs": {"x": ("u8", (COUNT * CHUNK,))}, "outputs": {"y": ("u8", (COUNT * CHUNK,))}}
    kw = dict(target="mcp2026-edge", scratch=(passes - 1) * COUNT * CHUNK, **io)
    _, addrs = build("halt", **kw)  # the DRAM layout, to place the scratch copies
    bases = [addrs["x"], *(addrs["scratch"] + p * COUNT * CHUNK for p in range(passes - 1)), addrs["y"]]
    steps, lines = COUNT * passes, []
    for i in range(steps):
        p, c, slot = i // COUNT, i % COUNT, (i % 4) * CHUNK
        lines += [
            f"load dram={bases[p] + c * CHUNK} sram={slot} rows=64 row_bytes=1024 dram_stride=1024 "
            f"sram_stride=1024 signal=ST wait={'ST' if i >= 4 else '-'}",
            f"store dram={bases[p + 1] + c * CHUNK} sram={slot} rows=1 row_bytes={CHUNK} wait=LD "
            f"signal={'LD' if i + 4 < steps else '-'}",
        ]
    program, _ = build("\n".join([*lines, "halt"]), **kw)
    return program


def test_streaming_without_spills_is_memory_bound_at_its_compulsory_bytes():
    res = run_program(loaded(_copy_through_scratch(1)), {"x": np.zeros(COUNT * CHUNK, np.uint8)})
    roof = res.profile["roofline"]
    assert roof["compulsory_dram_bytes"] == 2 * COUNT * CHUNK == roof["dram_moved_bytes"]
    assert roof["compulsory_dram_parts"] == {"weights": 0, "inputs": COUNT * CHUNK, "outputs": COUNT * CHUNK,
                                             "kv": 0}  # fmt: skip
    assert roof["bound"] == roof["bound_detail"] == "memory"
    assert roof["roofline_ratio"] < 1.2, roof


def test_a_program_that_spills_is_not_called_memory_bound():
    """Three scratch round trips: the program moves 4x its compulsory bytes; the old figure (the
    bytes moved, kept as dram_bound_cycles) would call it memory-bound, the roofline says latency
    and names the DRAM traffic above the compulsory bytes."""
    x = np.random.default_rng(0).integers(0, 256, COUNT * CHUNK).astype(np.uint8)
    res = run_program(loaded(_copy_through_scratch(4)), {"x": x})
    np.testing.assert_array_equal(res.outputs["y"], x)
    prof, roof = res.profile, res.profile["roofline"]
    assert roof["compulsory_dram_bytes"] == 2 * COUNT * CHUNK
    assert roof["dram_moved_bytes"] == 8 * COUNT * CHUNK == prof["dram_read_bytes"] + prof["dram_write_bytes"]
    assert roof["dram_traffic_ratio"] == 4.0
    assert (
        roof["dram_bound_cycles"]
        == roof["dram_moved_cycles"]
        == pytest.approx(4 * roof["memory_roof_cycles"])
    )
    assert roof["roofline_cycles"] == roof["memory_roof_cycles"] < prof["cycles"] / LATENCY_FACTOR
    assert roof["bound"] == "latency"
    assert roof["bound_detail"].startswith(
        f"latency ({roof['roofline_ratio']:.1f}× the roofline: DRAM traffic"
    )
    assert "4.0× the compulsory bytes" in roof["bound_detail"]


def test_classify_words():
    assert classify(100, 80, 10, "r") == ("compute", "compute", 1.25)
    assert classify(100, 10, 60, "r")[0] == "memory"
    word, detail, ratio = classify(1000, 10, 100, "a dependency chain of 900 cycles")
    assert (word, ratio) == (
        "latency",
        10.0,
    ) and detail == "latency (10.0× the roofline: a dependency chain of 900 cycles)"


def test_a_matmul_heavy_build_is_compute_bound(tmp_path):
    onnx.save(mlp(batch=512, d_in=1024, d_hidden=4096, d_out=1024), tmp_path / "mm.onnx")
    result = mcpc.compile(
        tmp_path / "mm.onnx", target="mcp2026-a100", qat_config="fp16", output=tmp_path / "mm.mcpb"
    )
    from mcpc.sim.loader import from_program

    prog = from_program(result.program)
    prof = run_program(prog, random_inputs(prog), timing_only=True).profile
    roof = prof["roofline"]
    assert roof["bound"] == "compute", roof
    assert roof["compute_bound_cycles"] == pytest.approx(prof["macs"] / 110_592)  # a100 f16 peak
    weights = roof["compulsory_dram_parts"]["weights"]
    assert weights == len(result.program.constants)  # every weight read, each once
    assert roof["compulsory_dram_parts"]["inputs"] == 512 * 1024 * 4  # x in f32
    assert roof["roofline_cycles"] == roof["compute_bound_cycles"] > roof["memory_roof_cycles"]


DECODERS = Path(__file__).parents[1] / "llm" / "decoders"


def test_a_decode_steps_compulsory_bytes_are_its_roofline(tmp_path):
    """One definition: the profile's compulsory bytes of a decode step are the decoder report's
    decode_roofline_cycles × the DRAM bytes a cycle (weights of the step + its inputs and outputs +
    the KV blocks in use)."""
    from mcpc.ir.decoder_import import DecoderBuild
    from mcpc.sim.decoder import DecoderSession

    rec = json.loads((DECODERS / "decoders.json").read_text())["models"]["llama"]
    out = tmp_path / "llama.mcpb"
    mcpc.compile(DECODERS / rec["file"], qat_config="fp32", decoder=DecoderBuild(max_seq=64, prefill_chunk=4),
                 output=out)  # fmt: skip
    dec = DecoderSession(str(out))
    report = dec.generate(rec["prompt"][:6], max_new_tokens=3)
    prof = dec.session.last_profile  # the last decode step
    assert prof["entry"] == "decode"
    roof = prof["roofline"]
    per_cycle = dec.target.dram_bytes_per_cycle
    assert roof["compulsory_dram_bytes"] == pytest.approx(report["decode_roofline_cycles"][-1] * per_cycle)
    parts = roof["compulsory_dram_parts"]
    assert (
        parts["weights"] == report["weight_bytes_per_step"] and parts["kv"] == report["decode_kv_bytes"][-1]
    )
    assert parts["kv"] > 0 and parts["inputs"] > 0 and parts["outputs"] > 0
    assert roof["memory_roof_cycles"] == pytest.approx(report["decode_roofline_cycles"][-1])


def _chain_model(n: int = 24) -> onnx.ModelProto:
    """x[1, 64] through n dependent Add nodes: far from any roof, bound by its dependency chain."""
    nodes, inits, prev = [], [], "x"
    for i in range(n):
        inits.append(numpy_helper.from_array(np.full((1, 64), 0.5, np.float32), f"c{i}"))
        nodes.append(helper.make_node("Add", [prev, f"c{i}"], [f"t{i}"], name=f"add{i}"))
        prev = f"t{i}"
    nodes[-1].output[0] = "y"
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_compile_summary_warns_past_twice_the_roofline_naming_nodes(tmp_path):
    onnx.save(_chain_model(), tmp_path / "chain.onnx")
    runner = CliRunner()
    args = [str(tmp_path / "chain.onnx"), "-t", "mcp2026-a100", "-o", str(tmp_path / "c.mcpb")]
    res = runner.invoke(compile_command, [*args, "--report-json", str(tmp_path / "r.json")])
    assert res.exit_code == 0, res.output
    line = next(x for x in res.output.splitlines() if x.startswith("warning: entry main"))
    assert "× its roofline" in line and "top reason: " in line
    est = json.loads((tmp_path / "r.json").read_text())["estimate"]["entries"][0]
    assert est["entry"] == "main" and est["bound"] == "latency" and est["roofline_ratio"] > 2
    assert est["nodes"] and all(n["excess_cycles"] > 0 for n in est["nodes"])
    # the nodes named are the build's own (the model's Adds, the casts of its fp16 build)
    prof = run_program(loaded(read_mcpb(tmp_path / "c.mcpb")), {"x": np.ones((1, 64), np.float32)}).profile
    own = {n["name"] for n in prof["nodes"]}
    named = line.split("nodes responsible: ", 1)[1]
    for n in est["nodes"]:
        assert n["name"] in own and f"{n['name']} ({n['op_type']}, {n['excess_cycles']:,} cycles" in named
    assert own & {f"add{i}" for i in range(24)}
    quiet = runner.invoke(compile_command, [*args, "--no-estimate"])
    assert quiet.exit_code == 0 and "warning: entry" not in quiet.output


def test_a_build_too_large_to_estimate_says_so(monkeypatch):
    from mcpc.sim import estimate

    monkeypatch.setattr(estimate, "MAX_INSTRUCTIONS", 10)
    est = estimate.estimate_program(_copy_through_scratch(1))
    (line,) = estimate.warning_lines(est)
    assert (
        line.startswith("note: cycles not estimated: 49 instructions, more than the 10")
        and "--timing-only" in line
    )
    monkeypatch.setattr(estimate, "MAX_INSTRUCTIONS", 100)
    (row,) = estimate.estimate_program(_copy_through_scratch(1))["entries"]
    assert (
        row["entry"] == "main"
        and row["bound"] == "memory"
        and estimate.warning_lines({"entries": [row]}) == []
    )
