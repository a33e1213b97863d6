"""The command-line form of the ONNX Runtime reference for served decoding, and its re-export for the
tests: the loop itself (``greedy``, ``ort_nll``, ``perplexity``, ``OrtDecoder``; both K/V naming
conventions) is ``mcpc/ort_decoder.py`` - read its docstring for the protocol.  The reference figures
beside ``mcpc sim generate`` / ``mcpc sim eval-ppl``::

    .venv/bin/python tests/llm/ort_greedy.py MODEL.onnx --prompt-ids IDS.npy --max-new-tokens N
    .venv/bin/python tests/llm/ort_greedy.py MODEL.onnx --tokens TOKENS.npy --window W [--prefill P]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from mcpc.ort_decoder import OrtDecoder, greedy, ort_nll, perplexity, windows

__all__ = ["OrtDecoder", "greedy", "ort_nll", "perplexity", "windows"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="ONNX Runtime greedy ids or perplexity of a with-past decoder")
    ap.add_argument("model", type=Path, help="decoder ONNX graph with past")
    ap.add_argument("--prompt-ids", type=Path, help=".npy of prompt ids, (n,) or (1, n)")
    ap.add_argument("--max-new-tokens", type=int, default=20)
    ap.add_argument("--tokens", type=Path, help=".npy of token ids: 1-D (cut into windows) or 2-D")
    ap.add_argument("--window", type=int, help="window length (1-D tokens)")
    ap.add_argument("--prefill", type=int, default=16)
    ap.add_argument("--json", type=Path, help="write the result here")
    opts = ap.parse_args(argv)
    if (opts.prompt_ids is None) == (opts.tokens is None):
        ap.error("give exactly one of --prompt-ids and --tokens")
    try:
        return _run(opts)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _run(opts: argparse.Namespace) -> int:
    dec = OrtDecoder(opts.model)
    t0 = time.perf_counter()
    if opts.prompt_ids is not None:
        ids, margins = greedy(dec, np.load(opts.prompt_ids), opts.max_new_tokens, return_margins=True)
        result = {"generated_ids": ids, "min_top1_margin": min(margins)}
        print(" ".join(map(str, ids)))
    else:
        nll = ort_nll(dec, np.load(opts.tokens), opts.window, opts.prefill)
        result = {
            "perplexity": perplexity(nll),
            "window_perplexity": [perplexity(row) for row in nll],
            "windows": nll.shape[0],
            "predictions": int(nll.size),
        }
        print(f"perplexity {result['perplexity']:.4f} over {nll.shape[0]} windows x {nll.shape[1] + 1}")
    result["seconds"] = round(time.perf_counter() - t0, 1)
    if opts.json:
        opts.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
