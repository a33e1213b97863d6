"""Make the committed dynamo-exporter decoders of ``tests/exporters/torch/fixtures/`` (run by hand).

The decoders of ``tests/llm/make_decoders.py`` — the same configs and seeded weights, imported from
it: ``llama`` (GQA 4 / 2 heads of 16) and ``qwen2`` (GQA 8 / 2 heads of 8, q/k/v biases, tied LM
head) — exported as transformers users export them with torch's dynamo exporter: transformers'
own ``OnnxExporter`` (``transformers.exporters``, which calls ``torch.onnx.export`` on the
``torch.export`` program; a bare ``torch.onnx.export(model, dynamo=True)`` of a model taking a
``DynamicCache`` stops in torch 2.13 at "Constant tensor lifted_tensor_4 is not in the constants
dictionary"), with a ``DynamicCache`` past of 4 tokens and 3 new ones on a batch of 2,
``dynamic=True`` (every axis ``Dim.AUTO``: symbols ``s44``, ``s70``, ..., the attention mask with
a batch symbol of its own, present outputs sized by the expression ``s36 + s70``) and
transformers' default SDPA attention:

* opset 18: the SDPA decomposed into MatMul/Softmax; the causal mask built with a ``GatherND``;
* opset 23: the onnxscript optimizer fuses ONNX's own ``RMSNormalization`` and
  ``RotaryEmbedding`` at exactly opset 23, and SDPA becomes ONNX ``Attention``; opsets 24 and 25
  (the newest the exporter offers: asked for 26, its version conversion fails and it writes an
  invalid opset-18 graph holding ``Attention``) give the opset-18 graph with ``Attention`` only,
  no op that 23 lacks, so they are not committed.

And, as a user calling torch's exporter directly writes it, a bare ``torch.onnx.export(...,
dynamo=True)`` at opset 18 of ``make_decoders.with_past`` (flat past tensors in, the DynamicCache
built inside) with ``input_names`` / ``output_names`` (``past_key_values.{i}.key`` ->
``present.{i}.key``) and ``Dim.AUTO`` axes: symbols ``s10`` (batch), ``s70``, ``s43``/``s53`` (the
mask), and one past symbol per group of past inputs torch could not prove equal (``s15``, ``s89``,
``s81``) — the form of the issue's SmolLM2 export; ``*-dynamo-plain-opset18.onnx``.

Names of the ``OnnxExporter`` files are the exporter's: inputs ``input_ids``, ``attention_mask``,
``position_ids``, ``past_key_values.layers.{i}.keys|values``; outputs ``logits``,
``cache.layers.{i}.keys|values``.
Weights are stored inline (the exporter writes a ``.data`` file beside the graph) and the nodes'
``metadata_props`` (torch stack traces, a third of the file) are dropped; nothing else is changed.

``dynamo.json`` records the versions, each file's dims, opset and op types, and ONNX Runtime's
24-token greedy continuation of ``tests/llm/decoders/decoders.json``'s prompt for the family
(``mcpc/ort_decoder.py``'s loop: prefill with past 0, then one token per step), which must equal
that file's (the TorchScript export of the same weights); ``README.md`` beside it is written from
it.  Run with the torch exporter venv (``tests/exporters/venv.sh torch``)::

    $(tests/exporters/venv.sh torch) tests/exporters/torch/make_fixtures.py [--out DIR]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import sys
import tempfile
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import onnx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT / "tests" / "llm"))
sys.path.insert(0, str(ROOT))  # mcpc.ort_decoder (numpy and onnxruntime only)
import make_decoders as md  # noqa: E402

from mcpc.ort_decoder import OrtDecoder, greedy  # noqa: E402

FAMILIES = ("llama", "qwen2")
# (how, opset): transformers' OnnxExporter, or a bare torch.onnx.export(dynamo=True) of a wrapper
EXPORTS = (("transformers", 18), ("transformers", 23), ("torch", 18))
PAST, NEW, BATCH = 4, 3, 2


def export(family: str, opset: int, path: Path) -> None:
    """Export ``family``'s decoder with past at ``opset`` into ``path`` (weights inline), atomically."""
    import torch
    from transformers import DynamicCache
    from transformers.exporters.configs import OnnxConfig
    from transformers.exporters.exporter_onnx import OnnxExporter

    model = md.build_model(family)
    model.config._attn_implementation = "sdpa"  # transformers' default: what users export
    d = md.dims(model.config)
    ids, mask, pos, kv = md.example_inputs(d, BATCH, NEW, PAST)
    cache = DynamicCache(config=model.config)
    for i in range(d["layers"]):
        cache.update(kv[2 * i], kv[2 * i + 1], i)
    inputs = {"input_ids": ids, "attention_mask": mask, "position_ids": pos, "past_key_values": cache}
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exported = OnnxExporter().export(model, inputs, config=OnnxConfig(dynamic=True, opset_version=opset))
        exported.save_pretrained(tmp)
        m = onnx.load(str(Path(tmp) / "model.onnx"))  # reads model.onnx.data beside it
    _save(m, path)


def export_plain(family: str, opset: int, path: Path) -> None:
    """Export ``family``'s decoder with past with a bare ``torch.onnx.export(..., dynamo=True)`` of
    ``make_decoders.with_past`` (flat past tensors in, a DynamicCache built inside), names given as
    ``input_names`` / ``output_names`` (``past_key_values.{i}.key`` -> ``present.{i}.key``), every
    axis ``Dim.AUTO`` but the heads and head_dim — as a user calls torch's exporter directly."""
    import torch
    from torch.export import Dim

    model = md.build_model(family)
    model.config._attn_implementation = "sdpa"
    d = md.dims(model.config)
    ids, mask, pos, kv = md.example_inputs(d, BATCH, NEW, PAST)
    past, present = md.kv_names(d["layers"], "past_key_values"), md.kv_names(d["layers"], "present")
    auto = Dim.AUTO
    shapes = ({0: auto, 1: auto},) * 3 + (tuple({0: auto, 2: auto} for _ in kv),)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            md.with_past(model),
            (ids, mask, pos, *kv),
            dynamo=True,
            opset_version=opset,
            input_names=["input_ids", "attention_mask", "position_ids", *past],
            output_names=["logits", *present],
            dynamic_shapes=shapes,
        )
    _save(program.model_proto, path)


def _save(m: onnx.ModelProto, path: Path) -> None:
    """``m`` into ``path`` (weights inline, no per-node provenance), checked, atomically."""
    for t in m.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            raise RuntimeError(f"{t.name} still external")
    m.doc_string = ""
    for node in m.graph.node:  # the exporter's per-node provenance (torch stack traces): ~1/3 of the file
        del node.metadata_props[:]
    onnx.checker.check_model(m)
    fd, tmp = tempfile.mkstemp(suffix=".onnx", dir=path.parent)
    os.close(fd)
    try:
        onnx.save(m, tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def describe(path: Path) -> dict:
    """Opset, I/O dims (as the file writes them) and op types of one file."""
    m = onnx.load(str(path))
    io = {}
    for v in [*m.graph.input, *m.graph.output]:
        io[v.name] = [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
    ops = Counter(n.op_type for n in m.graph.node)
    return {
        "opset": next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx")),
        "io": io,
        "op_types": dict(sorted(ops.items())),
    }


def _versions() -> dict[str, str]:
    names = ("torch", "transformers", "onnxscript", "onnx", "onnxruntime")
    return {n: importlib.metadata.version(n) for n in names}


def write_readme(out: Path, manifest: dict) -> None:
    v = manifest["versions"]
    lines = [
        "# Dynamo-exporter decoders with past (generated — do not edit)",
        "",
        "Written by `tests/exporters/torch/make_fixtures.py` (see its docstring) with",
        ", ".join(f"{k} {v[k]}" for k in v) + f" (Python {sys.version.split()[0]}): the",
        "`tests/llm/make_decoders.py` decoders (same configs, same seeded weights, SDPA attention)",
        "exported by transformers' `OnnxExporter` (`torch.onnx.export` of the `torch.export` program,",
        "`dynamic=True`, a `DynamicCache` past) and by a bare `torch.onnx.export(..., dynamo=True)` of",
        "`make_decoders.with_past` (`-plain-`); weights inline, the nodes' `metadata_props` (stack",
        "traces) dropped.",
        "Reproduce with",
        "`$(tests/exporters/venv.sh torch) tests/exporters/torch/make_fixtures.py`.",
        "",
        "`dynamo.json` holds each file's dims, op types and ONNX Runtime's 24-token greedy continuation of",
        "the family's prompt from `tests/llm/decoders/decoders.json` (equal to the TorchScript export's).",
        "",
        "| file | family | exporter | opset | KiB | inputs | outputs |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, f in manifest["files"].items():
        size = (out / name).stat().st_size / 1024

        def fmt(names, f=f):
            return "<br>".join(f"`{n}` [{', '.join(map(str, f['io'][n]))}]" for n in names)

        outs = [n for n in f["io"] if n.startswith(("logits", "cache.", "present."))]
        ins = [n for n in f["io"] if n not in outs]
        cells = [
            f"`{name}`",
            f["family"],
            f"`{f['exporter']}`",
            str(f["opset"]),
            f"{size:.0f}",
            fmt(ins),
            fmt(outs),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "| file | op types (count) |", "|---|---|"]
    for name, f in manifest["files"].items():
        lines.append(f"| `{name}` | {', '.join(f'{k} {c}' for k, c in f['op_types'].items())} |")
    (out / "README.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=HERE / "fixtures")
    opts = ap.parse_args(argv)
    opts.out.mkdir(parents=True, exist_ok=True)
    reference = json.loads((ROOT / "tests" / "llm" / "decoders" / "decoders.json").read_text())["models"]
    manifest = {"versions": _versions(), "past": PAST, "new": NEW, "batch": BATCH, "files": {}}
    for family in FAMILIES:
        ref = reference[family]
        for how, opset in EXPORTS:
            path = opts.out / f"{family}-dynamo{'-plain' if how == 'torch' else ''}-opset{opset}.onnx"
            (export_plain if how == "torch" else export)(family, opset, path)
            tokens, margins = greedy(OrtDecoder(path), ref["prompt"], len(ref["greedy"]), return_margins=True)
            if tokens != ref["greedy"]:
                raise AssertionError(
                    f"{path.name}: ORT greedy {tokens} != the TorchScript export's {ref['greedy']}"
                )
            manifest["files"][path.name] = {
                "family": family,
                "exporter": "transformers.exporters.OnnxExporter"
                if how == "transformers"
                else "torch.onnx.export",
                **describe(path),
                "torchscript": f"tests/llm/decoders/{ref['file']}",
                "prompt": ref["prompt"],
                "greedy": tokens,
                "min_margin": round(float(np.min(margins)), 4),
            }
            print(
                f"wrote {path.name} ({path.stat().st_size / 1e3:.0f} kB): greedy equal to the TorchScript "
                "export's"
            )
    (opts.out / "dynamo.json").write_text(json.dumps(manifest, indent=1) + "\n")
    write_readme(opts.out, manifest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
