"""Step costs of a compiled decoder program (a ``mcp-compile --max-seq`` build).

``served_shape`` reads what the build serves from its META ``decoder`` section.  ``measurer``
returns the callable ``CostGrid.measure`` and ``ExactCost`` call: timing-only calls of the build's
``prefill`` and ``decode`` entries through the decoder host driver (``DecoderSession``), which
builds each call's ``kv_*`` inputs and ``kv_blocks`` register from its KV manager.
"""

from __future__ import annotations

from pathlib import Path

from .cost import Measured, Measurer, ServedShape


def served_shape(loaded, source: str) -> ServedShape:
    """What a decoder build serves, from its META ``decoder`` section (``DecoderMeta``: a program
    that is not a decoder build is a usage error naming ``mcp-compile --max-seq``)."""
    from mcpc.sim.decoder import DecoderMeta, block_bytes

    m = DecoderMeta.from_program(loaded)
    per_block = block_bytes(m) if m.kv_quant is None else stored_block_bytes(m, source)
    return ServedShape(m.max_batch, m.max_seq, m.prefill_chunk, m.kv_blocks, m.block, per_block // m.block)


def stored_block_bytes(m, source: str) -> int:
    """Bytes one full KV block takes as a compressing build stores it (META ``kv_quant``: INT8,
    sparsity): every layer's K and V blocks of every kv head, as ``nominal_block_bytes`` sizes them
    without values (what ``DecoderSession`` counts on a timing-only run; an INT8 block that fails its
    error check and is kept fp16 is larger, which only a run with values can see)."""
    from mcpc.errors import InputError
    from mcpc.kv import KvSettings, nominal_block_bytes

    try:
        settings = KvSettings.from_json(m.kv_quant)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{source}: META decoder.kv_quant is malformed ({exc})") from None
    return 2 * sum(
        sum(nominal_block_bytes(settings, layer, m.kv_heads, m.block, m.head_dim, m.kv_dtype))
        for layer in range(m.layers)
    )


def measurer(program, source: str) -> Measurer:
    """Timing-only steps of ``program`` (a loaded program, or a Session-like object) through the
    decoder host driver: ``measure("decode", active, context)`` runs one decode call of ``active``
    sequences that each attend ``context`` positions, ``measure("prefill", chunk, past)`` one
    prefill call of a ``chunk``-token chunk after ``past`` cached tokens.  The cached tokens are
    placed in the KV manager without computing them (timing reads no K/V value), and the sequences
    of one measurement share their full blocks (the same ids), so even ``max_batch`` sequences at
    ``max_seq`` fit any pool; each step gathers every sequence's blocks all the same.  The answer
    is the step's cycles carrying the DRAM bytes its profile read (``Measured``)."""
    from mcpc.sim.decoder import DecoderSession

    dec = DecoderSession(program, prefix_sharing=True, timing_only=True)
    vocab = dec.meta.vocab

    def placed(n: int) -> int:
        ids = [i % vocab for i in range(n)]
        seq, hit = dec.new_sequence(ids)
        dec.kv.append(seq, ids[hit:])
        return seq

    def measure(kind: str, x: int, y: int) -> float:
        if kind == "decode":
            seqs = [placed(y - 1) for _ in range(x)]
            dec.decode(seqs, [0] * x)
        else:
            seqs = [placed(y)]
            dec.prefill([(seqs[0], [0] * x)])
        for seq in seqs:
            dec.free(seq)
        step = dec.steps[-1]
        return Measured(step["cycles"], step["dram_read_bytes"])

    return measure


def default_grid_path(program: Path) -> Path:
    """Where the cost grid of ``program`` is cached: beside it, ``NAME.costgrid.json``."""
    return program.with_name(program.stem + ".costgrid.json")
