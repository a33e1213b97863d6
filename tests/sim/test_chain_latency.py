"""The dependency-chain latency of a run (sim/chain.py, docs/timing.md "The dependency chain"):
the longest path through the true dependencies, each instruction weighing its fixed latency."""

from __future__ import annotations

from simprog import build, loaded

from mcpc.arch.target import load_target
from mcpc.sim.api import random_inputs, run_program

T = load_target("mcp2026-a100")
DRAM, STREAM, PIPE, VEC = (
    T.dram_latency_cycles,
    T.mac.stream_latency,
    T.mac.pipeline_latency,
    T.vector.latency,
)
MM = "matmul a={a} b=0 c={c} m={m} n=64 k=64 a_stride=64 b_stride=64 c_stride=64 in_dtype=f32 acc={acc}"


def _run(code: str, **io) -> dict:
    program = loaded(build(code + "\nhalt", **io)[0])
    prof = run_program(program, random_inputs(program)).profile
    chain = prof["roofline"]["chain_latency_cycles"]
    assert 0 < chain <= prof["cycles"]  # the chain never exceeds the run
    return prof


def test_dependent_matmuls_add_their_latencies_independent_ones_do_not():
    size = 64 * 64 * 4
    for m, tail in ((1, STREAM), (64, PIPE)):
        dep = "\n".join(MM.format(a=(1 + i) * size, c=(2 + i) * size, m=m, acc=0) for i in range(10))
        ind = "\n".join(MM.format(a=size, c=(2 + i) * size, m=m, acc=0) for i in range(10))
        assert _run(dep)["roofline"]["chain_latency_cycles"] == 10 * tail
        assert _run(ind)["roofline"]["chain_latency_cycles"] == tail  # reads of one A: no edge


def test_accumulating_matmuls_only_order():
    # the array forwards the partial sums (docs/timing.md): the accumulation chain is one latency
    code = "\n".join(MM.format(a=i * 0x4000, c=0x80000, m=64, acc=int(i > 0)) for i in range(8))
    assert _run(code)["roofline"]["chain_latency_cycles"] == PIPE


def test_load_compute_store_chain():
    # DRAM -> SRAM -> matmul -> store: two DRAM latencies around the matmul's
    k = 64
    code = "\n".join(
        [
            f"load dram={{x}} sram=0 rows=1 row_bytes={k * 2}",
            f"load dram={{w}} sram=0x1000 rows={k} row_bytes={k * 2} signal=EX",
            "matmul a=0 b=0x1000 c=0x4000 m=1 n=64 k=64 a_stride=64 b_stride=64 c_stride=64 in_dtype=f16 "
            "wait=LD signal=ST",
            "store dram={y} sram=0x4000 rows=1 row_bytes=256 wait=EX",
        ]
    )
    io = {"inputs": {"x": ("f16", (k,)), "w": ("f16", (k, 64))}, "outputs": {"y": ("f32", (64,))}}
    _, addrs = build("halt", **io)
    # the two loads are independent: the matmul reads both, one edge each
    prof = _run(code.format(**addrs), **io)
    assert prof["roofline"]["chain_latency_cycles"] == DRAM + STREAM + DRAM


def test_write_after_read_orders_without_adding_latency():
    # load X; vun reads X; a second load overwrites X (after the vun: order only); a vun reads it
    code = "\n".join(
        [
            "load dram={x} sram=0 rows=1 row_bytes=256 signal=EX",
            "vun func=copy in_dtype=f32 out_dtype=f32 dst=0x1000 src=0 rows=1 cols=64 wait=LD signal=LD",
            "load dram={x} sram=0 rows=1 row_bytes=256 wait=EX signal=EX",
            "vun func=copy in_dtype=f32 out_dtype=f32 dst=0x2000 src=0 rows=1 cols=64 wait=LD",
        ]
    )
    io = {"inputs": {"x": ("f32", (64,))}}
    _, addrs = build("halt", **io)
    prof = _run(code.format(**addrs), **io)
    # second load: no data it reads was written here; it completes after the first vun
    assert prof["roofline"]["chain_latency_cycles"] == DRAM + VEC + VEC


def test_register_edges_weigh_nothing_themselves():
    # setr (no latency) -> a register-offset load: only the DRAM latency
    code = "setr reg=1 value=64 signal=LD\nload dram={x} sram=0 rows=1 row_bytes=64 dram_reg=1 wait=EX"
    io = {"inputs": {"x": ("f32", (64,))}}
    _, addrs = build("halt", **io)
    assert _run(code.format(**addrs), **io)["roofline"]["chain_latency_cycles"] == DRAM
