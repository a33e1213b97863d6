"""Make the committed Hugging Face Optimum exports of ``tests/exporters/optimum/`` (run by hand).

Run in the Optimum venv (``tests/exporters/venv.sh optimum``: optimum-onnx 0.1.0, transformers
4.57.6, torch 2.13.0), from the repository root::

    $(tests/exporters/venv.sh optimum) tests/exporters/optimum/make_fixtures.py [--out DIR]

Each model is a ``transformers`` model built from a config with seeded random weights (nothing
downloaded), saved with ``save_pretrained`` to a temporary folder and exported by Optimum's
``main_export`` — what ``optimum-cli export onnx --model DIR --task TASK OUT`` runs:

* ``llama-optimum.onnx``, ``qwen2-optimum.onnx``: ``--task text-generation-with-past`` of the
  llama (GQA 4 / 2 heads of 16) and qwen2 (GQA 8 / 2 heads of 8, q/k/v biases, tied head)
  decoders of ``tests/llm/make_decoders.py`` — the same configs and the same weights (its
  ``build_model``; transformers 4.57 reads the RoPE base from ``rope_theta``, so it is copied
  there), so a greedy continuation equals the TorchScript fixture's of ``tests/llm/decoders/``
  (checked here).  Optimum's graph: opset 18, SDPA attention with ``IsNaN`` guards, RoPE's angles
  as a ``MatMul`` with the positions as B, dims ``batch_size``, ``sequence_length``,
  ``past_sequence_length`` and the expression ``past_sequence_length + sequence_length``;
* ``llama-optimum-merged.onnx``: the merged decoder Optimum's ``optimum.onnx.merge_decoders`` still
  makes of a decoder without past inputs that returns ``present`` (Optimum's ONNX config with
  ``use_past_in_inputs=False``) and the ``-with-past`` one: one graph with a ``use_cache_branch``
  bool input and an ``If`` choosing the branch.  optimum-onnx 0.1.0 no longer makes it by itself
  for a decoder-only model (it exports the single with-past graph); ``--monolith`` is refused with
  ``-with-past`` and gives the graph without past with ``--task text-generation``;
* ``bert-optimum.onnx``: ``--task feature-extraction`` of a 2-layer BERT encoder (hidden 64, 4
  heads) -> ``last_hidden_state``.

``optimum.json`` beside them records the versions, each file's inputs and outputs with their dims,
its op types, and for the decoders ONNX Runtime's greedy continuation (``mcpc/ort_decoder.py``'s
loop: a prefill with past 0, then one token a step) of the family's prompt in
``tests/llm/decoders/decoders.json`` and of an 11-token prompt; ``README.md`` the same as tables.
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

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "tests" / "llm"), str(ROOT)]
import make_decoders as md  # noqa: E402  (the decoders' configs and weights)

from mcpc.ort_decoder import OrtDecoder, greedy  # noqa: E402  (numpy and onnxruntime only)

OPSET = 18
NEW_TOKENS = 24
PROMPT11 = [5, 17, 99, 3, 250, 42, 7, 311, 128, 64, 9]  # the 11-token prompt of the TTFT comparison
DECODERS = ("llama", "qwen2")
BERT = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=128, max_position_embeddings=128, type_vocab_size=2)  # fmt: skip


def decoder_folder(family: str, into: Path) -> Path:
    """``save_pretrained`` of make_decoders' ``family`` model (same seeded weights) -> the folder."""
    model = md.build_model(family)
    theta = (getattr(model.config, "rope_parameters", None) or {}).get("rope_theta")
    if theta is not None:  # transformers 4.x reads rope_theta (5.x: rope_parameters); the
        model.config.rope_theta = theta  # exporter reloads the folder, inv_freq from this base
    path = into / family
    model.save_pretrained(path)
    return path


def bert_folder(into: Path) -> Path:
    """A 2-layer random-weight BERT encoder, weights drawn as make_decoders draws them."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(md.SEED)
    model = BertModel(BertConfig(**BERT)).eval()
    g = torch.Generator().manual_seed(md.SEED + 10)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * md.INIT_STD)
            elif name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * md.BIAS_STD)
            else:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
    path = into / "bert"
    model.save_pretrained(path)
    return path


def export(folder: Path, task: str, out: Path) -> Path:
    """Optimum's ``main_export`` of ``folder`` for ``task`` into the folder ``out`` -> model.onnx."""
    from optimum.exporters.onnx import main_export

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        main_export(str(folder), output=str(out), task=task, opset=OPSET, do_validation=True)
    return out / "model.onnx"


def export_no_past_with_present(folder: Path, out: Path) -> Path:
    """Optimum's decoder without past inputs that returns ``present`` (the first half of a merged
    decoder, which optimum-onnx 0.1.0 no longer exports for a decoder-only model by itself):
    its ONNX config for ``text-generation-with-past`` with ``use_past_in_inputs=False``."""
    from optimum.exporters.onnx import export as onnx_export
    from optimum.exporters.tasks import TasksManager
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder)
    make = TasksManager.get_exporter_config_constructor(
        exporter="onnx", model=model, task="text-generation-with-past", library_name="transformers"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onnx_export(model, make(model.config, use_past=True, use_past_in_inputs=False), out, opset=OPSET)
    return out


def save(src: Path, dst: Path) -> None:
    """``src`` (weights inline) checked and written to ``dst`` atomically, its doc string dropped."""
    m = onnx.load(str(src))
    m.doc_string = ""
    onnx.checker.check_model(m)
    fd, tmp = tempfile.mkstemp(suffix=".onnx", dir=dst.parent)
    os.close(fd)
    try:
        onnx.save(m, tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dst)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def merged_greedy(path: Path, prompt: list[int], new_tokens: int) -> list[int]:
    """ONNX Runtime's greedy continuation of a merged decoder: the prefill with
    ``use_cache_branch`` false (a past of length 0 fed, unread), then one token a step with it true."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    past = [i for i in s.get_inputs() if i.name.startswith("past_key_values.")]
    outs = [o.name for o in s.get_outputs()]
    kv = {i.name: np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32) for i in past}
    ids, done, tokens = np.array([prompt]), 0, []
    for _ in range(new_tokens):
        n = ids.shape[1]
        feeds = {"input_ids": ids, "attention_mask": np.ones((1, done + n), np.int64),
                 "position_ids": np.arange(done, done + n)[None], "use_cache_branch": np.array([done > 0]),
                 **kv}  # fmt: skip
        res = dict(zip(outs, s.run(outs, feeds), strict=True))
        kv = {i.name: res[i.name.replace("past_key_values", "present")] for i in past}
        done += n
        tokens.append(int(res["logits"][0, -1].argmax()))
        ids = np.array([[tokens[-1]]])
    return tokens


def describe(path: Path) -> dict:
    """A file's inputs and outputs (name, ONNX dtype, dims) and op types (count, If bodies too)."""
    m = onnx.load(str(path))

    def value(v):
        t = v.type.tensor_type
        dims = [d.dim_param or d.dim_value for d in t.shape.dim]
        return {"name": v.name, "dtype": onnx.TensorProto.DataType.Name(t.elem_type), "dims": dims}

    counts: dict[str, int] = {}

    def walk(graph):
        for n in graph.node:
            counts[n.op_type] = counts.get(n.op_type, 0) + 1
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g)

    walk(m.graph)
    return {
        "file": path.name,
        "kib": round(path.stat().st_size / 1024),
        "opset": next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx")),
        "inputs": [value(v) for v in m.graph.input],
        "outputs": [value(v) for v in m.graph.output],
        "op_types": dict(sorted(counts.items())),
    }


def _versions() -> dict[str, str]:
    names = ("torch", "transformers", "optimum", "optimum-onnx", "onnx", "onnxruntime")
    return {n: importlib.metadata.version(n) for n in names}


def write_readme(out: Path, manifest: dict) -> None:
    v = manifest["versions"]
    lines = [
        "# Hugging Face Optimum exports (generated — do not edit)",
        "",
        "Written by `tests/exporters/optimum/make_fixtures.py` (see its docstring) with "
        + ", ".join(f"{k} {x}" for k, x in v.items())
        + f" (Python {sys.version.split()[0]}); opset {OPSET}.  Reproduce in the Optimum venv:",
        "`$(tests/exporters/venv.sh optimum) tests/exporters/optimum/make_fixtures.py`.",
        "",
        "`optimum.json` holds each file's inputs, outputs, op types and, for the decoders, ONNX",
        "Runtime's greedy continuations (equal to the TorchScript fixtures' of `tests/llm/decoders/`).",
        "The exports are byte for byte reproducible but for the merged decoder, whose initializer",
        "names `merge_decoders` picks in a set's order (same graph and weights).",
        "The fp16 export `llama-optimum-fp16.onnx` is `make_fp16.py`'s: see `README.fp16.md`.",
        "",
        "| file | task | inputs (dims) | outputs (dims) | KiB |",
        "|---|---|---|---|---|",
    ]

    def io(vals):
        return "<br>".join(f"`{x['name']}` [{', '.join(map(str, x['dims']))}]" for x in vals)

    for f in manifest["files"].values():
        lines.append(f"| `{f['file']}` | {f['task']} | {io(f['inputs'])} | {io(f['outputs'])} | {f['kib']} |")
    lines += ["", "| file | op types (count, If branches included) |", "|---|---|"]
    for f in manifest["files"].values():
        lines.append(f"| `{f['file']}` | {', '.join(f'{k} {c}' for k, c in f['op_types'].items())} |")
    (out / "README.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).parent)
    opts = ap.parse_args(argv)
    out = opts.out
    out.mkdir(parents=True, exist_ok=True)
    ts = json.loads((ROOT / "tests" / "llm" / "decoders" / "decoders.json").read_text())["models"]
    manifest: dict = {"versions": _versions(), "opset": OPSET, "seed": md.SEED, "files": {}}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for family in DECODERS:
            folder = decoder_folder(family, tmp)
            dst = out / f"{family}-optimum.onnx"
            save(export(folder, "text-generation-with-past", tmp / f"{family}-past"), dst)
            prompt = ts[family]["prompt"]
            ids = greedy(OrtDecoder(dst), prompt, NEW_TOKENS)
            if ids != ts[family]["greedy"]:
                raise AssertionError(
                    f"{dst.name}: greedy {ids} != the TorchScript fixture's {ts[family]['greedy']}"
                )
            entry = describe(dst) | {"task": "text-generation-with-past", "family": family}
            entry |= {"prompt": prompt, "greedy": ids, "prompt11": PROMPT11}
            entry["greedy11"] = greedy(OrtDecoder(dst), PROMPT11, 20)
            manifest["files"][dst.name] = entry
            print(f"wrote {dst.name}: greedy equal to the TorchScript fixture's")
            if family == "llama":
                from optimum.onnx import merge_decoders

                plain = export_no_past_with_present(folder, tmp / "llama-plain.onnx")
                merged = out / "llama-optimum-merged.onnx"
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    merge_decoders(plain, tmp / "llama-past" / "model.onnx", save_path=tmp / "merged.onnx")
                save(tmp / "merged.onnx", merged)
                got = merged_greedy(merged, prompt, NEW_TOKENS)
                if got != ids:
                    raise AssertionError(f"{merged.name}: greedy {got} != {ids}")
                entry = describe(merged) | {"task": "text-generation + -with-past, merge_decoders"}
                manifest["files"][merged.name] = entry | {"family": family, "prompt": prompt, "greedy": got}
                print(f"wrote {merged.name}: greedy equal")
        dst = out / "bert-optimum.onnx"
        save(export(bert_folder(tmp), "feature-extraction", tmp / "bert-out"), dst)
        manifest["files"][dst.name] = describe(dst) | {"task": "feature-extraction", "family": "bert"}
        print(f"wrote {dst.name}")
    (out / "optimum.json").write_text(json.dumps(manifest, indent=1) + "\n")
    write_readme(out, manifest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
