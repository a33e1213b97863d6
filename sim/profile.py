"""Profiling: counters, per-node and per-IR-op attribution, roofline, and the Chrome trace.

Everything here is computed after the run from the issue/completion times the event loop
recorded and the static per-instruction counters of the LoadedProgram, with numpy reductions,
so the run loop itself only stores two integers per instruction.

Node cycles are the busy cycles of the node's instructions summed over all engines; the node's
span is first issue to last completion (the critical window it occupies).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from mcpc.arch.isa import ENGINES

from . import roofline as rl
from .loader import LoadedProgram

COALESCE_ABOVE = 200_000  # trace events are merged per (engine, node) run beyond this many instructions


def build_profile(
    p: LoadedProgram,
    entry: str,
    order: range,
    issue: list,
    done: list,
    stall: list,
    chain_cycles: int | None = None,
) -> dict:
    """The profile dict (JSON-ready) of one run of ``order`` (global instruction indices).

    ``chain_cycles``: the run's dependency-chain latency (sim/chain.py), a candidate reason of a
    latency-bound run.  The roofline's KV part is the bytes the run read from the KV cache
    (``roofline.kv_reader_mask``); a decoder session sets its own figure (``roofline.finish``)."""
    t = p.target
    sl = slice(order.start, order.stop)
    n = len(order)
    iss = np.asarray(issue, dtype=np.int64)
    don = np.asarray(done, dtype=np.int64)
    busy, eng = p.busy[sl], p.engine_of[sl]
    cycles = int(don.max()) if n else 0
    macs = int(p.macs[sl].sum())
    rd, wr = int(p.dram_read[sl].sum()), int(p.dram_write[sl].sum())
    engines = {}
    for e, name in enumerate(ENGINES):
        b = int(busy[eng == e].sum())
        engines[name] = {"busy": b, "stall": int(stall[e]), "utilization": b / cycles if cycles else 0.0}
    macs_by_dtype: dict[str, int] = {}
    for idx in np.flatnonzero(p.macs[sl]) + order.start:
        dt = p.mac_dtype[idx]
        macs_by_dtype[dt] = macs_by_dtype.get(dt, 0) + int(p.macs[idx])
    compute_cycles = sum(v / t.macs_per_cycle_for(d) for d, v in macs_by_dtype.items())
    dram_cycles = (rd + wr) / t.dram_bytes_per_cycle  # the bytes moved, spills and re-reads included
    main_dtype = max(macs_by_dtype, key=macs_by_dtype.get) if macs_by_dtype else "f16"
    # The MAC array's real occupancy: matmul instructions pay for whole row passes, partly filled
    # column tiles and weight ingestion (docs/timing.md), so useful MACs alone understate it.
    is_mm = np.isin(np.asarray(p.mnemonics[sl]), ("matmul", "matmul_w4a16", "vmmul.q4f8", "matmul_i8"))
    array_cycles = int(busy[is_mm].sum()) if n else 0
    roofline = {
        "achieved_macs_per_cycle": macs / cycles if cycles else 0.0,
        "peak_macs_per_cycle": t.mac.macs_per_cycle.get(main_dtype, 0),
        "peak_dtype": main_dtype,
        "compute_bound_cycles": compute_cycles,
        "mac_utilization": compute_cycles / cycles if cycles else 0.0,
        "achieved_dram_bytes_per_cycle": (rd + wr) / cycles if cycles else 0.0,
        "peak_dram_bytes_per_cycle": t.dram_bytes_per_cycle,
        "dram_moved_bytes": rd + wr,
        "dram_moved_cycles": dram_cycles,
        "dram_bound_cycles": dram_cycles,  # the old name of dram_moved_cycles, kept for its users
        "dram_utilization": dram_cycles / cycles if cycles else 0.0,
        "mac_array_busy_cycles": array_cycles,
        "mac_array_fill": compute_cycles / array_cycles if array_cycles else 0.0,
        "chain_latency_cycles": chain_cycles,
    }
    profile = {
        "target": t.name,
        "entry": entry,
        "clock_mhz": t.clock_mhz,
        "cycles": cycles,
        "latency_us": cycles / t.clock_mhz,
        "instructions": n,
        "instruction_mix": dict(sorted(Counter(p.mnemonics[sl]).items())),
        "macs": macs,
        "macs_by_dtype": macs_by_dtype,
        "dram_read_bytes": rd,
        "dram_write_bytes": wr,
        "peak_sram_bytes": int(p.sram_hi[sl].max()) if n else 0,
        "sram_size_bytes": t.sram.size_bytes,
        "planned_sram_peak_bytes": p.memory_map.get("sram_peak_bytes"),
        "engines": engines,
        "roofline": roofline,
        "nodes": _nodes(p, sl, iss, don, busy),
        "ir_ops": _ir_ops(p, sl, busy),
        "memory": memory_breakdown(p.memory_map),
    }
    kv_bytes = int(p.dram_read[sl][rl.kv_reader_mask(p, order)].sum()) if n else 0
    rl.finish(profile, t, rl.step_weight_bytes(p, entry), rl.entry_io_bytes(p, entry), kv_bytes, chain_cycles)
    return profile


def memory_breakdown(memory_map: dict) -> dict:
    """NPU DRAM the program occupies: ``peak_bytes`` (the planned DRAM size, every region included)
    and ``bytes_per_kind`` summed over the memory map's regions (``const`` = weights, ``input``,
    ``output``, ``scratch`` = activations; later kinds such as ``persistent`` listed as they come)."""
    per_kind: Counter = Counter()
    for region in memory_map.get("regions") or []:
        per_kind[str(region.get("kind", "?"))] += int(region.get("bytes", 0))
    return {
        "peak_bytes": int(memory_map.get("dram_size", 0)),
        "bytes_per_kind": dict(sorted(per_kind.items())),
    }


def _nodes(p: LoadedProgram, sl: slice, iss: np.ndarray, don: np.ndarray, busy: np.ndarray) -> list[dict]:
    node = p.node_of[sl]
    if not len(node):
        return []
    k = len(p.nodes)
    cyc = np.bincount(node, weights=busy, minlength=k)
    cnt = np.bincount(node, minlength=k)
    eng = p.engine_of[sl]
    per_engine = [
        np.bincount(node[eng == e], weights=busy[eng == e], minlength=k) for e in range(len(ENGINES))
    ]
    macs = np.bincount(node, weights=p.macs[sl], minlength=k)
    dram = np.bincount(node, weights=p.dram_read[sl] + p.dram_write[sl], minlength=k)
    t = p.target
    mac_cycles = np.zeros(len(node), dtype=np.float64)  # each instruction's MACs ÷ its dtype's peak
    for i in np.flatnonzero(p.macs[sl]):
        mac_cycles[i] = p.macs[sl.start + i] / t.macs_per_cycle_for(p.mac_dtype[sl.start + i])
    roof = np.maximum(np.bincount(node, weights=mac_cycles, minlength=k), dram / t.dram_bytes_per_cycle)
    # the run's timeline split between nodes: each stretch between two consecutive completions goes
    # to the node whose instruction completes at its end (what the run was waiting for); the
    # stretches sum to the run's cycles
    by_done = np.argsort(don, kind="stable")
    gaps = np.diff(np.concatenate(([0], don[by_done])))
    timeline = np.bincount(node[by_done], weights=gaps, minlength=k)
    covered = _covered(node, iss, busy, k)
    first = np.full(k, np.iinfo(np.int64).max, dtype=np.int64)
    last = np.zeros(k, dtype=np.int64)
    np.minimum.at(first, node, iss)
    np.maximum.at(last, node, don)
    rows = []
    for j in np.flatnonzero(cnt):
        name, op_type = p.nodes[j]
        rows.append(
            {
                "name": name,
                "op_type": op_type,
                "cycles": int(cyc[j]),
                "span": int(last[j] - first[j]),
                "first_issue": int(first[j]),
                "instructions": int(cnt[j]),
                "engine_cycles": {name: int(per_engine[e][j]) for e, name in enumerate(ENGINES)},
                "idle": int(last[j] - first[j] - covered[j]),
                "macs": int(macs[j]),
                "dram_bytes": int(dram[j]),
                "timeline_cycles": int(timeline[j]),
                # its timeline cycles beyond its own roof (MACs ÷ peak or moved bytes ÷ bandwidth)
                "excess_cycles": max(int(timeline[j] - roof[j]), 0),
            }
        )
    rows.sort(key=lambda r: (-r["cycles"], r["name"]))
    return rows


def _covered(node: np.ndarray, iss: np.ndarray, busy: np.ndarray, k: int) -> np.ndarray:
    """Per node, the cycles of its span in which at least one of its instructions is busy on some
    engine (the union of its [issue, issue + busy) intervals); ``span - covered`` is its idle time."""
    if not len(node):
        return np.zeros(k, dtype=np.int64)
    start = iss.astype(np.int64)
    end = start + busy.astype(np.int64)
    order = np.lexsort((start, node))
    n, s, e = node[order].astype(np.int64), start[order], end[order]
    # a running maximum of the end within each node: offsetting node j by j * (max end + 1) keeps
    # one node's ends from leaking into the next node's maximum
    off = n * (int(e.max()) + 1)
    reach = np.maximum.accumulate(e + off) - off
    prev = np.concatenate(([0], reach[:-1]))
    prev[np.concatenate(([True], n[1:] != n[:-1]))] = 0
    gain = np.clip(e - np.maximum(s, prev), 0, None)
    return np.bincount(n, weights=gain, minlength=k).astype(np.int64)


def _ir_ops(p: LoadedProgram, sl: slice, busy: np.ndarray) -> list[dict]:
    ops = p.ir_op_of[sl]
    if not len(ops):
        return []
    k = len(p.ir_ops)
    cyc = np.bincount(ops, weights=busy, minlength=k)
    cnt = np.bincount(ops, minlength=k)
    rows = [
        {"ir_op": p.ir_ops[j] or "<none>", "cycles": int(cyc[j]), "instructions": int(cnt[j])}
        for j in np.flatnonzero(cnt)
    ]
    rows.sort(key=lambda r: (-r["cycles"], r["ir_op"]))
    return rows


def trace_events(p: LoadedProgram, entry: str, order: range, issue: list) -> list[dict[str, Any]]:
    """Chrome/Perfetto trace events: one track per engine, one "X" slice per instruction.

    ts/dur are microseconds (cycles / clock_mhz); a slice lasts the engine-busy cycles.  Beyond
    COALESCE_ABOVE instructions, consecutive instructions of one node on one engine become one
    slice (named after the node), and a metadata event says so.
    """
    clk = p.target.clock_mhz
    events: list[dict[str, Any]] = [
        {"ph": "M", "pid": 0, "name": "process_name", "args": {"name": f"{p.target.name} {entry}"}}
    ]
    for e, name in enumerate(ENGINES):
        events.append({"ph": "M", "pid": 0, "tid": e, "name": "thread_name", "args": {"name": name}})
        events.append({"ph": "M", "pid": 0, "tid": e, "name": "thread_sort_index", "args": {"sort_index": e}})
    coalesce = len(order) > COALESCE_ABOVE
    if coalesce:
        events.append(
            {
                "ph": "M",
                "pid": 0,
                "name": "process_labels",
                "args": {"labels": f"coalesced: {len(order)} instructions merged per (engine, node) run"},
            }
        )
    base = order.start
    if not coalesce:
        for idx in order:
            node = p.nodes[p.node_of[idx]][0]
            events.append(
                {
                    "name": p.mnemonics[idx],
                    "cat": node,
                    "ph": "X",
                    "pid": 0,
                    "tid": int(p.engine_of[idx]),
                    "ts": issue[idx - base] / clk,
                    "dur": int(p.busy[idx]) / clk,
                    "args": {"node": node, "ir_op": p.ir_ops[p.ir_op_of[idx]], "addr": idx},
                }
            )
        return events
    runs: dict[int, list] = {}  # engine -> [node id, first idx, start, end, count]
    for idx in order:
        e, nid = int(p.engine_of[idx]), int(p.node_of[idx])
        start = issue[idx - base]
        end = start + int(p.busy[idx])
        run = runs.get(e)
        if run is not None and run[0] == nid:
            run[3], run[4] = max(run[3], end), run[4] + 1
            continue
        if run is not None:
            events.append(_run_event(p, e, run, clk))
        runs[e] = [nid, idx, start, end, 1]
    for e, run in runs.items():
        events.append(_run_event(p, e, run, clk))
    return events


def _run_event(p: LoadedProgram, e: int, run: list, clk: float) -> dict[str, Any]:
    nid, first, start, end, count = run
    node = p.nodes[nid][0]
    return {
        "name": node,
        "cat": ENGINES[e],
        "ph": "X",
        "pid": 0,
        "tid": e,
        "ts": start / clk,
        "dur": (end - start) / clk,
        "args": {"node": node, "ir_op": p.ir_ops[p.ir_op_of[first]], "addr": first, "instructions": count},
    }
