"""Make the committed random-weight decoders of ``tests/llm/decoders/`` (run by hand).

Three decoder families as users export them: a ``transformers`` model built from a config (no hub,
nothing downloaded), weights drawn from a seeded generator, exported by the TorchScript exporter
(``torch.onnx.export(..., dynamo=False)``, opset 17, eager attention, constant folding off — as
``export_smollm2.py`` exports SmolLM2):

* ``llama``: RMSNorm, RoPE (base 10 000), SiLU-gated MLP, GQA with 4 query / 2 KV heads of 16,
  untied LM head;
* ``qwen2``: RMSNorm, RoPE base 1e6, GQA with 8 query / 2 KV heads of 8 and biases on the q/k/v
  projections, LM head tied to the embedding;
* ``gpt2``: learned positions, LayerNorm, ``Conv1D`` layers (exported as ``Gemm``), the fused
  q/k/v projection cut by ``Split``, tanh GELU written out, 4 heads of 16, tied LM head.

All have hidden size 64, 2 layers, a vocabulary of 256–512 and 512 positions.  Each file is ONE
graph "with past" — the form ``mcp-compile --max-seq`` takes — named as transformers exports name
it: inputs ``input_ids`` [batch, seq], ``attention_mask`` [batch, total_seq] (past and new tokens),
``position_ids`` [batch, seq] (int64) and ``past_key_values.{i}.key|value`` [batch, kv_heads,
past_seq, head_dim]; outputs ``logits`` [batch, seq, vocab] and ``present.{i}.key|value``
[batch, kv_heads, total_seq, head_dim].  A prefill is a call with past_seq 0.  The graph is traced
with seq 3 after a past of 4, so neither a one-token step nor an empty past is baked in.

The default init (std 0.02) gives near-uniform logits whose greedy continuation repeats one token;
every weight matrix is redrawn with std ``INIT_STD`` (biases ``BIAS_STD``, norm gains 1 ± 0.1) so that
a greedy continuation moves between tokens and its top-1 choices win by clear margins (recorded).

``decoders.json`` beside the files records, per model, its configuration, a prompt and the 24-token
greedy continuation ONNX Runtime gives in its own KV loop (``ort_greedy.py``: a prefill of the
prompt with past 0, then one token per step), with the smallest top-1 margin (top-1 minus top-2
logit) on the way: of 16 seeded random 8-token prompts, the one with the largest such margin;
``README.md`` records the tool versions and each file's op types.  Needs the ``llm`` extra (torch
2.13.0 CPU, transformers); the tests need neither::

    .venv/bin/python tests/llm/make_decoders.py [--out DIR] [--check]

``--check`` compares ONNX Runtime with eager torch: the logits of a prefill (past 0) and of a
decode step (past > 0) on a batch of two, and the greedy continuation, token for token.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ort_greedy import OrtDecoder, greedy  # noqa: E402

OPSET = 17
SEED = 2026
INIT_STD = 0.25
BIAS_STD = 0.1
PROMPT_LEN, NEW_TOKENS, PROMPT_CANDIDATES = 8, 24, 16
HIDDEN, LAYERS, MAX_POS = 64, 2, 512
FAMILIES = ("llama", "qwen2", "gpt2")


def make_config(family: str):
    """The transformers config of one family (eager attention, KV cache on)."""
    from transformers import GPT2Config, LlamaConfig, Qwen2Config

    if family == "llama":
        cfg = LlamaConfig(
            vocab_size=512,
            hidden_size=HIDDEN,
            intermediate_size=128,
            num_hidden_layers=LAYERS,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=MAX_POS,
            rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            tie_word_embeddings=False,
        )
    elif family == "qwen2":
        cfg = Qwen2Config(
            vocab_size=384,
            hidden_size=HIDDEN,
            intermediate_size=160,
            num_hidden_layers=LAYERS,
            num_attention_heads=8,
            num_key_value_heads=2,
            max_position_embeddings=MAX_POS,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            tie_word_embeddings=True,
        )
    elif family == "gpt2":
        cfg = GPT2Config(
            vocab_size=256,
            n_positions=MAX_POS,
            n_embd=HIDDEN,
            n_layer=LAYERS,
            n_head=4,
            n_inner=256,
            activation_function="gelu_new",
            bos_token_id=255,
            eos_token_id=255,
            tie_word_embeddings=True,
        )
    else:
        raise ValueError(f"unknown family {family!r}; one of {FAMILIES}")
    cfg._attn_implementation = "eager"
    cfg.use_cache = True
    return cfg


def dims(cfg) -> dict[str, int]:
    """Layers, heads, KV heads, head_dim and vocabulary of a config (GPT-2 names them differently)."""
    layers = cfg.num_hidden_layers
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return {
        "layers": layers,
        "q_heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "hidden": cfg.hidden_size,
        "vocab": cfg.vocab_size,
    }


def build_model(family: str):
    """The eager model of one family with seeded, rescaled random weights."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(make_config(family), attn_implementation="eager")
    g = torch.Generator().manual_seed(SEED + FAMILIES.index(family))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:  # projections, Conv1D, embeddings, position table
                p.copy_(torch.randn(p.shape, generator=g) * INIT_STD)
            elif name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * BIAS_STD)
            else:  # RMSNorm / LayerNorm gains
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
    model.eval()
    return model


def with_past(model):
    """A torch module around the model: (input_ids, attention_mask, position_ids, *past) ->
    (logits, *present), past and present flat as layer 0 key, layer 0 value, layer 1 key, ..."""
    import torch
    from transformers import DynamicCache

    layers = model.config.num_hidden_layers

    class WithPast(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, position_ids, *past):
            cache = DynamicCache(config=model.config)
            for i in range(layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=cache,
                use_cache=True,
            )
            return (out.logits, *flat_present(out.past_key_values, layers))

    return WithPast().eval()


def flat_present(cache, layers: int) -> list:
    """A transformers cache's K/V as one flat list: layer 0 key, layer 0 value, layer 1 key, ..."""
    flat = []
    for layer in cache.layers[:layers]:
        flat += [layer.keys, layer.values]
    return flat


def kv_names(layers: int, prefix: str) -> list[str]:
    return [f"{prefix}.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]


def example_inputs(d: dict[str, int], batch: int, seq: int, past: int, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, d["vocab"], (batch, seq), generator=g)
    mask = torch.ones(batch, past + seq, dtype=torch.int64)
    pos = torch.arange(past, past + seq).unsqueeze(0).expand(batch, seq).contiguous()
    kv = [torch.randn(batch, d["kv_heads"], past, d["head_dim"], generator=g) for _ in range(2 * d["layers"])]
    return ids, mask, pos, kv


def export(model, path: Path) -> None:
    """Trace ``model`` with past into ``path`` (opset 17, weights inline), atomically."""
    import torch

    d = dims(model.config)
    past, present = kv_names(d["layers"], "past_key_values"), kv_names(d["layers"], "present")
    text = {0: "batch", 1: "seq"}
    ids, mask, pos, kv = example_inputs(d, 2, 3, 4)
    fd, tmp = tempfile.mkstemp(suffix=".onnx", dir=path.parent)
    os.close(fd)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tracer warnings about Python control flow on shapes
            torch.onnx.export(
                with_past(model),
                (ids, mask, pos, *kv),
                tmp,
                input_names=["input_ids", "attention_mask", "position_ids", *past],
                output_names=["logits", *present],
                dynamic_axes={
                    "input_ids": text,
                    "attention_mask": {0: "batch", 1: "total_seq"},
                    "position_ids": text,
                    "logits": text,
                    **{n: {0: "batch", 2: "past_seq"} for n in past},
                    **{n: {0: "batch", 2: "total_seq"} for n in present},
                },
                opset_version=OPSET,
                dynamo=False,
                do_constant_folding=False,
            )
        m = onnx.load(tmp)
        # the K/V heads and head_dim axes are numbers (the exporter leaves some of them symbolic)
        for v in [*m.graph.input, *m.graph.output]:
            if v.name.startswith(("present.", "past_key_values.")):
                axes = v.type.tensor_type.shape.dim
                for axis, value in ((1, d["kv_heads"]), (3, d["head_dim"])):
                    axes[axis].Clear()
                    axes[axis].dim_value = value
        m.doc_string = ""
        onnx.checker.check_model(m)
        onnx.save(m, tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def pick_prompt(dec: OrtDecoder, vocab: int, index: int) -> tuple[list[int], list[int], list[float]]:
    """Of ``PROMPT_CANDIDATES`` seeded random prompts, the one whose greedy continuation has the
    largest smallest top-1 margin (so that a build whose logits differ from ONNX Runtime's by
    rounding still picks the same tokens) -> (prompt, continuation, margins)."""
    rng = np.random.default_rng(SEED + index)
    best = None
    for _ in range(PROMPT_CANDIDATES):
        prompt = [int(t) for t in rng.integers(0, vocab, PROMPT_LEN)]
        tokens, margins = greedy(dec, prompt, NEW_TOKENS, return_margins=True)
        if best is None or min(margins) > min(best[2]):
            best = (prompt, tokens, margins)
    return best


def torch_greedy(model, prompt: list[int], new_tokens: int) -> list[int]:
    """Eager torch's greedy continuation in its own KV loop (the check for ORT's)."""
    import torch
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    ids = torch.tensor([prompt])
    out_ids: list[int] = []
    past = 0
    with torch.no_grad():
        for _ in range(new_tokens):
            s = ids.shape[1]
            out = model(
                input_ids=ids,
                attention_mask=torch.ones(1, past + s, dtype=torch.int64),
                position_ids=torch.arange(past, past + s).unsqueeze(0),
                past_key_values=cache,
                use_cache=True,
            )
            past += s
            nxt = int(out.logits[0, -1].argmax())
            out_ids.append(nxt)
            ids = torch.tensor([[nxt]])
    return out_ids


def check(model, path: Path, prompt: list[int], want: list[int]) -> dict[str, float]:
    """Max |ORT − torch| / max |torch| of the logits of a prefill (past 0, batch 2 × 5) and of a
    decode step (past 5); raises when the greedy continuations differ."""
    import torch

    d = dims(model.config)
    wrapped = with_past(model)
    dec = OrtDecoder(path)
    errors = {}
    ids, mask, pos, kv = example_inputs(d, 2, 5, 0, seed=1)
    with torch.no_grad():
        ref = wrapped(ids, mask, pos, *kv)
    logits, present = dec.run(ids.numpy(), [t.numpy() for t in kv], 0)
    w = ref[0].numpy()
    errors["prefill"] = float(np.abs(logits - w).max() / np.abs(w).max())
    nxt = torch.tensor([[7], [9]])
    with torch.no_grad():
        ref2 = wrapped(nxt, torch.ones(2, 6, dtype=torch.int64), torch.tensor([[5], [5]]), *ref[1:])
    logits2, _ = dec.run(nxt.numpy(), present, 5)
    w2 = ref2[0].numpy()
    errors["decode"] = float(np.abs(logits2 - w2).max() / np.abs(w2).max())
    got = torch_greedy(model, prompt, len(want))
    if got != want:
        raise AssertionError(f"{path.name}: torch greedy {got} != onnxruntime greedy {want}")
    return errors


def _versions() -> dict[str, str]:
    names = ("torch", "transformers", "onnx", "onnxruntime")
    return {n: importlib.metadata.version(n) for n in names}


def write_readme(out: Path, manifest: dict) -> None:
    """``README.md`` beside the files: versions, each file's dims and op types."""
    v = manifest["versions"]
    lines = [
        "# Random-weight decoders with past (generated — do not edit)",
        "",
        "Written by `tests/llm/make_decoders.py` (see its docstring and `docs/real_models.md`) with",
        f"torch {v['torch']}, transformers {v['transformers']}, onnx {v['onnx']}, onnxruntime "
        f"{v['onnxruntime']} (Python {sys.version.split()[0]}); TorchScript exporter, opset {OPSET},",
        f"constant folding off; seed {SEED}, weights std {INIT_STD}, biases std {BIAS_STD}.",
        "Reproduce with `make llm-models` (the `llm` extra) then",
        "`.venv/bin/python tests/llm/make_decoders.py --check`.",
        "",
        "`decoders.json` holds each model's dims, a prompt and ONNX Runtime's 24-token greedy",
        "continuation of it (prefill with past 0, then one token per step feeding present back as past).",
        "",
        "| file | family | layers | q / kv heads × head_dim | vocab | KiB | distinct of 24 "
        "| min top-1 margin |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, m in manifest["models"].items():
        size = (out / m["file"]).stat().st_size / 1024
        lines.append(
            f"| `{m['file']}` | {name} | {m['layers']} | {m['q_heads']} / {m['kv_heads']} × {m['head_dim']} "
            f"| {m['vocab']} | {size:.0f} | {len(set(m['greedy']))} | {m['min_margin']:.3f} |"
        )
    lines += ["", "| file | op types (count) |", "|---|---|"]
    for m in manifest["models"].values():
        g = onnx.load(str(out / m["file"])).graph
        counts: dict[str, int] = {}
        for n in g.node:
            counts[n.op_type] = counts.get(n.op_type, 0) + 1
        lines.append(f"| `{m['file']}` | {', '.join(f'{k} {c}' for k, c in sorted(counts.items()))} |")
    (out / "README.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "decoders")
    ap.add_argument("--check", action="store_true", help="compare ONNX Runtime with eager torch")
    ap.add_argument("--only", choices=FAMILIES, action="append", help="families to make (default: all)")
    opts = ap.parse_args(argv)
    opts.out.mkdir(parents=True, exist_ok=True)
    record = opts.out / "decoders.json"
    manifest = json.loads(record.read_text()) if record.is_file() else {"models": {}}
    manifest.update(
        versions=_versions(),
        opset=OPSET,
        seed=SEED,
        exporter="torchscript, constant folding off",
    )
    for family in opts.only or FAMILIES:
        model = build_model(family)
        d = dims(model.config)
        path = opts.out / f"{family}-with-past.onnx"
        export(model, path)
        prompt, tokens, margins = pick_prompt(OrtDecoder(path), d["vocab"], FAMILIES.index(family))
        entry = {
            "file": path.name,
            "family": family,
            **d,
            "max_positions": MAX_POS,
            "rope_theta": (getattr(model.config, "rope_parameters", None) or {}).get("rope_theta"),
            "prompt": prompt,
            "greedy": tokens,
            "min_margin": round(float(min(margins)), 4),
        }
        manifest["models"][family] = entry
        note = f"{len(set(tokens))} distinct of {len(tokens)}, min top-1 margin {min(margins):.3f}"
        if opts.check:
            errs = check(model, path, prompt, tokens)
            note += ", torch greedy equal, " + ", ".join(f"{k} err {v:.1e}" for k, v in errs.items())
        print(f"wrote {path.name} ({path.stat().st_size / 1e3:.0f} kB): {note}")
    manifest["models"] = dict(sorted(manifest["models"].items(), key=lambda kv: FAMILIES.index(kv[0])))
    record.write_text(json.dumps(manifest, indent=1) + "\n")
    write_readme(opts.out, manifest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
