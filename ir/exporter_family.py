"""Which exporter wrote an ONNX graph, and which I/O convention a decoder with past follows.

``exporter_family(proto)`` names the exporter family of a graph by its structure and names (the
producer, the dims' names, the node names, the contrib ops), for ``mcpc inspect-model``: each
family is a recogniser registered with ``register_family(name, test, order)``, tried in order,
the first whose ``test(ModelFacts)`` returns evidence (a short text) wins.  A family the other
exporters need plugs in with one ``register_family`` call beside its handlers.

``decoder_convention(dec)`` describes what ``ir/decoder_graph.recognise`` found in a decoder with
past — how the past/present pairs are named, whether the graph takes an ``attention_mask`` and
``position_ids`` — and ``convention_line`` says it in one line (``mcpc sim generate``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import onnx

from mcpc.ir.onnx_shapes import dim_expression, expression_names

_DYNAMO_SYMBOL = re.compile(r"^s\d+$")


@dataclass
class ModelFacts:
    """What the recognisers read of a graph, collected once: producer, graph name, the dim params
    of its inputs and outputs, its (domain, op type)s with subgraphs, node names, input names."""

    producer: str
    graph_name: str
    dims: set[str]
    ops: set[tuple[str, str]]
    node_names: list[str]
    inputs: list[str]
    outputs: list[str]
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, proto: onnx.ModelProto) -> ModelFacts:
        dims: set[str] = set()
        for vi in [*proto.graph.input, *proto.graph.output]:
            if vi.type.HasField("tensor_type"):
                dims.update(d.dim_param for d in vi.type.tensor_type.shape.dim if d.dim_param)
        ops: set[tuple[str, str]] = set()
        names: list[str] = []

        def walk(graph: onnx.GraphProto) -> None:
            for n in graph.node:
                ops.add((n.domain or "ai.onnx", n.op_type))
                names.append(n.name)
                for a in n.attribute:
                    if a.type == onnx.AttributeProto.GRAPH:
                        walk(a.g)

        walk(proto.graph)
        inits = {t.name for t in proto.graph.initializer}
        return cls(
            producer=proto.producer_name,
            graph_name=proto.graph.name,
            dims=dims,
            ops=ops,
            node_names=names,
            inputs=[i.name for i in proto.graph.input if i.name not in inits],
            outputs=[o.name for o in proto.graph.output],
        )

    def has_op(self, op_type: str, domain: str | None = None) -> bool:
        return any(t == op_type and (domain is None or d == domain) for d, t in self.ops)


Recogniser = Callable[[ModelFacts], str | None]
_FAMILIES: list[tuple[float, str, Recogniser]] = []


def register_family(name: str, test: Recogniser, order: float) -> None:
    """Add the exporter family ``name``: ``test(facts)`` returns the evidence when a graph is its
    (None otherwise); families are tried by increasing ``order`` (specific ones first)."""
    _FAMILIES[:] = [f for f in _FAMILIES if f[1] != name]
    _FAMILIES.append((order, name, test))
    _FAMILIES.sort(key=lambda f: f[0])


def exporter_family(proto: onnx.ModelProto) -> dict[str, str]:
    """``{"family", "evidence"}`` of the first registered family recognising ``proto``; family
    "unknown" (evidence: the producer) when none does."""
    facts = ModelFacts.of(proto)
    for _, name, test in _FAMILIES:
        evidence = test(facts)
        if evidence:
            return {"family": name, "evidence": evidence}
    return {"family": "unknown", "evidence": f"producer '{facts.producer or '?'}', no known exporter's names"}


# -- the families ------------------------------------------------------------------------------

_ORT_FUSED = ("Attention", "SkipLayerNormalization", "EmbedLayerNormalization", "FastGelu", "BiasGelu")
_OPTIMUM_DIMS = ("batch_size", "sequence_length", "past_sequence_length")


def _genai(f: ModelFacts) -> str | None:
    if f.has_op("GroupQueryAttention", "com.microsoft"):
        return "com.microsoft GroupQueryAttention (the ONNX Runtime GenAI model builder's attention)"
    if "genai" in f.producer.lower():
        return f"producer '{f.producer}'"
    return None


def _ort_optimizer(f: ModelFacts) -> str | None:
    fused = sorted(t for d, t in f.ops if d == "com.microsoft" and t in _ORT_FUSED)
    return f"fused com.microsoft ops {', '.join(fused)}" if fused else None


def _expressions(f: ModelFacts, names: Callable[[str], bool]) -> list[str]:
    """The dims of ``f`` named by an expression every name of which passes ``names``."""
    found = []
    for d in sorted(f.dims):
        tree = dim_expression(d)
        if tree is not None and all(names(n) for n in expression_names(tree)):
            found.append(d)
    return found


def _optimum(f: ModelFacts) -> str | None:
    if f.producer == "optimum-onnx":
        return "producer 'optimum-onnx' (a merged decoder: use_cache_branch, If)"
    named = [d for d in _OPTIMUM_DIMS if d in f.dims]
    exprs = _expressions(f, lambda n: n in _OPTIMUM_DIMS)
    if "batch_size" in f.dims and (exprs or len(named) > 1):
        return "dims " + ", ".join(f"'{d}'" for d in [*named, *exprs])
    return None


def _dynamo(f: ModelFacts) -> str | None:
    symbols = sorted(d for d in f.dims if _DYNAMO_SYMBOL.match(d))
    exprs = _expressions(f, lambda n: bool(_DYNAMO_SYMBOL.match(n)))
    if symbols or exprs:
        shown = ", ".join(f"'{d}'" for d in [*symbols, *exprs][:4])
        return f"symbolic dims named {shown} (torch.export's symbols)"
    return None


def _torchscript(f: ModelFacts) -> str | None:
    scoped = sum(1 for n in f.node_names if n.startswith("/"))
    if f.producer == "pytorch" and scoped * 2 >= len(f.node_names) > 0:
        return "producer 'pytorch', node names by module scope ('/model/...')"
    return None


register_family("ONNX Runtime GenAI model builder", _genai, 10)
register_family("ONNX Runtime transformers optimizer", _ort_optimizer, 20)
register_family("Hugging Face Optimum (optimum-cli export onnx)", _optimum, 30)
register_family("torch.onnx.export, dynamo exporter", _dynamo, 40)
register_family("torch.onnx.export, TorchScript exporter", _torchscript, 50)


# -- a decoder's I/O convention ------------------------------------------------------------------

_HF_PAST = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")
_TORCH_PAST = re.compile(r"^past_(key|value)_(\d+)$")


def decoder_convention(dec: Any, merged: bool = False) -> dict[str, Any]:
    """What a decoder with past recognised by ``recognise`` takes and returns: the past/present
    naming, the token ids, positions and mask inputs (None when absent), the logits output, and
    whether it was the with-past branch of a merged decoder (``ir/merged_decoder.py``)."""
    first = dec.layers[0]
    past, present = first.past["key"], first.present["key"]
    if _HF_PAST.match(past):
        kv = "past_key_values.{i}.key|value -> present.{i}.key|value"
    elif _TORCH_PAST.match(past):
        kv = "past_key_<i> / past_value_<i> -> present_key_<i> / present_value_<i>"
    else:  # read by structure (ir/decoder_graph.py): e.g. the dynamo export through transformers
        kv = (
            f"{_layer_pattern(past, first.index)}|{_layer_pattern(first.past['value'], first.index)} -> "
            f"{_layer_pattern(present, first.index)}|{_layer_pattern(first.present['value'], first.index)} "
            "(paired by structure: each present is Concat(past, new))"
        )
    return {
        "kv": kv,
        "layers": len(dec.layers),
        "example": f"{past} -> {present}",
        "ids": dec.ids,
        "positions": dec.positions,
        "mask": dec.mask,
        "logits": dec.logits,
        "merged": merged,
    }


def _layer_pattern(name: str, index: int) -> str:
    """``name`` with its last part equal to the layer number written ``{i}``."""
    parts = re.split(r"([._/])", name)
    for k in range(len(parts) - 1, -1, -1):
        if parts[k] == str(index):
            parts[k] = "{i}"
            break
    return "".join(parts)


def convention_line(conv: dict[str, Any], exporter: str | None = None) -> str:
    """One line: ``convention: past_key_values.{i}.key|value -> present.{i}.key|value (2 layers);
    input_ids; position_ids fed by the host; attention_mask replaced by the paged cache's ...``."""
    parts = [f"{conv['kv']} ({conv['layers']} layers)", conv["ids"]]
    parts.append(
        f"{conv['positions']} fed with each token's position"
        if conv["positions"]
        else "no position ids (the graph derives positions itself)"
    )
    parts.append(
        f"{conv['mask']} read as causal over the cache (the paged attention's lengths)"
        if conv["mask"]
        else "no attention mask"
    )
    parts.append(f"logits '{conv['logits']}'")
    if conv.get("merged"):
        parts.append("a merged decoder: its use_cache_branch=true branch, the one with past")
    head = "convention" + (f" ({exporter})" if exporter else "")
    return f"{head}: " + "; ".join(parts)
