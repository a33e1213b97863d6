"""What each KV-cache setting costs in perplexity and saves in KV bytes, on a decoder build.

    python bench/kv_table.py [--onnx DECODER.onnx] [--tokens TOKENS.npy] [--windows 4] [--window 128]
                             [--max-seq 128] [--target mcp2026-a100] [--markdown OUT.md]

Default model: the small random-weight Llama decoder of tests/llm/decoders (head_dim 16, so INT8
saves at most 32/19 = 1.68x per row; random tokens).  Builds: fp32, fp16, W4A16 (qat_w4a16),
W4A16 + INT8 KV (qat_w4a16_kv8), W4A16 + INT8 KV + 70 % sparsity under each policy, and W4A16 + INT8
KV with the dynamic window (min_window 8: a line under the table says where it put the rows); each is
compiled once (``--max-seq``) and evaluated with ``DecoderSession.eval_ppl`` (prefill 16, then one
decode step per token, every step reading K/V from the stored cache), beside ONNX Runtime fp32 on
the same windows (its own KV loop, tests/llm/ort_greedy.py).  Columns: perplexity, its change
against the same build without the KV setting, peak ``kv_bytes`` (stored bytes for a compressed
cache, whole reserved blocks otherwise), the mean decode step's DRAM bytes read (weights + K/V) and
its cycles.  For SmolLM2-135M pass
``--onnx`` its export (tests/llm/export_smollm2.py) and ``--tokens tests/data`` ids: its weights come
from a Q4_1 GGUF, so even the "fp32" baseline carries 4-bit weights.

A compressed cache lives in NPU DRAM and the program reads its full blocks with ``kvdecomp``
(docs/kv-cache.md, "In NPU memory"): the decode step's DRAM bytes and cycles follow the stored
bytes (the block being filled is read plain), so they fall with each KV setting, by what those
bytes are worth at the target's DRAM bandwidth.  The ``topk_entropy`` and ``heavy_hitter`` builds
also write the attention heat (docs/decoding.md, "Attention heat"), whose work they are charged.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "llm"))

BUILDS = [  # (label, qat config, kv flags (quant, ratio, policy) or None, the build it is compared to)
    ("fp32", "fp32", None, None),
    ("fp16", "fp16", None, None),
    ("W4A16", "qat_w4a16", None, None),
    ("W4A16 + INT8 KV", "qat_w4a16", ("int8", None, None), "W4A16"),
    ("+ 70 % topk_magnitude", "qat_w4a16", ("int8", 0.7, "topk_magnitude"), "W4A16 + INT8 KV"),
    ("+ 70 % topk_entropy", "qat_w4a16", ("int8", 0.7, "topk_entropy"), "W4A16 + INT8 KV"),
    ("+ 70 % heavy_hitter", "qat_w4a16", ("int8", 0.7, "heavy_hitter"), "W4A16 + INT8 KV"),
    ("+ dynamic window (min 8)", "qat_w4a16", ("int8", None, None, 8), "W4A16 + INT8 KV"),
]


def measure(onnx_path: Path, tokens: np.ndarray, window: int, max_seq: int, target: str) -> dict:
    from ort_greedy import ort_nll, perplexity

    import mcpc
    from mcpc import driver
    from mcpc.ir.decoder_import import DecoderBuild
    from mcpc.qat_configs.kv_cache import DynamicWindow, with_kv_flags
    from mcpc.sim.decoder import DecoderSession

    rows = []
    ort = perplexity(ort_nll(onnx_path, tokens, window))
    for label, config, flags, base in BUILDS:
        t = time.perf_counter()
        cfg = driver.load_qat_config(config)
        if flags is not None:
            cfg = with_kv_flags(cfg, *flags[:3], max_seq)
            if len(flags) > 3:  # the dynamic window, its min_window
                window_cfg = DynamicWindow(enabled=True, min_window=flags[3])
                cfg = cfg.model_copy(
                    update={"kv_cache": cfg.kv_cache.model_copy(update={"dynamic_window": window_cfg})}
                )
        built = mcpc.compile(str(onnx_path), target=target, qat_config=cfg, decoder=DecoderBuild(max_seq))
        dec = DecoderSession(built)
        r = dec.eval_ppl(tokens, window=window)
        reads = [s["dram_read_bytes"] for s in dec.steps if s["entry"] == "decode"]
        rows.append(
            {"build": label, "base": base, "perplexity": r["perplexity"], "kv_bytes": r["kv_bytes"],
             "cycles_per_token": r["cycles_per_token"], "dram_read_per_token": float(np.mean(reads)),
             "seconds": time.perf_counter() - t, "kv_store": r.get("kv_store"),
             "dynamic_window": r.get("dynamic_window")}
        )  # fmt: skip
        print(f"{label}: ppl {r['perplexity']:.4f}, kv_bytes {r['kv_bytes']:,} ({rows[-1]['seconds']:.0f} s)",
              file=sys.stderr, flush=True)  # fmt: skip
    return {"model": onnx_path.name, "window": window, "windows": len(tokens) // window, "ort_fp32": ort,
            "max_seq": max_seq, "target": target, "rows": rows}  # fmt: skip


def markdown(result: dict) -> str:
    by = {r["build"]: r for r in result["rows"]}
    out = [
        f"KV settings on {result['model']}: {result['windows']} windows of {result['window']} tokens, "
        f"prefill 16, --max-seq {result['max_seq']}, {result['target']}; ONNX Runtime fp32 perplexity "
        f"{result['ort_fp32']:.4f}",
        "",
        "| build | perplexity | vs ORT fp32 | vs same build without it | kv_bytes | DRAM bytes / token "
        "| cycles / token |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        base = by.get(r["base"]) if r["base"] else None
        rel = f"{(r['perplexity'] / base['perplexity'] - 1) * 100:+.2f} %" if base else ""
        ort = (r["perplexity"] / result["ort_fp32"] - 1) * 100
        out.append(
            f"| {r['build']} | {r['perplexity']:.4f} | {ort:+.2f} % "
            f"| {rel} | {r['kv_bytes']:,} | {r['dram_read_per_token']:,.0f} | {r['cycles_per_token']:,.0f} |"
        )
    for r in result["rows"]:
        w = r.get("dynamic_window")
        if w:
            out.append(
                f"\n{r['build']}: {w['narrowed_rows']} of {w['rows']} rows narrowed, left edge mean "
                f"{w['mean_left']:.2f} (max {w['max_left']}), mean width {w['mean_width']:.1f} positions."
            )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--onnx", type=Path, default=ROOT / "tests" / "llm" / "decoders" / "llama-with-past.onnx")
    p.add_argument("--tokens", type=Path, default=None, help="token ids .npy (default: random, seed 0)")
    p.add_argument("--windows", type=int, default=4)
    p.add_argument("--window", type=int, default=128)
    p.add_argument("--max-seq", type=int, default=128)
    p.add_argument("--target", default="mcp2026-a100")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--markdown", type=Path, default=None)
    args = p.parse_args(argv)
    if args.tokens is not None:
        tokens = np.load(args.tokens).reshape(-1)
    else:
        record = json.loads((ROOT / "tests/llm/decoders/decoders.json").read_text())["models"]["llama"]
        vocab = record["vocab"]
        tokens = np.random.default_rng(0).integers(0, vocab, args.windows * args.window)
    tokens = tokens[: args.windows * args.window]
    result = measure(args.onnx, tokens, args.window, args.max_seq, args.target)
    text = markdown(result)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    if args.markdown:
        args.markdown.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
