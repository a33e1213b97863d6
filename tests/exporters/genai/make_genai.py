"""Make the committed ONNX Runtime GenAI fixtures of ``tests/exporters/genai/`` (run by hand).

A tiny Llama-style decoder built from a ``transformers`` config (nothing downloaded): hidden 64,
2 layers, 4 query / 2 KV heads of 16, SiLU-gated MLP of 128, RoPE base 10 000, a vocabulary of
384, LM head tied to the embedding (so the int4 build emits ``GatherBlockQuantized``), weights
drawn from a seeded generator with std ``INIT_STD`` (norm gains 1 ± 0.1) so that a greedy
continuation moves between tokens, and a word-level tokenizer of the same vocabulary (the builder
insists on one).  Saved with ``save_pretrained`` to a temporary folder and built by ONNX Runtime
GenAI's model builder, CPU execution provider, twice::

    python -m onnxruntime_genai.models.builder -i HF -o OUT -p fp32 -e cpu
    python -m onnxruntime_genai.models.builder -i HF -o OUT -p int4 -e cpu

and ``-p fp16`` (MultiHeadAttention and RotaryEmbedding instead of GroupQueryAttention).  Each
build's ``model.onnx`` (re-saved with its weights inline: one file) and ``genai_config.json`` go to
``fp32/``, ``int4/`` and ``fp16/`` beside this script.  ``genai.json`` records, per build, a prompt and
ONNX Runtime GenAI's own greedy continuation of it (``og.Generator``, ``do_sample`` false), the
same continuation from a plain ONNX Runtime loop (prefill with an empty past, then one token per
step, present fed back as past; the script fails when the two differ), the smallest top-1 margin
on the way, and each graph's inputs, outputs and op types; ``README.md`` records the versions.
Run in the GenAI exporter venv (``tests/exporters/venv.sh genai``)::

    $(tests/exporters/venv.sh genai) tests/exporters/genai/make_genai.py
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

SEED = 2026
INIT_STD = 0.25
VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS, MAX_POS = 384, 64, 2, 4, 2, 512
BOS, EOS = 1, 2
PROMPT_LEN, NEW_TOKENS, PROMPT_CANDIDATES = 11, 20, 12
PRECISIONS = ("fp32", "int4", "fp16")
HERE = Path(__file__).resolve().parent


def make_hf(folder: Path) -> None:
    """The seeded random-weight Llama and its word-level tokenizer, saved into ``folder``."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=MAX_POS,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=0,
    )
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(cfg)
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * INIT_STD)
            else:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
    model.save_pretrained(folder)
    vocab = {f"t{i}": i for i in range(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="t0", pad_token="t0", bos_token=f"t{BOS}", eos_token=f"t{EOS}"
    )
    fast.save_pretrained(folder)


def build(hf: Path, out: Path, precision: str, cache: Path) -> None:
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(out)]
    cmd += ["-p", precision, "-e", "cpu", "-c", str(cache)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        sys.stderr.write(res.stdout[-4000:] + res.stderr[-4000:])
        raise SystemExit(f"the builder failed ({precision})")


def og_greedy(folder: Path, prompt: list[int], new: int) -> list[int]:
    """ONNX Runtime GenAI's greedy continuation (its generator; stops early at EOS)."""
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(prompt) + new)
    gen = og.Generator(model, params)
    gen.append_tokens(np.array([prompt], dtype=np.int32))
    while not gen.is_done():
        gen.generate_next_token()
    return [int(t) for t in gen.get_sequence(0)[len(prompt) :]]


def ort_greedy(path: Path, prompt: list[int], new: int) -> tuple[list[int], list[float]]:
    """A plain ONNX Runtime loop over the builder's graph: a prefill with an empty past, then one
    token per step with present fed back as past; stops at EOS like the generator."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ins = {i.name: i for i in sess.get_inputs()}
    past_names = [n for n in ins if n.startswith("past_key_values.")]
    head_dim = HIDDEN // HEADS
    kv_dtype = np.float16 if ins[past_names[0]].type == "tensor(float16)" else np.float32
    past = {n: np.zeros((1, KV_HEADS, 0, head_dim), kv_dtype) for n in past_names}
    ids, out, margins, total = list(prompt), [], [], 0
    outs = [o.name for o in sess.get_outputs()]
    for _ in range(new):
        total += len(ids)
        feed = {
            "input_ids": np.array([ids], np.int64),
            "attention_mask": np.ones((1, total), np.int64),
            **past,
        }
        if "position_ids" in ins:  # the fp16 CPU build (MultiHeadAttention + RotaryEmbedding) has them
            feed["position_ids"] = np.arange(total - len(ids), total, dtype=np.int64)[None]
        res = dict(zip(outs, sess.run(None, feed), strict=True))
        last = res["logits"][0, -1]
        top = np.sort(last)[-2:]
        margins.append(float(top[1] - top[0]))
        nxt = int(last.argmax())
        out.append(nxt)
        if nxt == EOS:
            break
        past = {n: res[n.replace("past_key_values.", "present.")] for n in past_names}
        ids = [nxt]
    return out, margins


def fp16_record(built: Path, path: Path, fp32: dict, tmp: Path) -> dict:
    """The fp16 build's record.  ONNX Runtime GenAI 0.18.0 and a plain ONNX Runtime 1.32 session both
    fail the decode step of this CPU fp16 graph as the builder writes it (its value_info names the
    repeated K/V's total length 'sequence_length'; recorded as ``greedy_failure``); with the graph's
    value_info dropped both run, agree, and are recorded (``greedy``, of the fp32 build's prompt)."""
    prompt = fp32["prompt"]
    try:
        og_greedy(built, prompt, NEW_TOKENS)
        failure = None
    except Exception as e:  # noqa: BLE001 - recorded, not raised
        failure = str(e).splitlines()[0][:400]
    fixed = tmp / "fp16-no-value-info"
    fixed.mkdir()
    m = onnx.load(str(path))
    del m.graph.value_info[:]
    onnx.save(m, str(fixed / "model.onnx"))
    shutil.copy(built / "genai_config.json", fixed / "genai_config.json")
    ids, margins = ort_greedy(fixed / "model.onnx", prompt, NEW_TOKENS)
    got = og_greedy(fixed, prompt, NEW_TOKENS)
    if got != ids:
        raise SystemExit(f"fp16: ORT GenAI greedy {got} != plain ONNX Runtime loop {ids}")
    return {
        "prompt": prompt,
        "greedy": ids,
        "greedy_of": "the graph with its value_info dropped",
        "greedy_failure": failure,
        "min_margin": round(min(margins), 4),
        "genai_config": json.loads((built / "genai_config.json").read_text()),
        **graph_record(path),
    }


_RECORDED_ATTRS = ("GroupQueryAttention", "MatMulNBits", "GatherBlockQuantized")


def graph_record(path: Path) -> dict:
    m = onnx.load(str(path))
    counts: dict[str, int] = {}
    for n in m.graph.node:
        key = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}:{n.op_type}"
        counts[key] = counts.get(key, 0) + 1

    def io(vs):
        return {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in vs}

    attrs = {}
    for n in m.graph.node:
        if n.op_type in _RECORDED_ATTRS and n.op_type not in attrs:
            attrs[n.op_type] = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
    return {
        "opsets": {o.domain or "ai.onnx": o.version for o in m.opset_import},
        "inputs": io(m.graph.input),
        "outputs": io(m.graph.output),
        "op_types": dict(sorted(counts.items())),
        "first_attributes": attrs,
    }


def single_file(src: Path, dst: Path) -> None:
    """``src`` (maybe with external data) re-saved to ``dst`` with every tensor inline."""
    m = onnx.load(str(src))
    onnx.save(m, str(dst), save_as_external_data=False)


def versions() -> dict[str, str]:
    names = ("torch", "transformers", "tokenizers", "onnx", "onnxruntime", "onnxruntime-genai")
    return {n: importlib.metadata.version(n) for n in names} | {"python": sys.version.split()[0]}


def write_readme(record: dict) -> None:
    v = ", ".join(f"{k} {x}" for k, x in record["versions"].items())
    lines = [
        "# ONNX Runtime GenAI model-builder fixtures (generated — do not edit)",
        "",
        f"Written by `make_genai.py` (see its docstring) with {v};",
        f"seed {SEED}, weights std {INIT_STD}; a Llama of hidden {HIDDEN}, {LAYERS} layers, "
        f"{HEADS} / {KV_HEADS} heads × {HIDDEN // HEADS}, vocabulary {VOCAB}, tied embeddings.",
        "Reproduce with `$(tests/exporters/venv.sh genai) tests/exporters/genai/make_genai.py`.",
        "",
        "`genai.json` holds each build's prompt, ONNX Runtime GenAI's greedy continuation (equal to a",
        "plain ONNX Runtime loop's), the inputs/outputs with their dims and the op types. The fp16 CPU",
        "build (MultiHeadAttention, RotaryEmbedding): ONNX Runtime GenAI 0.18.0 fails its decode step as",
        "built (`greedy_failure`: its value_info names a total length 'sequence_length'); its greedy ids",
        "are those of the graph with the value_info dropped (`greedy_of`).",
        "",
        "| build | file | KiB | greedy distinct | min top-1 margin | op types (count) |",
        "|---|---|---|---|---|---|",
    ]
    for p, b in record["builds"].items():
        size = (HERE / p / "model.onnx").stat().st_size / 1024
        ops_ = ", ".join(f"{k} {c}" for k, c in b["op_types"].items())
        lines.append(
            f"| {p} | `{p}/model.onnx` | {size:.0f} | {len(set(b['greedy']))} of {len(b['greedy'])} "
            f"| {b['min_margin']:.3f} | {ops_} |"
        )
    (HERE / "README.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep", type=Path, help="also keep the builder's whole output folders here")
    opts = ap.parse_args(argv)
    record: dict = {"versions": versions(), "seed": SEED, "builds": {}}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        make_hf(tmp / "hf")
        for precision in PRECISIONS:
            built = tmp / f"out-{precision}"
            build(tmp / "hf", built, precision, tmp / "cache")
            if opts.keep:
                shutil.copytree(built, opts.keep / precision, dirs_exist_ok=True)
            dst = HERE / precision
            dst.mkdir(exist_ok=True)
            single_file(built / "model.onnx", dst / "model.onnx")
            shutil.copy(built / "genai_config.json", dst / "genai_config.json")
            os.chmod(dst / "model.onnx", 0o644)
            if precision == "fp16":
                record["builds"][precision] = fp16_record(
                    built, dst / "model.onnx", record["builds"]["fp32"], tmp
                )
                continue
            rng = np.random.default_rng(SEED + PRECISIONS.index(precision))
            best = None
            for _ in range(PROMPT_CANDIDATES):
                prompt = [int(t) for t in rng.integers(3, VOCAB, PROMPT_LEN)]
                ids, margins = ort_greedy(dst / "model.onnx", prompt, NEW_TOKENS)
                if len(ids) < NEW_TOKENS:
                    continue  # stopped at EOS: a shorter test
                if best is None or min(margins) > min(best[2]):
                    best = (prompt, ids, margins)
            if best is None:
                raise SystemExit(f"{precision}: every candidate prompt reaches EOS early")
            prompt, ids, margins = best
            got = og_greedy(built, prompt, NEW_TOKENS)
            if got != ids:
                raise SystemExit(f"{precision}: ORT GenAI greedy {got} != plain ONNX Runtime loop {ids}")
            record["builds"][precision] = {
                "prompt": prompt,
                "greedy": ids,
                "min_margin": round(min(margins), 4),
                "genai_config": json.loads((built / "genai_config.json").read_text()),
                **graph_record(dst / "model.onnx"),
            }
            print(
                f"{precision}: {len(set(ids))} distinct of {len(ids)}, min margin {min(margins):.3f}, "
                f"{(dst / 'model.onnx').stat().st_size / 1e3:.0f} kB"
            )
    (HERE / "genai.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
    write_readme(record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
