"""The compile summary's estimate: a fresh build's entries run timing-only on the simulator, each
beside its roofline (sim/roofline.py), and a warning for an entry more than
``roofline.LATENCY_FACTOR`` × its bound, naming the nodes responsible (docs/timing.md "The
roofline").

A plain build runs each entry once on random inputs (``api.random_inputs``); a decoder build
(META ``decoder``) runs a prefill of one chunk of token ids and one decode step through
``DecoderSession``, timing-only.  Cycles are those ``mcpc sim run --timing-only`` gives (the same
cost model); a build of more than ``MAX_INSTRUCTIONS`` instructions is not estimated (a note says
so and how to get the figure), since loading and running it would lengthen the compile.
"""

from __future__ import annotations

from typing import Any

from mcpc.arch.isa import INSTR_BYTES
from mcpc.errors import McpcError

from . import roofline

MAX_INSTRUCTIONS = 100_000


def estimate_program(program: Any, source: str = "<program>") -> dict:
    """``{"entries": [row, ...]}`` or ``{"skipped": reason}`` for a compiled ``Program``; a row is
    ``{entry, cycles, roofline_cycles, roofline_ratio, compulsory_dram_bytes, bound, bound_detail,
    bound_reason, nodes}`` with ``nodes``
    the responsible ones (``roofline.responsible_nodes``: name, op_type, excess_cycles), or
    ``{entry, error}`` when the entry could not be run timing-only (the message)."""
    count = len(program.text) // INSTR_BYTES
    if count > MAX_INSTRUCTIONS:
        return {
            "skipped": f"{count:,} instructions, more than the {MAX_INSTRUCTIONS:,} the compile estimates "
            "(`mcpc sim run --timing-only --random-inputs` gives its cycles and bound)"
        }
    from .loader import from_program

    try:
        loaded = from_program(program, source)
    except McpcError as exc:
        return {"skipped": exc.message}
    decoder = (program.meta or {}).get("decoder")
    if isinstance(decoder, dict) and {"prefill", "decode"} <= set(loaded.entries):
        return {"entries": _decoder_rows(loaded)}
    from .api import random_inputs, run_program

    rows = []
    for entry in loaded.entries:
        try:
            res = run_program(loaded, random_inputs(loaded, entry), entry=entry, timing_only=True)
        except McpcError as exc:
            rows.append({"entry": entry, "error": exc.message})
            continue
        rows.append(_row(entry, res.profile))
    return {"entries": rows}


def _decoder_rows(loaded: Any) -> list[dict]:
    """A prefill of one chunk (token ids 0, 1, ...) and one decode step of one sequence."""
    from .decoder import DecoderSession
    from .session import Session

    session = Session(loaded)
    try:
        dec = DecoderSession(session, timing_only=True)
        prompt = [t % dec.meta.vocab for t in range(min(dec.meta.prefill_chunk, dec.meta.max_seq - 1))]
        seq, _ = dec.new_sequence(prompt)
        dec.prefill([(seq, prompt)])
        rows = [_row("prefill", session.last_profile)]
        dec.decode([seq], [0])
        rows.append(_row("decode", session.last_profile))
    except McpcError as exc:
        return [{"entry": "prefill/decode", "error": exc.message}]
    return rows


def _row(entry: str, prof: dict) -> dict:
    r = prof["roofline"]
    return {
        "entry": entry,
        "cycles": int(prof["cycles"]),
        "roofline_cycles": r["roofline_cycles"],
        "roofline_ratio": r["roofline_ratio"],
        "compulsory_dram_bytes": r["compulsory_dram_bytes"],
        "bound": r["bound"],
        "bound_detail": r["bound_detail"],
        "bound_reason": r["bound_reason"],
        "nodes": [
            {"name": n["name"], "op_type": n["op_type"], "excess_cycles": n["excess_cycles"]}
            for n in roofline.responsible_nodes(prof)
        ],
    }


def warning_lines(estimate: dict | None) -> list[str]:
    """The compile summary's lines: one per entry more than LATENCY_FACTOR × its roofline (naming
    its responsible nodes), a note per entry that could not be estimated or for a skipped build."""
    if not estimate:
        return []
    if "skipped" in estimate:
        return [f"note: cycles not estimated: {estimate['skipped']}"]
    out = []
    for row in estimate.get("entries", []):
        if "error" in row:
            out.append(f"note: entry {row['entry']}: cycles not estimated: {row['error']}")
            continue
        if not row["roofline_cycles"] or row["roofline_ratio"] <= roofline.LATENCY_FACTOR:
            continue
        nodes = "; ".join(
            f"{n['name']} ({n['op_type']}, {n['excess_cycles']:,} cycles beyond its own roof)"
            for n in row["nodes"]
        )
        out.append(
            f"warning: entry {row['entry']}: an estimated {row['cycles']:,} cycles, "
            f"{row['roofline_ratio']:.1f}× its roofline of {row['roofline_cycles']:,.0f} cycles; "
            f"top reason: {row['bound_reason']}" + (f"; nodes responsible: {nodes}" if nodes else "")
        )
    return out
