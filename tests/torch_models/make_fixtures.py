"""Make the committed PyTorch-export fixtures of ``tests/torch_models/fixtures/`` (run by hand).

Small transformers written in plain torch (no ``transformers`` package, no hub download), each
exported with both exporters PyTorch offers — the dynamo-based ``torch.onnx.export(...,
dynamo=True)`` and the legacy TorchScript one (``dynamo=False``) — at opset 17 and 18, with the
batch and sequence dims dynamic and named:

* ``bert``: a BERT-style encoder (token + position embeddings from int64 ``input_ids``, an additive
  attention mask from the int64 padding ``attention_mask``, 2 post-LN layers: the first with
  hand-written attention and exact GELU, the second with ``F.scaled_dot_product_attention`` and
  tanh GELU), outputs ``last_hidden_state`` and a tanh ``pooler_output`` of the first token;
* ``gpt``: a GPT-style decoder (RoPE, RMSNorm written out, SiLU-gated MLP, lm head tied to the
  embedding; layer 0 builds its causal mask with ``torch.triu``, layer 1 uses ``is_causal=True``),
  output ``logits``;
* ``gpt_kv``: the same decoder with a ``past_key_values`` interface: inputs ``past_key_<i>`` /
  ``past_value_<i>`` ``[batch, heads, past_seq, head_dim]`` concatenated with the new K/V, outputs
  ``logits`` and ``present_key_<i>`` / ``present_value_<i>``; the mask is built in-graph with
  ``torch.tril(..., diagonal=past_seq)`` (a decode step binds ``seq=1``).

Files are ``<model>-<exporter>-op<opset>.onnx`` (exporter ``dynamo`` or ``torchscript``), weights
inline (no external data), fp32, each well under 2 MB.  ``README.md`` beside them records the exact
torch, onnx and onnxscript versions.  Needs torch (``.venv/bin/pip install torch==2.13.0``) and
onnxscript (the dynamo exporter's dependency); the tests need neither.

    .venv/bin/python tests/torch_models/make_fixtures.py [--out DIR] [--check]

``--check`` runs each written file with ONNX Runtime against the eager torch model.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn
from torch.nn import functional as F

HIDDEN, HEADS, LAYERS, FFN, VOCAB, MAX_POS = 64, 4, 2, 128, 256, 128
HEAD_DIM = HIDDEN // HEADS
# The dynamo exporter implements opset 18 and up (asked for 17 it converts down, and the result
# either stays at 18 or does not validate); 20 is both exporters' default and the TorchScript one's
# maximum.  (At 23 the dynamo exporter writes the ONNX Attention op, whose ONNX Runtime 1.32 CPU
# kernel refuses the broadcast [batch, 1, 1, seq] padding mask.)
OPSETS = {"dynamo": (18, 20), "torchscript": (17, 20)}
SEED = 2026


# -- models --------------------------------------------------------------------------------------
class EncoderLayer(nn.Module):
    """A post-LN BERT layer; ``sdpa`` picks F.scaled_dot_product_attention over the written-out form."""

    def __init__(self, sdpa: bool, gelu: str):
        super().__init__()
        self.qkv, self.proj = nn.Linear(HIDDEN, 3 * HIDDEN), nn.Linear(HIDDEN, HIDDEN)
        self.ln1, self.ln2 = nn.LayerNorm(HIDDEN, eps=1e-12), nn.LayerNorm(HIDDEN, eps=1e-12)
        self.up, self.down = nn.Linear(HIDDEN, FFN), nn.Linear(FFN, HIDDEN)
        self.sdpa, self.gelu = sdpa, gelu

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (t.view(b, s, HEADS, HEAD_DIM).transpose(1, 2) for t in self.qkv(x).split(HIDDEN, -1))
        if self.sdpa:
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        else:
            scores = q @ k.transpose(-2, -1) / math.sqrt(HEAD_DIM) + bias
            a = scores.softmax(-1) @ v
        x = self.ln1(x + self.proj(a.transpose(1, 2).reshape(b, s, HIDDEN)))
        return self.ln2(x + self.down(F.gelu(self.up(x), approximate=self.gelu)))


class Bert(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, HIDDEN), nn.Embedding(MAX_POS, HIDDEN)
        self.ln = nn.LayerNorm(HIDDEN, eps=1e-12)
        self.layers = nn.ModuleList([EncoderLayer(False, "none"), EncoderLayer(True, "tanh")])
        self.pool = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.ln(self.tok(input_ids) + self.pos(pos)[None])
        # the Hugging Face extended mask: 0 where attended, the dtype's lowest value on padding
        bias = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        for layer in self.layers:
            x = layer(x, bias)
        return x, torch.tanh(self.pool(x[:, 0]))


class RMSNorm(nn.Module):
    def __init__(self, eps: float = 1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(HIDDEN)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : HEAD_DIM // 2], x[..., HEAD_DIM // 2 :]
    return torch.cat((-x2, x1), dim=-1)


class DecoderLayer(nn.Module):
    """A pre-norm Llama-style layer; ``mask`` is how the causal mask is made without a cache:
    ``triu`` (an additive -inf mask) or ``is_causal`` (SDPA's flag)."""

    def __init__(self, mask: str):
        super().__init__()
        self.q, self.k = nn.Linear(HIDDEN, HIDDEN, bias=False), nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.v, self.o = nn.Linear(HIDDEN, HIDDEN, bias=False), nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.gate, self.up = nn.Linear(HIDDEN, FFN, bias=False), nn.Linear(HIDDEN, FFN, bias=False)
        self.down = nn.Linear(FFN, HIDDEN, bias=False)
        self.norm1, self.norm2 = RMSNorm(), RMSNorm()
        self.mask = mask

    def forward(self, x, cos, sin, past_k=None, past_v=None):
        b, s, _ = x.shape
        h = self.norm1(x)
        q, k, v = (p(h).view(b, s, HEADS, HEAD_DIM).transpose(1, 2) for p in (self.q, self.k, self.v))
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        if past_k is not None:
            past = past_k.shape[2]
            k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
            # query i sits at position past + i and sees keys 0 .. past + i
            allowed = torch.ones(s, past + s, dtype=torch.bool, device=x.device).tril(diagonal=past)
            if self.mask == "triu":
                scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HEAD_DIM))
                a = scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v
            else:
                a = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        elif self.mask == "triu":
            causal = torch.full((s, s), float("-inf"), device=x.device).triu(1)
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(HEAD_DIM) + causal
            a = scores.softmax(-1) @ v
        else:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, HIDDEN))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h)), k, v


class Gpt(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList([DecoderLayer("triu"), DecoderLayer("is_causal")])
        self.norm = RMSNorm()
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)
        self.lm_head.weight = self.embed.weight  # tied
        inv = 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM))
        freqs = torch.outer(torch.arange(MAX_POS, dtype=torch.float32), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def run(self, input_ids, past: list[torch.Tensor] | None):
        s = input_ids.shape[1]
        start = 0 if past is None else past[0].shape[2]
        cos, sin = self.cos[start : start + s], self.sin[start : start + s]
        x = self.embed(input_ids)
        present = []
        for i, layer in enumerate(self.layers):
            pk, pv = (None, None) if past is None else (past[2 * i], past[2 * i + 1])
            x, k, v = layer(x, cos, sin, pk, pv)
            present += [k, v]
        return self.lm_head(self.norm(x)), present

    def forward(self, input_ids):
        return self.run(input_ids, None)[0]


class GptKv(nn.Module):
    """The decoder with ``past_key_values``: (input_ids, past_key_0, past_value_0, ...) ->
    (logits, present_key_0, present_value_0, ...)."""

    def __init__(self, gpt: Gpt):
        super().__init__()
        self.gpt = gpt

    def forward(self, input_ids, past_key_0, past_value_0, past_key_1, past_value_1):
        # named arguments, not *past: torch.export matches dynamic_shapes to the call's structure
        logits, present = self.gpt.run(input_ids, [past_key_0, past_value_0, past_key_1, past_value_1])
        return (logits, *present)


# -- export --------------------------------------------------------------------------------------
def _kv_names(prefix: str) -> list[str]:
    return [f"{prefix}_{kind}_{i}" for i in range(LAYERS) for kind in ("key", "value")]


def cases() -> dict[str, tuple[nn.Module, tuple, list[str], list[str], dict[str, dict[int, str]]]]:
    """name -> (model, example args, input names, output names, dynamic dims {input: {axis: name}})."""
    torch.manual_seed(SEED)
    bert, gpt = Bert().eval(), Gpt().eval()
    ids = torch.randint(1, VOCAB, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.int64)
    mask[1, 5:] = 0
    text = {0: "batch", 1: "seq"}
    kv_dims = {0: "batch", 2: "past_seq"}
    past = tuple(torch.randn(2, HEADS, 5, HEAD_DIM) for _ in range(2 * LAYERS))
    kv_in = ["input_ids", *_kv_names("past")]
    return {
        "bert": (
            bert,
            (ids, mask),
            ["input_ids", "attention_mask"],
            ["last_hidden_state", "pooler_output"],
            {"input_ids": text, "attention_mask": text},
        ),
        "gpt": (gpt, (ids,), ["input_ids"], ["logits"], {"input_ids": text}),
        "gpt_kv": (
            GptKv(gpt).eval(),
            (ids[:, :3], *past),
            kv_in,
            ["logits", *_kv_names("present")],
            {"input_ids": text, **{n: kv_dims for n in kv_in[1:]}},
        ),
    }


def export(model, args, names_in, names_out, dyn, exporter: str, opset: int, path: Path) -> None:
    """Export with one exporter at one opset to ``path`` (weights inline), atomically."""
    fd, tmp = tempfile.mkstemp(suffix=".onnx", dir=path.parent)
    os.close(fd)
    try:
        if exporter == "dynamo":
            dims: dict[str, torch.export.Dim] = {}
            # one spec per positional argument (so ``*past`` needs no name); one Dim object per name
            shapes = tuple(
                {a: dims.setdefault(d, torch.export.Dim(d, min=1, max=MAX_POS)) for a, d in dyn[n].items()}
                for n in names_in
            )
            torch.onnx.export(
                model,
                args,
                tmp,
                dynamo=True,
                opset_version=opset,
                input_names=names_in,
                output_names=names_out,
                dynamic_shapes=shapes,
                external_data=False,
            )
        else:
            torch.onnx.export(
                model,
                args,
                tmp,
                dynamo=False,
                opset_version=opset,
                input_names=names_in,
                output_names=names_out,
                dynamic_axes=dyn,
            )
        _scrub_paths(tmp)
        onnx.checker.check_model(tmp)
        got = [o.version for o in onnx.load(tmp).opset_import if o.domain in ("", "ai.onnx")]
        if got != [opset]:
            raise RuntimeError(f"asked for opset {opset}, the exporter wrote {got}")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


_FILE = re.compile(r'File "([^"]*[/\\])?([^"/\\]+)"')


def _scrub_paths(path: str) -> None:
    """Cut the directories out of the ``File "..."`` stack traces the dynamo exporter stores in
    metadata (the fixtures are committed: no machine paths); everything else is kept as exported."""
    model = onnx.load(path)
    g = model.graph
    for proto in [*g.node, *g.value_info, *g.input, *g.output, *g.initializer]:
        for prop in proto.metadata_props:
            prop.value = _FILE.sub(r'File "\2"', prop.value)
        if proto.doc_string:
            proto.doc_string = _FILE.sub(r'File "\2"', proto.doc_string)
    onnx.save(model, path)


def check_against_torch(path: Path, model, args, names_in) -> float:
    """Max abs difference between ONNX Runtime on ``path`` and eager torch, on fresh inputs whose
    dims differ from the example's (the dynamic dims really are dynamic)."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ids = torch.randint(1, VOCAB, (3, 11))
    if names_in == ["input_ids", "attention_mask"]:
        mask = torch.ones(3, 11, dtype=torch.int64)
        mask[1, 7:], mask[2, 4:] = 0, 0
        fresh = (ids, mask)
    elif len(names_in) == 1:
        fresh = (ids,)
    else:
        fresh = (ids[:, :1], *(torch.randn(3, HEADS, 9, HEAD_DIM) for _ in names_in[1:]))
    with torch.no_grad():
        want = model(*fresh)
    want = [want] if isinstance(want, torch.Tensor) else list(want)
    got = sess.run(None, {n: a.numpy() for n, a in zip(names_in, fresh, strict=True)})
    return max(float(np.abs(g - w.numpy()).max()) for g, w in zip(got, want, strict=True))


def write_readme(out: Path, written: list[str], failed: list[str]) -> None:
    """``README.md`` beside the fixtures: the exact tool versions and each file's op types."""
    import onnxscript

    lines = [
        "# PyTorch exports (generated — do not edit)",
        "",
        "Written by `tests/torch_models/make_fixtures.py` (see its docstring and `docs/torch_exports.md`)",
        f"with torch {torch.__version__}, onnx {onnx.__version__}, onnxscript {onnxscript.__version__}",
        f"(Python {sys.version.split()[0]}), seed {SEED}.  Reproduce with",
        f"`.venv/bin/pip install torch=={torch.__version__.split('+')[0]} onnxscript` then",
        "`.venv/bin/python tests/torch_models/make_fixtures.py --check`.",
        "",
        "| file | opset | inputs (dims) | op types (count) |",
        "|---|---|---|---|",
    ]
    for name in written:
        m = onnx.load(str(out / name))
        opset = next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx"))
        ins = ", ".join(
            f"{i.name} [{', '.join(str(d.dim_param or d.dim_value) for d in i.type.tensor_type.shape.dim)}]"
            for i in m.graph.input
            if i.name in ("input_ids", "attention_mask", "past_key_0")
        )
        counts: dict[str, int] = {}
        for n in m.graph.node:
            counts[n.op_type] = counts.get(n.op_type, 0) + 1
        types = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        lines.append(f"| `{name}` | {opset} | {ins} | {types} |")
    if failed:
        lines += ["", "Exports the exporter refused:", ""] + [f"- {f}" for f in failed]
    (out / "README.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "fixtures")
    ap.add_argument("--check", action="store_true", help="compare each file with eager torch (ORT)")
    opts = ap.parse_args(argv)
    opts.out.mkdir(parents=True, exist_ok=True)
    warnings.filterwarnings("ignore")
    written, failed = [], []
    for name, (model, args, names_in, names_out, dyn) in cases().items():
        for exporter, opsets in OPSETS.items():
            for opset in opsets:
                path = opts.out / f"{name}-{exporter}-op{opset}.onnx"
                try:
                    with torch.no_grad():
                        export(model, args, names_in, names_out, dyn, exporter, opset, path)
                except Exception as e:  # report every export the exporter refuses, then go on
                    failed.append(f"{path.name}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                    continue
                note = ""
                if opts.check:
                    note = f"  max |ORT - torch| = {check_against_torch(path, model, args, names_in):.2e}"
                written.append(path.name)
                print(f"wrote {path.name} ({path.stat().st_size / 1e6:.2f} MB){note}")
    write_readme(opts.out, written, failed)
    for f in failed:
        print(f"FAILED {f}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
