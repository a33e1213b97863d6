"""A prefill with an empty past (``--dim past_seq=0``) on every committed decoder fixture: compiled
with fixed dims, run on the simulator, logits and presents checked against ONNX Runtime at the fp32
tolerance by ``mcpc check``; each also as a copy whose past inputs first pass through a one-input
Concat (an identity, as the TorchScript export of a Llama decoder writes it) — refused before the
zero-size work.  The ``--max-seq`` build of the same fixtures is tested in tests/e2e and tests/llm.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

import mcpc
from mcpc.check import check

TESTS = Path(__file__).resolve().parents[1]
DECODERS = TESTS / "llm" / "decoders"
TORCH = TESTS / "torch_models" / "fixtures"
SEQ = 5
FIXTURES = [
    *(DECODERS / f"{n}-with-past.onnx" for n in ("llama", "qwen2", "gpt2")),
    *(TORCH / f"gpt_kv-torchscript-op{o}.onnx" for o in (17, 20)),
    *(TORCH / f"gpt_kv-dynamo-op{o}.onnx" for o in (18, 20)),
]


def _past_inputs(model: onnx.ModelProto) -> list[str]:
    return [i.name for i in model.graph.input if i.name.startswith("past")]


def with_identity_concat(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy where every past input reaches its consumers through a one-input Concat."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    pasts = _past_inputs(out)
    for node in out.graph.node:
        node.input[:] = [f"{n}__cat" if n in pasts else n for n in node.input]
    cats = [
        helper.make_node("Concat", [p], [f"{p}__cat"], axis=2, name=f"identity_concat_{p}") for p in pasts
    ]
    for i, node in enumerate(cats):
        out.graph.node.insert(i, node)
    onnx.checker.check_model(out)
    return out


def prefill_inputs(model: onnx.ModelProto, seq: int) -> dict[str, np.ndarray]:
    """input_ids (a fixed prompt), attention_mask of ones, positions 0..seq-1, every past empty."""
    feeds = {}
    for vi in model.graph.input:
        dims = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        if vi.name == "input_ids":
            feeds[vi.name] = (np.arange(seq, dtype=np.int64) * 37 + 11)[None] % 200
        elif vi.name == "attention_mask":
            feeds[vi.name] = np.ones((1, seq), np.int64)
        elif vi.name == "position_ids":
            feeds[vi.name] = np.arange(seq, dtype=np.int64)[None]
        else:
            feeds[vi.name] = np.zeros((1, dims[1], 0, dims[3]), np.float32)
    return feeds


def prefill_dims(model: onnx.ModelProto, seq: int) -> dict[str, int]:
    """--dim bindings of a prefill: batch 1, seq new tokens, an empty past (each by the model's
    own dim names: axis 2 of a past input, axis 1 of input_ids and attention_mask)."""
    dims = {}
    for vi in model.graph.input:
        names = [d.dim_param for d in vi.type.tensor_type.shape.dim]
        for axis, name in enumerate(names):
            if not name:
                continue
            if axis == 0:
                dims[name] = 1
            elif vi.name.startswith("past"):
                dims[name] = 0 if axis == 2 else dims.get(name, 1)
            else:
                dims[name] = seq
    return dims


@pytest.mark.parametrize("identity", [False, True], ids=["as_exported", "identity_concat"])
@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_prefill_with_an_empty_past_agrees_with_onnxruntime(path, identity, tmp_path):
    model = onnx.load(path)
    if identity:
        model = with_identity_concat(model)
    onnx_path = tmp_path / "model.onnx"
    onnx.save(model, onnx_path)
    feeds = prefill_inputs(model, SEQ)
    program = tmp_path / "prefill.mcpb"
    mcpc.compile(onnx_path, qat_config="fp32.yaml", output=program, dims=prefill_dims(model, SEQ))
    report = check(onnx_path, program, feeds)
    scored = {o["name"]: o for o in report["outputs"]}
    assert report["passed"], [(o["name"], o["reasons"]) for o in report["outputs"] if not o["passed"]]
    assert report["tolerances"]["max_norm_err"] <= 1e-4  # the fp32 build's tolerance
    logits = next(o for n, o in scored.items() if n == "logits")
    assert tuple(logits["shape"][:2]) == (1, SEQ) and logits["top1"] == 1.0
    presents = [o for n, o in scored.items() if n.startswith("present")]
    assert presents and all(o["shape"][2] == SEQ for o in presents)  # the past (0) + SEQ new rows
