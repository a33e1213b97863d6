"""Profile attribution, trace coalescing and a long program through the run loop."""

from __future__ import annotations

import numpy as np
import pytest
from simprog import add_program, build, loaded, x_input

from mcpc.sim import profile as profile_mod
from mcpc.sim.api import run_program


def test_nodes_and_ir_ops_add_up_to_engine_busy():
    res = run_program(loaded(add_program()), x_input())
    p = res.profile
    busy = sum(e["busy"] for e in p["engines"].values())
    assert sum(n["cycles"] for n in p["nodes"]) == busy == sum(o["cycles"] for o in p["ir_ops"])
    assert p["instruction_mix"] == {"halt": 1, "load": 1, "store": 1, "vbin": 1, "vun": 1}
    assert p["peak_sram_bytes"] == 0x200 + 4 * 8 * 2
    assert p["latency_us"] == pytest.approx(p["cycles"] / p["clock_mhz"])
    for e in p["engines"].values():
        assert 0 <= e["utilization"] <= 1


def test_trace_is_coalesced_per_engine_and_node_beyond_the_limit(monkeypatch):
    code = "\n".join(["nop"] * 6 + ["halt"])
    program = loaded(build(code, node_of=lambda i: "a" if i < 3 else "b")[0])
    full = run_program(program, {}, trace=True).trace_events
    assert sum(e["ph"] == "X" for e in full) == 7
    monkeypatch.setattr(profile_mod, "COALESCE_ABOVE", 5)
    merged = run_program(program, {}, trace=True).trace_events
    slices = [e for e in merged if e["ph"] == "X"]
    assert [(s["name"], s["args"]["instructions"]) for s in slices] == [("a", 3), ("b", 4)]
    assert slices[1]["dur"] == pytest.approx(4 / program.target.clock_mhz)
    assert any(e["name"] == "process_labels" and "coalesced" in e["args"]["labels"] for e in merged)


@pytest.mark.slow
def test_long_program_runs_twice_alike():
    # (speed is measured by `make bench`, never asserted in a timed unit test)
    lines = []
    for i in range(4000):
        lines += [
            f"load dram=0 sram=0 rows=8 row_bytes=256 dram_stride=256 sram_stride=256 signal=EX"
            f" wait={'EX' if i else '-'}",
            "vbin func=add dst=0x1000 src0=0 src1=0 rows=8 cols=64 dst_stride=64 s0_stride=64 s1_stride=64"
            " wait=LD",
            "matmul a=0 b=0 c=0x4000 m=16 n=16 k=16 a_stride=16 b_stride=16 c_stride=16",
            "vun func=exp dst=0x2000 src=0x1000 rows=8 cols=64 dst_stride=64 src_stride=64 signal=LD|ST",
            "store dram=0x1000 sram=0x2000 rows=8 row_bytes=256 dram_stride=256 sram_stride=256 wait=EX",
        ]
    program = loaded(build("\n".join(lines), scratch=0x4000)[0])
    res = run_program(program, {})
    assert res.profile["tokens_left"] == {"EX->LD": 1}
    assert res.profile["instructions"] == len(lines) and np.isfinite(res.profile["cycles"])
    assert run_program(program, {}).profile == res.profile  # the second run reuses the machine
