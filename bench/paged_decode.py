"""Cycles of one decode step of a ``--max-seq`` decoder build at several contexts, on builds that
reserve different lengths: the work of a step follows the context in use, not the reservation.

    python bench/paged_decode.py [--onnx DECODER.onnx] [--config fp16] [--target mcp2026-a100]
                                 [--max-seq 128 2048] [--contexts 64 512 1024]

``--onnx`` is an ONNX graph with past (default: the SmolLM2-135M export of
``tests/llm/export_smollm2.py``, ``smollm2-decode.onnx`` in its cache directory).  Each build
compiles once (``mcpc.compile(..., decoder=DecoderBuild(max_seq))``); each context runs one
``decode`` call of one sequence whose blocks are 0, 1, …, timing-only (its cycles equal the
functional run's), and prints its cycles, the KV bytes its gathers read and those bytes ÷ the
target's DRAM bandwidth.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

import mcpc
from mcpc.decoder_check import paged_feeds
from mcpc.ir.decoder_import import DecoderBuild
from mcpc.sim import Session
from mcpc.sim.loader import from_program


def _default_onnx() -> Path:
    sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "llm"))
    from export_smollm2 import cache_dir  # noqa: PLC0415 - a test helper, only for the default path

    return cache_dir() / "smollm2-decode.onnx"


def step_cycles(program, context: int) -> tuple[int, int]:
    """(cycles, KV bytes gathered) of one decode call at ``context`` tokens (timing-only)."""
    loaded = from_program(program)
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
    return session.last_profile["cycles"], kv


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--onnx", type=Path, default=None)
    ap.add_argument("--config", default="fp16")
    ap.add_argument("--target", default="mcp2026-a100")
    ap.add_argument("--max-seq", type=int, nargs="+", default=[128, 2048])
    ap.add_argument("--contexts", type=int, nargs="+", default=[64, 512, 1024])
    args = ap.parse_args(argv)
    onnx_path = args.onnx or _default_onnx()
    print(f"{onnx_path.name}, {args.config}, {args.target}")
    print("max_seq  context      cycles   KV bytes read  KV bytes / DRAM bw (cycles)")
    for max_seq in args.max_seq:
        t0 = time.perf_counter()
        res = mcpc.compile(str(onnx_path), target=args.target, qat_config=args.config,
                           decoder=DecoderBuild(max_seq=max_seq))  # fmt: skip
        bw = from_program(res.program).target.dram_bytes_per_cycle
        print(f"  (build --max-seq {max_seq}: {time.perf_counter() - t0:.0f} s)")
        for context in args.contexts:
            if context > max_seq:
                continue
            cycles, kv = step_cycles(res.program, context)
            print(f"{max_seq:7d}  {context:7d}  {cycles:10d}  {kv:14d}  {kv / bw:12.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
