"""Cycles of one ``prefill`` call of a ``--max-seq`` decoder build at several chunk lengths: the
work of a prefill follows the tokens it takes, not the ``--prefill-chunk`` capacity.

    python bench/prefill_extent.py [--onnx DECODER.onnx] [--config fp16] [--target mcp2026-a100]
                                   [--max-seq 128] [--chunk 64] [--lengths 1 16 64]
                                   [--save P.mcpb | --program P.mcpb]

``--onnx`` defaults to the SmolLM2-135M export of ``tests/llm/export_smollm2.py``.  Each length n
runs one ``prefill`` call of one fresh sequence of n tokens (past 0), timing-only (its cycles equal
the functional run's), and prints its cycles, the DRAM roofline (the weight bytes the call reads
+ the KV block it writes, ÷ the target's DRAM bandwidth), the compute roofline (the call's MACs
÷ the target's peak MACs per cycle for the build's dtype, from the profile) and the latency of
its dependency chain.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

import mcpc
from mcpc.arch.mcpb import write_mcpb
from mcpc.ir.decoder_import import PREFILL_ROWS_REG, DecoderBuild
from mcpc.sim import Session
from mcpc.sim.decoder import DecoderMeta, StepItem, step_inputs, step_weight_bytes
from mcpc.sim.loader import from_program, load_program


def _default_onnx() -> Path:
    sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "llm"))
    from export_smollm2 import cache_dir  # noqa: PLC0415 - a test helper, only for the default path

    return cache_dir() / "smollm2-decode.onnx"


def prefill_profile(loaded, n: int) -> dict:
    """The profile of one timing-only ``prefill`` call of n new tokens of one sequence (past 0)."""
    meta = DecoderMeta.from_program(loaded)
    items = [StepItem(list(range(meta.blocks_per_seq)), 0, [0] * n)]
    inputs, used = step_inputs(meta, meta.prefill_chunk, items)
    regs = {"kv_blocks": used}
    if any(h["name"] == PREFILL_ROWS_REG for h in loaded.program.host_registers):
        regs[PREFILL_ROWS_REG] = n
    session = Session(loaded)
    session.run(inputs, entry="prefill", registers=regs, timing_only=True)
    return session.last_profile


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--onnx", type=Path, default=None)
    ap.add_argument("--config", default="fp16")
    ap.add_argument("--target", default="mcp2026-a100")
    ap.add_argument("--max-seq", type=int, default=128)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--lengths", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--save", type=Path, default=None, help="write the build's .mcpb here")
    ap.add_argument("--program", type=Path, default=None, help="measure a saved build instead")
    args = ap.parse_args(argv)
    if args.program:
        loaded = load_program(args.program)
        print(args.program.name)
    else:
        onnx_path = args.onnx or _default_onnx()
        t0 = time.perf_counter()
        res = mcpc.compile(str(onnx_path), target=args.target, qat_config=args.config,
                           decoder=DecoderBuild(max_seq=args.max_seq, prefill_chunk=args.chunk))  # fmt: skip
        print(f"{onnx_path.name}, {args.config}, {args.target} (build: {time.perf_counter() - t0:.0f} s)")
        if args.save:
            write_mcpb(args.save, res.program)
        loaded = from_program(res.program)
    bw = loaded.target.dram_bytes_per_cycle
    weights = step_weight_bytes(loaded, "prefill")
    info = loaded.meta["decoder"]
    kv_block = 2 * info["layers"] * info["kv_heads"] * info["block"] * info["head_dim"]
    kv_block *= np.dtype(np.float16 if info["kv_dtype"] == "f16" else np.float32).itemsize
    print(f"prefill chunk capacity {info['prefill_chunk']}, weight bytes a call reads {weights:,d}")
    print("tokens      cycles  cycles/token  DRAM roofline  compute roofline       chain")
    for n in args.lengths:
        t0 = time.perf_counter()
        prof = prefill_profile(loaded, n)
        roof = prof.get("roofline") or {}
        dram = (weights + kv_block) / bw
        compute = roof.get("compute_bound_cycles", float("nan"))
        print(
            f"{n:6d}  {prof['cycles']:10,d}  {prof['cycles'] / n:12,.0f}  {dram:13,.0f}  {compute:16,.0f}  "
            f"{roof.get('chain_latency_cycles', 0):10,d}   ({time.perf_counter() - t0:.1f} s)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
