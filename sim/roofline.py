"""The roofline of a run, computed from what the model must move and compute, never from the bytes
a program happened to move (docs/simulator.md "Profile JSON", docs/timing.md "The roofline").

* ``compulsory_dram_bytes`` = the weights one call of the entry reads (each byte once) + its
  inputs + its outputs + the KV cache in use.  It is the one definition: the profile's
  ``roofline.compulsory_dram_bytes`` and a decode step's ``decode_roofline_cycles`` × bandwidth
  (sim/decoder.py) are both this function's value.
* the bound = max(MACs ÷ the peak MACs a cycle of their dtype, compulsory bytes ÷ DRAM bytes a
  cycle); ``bound`` says ``compute`` or ``memory`` (the larger roof) or, when the run takes more
  than ``LATENCY_FACTOR`` × the bound, ``latency``, and ``bound_detail`` says
  ``latency (N× the roofline: <the top reason>)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# A run this many times its roofline or more is far from both roofs: latency-bound.  The compile
# summary warns about a build past the same factor.
LATENCY_FACTOR = 2.0
# The per-region kinds the compulsory bytes count as weights, inputs and outputs; reads of any
# other region kind (``persistent``: the KV cache) and register-offset reads are the KV in use.
_NOT_KV = ("const", "input", "output", "scratch")


def compulsory_dram_bytes(weight_bytes: int, input_bytes: int, output_bytes: int, kv_bytes: int) -> int:
    """The bytes a call must move between DRAM and the NPU whatever the schedule: the weights read
    once, the inputs, the outputs and the KV cache in use (all non-negative byte counts)."""
    return int(weight_bytes) + int(input_bytes) + int(output_bytes) + int(kv_bytes)


def step_weight_bytes(program: Any, entry: str = "decode") -> int:
    """The constant (weight) bytes one call of ``entry`` reads from DRAM: the union of the constant
    bytes its loads read (a weight read twice counts once), plus the rows its gathers pick from a
    constant table that no load reads whole (an embedding look-up reads its rows; a table the
    loads read anyway — a tied LM head — counts once).  A gather of a run-time count counts its
    capacity.  A program without instructions to look at (a stand-in) counts all its constants.
    Cached per entry on a LoadedProgram."""
    cache = getattr(program, "_roof", None)
    if cache is not None and ("weights", entry) in cache:
        return cache["weights", entry]
    consts = [
        (int(r["dram"]), int(r["dram"]) + int(r["bytes"]))
        for r in (getattr(program, "memory_map", None) or {}).get("regions") or []
        if r.get("kind") == "const" and r.get("bytes")
    ]
    if not hasattr(program, "mnemonics") or entry not in program.entries:
        return len(program.program.constants)

    def const(lo: int) -> bool:
        return any(a <= lo < b for a, b in consts)

    start, count = program.entries[entry]
    spans: list[tuple[int, int]] = []
    gathers: list[tuple[int, int, int]] = []
    for idx in range(start, start + count):
        op = program.mnemonics[idx]
        if op not in ("load", "gather"):
            continue
        f = program.instr(idx).fields
        lo = f["dram"]
        if f["dram_reg"] or not const(lo):
            continue
        n = f["rows"] if op == "load" else max(f["limit"], 1)
        hi = lo + (n - 1) * f["dram_stride"] + f["row_bytes"]
        if op == "load":
            spans.append((lo, hi))
        else:
            gathers.append((lo, hi, f["count"] * f["row_bytes"]))
    merged: list[list[int]] = []
    for lo, hi in sorted(spans):
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    total = sum(hi - lo for lo, hi in merged)
    for lo, hi, n in gathers:
        if not any(a <= lo and hi <= b for a, b in merged):
            total += min(n, hi - lo)
    if cache is not None:
        cache["weights", entry] = total
    return total


def entry_io_bytes(program: Any, entry: str) -> tuple[int, int]:
    """(input bytes, output bytes) of ``entry``'s I/O bindings (the loader checked each binding
    covers a region of exactly its bytes)."""
    from mcpc.arch.dtypes import nbytes

    io = program.io.get(entry, {}) if isinstance(getattr(program, "io", None), dict) else {}

    def total(kind: str) -> int:
        return sum(nbytes(b["dtype"], int(np.prod(b["shape"], dtype=np.int64))) for b in io.get(kind, []))

    return total("inputs"), total("outputs")


def kv_reader_mask(program: Any, order: range) -> np.ndarray:
    """Per instruction of ``order``, whether its DRAM reads are of the KV cache: a read of a region
    that is none of const/input/output/scratch (a ``persistent`` global), or offset by a register
    the program or host sets (the paged cache's gathers).  Cached per entry range."""
    cache = getattr(program, "_roof", None)
    key = ("kv", order.start, order.stop)
    if cache is not None and key in cache:
        return cache[key]
    regions = [
        (int(r["dram"]), int(r["dram"]) + int(r["bytes"]), str(r.get("kind", "?")))
        for r in (getattr(program, "memory_map", None) or {}).get("regions") or []
        if r.get("bytes")
    ]
    mask = np.zeros(len(order), dtype=bool)
    varying = {idx for idx, _ in getattr(program, "extents", ())}
    for k, idx in enumerate(order):
        if not program.dram_read[idx] and idx not in varying:
            continue
        ins = program.instr(idx)
        for mem, base, _rows, _cols, _stride, _elem, write, reg in ins.spec.access(ins.fields):
            if mem != "dram" or write:
                continue
            kind = next((kd for lo, hi, kd in regions if lo <= base < hi), "?")
            if reg or kind not in _NOT_KV:
                mask[k] = True
    if cache is not None:
        cache[key] = mask
    return mask


def roofs(macs_by_dtype: dict[str, int], compulsory_bytes: int, target: Any) -> tuple[float, float]:
    """(compute roof, memory roof) in cycles: Σ MACs[dtype] ÷ peak MACs a cycle of that dtype, and
    the compulsory bytes ÷ the target's DRAM bytes a cycle."""
    compute = sum(v / target.macs_per_cycle_for(d) for d, v in macs_by_dtype.items())
    return compute, compulsory_bytes / target.dram_bytes_per_cycle


def classify(cycles: int, compute_roof: float, memory_roof: float, reason: str) -> tuple[str, str, float]:
    """(``bound``, ``bound_detail``, cycles ÷ roofline): ``latency`` when the run takes more than
    LATENCY_FACTOR × the larger roof (detail ``latency (N× the roofline: reason)``), else the
    larger roof's name."""
    roof = max(compute_roof, memory_roof)
    ratio = cycles / roof if roof else 0.0
    if cycles and (not roof or ratio > LATENCY_FACTOR):
        times = f"{ratio:.1f}× the roofline" if roof else "no roofline: no MACs and no compulsory bytes"
        return "latency", f"latency ({times}: {reason})", ratio
    word = "compute" if compute_roof >= memory_roof else "memory"
    return word, word, ratio


def top_reason(profile: dict, chain_cycles: int | None) -> str:
    """The largest thing the profile already knows that keeps the run from its roofline, in words:
    the dependency chain, DRAM traffic (its ratio to the compulsory bytes when well above), the MAC
    array's busy time beyond its useful MACs (fill/drain, padding, weight ingestion), one engine's
    busy time — whichever accounts for the most cycles, when that is at least a third of the run —
    or else the engines' stalls (waiting on each other's tokens: latencies paid in sequence)."""
    roof, cycles = profile["roofline"], max(int(profile["cycles"]), 1)
    cands: list[tuple[float, str]] = []
    if chain_cycles:
        cands.append((chain_cycles, f"a dependency chain of {chain_cycles:,} cycles"))
    moved, need = roof["dram_moved_bytes"], roof["compulsory_dram_bytes"]
    if moved:
        extra = ""
        if moved > 1.05 * need:  # well above what the model must move
            extra = f", {moved / need:.1f}× the compulsory bytes (spills and re-reads)" if need else ""
        moved_cycles = roof["dram_moved_cycles"]
        cands.append((moved_cycles, f"DRAM traffic of {moved_cycles:,.0f} cycles{extra}"))
    array, useful = roof["mac_array_busy_cycles"], roof["compute_bound_cycles"]
    if array > 2 * useful:
        cands.append(
            (array, f"the MAC array busy {array:,} cycles, {100 * roof['mac_array_fill']:.0f} % of them "
             "doing useful MACs (fill/drain, padding, weight ingestion)")
        )  # fmt: skip
    for name, e in profile["engines"].items():
        cands.append((e["busy"], f"the {name} engine busy {e['busy']:,} cycles"))
    best = max(cands, default=(0, ""))
    if best[0] >= cycles / 3:
        return f"{best[1]}, {100 * best[0] / cycles:.0f} % of the run"
    stalls = [(name, e["stall"]) for name, e in profile["engines"].items() if e["stall"]]
    if stalls:
        which = ", ".join(f"{name} {100 * st / cycles:.0f} %" for name, st in stalls)
        beyond = f"; beyond {best[1]}, {100 * best[0] / cycles:.0f} % of the run" if best[1] else ""
        return (
            f"engines waiting on each other's tokens or the channel (stalled: {which} of the run): "
            f"latencies paid one after another{beyond}"
        )
    return best[1] or "engines idle"


def responsible_nodes(profile: dict, count: int = 3) -> list[dict]:
    """The nodes keeping the run from its roofline: the largest ``excess_cycles`` (the node's share
    of the run's timeline, ``timeline_cycles``, less its own roof: its MACs ÷ peak or its moved
    bytes ÷ bandwidth), at most ``count``."""
    rows = [n for n in profile.get("nodes") or [] if n.get("excess_cycles", 0) > 0]
    rows.sort(key=lambda n: (-n["excess_cycles"], n["name"]))
    return rows[:count]


def finish(
    profile: dict,
    target: Any,
    weight_bytes: int,
    io_bytes: tuple[int, int],
    kv_bytes: int,
    chain_cycles: int | None,
) -> None:
    """Set the profile's roofline figures from the compulsory bytes (the parts given) and its
    MACs: ``compulsory_dram_bytes`` and its parts, ``memory_roof_cycles``, ``roofline_cycles``,
    ``roofline_ratio``, ``bound``, ``bound_detail``, ``bound_reason`` (``top_reason``, whatever the
    bound), ``dram_traffic_ratio`` (moved ÷ compulsory).
    Called again by a caller that knows the KV in use better (sim/decoder.py)."""
    roof = profile["roofline"]
    need = compulsory_dram_bytes(weight_bytes, io_bytes[0], io_bytes[1], kv_bytes)
    compute, memory = roofs(profile["macs_by_dtype"], need, target)
    roof.update(
        compulsory_dram_bytes=need,
        compulsory_dram_parts={
            "weights": int(weight_bytes),
            "inputs": int(io_bytes[0]),
            "outputs": int(io_bytes[1]),
            "kv": int(kv_bytes),
        },  # fmt: skip
        memory_roof_cycles=memory,
        roofline_cycles=max(compute, memory),
        dram_traffic_ratio=roof["dram_moved_bytes"] / need if need else 0.0,
    )
    reason = top_reason(profile, chain_cycles)
    word, detail, ratio = classify(profile["cycles"], compute, memory, reason)
    roof.update(bound=word, bound_detail=detail, bound_reason=reason, roofline_ratio=ratio)
