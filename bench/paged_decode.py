"""Cycles of one decode step of a ``--max-seq`` decoder build at several contexts, on builds that
reserve different lengths: the work of a step follows the context in use, not the reservation.

    python bench/paged_decode.py [--onnx DECODER.onnx] [--config fp16] [--target mcp2026-a100]
                                 [--max-seq 128 2048] [--contexts 64 512 1024]

``--onnx`` is an ONNX graph with past (default: the SmolLM2-135M export of
``tests/llm/export_smollm2.py``, ``smollm2-decode.onnx`` in its cache directory).  Each build
compiles once (``mcpc.compile(..., decoder=DecoderBuild(max_seq))``); each context runs one
``decode`` call of one sequence whose blocks are 0, 1, …, timing-only (its cycles equal the
functional run's), and prints its cycles, the KV bytes its gathers read and those bytes ÷ the
target's DRAM bandwidth, the step's DRAM roofline ((the weight bytes a step reads + those KV bytes)
÷ bandwidth), the latency of its dependency chain and the bound roofline ÷ 0.85 + chain it is held
to (docs/timing.md, "The dependency chain").  ``--save DIR`` writes each build's .mcpb there, and
``--program P.mcpb`` measures a saved build instead of compiling.

``--served`` measures the served path instead (``DecoderSession``, timing-only): a prefill of
context − 1 tokens, then one decode step; for a build that compresses its KV cache it prints the
cycles of the ``kvcomp``s the host issued (docs/kv-cache.md): those of the decode step (in its
cycles) and those of one full block (every layer's K and V, from the prefill).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

import mcpc
from mcpc.arch.mcpb import write_mcpb
from mcpc.decoder_check import paged_feeds
from mcpc.ir.decoder_import import DecoderBuild
from mcpc.sim import Session
from mcpc.sim.decoder import ROOFLINE_EFFICIENCY, step_weight_bytes
from mcpc.sim.loader import LoadedProgram, from_program, load_program


def _default_onnx() -> Path:
    sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "llm"))
    from export_smollm2 import cache_dir  # noqa: PLC0415 - a test helper, only for the default path

    return cache_dir() / "smollm2-decode.onnx"


def step_cycles(program, context: int) -> tuple[int, int, int]:
    """(cycles, KV bytes gathered, chain latency) of one decode call at ``context`` tokens
    (timing-only)."""
    loaded = program if isinstance(program, LoadedProgram) else from_program(program)
    info = loaded.meta["decoder"]
    gather = info["max_batch"] * -(-info["max_seq"] // 64)
    blocks = -(-context // 64)
    feeds, used = paged_feeds([list(range(blocks))], [context - 1], [1], 1, gather, info["kv_blocks"])
    ids = np.zeros((info["max_batch"], 1), np.int64)
    pos = np.full((info["max_batch"], 1), context - 1, np.int64)
    inputs = {info["inputs"]["ids"]: ids, **feeds}
    if info["inputs"]["positions"]:
        inputs[info["inputs"]["positions"]] = pos
    session = Session(loaded)
    session.run(inputs, entry="decode", registers={"kv_blocks": used}, timing_only=True)
    start, count = loaded.entries["decode"]
    blocks_read = [  # the gathers of K/V blocks: a run-time count (an embedding look-up has none)
        i for i in range(start, start + count)
        if loaded.mnemonics[i] == "gather" and loaded.instr(i).fields["count_reg"]
    ]  # fmt: skip
    kv = int(sum(loaded.dram_read[i] for i in blocks_read))
    prof = session.last_profile
    return prof["cycles"], kv, prof["roofline"]["chain_latency_cycles"]


def served_step(program, context: int) -> dict:
    """The served path at ``context``: a timing-only prefill of context - 1 tokens (its kvcomp cycles
    per full block) and one decode step (its cycles and its kvcomp cycles)."""
    from mcpc.sim.decoder import DecoderSession

    dec = DecoderSession(program, timing_only=True)
    seq, _ = dec.new_sequence()
    dec.prefill([(seq, [1] * (context - 1))])
    full = (context - 1) // 64
    prefill_kvcomp = sum(s["kvcomp_cycles"] for s in dec.steps)
    dec.decode([seq], [1])
    step = dec.steps[-1]
    # the prefill's kvcomps store `full` full blocks and the filling one: a full block's share is
    # measured directly on a fresh session filling exactly one block
    one = DecoderSession(program, timing_only=True)
    s1, _ = one.new_sequence()
    one.prefill([(s1, [1] * 64)])
    chunks = [s["kvcomp_cycles"] for s in one.steps]
    return {
        "cycles": step["cycles"],
        "kvcomp_cycles": step["kvcomp_cycles"],
        "prefill_kvcomp_cycles": prefill_kvcomp,
        "full_blocks": full,
        "block_kvcomp_cycles": chunks[-1],
        "prefill_chunk": one.meta.prefill_chunk,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--onnx", type=Path, default=None)
    ap.add_argument("--config", default="fp16")
    ap.add_argument("--target", default="mcp2026-a100")
    ap.add_argument("--max-seq", type=int, nargs="+", default=[128, 2048])
    ap.add_argument("--contexts", type=int, nargs="+", default=[64, 512, 1024])
    ap.add_argument("--save", type=Path, default=None, help="write each build's .mcpb into this directory")
    ap.add_argument("--program", type=Path, nargs="+", default=None, help="measure saved builds instead")
    ap.add_argument("--served", action="store_true", help="the served path: kvcomp cycles (see above)")
    args = ap.parse_args(argv)
    if args.program:
        builds = [(None, p) for p in args.program]
        print(f"{', '.join(p.name for p in args.program)}")
    else:
        onnx_path = args.onnx or _default_onnx()
        builds = [(m, None) for m in args.max_seq]
        print(f"{onnx_path.name}, {args.config}, {args.target}")
    if args.served:
        print("max_seq  context  step cycles  of which kvcomp  last prefill chunk's kvcomp (one full block)")
    else:
        print(
            "max_seq  context      cycles   KV bytes read  KV bytes / DRAM bw (cycles)    roofline"
            "       chain  roof/0.85+chain  cycles/bound"
        )
    for max_seq, path in builds:
        if path is None:
            t0 = time.perf_counter()
            res = mcpc.compile(str(onnx_path), target=args.target, qat_config=args.config,
                               decoder=DecoderBuild(max_seq=max_seq))  # fmt: skip
            print(f"  (build --max-seq {max_seq}: {time.perf_counter() - t0:.0f} s)")
            if args.save:
                args.save.mkdir(parents=True, exist_ok=True)
                write_mcpb(
                    args.save / f"{onnx_path.stem}-{Path(args.config).stem}-{max_seq}.mcpb", res.program
                )
            loaded = from_program(res.program)
        else:
            loaded = load_program(path)
        max_seq = loaded.meta["decoder"]["max_seq"]
        bw = loaded.target.dram_bytes_per_cycle
        weights = step_weight_bytes(loaded, "decode")
        for context in args.contexts:
            if context > max_seq:
                continue
            if args.served:
                r = served_step(loaded, context)
                print(
                    f"{max_seq:7d}  {context:7d}  {r['cycles']:11d}  {r['kvcomp_cycles']:15d}  "
                    f"{r['block_kvcomp_cycles']:10d} (prefill chunk {r['prefill_chunk']})"
                )
                continue
            cycles, kv, chain = step_cycles(loaded, context)
            roof = (weights + kv) / bw
            bound = roof / ROOFLINE_EFFICIENCY + chain
            print(
                f"{max_seq:7d}  {context:7d}  {cycles:10d}  {kv:14d}  {kv / bw:12.0f}  {roof:25.0f}  "
                f"{chain:10d}  {bound:15.0f}  {cycles / bound:12.3f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
