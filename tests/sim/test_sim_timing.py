"""Timing model: double-buffered overlap, token semantics, DRAM- and compute-bound rooflines."""

from __future__ import annotations

import numpy as np
import pytest
from simprog import build, loaded

from mcpc.arch.asm import parse_asm
from mcpc.arch.numerics import matmul_2d
from mcpc.errors import SimTrap
from mcpc.sim.api import run_program

# M = 16 rows take the weight-streaming path (64-cycle latency on a100): a load that waits for a
# matmul's completion then overlaps the next matmul's issue cycles.  (With 32 rows the array's
# 992-cycle drain would outlast each matmul's issue cycles and the loads would overlap drains.)
M, N, K, TK = 16, 48, 256, 64
F32 = np.float32
A_SLOT, B_SLOT, C_ADDR = (0x0, 0x4000), (0x8000, 0x10000), 0x20000


def matmul_program(double_buffer: bool = True, drop: tuple[int, str] | None = None):
    """C = A @ B with K split into tiles of TK; A (M x K) and B (K x N) are f32 inputs.

    Double-buffered: two SRAM slots, LD runs ahead by one tile, each matmul hands its slot back to
    LD with a token.  Single-buffered: one slot, each load waits for the previous matmul.
    ``drop=(instruction index, "wait"|"signal")`` clears that instruction's token bits.
    """
    tiles = K // TK
    lines: list[str] = []
    nodes: list[str] = []
    for t in range(tiles):
        s = t % 2 if double_buffer else 0
        reuse = t >= (2 if double_buffer else 1)
        frees = t + (2 if double_buffer else 1) < tiles
        signal = "|".join(x for x, on in (("LD", frees), ("ST", t == tiles - 1)) if on) or "-"
        lines += [
            f"load dram={t * TK * 4} sram={A_SLOT[s]} rows={M} row_bytes={TK * 4} dram_stride={K * 4} "
            f"sram_stride={TK * 4} wait={'EX' if reuse else '-'}",
            f"load dram={(M * K + t * TK * N) * 4} sram={B_SLOT[s]} rows={TK} row_bytes={N * 4} "
            f"dram_stride={N * 4} sram_stride={N * 4} signal=EX",
            f"matmul a={A_SLOT[s]} b={B_SLOT[s]} c={C_ADDR} m={M} n={N} k={TK} a_stride={TK} b_stride={N} "
            f"c_stride={N} in_dtype=f32 acc={int(t > 0)} wait=LD signal={signal}",
        ]
        nodes += ["load_a", "load_b", "matmul"]
    lines += [
        f"store dram={(M * K + K * N) * 4} sram={C_ADDR} rows={M} row_bytes={N * 4} dram_stride={N * 4} "
        f"sram_stride={N * 4} wait=EX",
        "halt",
    ]
    nodes += ["store", "halt"]
    code = parse_asm("\n".join(lines))
    if drop is not None:
        idx, what = drop
        code[idx] = code[idx].replace(**{what: 0})
    program, _ = build(
        code,
        inputs={"a": ("f32", (M, K)), "b": ("f32", (K, N))},
        outputs={"c": ("f32", (M, N))},
        node_of=lambda i: nodes[i],
    )
    return loaded(program)


@pytest.fixture(scope="module")
def ab():
    rng = np.random.default_rng(1)
    return {"a": rng.standard_normal((M, K), dtype=F32), "b": rng.standard_normal((K, N), dtype=F32)}


def _intervals(events, tid):
    return [(e["ts"], e["ts"] + e["dur"]) for e in events if e["ph"] == "X" and e["tid"] == tid]


def test_double_buffered_matmul_is_correct_and_overlaps(ab):
    res = run_program(matmul_program(), ab, trace=True)
    np.testing.assert_array_equal(res.outputs["c"], matmul_2d(ab["a"], ab["b"], tile=(0, 0, TK)))
    loads, mms = _intervals(res.trace_events, 0), _intervals(res.trace_events, 1)
    overlap = any(lo < me and ms < le for lo, le in loads for ms, me in mms)
    assert overlap, "no LD transfer overlaps an EX matmul"
    prof = res.profile
    assert prof["tokens_left"] == {}
    assert prof["macs"] == M * N * K
    assert prof["dram_read_bytes"] == (M * K + K * N) * 4 and prof["dram_write_bytes"] == M * N * 4
    single = run_program(matmul_program(double_buffer=False), ab)
    np.testing.assert_array_equal(single.outputs["c"], res.outputs["c"])
    assert single.profile["cycles"] > prof["cycles"], "double-buffering should save cycles"
    names = {n["name"]: n for n in prof["nodes"]}
    assert set(names) == {"load_a", "load_b", "matmul", "store", "halt"}
    assert names["matmul"]["cycles"] == prof["engines"]["EX"]["busy"] - 1  # all EX but the halt
    assert names["matmul"]["span"] >= names["matmul"]["cycles"]


def test_missing_wait_token_corrupts_outputs(ab):
    # the load of A tile 2 (instruction 6) no longer waits for matmul 0 to release slot 0: it runs
    # ahead and overwrites A tile 0 before matmul 0 has read it
    res = run_program(matmul_program(drop=(6, "wait")), ab)
    assert res.profile["tokens_left"] == {"EX->LD": 1}  # the token load 6 should have taken
    assert not np.array_equal(res.outputs["c"], matmul_2d(ab["a"], ab["b"], tile=(0, 0, TK)))


def test_missing_signal_token_deadlocks_with_named_instructions(ab):
    # matmul 0 (instruction 2) never hands slot 0 back; tokens count, so the load of tile 2 takes
    # matmul 1's token and the load of tile 3 (instruction 9) waits forever
    with pytest.raises(SimTrap) as info:
        run_program(matmul_program(drop=(2, "signal")), ab)
    msg = str(info.value)
    assert "token deadlock" in msg and "instruction 9 (0x120) load" in msg and "load_a" in msg
    assert "waits for a token from EX" in msg


def test_dram_streaming_reaches_bandwidth():
    chunk, count = 64 * 1024, 24
    lines = []
    for i in range(count):
        slot = (i % 4) * chunk
        lines += [
            f"load dram={i * chunk} sram={slot} rows=64 row_bytes=1024 dram_stride=1024 sram_stride=1024 "
            f"signal=ST wait={'ST' if i >= 4 else '-'}",
            f"store dram={(count + i) * chunk} sram={slot} rows=1 row_bytes={chunk} wait=LD "
            f"signal={'LD' if i + 4 < count else '-'}",
        ]
    code = parse_asm("\n".join([*lines, "halt"]))
    # edge: 64 KiB take ~600 transfer cycles, so four buffers in flight cover the DRAM latency
    io = {"inputs": {"x": ("u8", (count * chunk,))}, "outputs": {"y": ("u8", (count * chunk,))}}
    program, _ = build(code, target="mcp2026-edge", **io)
    x = np.random.default_rng(2).integers(0, 256, count * chunk).astype(np.uint8)
    res = run_program(loaded(program), {"x": x})
    np.testing.assert_array_equal(res.outputs["y"], x)
    roof = res.profile["roofline"]
    assert roof["bound"] == "memory"
    assert roof["dram_utilization"] >= 0.9, roof


def test_matmul_stream_reaches_peak_macs():
    # edge: 64 x 128 array, f16 at 8192 MACs/cycle; each instruction fills the array for k cycles
    k, count = 4096, 6
    mm = (
        "matmul a=0 b=0x80000 c=0x180000 m=64 n=128 k={k} a_stride={k} b_stride=128 c_stride=128 in_dtype=f16"
    )
    code = "\n".join([*(f"{mm.format(k=k)} acc={int(i > 0)}" for i in range(count)), "halt"])
    program, _ = build(code, target="mcp2026-edge")
    res = run_program(loaded(program), {})
    prof = res.profile
    assert prof["macs"] == count * 64 * 128 * k
    assert prof["roofline"]["bound"] == "compute"
    assert prof["roofline"]["mac_utilization"] >= 0.9, prof["roofline"]
    assert prof["peak_sram_bytes"] == 0x180000 + 64 * 128 * 4


def test_small_m_underfills_the_array():
    code = "matmul a=0 b=0x1000 c=0x40000 m=1 n=128 k=512 a_stride=512 b_stride=128 c_stride=128 in_dtype=f16"
    res = run_program(loaded(build(code, target="mcp2026-edge")[0]), {})
    assert res.profile["roofline"]["mac_utilization"] < 1 / 32


def test_special_functions_use_the_sfu_lanes():
    from mcpc.arch.isa import Instr
    from mcpc.arch.target import load_target
    from mcpc.sim.timing import instr_cost

    tgt = load_target("mcp2026-a100")
    vec = tgt.vector

    def busy(func: str) -> int:
        cost = instr_cost(Instr("vun", {"func": func, "rows": 64, "cols": 512}), tgt)
        assert cost.tail == vec.latency  # the pipeline latency follows the issue cycles
        return cost.busy

    n = 64 * 512
    for func in ("sin", "cos", "log", "exp"):
        assert busy(func) == -(-n // vec.sfu_lanes), func
    for func in ("floor", "neg", "copy"):
        assert busy(func) == -(-n // tgt.vector_lanes_for("f32")), func
