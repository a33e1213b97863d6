"""The matrix engine's timing (docs/timing.md): rows actually present, latency on dependency chains,
weight ingestion in bytes per cycle, and the rooflines a decode and a prefill step rest on."""

from __future__ import annotations

import math

import numpy as np
import pytest
from simprog import build, loaded

from mcpc.arch.isa import Instr
from mcpc.arch.numerics import matmul_2d
from mcpc.arch.target import load_target
from mcpc.sim.api import run_program
from mcpc.sim.timing import instr_cost, overlaps

TARGETS = ("mcp2026-a10", "mcp2026-a100", "mcp2026-edge")


def _mm(m: int, n: int, k: int, dtype: str = "f16", **kw) -> Instr:
    return Instr("matmul", {"m": m, "n": n, "k": k, "in_dtype": dtype, **kw})


@pytest.mark.parametrize("target", TARGETS)
def test_matmul_cost_follows_the_rows_present(target):
    t = load_target(target)
    mac = t.mac
    rows, cols = mac.array_rows, mac.array_cols
    step = rows * cols / t.macs_per_cycle_for("f16")
    k, n = 4 * rows, cols
    full = instr_cost(_mm(rows, n, k), t)
    assert full.busy == math.ceil(k * step) and full.tail == mac.pipeline_latency
    # one row: the idle rows take other slices of K, and B (k x n f16) is read once at the
    # ingestion rate, which is what limits it
    one = instr_cost(_mm(1, n, k), t)
    assert one.busy == math.ceil(max(k / rows * step, k * n * 2 / mac.weight_bytes_per_cycle))
    assert one.busy <= full.busy  # edge: its ingestion rate is exactly the full array's need
    assert one.tail == mac.stream_latency < mac.pipeline_latency
    # fewer rows never cost more, and the cost grows with the rows once K cannot fold further
    busy = [instr_cost(_mm(m, n, k), t).busy for m in (1, 2, 4, 16, rows // 2, rows, 2 * rows)]
    assert busy == sorted(busy)
    assert instr_cost(_mm(mac.stream_max_rows + 1, n, k), t).tail == mac.pipeline_latency


def test_weight_ingestion_is_in_bytes():
    # narrower weights stream more elements per cycle: i8 weights take half the cycles of f16
    # ones, and 4-bit ones (packed two per byte) a quarter, on a matvec the ingestion limits
    t = load_target("mcp2026-a100")
    n, k = 4 * t.mac.array_cols, 8192
    f16, i8, i4 = (instr_cost(_mm(1, n, k, dt), t).busy for dt in ("f16", "i8", "i4"))
    assert f16 == math.ceil(n * k * 2 / t.mac.weight_bytes_per_cycle)
    assert i8 == math.ceil(f16 / 2) and i4 == math.ceil(f16 / 4)


def _matvec_stream(target: str, chunks: int, k: int, n: int):
    """y[t] = x @ W[t] for ``chunks`` independent f16 chunks of W streamed from DRAM through four
    SRAM slots (LD runs ahead by three chunks; each matmul hands its slot back).  Four slots of
    256 KiB cover the DRAM latency on every target: the bytes in flight (slots x chunk) exceed
    bandwidth x (latency + transfer)."""
    wbytes, nslots = k * n * 2, 4
    slots = tuple(i * wbytes for i in range(nslots))
    x_addr, y_addr = nslots * wbytes, nslots * wbytes + k * 2
    lines, io = [], {"inputs": {"x": ("f16", (k,)), "w": ("f16", (chunks, k, n))}}
    io["outputs"] = {"y": ("f32", (chunks, n))}
    program, addrs = build("halt", target=target, **io)  # addresses only
    lines.append(f"load dram={addrs['x']} sram={x_addr} rows=1 row_bytes={k * 2}")
    for c in range(chunks):
        s = slots[c % nslots]
        lines.append(
            f"load dram={addrs['w'] + c * wbytes} sram={s} rows={k} row_bytes={n * 2} dram_stride={n * 2} "
            f"sram_stride={n * 2} signal=EX wait={'EX' if c >= nslots else '-'}"
        )
        signal = "|".join(x for x, on in (("LD", c + nslots < chunks), ("ST", c == chunks - 1)) if on) or "-"
        lines.append(
            f"matmul a={x_addr} b={s} c={y_addr + c * n * 4} m=1 n={n} k={k} a_stride={k} b_stride={n} "
            f"c_stride={n} in_dtype=f16 wait=LD signal={signal}"
        )
    lines += [
        f"store dram={addrs['y']} sram={y_addr} rows=1 row_bytes={chunks * n * 4} wait=EX",
        "halt",
    ]
    return loaded(build("\n".join(lines), target=target, **io)[0])


@pytest.mark.parametrize("target", TARGETS)
def test_independent_matvecs_stream_at_dram_bandwidth(target):
    """A decode-step-like chain of independent matrix-vector products over more weights than the
    SRAM holds costs within 10 % of weight bytes / DRAM bandwidth (the weights cross DRAM once)."""
    t = load_target(target)
    k, n = 256, 512
    chunk = k * n * 2
    chunks = max(8, math.ceil(2 * t.sram.size_bytes / chunk))
    program = _matvec_stream(target, chunks, k, n)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(k).astype(np.float16)
    w = rng.standard_normal((chunks, k, n)).astype(np.float16)
    res = run_program(program, {"x": x, "w": w})
    want = np.stack([matmul_2d(x[None, :], w[c])[0] for c in range(min(chunks, 3))])
    np.testing.assert_array_equal(res.outputs["y"][: len(want)], want)
    roof = chunks * chunk / t.dram_bytes_per_cycle
    assert chunks * chunk > t.sram.size_bytes
    assert res.profile["cycles"] <= 1.10 * roof, (res.profile["cycles"], roof)
    assert res.profile["roofline"]["bound"] == "memory"


@pytest.mark.parametrize("target", TARGETS)
def test_prefill_matmuls_reach_peak_macs(target):
    """Back-to-back independent prefill-sized matmuls (4 array heights of token rows) keep the
    array at >= 85 % of its peak f16 MAC rate: the fill and drain of one overlaps the next one."""
    t = load_target(target)
    rows, cols = t.mac.array_rows, t.mac.array_cols
    m, n, k, count = 4 * rows, 2 * cols, 1024, 4
    a, b = 0, m * k * 2
    c = (b + k * n * 2, b + k * n * 2 + m * n * 4)  # two output tiles, used alternately
    code = [
        f"matmul a={a} b={b} c={c[i % 2]} m={m} n={n} k={k} a_stride={k} b_stride={n} c_stride={n} "
        "in_dtype=f16"
        for i in range(count)
    ]
    assert c[1] + m * n * 4 <= t.sram.size_bytes
    res = run_program(loaded(build("\n".join([*code, "halt"]), target=target)[0]), {})
    util = res.profile["roofline"]["mac_utilization"]
    assert res.profile["macs"] == count * m * n * k and rows <= m
    assert util >= 0.85, f"{target}: {util:.1%} of peak MACs"


def _chain(target: str, links: int, dependent: bool, m: int):
    """``links`` f32 matmuls (m x 64 by 64 x 64); dependent: each one's A is the previous C."""
    size = 64 * 64 * 4
    lines = []
    for i in range(links):
        a = (1 + i) * size if dependent else size
        c = (2 + i) * size
        lines.append(
            f"matmul a={a} b=0 c={c} m={m} n=64 k=64 a_stride=64 b_stride=64 c_stride=64 in_dtype=f32"
        )
    return loaded(build("\n".join([*lines, "halt"]), target=target)[0])


@pytest.mark.parametrize("m", [1, 64])
def test_dependent_chain_pays_latency_per_link(m):
    t = load_target("mcp2026-a100")
    cost = instr_cost(_mm(m, 64, 64, "f32"), t)
    assert cost.tail == (t.mac.stream_latency if m == 1 else t.mac.pipeline_latency)
    links = 10
    dep = run_program(_chain("mcp2026-a100", links, True, m), {}).profile["cycles"]
    ind = run_program(_chain("mcp2026-a100", links, False, m), {}).profile["cycles"]
    assert dep == links * (cost.busy + cost.tail)  # each link waits for the previous result
    assert ind == links * cost.busy + cost.tail  # independent ones issue back to back


def test_accumulating_matmuls_pay_the_latency_once():
    # K split into tiles accumulating into one output tile: the partial sums meet at the array's
    # output in issue order, so the chain issues back to back
    t = load_target("mcp2026-a100")
    code = [
        f"matmul a={i * 0x1000} b=0x20000 c=0x40000 m=64 n=64 k=64 a_stride=64 b_stride=64 c_stride=64 "
        f"in_dtype=f16 acc={int(i > 0)}"
        for i in range(8)
    ]
    cost = instr_cost(_mm(64, 64, 64), t)
    res = run_program(loaded(build("\n".join([*code, "halt"]))[0]), {})
    assert res.profile["cycles"] == 8 * cost.busy + cost.tail


def test_vector_op_waits_for_the_matmul_it_reads():
    t = load_target("mcp2026-a100")
    mm = "matmul a=0 b=0x1000 c=0x8000 m=1 n=64 k=64 a_stride=64 b_stride=64 c_stride=64 in_dtype=f16"
    after = "vun func=exp in_dtype=f32 out_dtype=f32 dst={dst} src={src} rows=1 cols=64"
    cost, vec = instr_cost(_mm(1, 64, 64), t), t.vector
    reads = run_program(loaded(build("\n".join([mm, after.format(dst=0x9000, src=0x8000), "halt"]))[0]), {})
    other = run_program(loaded(build("\n".join([mm, after.format(dst=0x9000, src=0xA000), "halt"]))[0]), {})
    assert reads.profile["cycles"] == cost.busy + cost.tail + 1 + vec.latency
    assert other.profile["cycles"] == max(cost.busy + cost.tail, cost.busy + 1 + vec.latency)


def test_region_overlap_is_exact_for_strided_tiles():
    # two column tiles of one 4-row matrix (row stride 1024 bytes) do not overlap; a row does
    left, right = (0, 4, 512, 1024), (512, 4, 512, 1024)
    assert not overlaps(left, right) and not overlaps(right, left)
    assert overlaps(left, (1024 + 100, 1, 8, 0))
    assert not overlaps(left, (512, 1, 512, 0)) and overlaps(left, (511, 1, 2, 0))
    assert overlaps((0, 4, 512, 1024), (256, 3, 16, 2048))
    assert not overlaps((0, 4, 256, 1024), (512, 3, 16, 2048))
