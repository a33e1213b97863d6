"""Recognise a decoder "with past" in an ONNX graph and rewrite it for a paged KV cache.

A decoder with past takes each layer's past K and V as graph inputs and returns them extended by
the new tokens' K/V (``present = Concat(past, new, axis = seq)``).  ``recognise`` finds, by
structure, for every layer: that Concat pair, the attention consuming it — scores ``MatMul`` of Q
with K transposed (through a GQA ``repeat_kv`` of Unsqueeze/Expand/Reshape), constant scale
factors (Mul/Div by a scalar on Q, on K or on the scores), the mask (an Add, or a Where filling
masked scores), ``Softmax`` over the last axis (and the ``IsNaN``/``Where`` guard SDPA exports add),
then the ``MatMul`` with V — and the tensor Q feeds.  Both naming conventions in use are read:
``past_key_values.{i}.key|value -> present.{i}.key|value`` (transformers) and
``past_key_<i>|past_value_<i> -> present_key_<i>|present_value_<i>`` (our torch fixtures).

``rewrite`` replaces each layer's attention by two ``mcpc.kv`` domain nodes the importer turns into
IR (``ir/decoder_import.py``): ``KVStore`` of the new K and of the new V to the host-given slots,
and ``PagedAttention`` of Q over the cache; the past and ``attention_mask`` inputs and the present
outputs go, and the inputs ``kv_slot``, ``kv_gather``, ``kv_start``, ``kv_len`` (i32) come.
Afterwards nothing may read a past input, a present K/V or ``attention_mask``: a node that does
(positions computed from the past length, a bias that is not the causal/padding mask) is refused,
named — never a program that would compute with a stale length.

Every refusal is an ``UnsupportedError`` naming the graph input, output or node that broke the
pattern.  What the structure cannot prove (that the mask is plain causal + padding, that the
scale is what the factors say) the build's self-check holds against ONNX Runtime
(``mcpc/decoder_check.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from mcpc.errors import UnsupportedError

DOMAIN = "mcpc.kv"
KV_INPUTS = ("kv_slot", "kv_gather", "kv_start", "kv_len")
_HF = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")
_TORCH = re.compile(r"^past_(key|value)_(\d+)$")
# ops a K/V tensor may pass through between the cache and the attention matmuls: GQA's repeat_kv
_REPEAT = ("Unsqueeze", "Expand", "Reshape", "Identity")
_CAST_LIKE = ("Cast", "Identity")
_KINDS = {"key": "key", "keys": "key", "k": "key", "value": "value", "values": "value", "v": "value"}


@dataclass
class Layer:
    """One layer's KV interface and attention, as node/tensor names of the ONNX graph."""

    index: int
    past: dict[str, str] = field(default_factory=dict)  # "key"/"value" -> input name
    present: dict[str, str] = field(default_factory=dict)  # -> output name
    concat: dict[str, onnx.NodeProto] = field(default_factory=dict)
    new: dict[str, str] = field(default_factory=dict)  # the new tokens' K/V (Concat's 2nd input)
    pv: onnx.NodeProto | None = None  # the MatMul of the probabilities with V (its output: attention)
    q: str = ""  # Q before any scale factor
    factors: list[tuple[str, bool]] = field(default_factory=list)  # (scalar tensor, divides)
    mask_nodes: list[onnx.NodeProto] = field(default_factory=list)
    guard: onnx.NodeProto | None = None  # Where(no key visible, 0, attention) after the V matmul
    kv_heads: int = 0
    q_heads: int = 0
    head_dim: int = 0
    gqa: onnx.NodeProto | None = None  # com.microsoft GroupQueryAttention owning the cache (ORT GenAI)
    scale: float | None = None  # the attention scale when an attribute gives it (GQA)
    rope_half: int = 0  # GQA: angles per position in cos_cache (the rotary dim / 2)
    mha: onnx.NodeProto | None = None  # com.microsoft MultiHeadAttention reading the present K/V
    out_cast: int | None = None  # V cast to this ONNX dtype before the V matmul (fp16 exports' SDPA)


@dataclass
class DecoderGraph:
    """What ``recognise`` found: the layers, the token inputs and the logits output."""

    layers: list[Layer]
    ids: str
    positions: str | None
    mask: str | None
    logits: str


def _label(model: onnx.ModelProto) -> str:
    return f"model '{model.graph.name or 'model'}'"


def _node_name(node: onnx.NodeProto, index: int | None = None) -> str:
    return node.name or f"{node.op_type}_{index if index is not None else '?'}"


def _static_dims(vi) -> list[int | str]:
    dims = vi.type.tensor_type.shape.dim
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in dims]


class GraphIndex:
    """Producer/consumer maps and constant lookup over one ONNX graph."""

    def __init__(self, model: onnx.ModelProto):
        self.model, self.graph, self.label = model, model.graph, _label(model)
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        self.index: dict[int, int] = {}
        for i, node in enumerate(self.graph.node):
            self.index[id(node)] = i
            for o in node.output:
                self.producer[o] = node
            for x in node.input:
                self.consumers.setdefault(x, []).append(node)
        self.inits = {t.name: t for t in self.graph.initializer}
        self.inputs = [i for i in self.graph.input if i.name not in self.inits]
        self.outputs = {o.name for o in self.graph.output}

    def name(self, node: onnx.NodeProto) -> str:
        return f"node '{_node_name(node, self.index.get(id(node)))}' ({node.op_type})"

    def constant(self, name: str) -> np.ndarray | None:
        """The value of ``name`` when it is an initializer or a Constant node's output, else None."""
        if name in self.inits:
            return numpy_helper.to_array(self.inits[name])
        node = self.producer.get(name)
        if node is not None and node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value":
                    return numpy_helper.to_array(a.t)
                if a.name in ("value_float", "value_int"):
                    return np.array(helper.get_attribute_value(a))
        return None

    def refuse(self, what: str) -> UnsupportedError:
        return UnsupportedError(f"{self.label}: --max-seq decoder build: {what}")


def _attr(node: onnx.NodeProto, key: str, default=None):
    for a in node.attribute:
        if a.name == key:
            return helper.get_attribute_value(a)
    return default


def _past_inputs(g: GraphIndex) -> dict[int, Layer]:
    layers: dict[int, Layer] = {}
    if not any(_HF.match(vi.name) or _TORCH.match(vi.name) for vi in g.inputs):
        return _past_by_structure(g)
    for vi in g.inputs:
        hf, torch = _HF.match(vi.name), _TORCH.match(vi.name)
        if hf:
            i, kind, present = int(hf.group(1)), hf.group(2), f"present.{hf.group(1)}.{hf.group(2)}"
        elif torch:
            i, kind = int(torch.group(2)), torch.group(1)
            present = f"present_{kind}_{i}"
        else:
            continue
        layer = layers.setdefault(i, Layer(i))
        layer.past[kind], layer.present[kind] = vi.name, present
        if present not in g.outputs:
            raise g.refuse(
                f"past input '{vi.name}' has no present output '{present}' (a decoder with past returns "
                "each past K/V extended by the new tokens)"
            )
    return layers


def _kind_and_layer(name: str) -> tuple[str | None, int | None]:
    """The K/V kind and layer number a past input's name carries, read from its last parts:
    ``past_key_values.layers.3.keys`` -> ("key", 3); (None, None) where it says neither."""
    parts = re.split(r"[._/]", name)
    kind = next((_KINDS[p.lower()] for p in reversed(parts) if p.lower() in _KINDS), None)
    layer = next((int(p) for p in reversed(parts) if p.isdigit()), None)
    return kind, layer


def concat_pairs(graph: onnx.GraphProto) -> list[tuple[str, str]]:
    """The (past input, present output) pairs of a with-past graph read by structure, in the order
    of the past inputs: each graph output computed as ``Concat(input, new)`` of a rank-4 graph input
    along axis 2 (−2) — how every exporter extends the cache, whatever it names it (initializers
    listed as inputs are not inputs)."""
    inits = {t.name for t in graph.initializer}
    inputs = [
        vi.name for vi in graph.input if vi.name not in inits and len(vi.type.tensor_type.shape.dim) == 4
    ]
    names, outputs = set(inputs), {o.name for o in graph.output}
    found: dict[str, str] = {}
    for node in graph.node:
        if (
            node.op_type == "Concat"
            and len(node.input) == 2
            and _attr(node, "axis") in (2, -2)
            and node.output[0] in outputs
            and node.input[0] in names
        ):
            found[node.input[0]] = node.output[0]
    return [(p, found[p]) for p in inputs if p in found]


def _past_by_structure(g: GraphIndex) -> dict[int, Layer]:
    """The layers of a graph whose past/present names follow neither convention (torch's dynamo
    exporter through transformers: ``past_key_values.layers.{i}.keys|values`` ->
    ``cache.layers.{i}.keys|values``): the ``concat_pairs``; the past's name's last parts say key or
    value and the layer (refused, naming the input, when they do not)."""
    layers: dict[int, Layer] = {}
    for past, present in concat_pairs(g.graph):
        kind, index = _kind_and_layer(past)
        if kind is None or index is None:
            raise g.refuse(
                f"input '{past}' is extended into output '{present}' by "
                f"{g.name(g.producer[present])} like a past K/V, but its name says neither key/value nor a "
                "layer number"
            )
        layer = layers.setdefault(index, Layer(index))
        if kind in layer.past:
            raise g.refuse(f"inputs '{layer.past[kind]}' and '{past}' both read as layer {index}'s {kind}")
        layer.past[kind], layer.present[kind] = past, present
    return layers


def alias_past_inputs(model: onnx.ModelProto) -> int:
    """Drop, in place, the Identity and one-input Concat nodes that only rename a past K/V input
    (a TorchScript export wraps the first layer's past so), pointing their readers at the input;
    returns how many went."""
    past = {vi.name for vi in model.graph.input if _HF.match(vi.name) or _TORCH.match(vi.name)}
    if not past:  # names of neither convention: the inputs of each present's Concat
        found = _past_by_structure(GraphIndex(model)).values()
        past = {n for layer in found for n in layer.past.values()}
    outputs = {o.name for o in model.graph.output}
    rename: dict[str, str] = {}
    keep = []
    for node in model.graph.node:
        src = rename.get(node.input[0], node.input[0]) if len(node.input) == 1 else None
        if node.op_type in ("Identity", "Concat") and src in past and node.output[0] not in outputs:
            rename[node.output[0]] = src
            continue
        keep.append(node)
    if rename:
        for node in keep:
            for i, x in enumerate(node.input):
                if x in rename:
                    node.input[i] = rename[x]
        del model.graph.node[:]
        model.graph.node.extend(keep)
    return len(rename)


def recognise(model: onnx.ModelProto) -> DecoderGraph:
    """The layers of a decoder with past in ``model`` (UnsupportedError naming what does not fit)."""
    g = GraphIndex(model)
    layers = _past_inputs(g)
    if not layers:
        raise g.refuse(
            "the graph has no past K/V inputs (past_key_values.{i}.key|value or "
            "past_key_<i>/past_value_<i>): it is not a decoder with past; compile it without --max-seq"
        )
    if sorted(layers) != list(range(len(layers))):
        raise g.refuse(f"past K/V inputs cover layers {sorted(layers)}, not 0..{len(layers) - 1}")
    expected = {layer.present[k] for layer in layers.values() for k in ("key", "value") if k in layer.present}
    for out in g.graph.output:
        if (out.name.startswith("present") and out.name not in expected) or (
            _HF.match(out.name) or _TORCH.match(out.name)
        ):
            raise g.refuse(f"output '{out.name}' has no past input that it extends")
    mask_name = "attention_mask" if any(vi.name == "attention_mask" for vi in g.inputs) else None
    for layer in layers.values():
        for kind in ("key", "value"):
            if kind not in layer.past:
                other = next(iter(layer.past.values()))
                raise g.refuse(f"layer {layer.index} has '{other}' but no past {kind} input")
        if _match_gqa(g, layer):
            continue
        for kind in ("key", "value"):
            _match_concat(g, layer, kind)
        if not _match_mha(g, layer):
            _match_attention(g, layer, mask_name)
    rest = [o.name for o in g.graph.output if o.name not in expected]
    if len(rest) != 1:
        raise g.refuse(
            f"a decoder build returns the logits only, but outputs {rest} remain beside the present K/V"
        )
    names = {vi.name for vi in g.inputs}
    ids = next((n for n in ("input_ids",) if n in names), None)
    if ids is None:
        raise g.refuse(f"no 'input_ids' input (inputs: {sorted(names)})")
    positions = "position_ids" if "position_ids" in names else None
    mask = "attention_mask" if "attention_mask" in names else None
    known = {ids, positions, mask} | {n for la in layers.values() for n in la.past.values()}
    other = sorted(names - known)
    if other:
        raise g.refuse(f"input(s) {other} are not token ids, positions, attention_mask or past K/V")
    return DecoderGraph([layers[i] for i in range(len(layers))], ids, positions, mask, rest[0])


def _match_concat(g: GraphIndex, layer: Layer, kind: str) -> None:
    present, past = layer.present[kind], layer.past[kind]
    node = g.producer.get(present)
    if node is None or node.op_type != "Concat" or list(node.input)[:1] != [past] or len(node.input) != 2:
        what = g.name(node) if node is not None else "a graph input"
        raise g.refuse(
            f"output '{present}' is computed by {what}, not by Concat('{past}', new) along the sequence "
            "axis (nor by a GroupQueryAttention reading it)"
        )
    vi = next(i for i in g.inputs if i.name == past)
    rank = len(vi.type.tensor_type.shape.dim)
    axis = _attr(node, "axis")
    if rank != 4 or axis not in (2, -2):
        raise g.refuse(
            f"{g.name(node)} extends '{past}' (rank {rank}) along axis {axis}: the paged cache takes "
            "[batch, kv_heads, seq, head_dim] extended along axis 2"
        )
    dims = _static_dims(vi)
    if isinstance(dims[1], int) and dims[1] > 0 and not isinstance(dims[3], int):
        width = _width(g, _through_heads(g, node.input[1]), 0)  # e.g. the GenAI builder's 'kv_cache_dim'
        if width is not None and width % dims[1] == 0:
            dims[3] = width // dims[1]
    if not isinstance(dims[1], int) or not isinstance(dims[3], int) or dims[1] < 1 or dims[3] < 1:
        raise g.refuse(
            f"input '{past}' has dims {dims}: its heads (axis 1) and head_dim (axis 3) must be fixed"
        )
    layer.kv_heads, layer.head_dim = dims[1], dims[3]
    layer.concat[kind], layer.new[kind] = node, node.input[1]


# GroupQueryAttention attributes and inputs a paged build does not take (``_match_gqa``)
_GQA_UNTAKEN_ATTRS = ("softcap", "local_window_size", "smooth_softmax", "qk_output")
_GQA_UNTAKEN_INPUTS = {9: "position_ids", 10: "attention_bias", 11: "head_sink"}


def _match_gqa(g: GraphIndex, layer: Layer) -> bool:
    """True when ``layer``'s present K/V are outputs 1/2 of one com.microsoft GroupQueryAttention
    reading its past K/V as inputs 3/4 (ONNX Runtime GenAI's builder): the layer's heads, head size
    (from the past input, else the width of the projection feeding the node) and scale come from
    it.  UnsupportedError, naming the node and field, for what a paged build does not take."""
    node = g.producer.get(layer.present["key"])
    if node is None or node.op_type != "GroupQueryAttention" or node.domain != "com.microsoft":
        return False
    ins, outs = list(node.input) + [""] * 12, list(node.output) + [""] * 3
    if ins[3:5] != [layer.past["key"], layer.past["value"]] or outs[1:3] != [
        layer.present["key"],
        layer.present["value"],
    ]:
        raise g.refuse(
            f"{g.name(node)} computes '{layer.present['key']}' but does not read '{layer.past['key']}' / "
            f"'{layer.past['value']}' as its past_key / past_value and return both presents"
        )
    for key in _GQA_UNTAKEN_ATTRS:
        value = _attr(node, key, 0)
        if key == "local_window_size" and value == -1:
            continue
        if value:
            raise g.refuse(f"{g.name(node)}: attribute {key}={value} is not taken by the paged attention")
    for index, what in _GQA_UNTAKEN_INPUTS.items():
        if ins[index]:
            raise g.refuse(f"{g.name(node)}: input {index} ({what}) is not taken by the paged attention")
    if len(outs) > 3 and outs[3]:
        raise g.refuse(f"{g.name(node)}: output 3 (output_qk) is not taken by the paged attention")
    heads, kv_heads = int(_attr(node, "num_heads", 0)), int(_attr(node, "kv_num_heads", 0))
    if heads <= 0 or kv_heads <= 0 or heads % kv_heads:
        raise g.refuse(f"{g.name(node)}: num_heads={heads}, kv_num_heads={kv_heads}")
    vi = next(i for i in g.inputs if i.name == layer.past["key"])
    dims = _static_dims(vi)
    head = dims[3] if len(dims) == 4 and isinstance(dims[3], int) and dims[3] > 0 else None
    if head is None:  # e.g. the builder's symbolic 'kv_cache_dim': read it off the weights
        packed = not ins[1]
        width = _width(g, ins[0], 0)
        parts = heads + 2 * kv_heads if packed else heads
        if width is None or width % parts:
            raise g.refuse(
                f"{g.name(node)}: the head size is symbolic in '{layer.past['key']}' {dims} and cannot be "
                f"read off the projection feeding input 0 ('{ins[0]}', width {width})"
            )
        head = width // parts
    layer.gqa, layer.kv_heads, layer.q_heads, layer.head_dim = node, kv_heads, heads, head
    scale = float(_attr(node, "scale", 0.0))
    layer.scale = scale if scale else float(1.0 / np.sqrt(head))
    if _attr(node, "do_rotary", 0):
        cos = g.constant(ins[7]) if ins[7] else None
        if cos is None or cos.ndim != 2 or not ins[8] or 2 * cos.shape[1] > head:
            raise g.refuse(
                f"{g.name(node)}: do_rotary=1 needs constant cos_cache/sin_cache [positions, <= head/2]"
            )
        layer.rope_half = int(cos.shape[1])
    return True


def _width(g: GraphIndex, name: str, depth: int) -> int | None:
    """The last dim of ``name`` when a projection computes it: a MatMul by a constant, a
    com.microsoft MatMulNBits (its N), a bias Add or a Cast of one."""
    node = g.producer.get(name)
    if node is None or depth > 8:
        return None
    if node.op_type == "MatMul":
        w = g.constant(node.input[1])
        return int(w.shape[-1]) if w is not None and w.ndim >= 2 else None
    if node.op_type == "MatMulNBits" and node.domain == "com.microsoft":
        return int(_attr(node, "N", 0)) or None
    if node.op_type in ("Add", "Cast", "Identity"):
        for x in node.input[:2]:
            found = _width(g, x, depth + 1)
            if found is not None:
                return found
    return None


def _through_heads(g: GraphIndex, name: str) -> str:
    """Back from the new K/V [B, N, S, H] through the head split (Transpose, Reshape), RoPE
    (com.microsoft RotaryEmbedding, input 0) and casts to the projection's [B, S, N·H] output."""
    for _ in range(8):
        node = g.producer.get(name)
        if node is None:
            return name
        if node.op_type in ("Transpose", "Reshape", "Cast", "Identity") or (
            node.op_type == "RotaryEmbedding" and node.domain == "com.microsoft"
        ):
            name = node.input[0]
        else:
            return name
    return name


_MHA_UNTAKEN_INPUTS = {3: "bias", 4: "key_padding_mask", 6: "past_key", 7: "past_value",
                       8: "past_sequence_length", 9: "cache_indirection"}  # fmt: skip


def _to_present(g: GraphIndex, name: str, present: str) -> bool:
    """``name`` is ``present`` repeated for the query heads and laid out for an attention op:
    reached back through Reshape, Transpose, Expand, Unsqueeze, Identity and Cast alone."""
    for _ in range(16):
        if name == present:
            return True
        node = g.producer.get(name)
        if node is None or node.op_type not in (
            "Reshape",
            "Transpose",
            "Expand",
            "Unsqueeze",
            "Identity",
            "Cast",
        ):
            return False
        name = node.input[0]
    return False


def _match_mha(g: GraphIndex, layer: Layer) -> bool:
    """True when a com.microsoft MultiHeadAttention reads the layer's present K and V (repeated for
    the query heads through repeat_kv's Reshape/Expand/Transpose) as its key and value: the ONNX
    Runtime GenAI builder's fp16 CPU graphs.  Its mask (attention_bias, built from
    attention_mask) is left to the paged cache's causal lengths and held by the self-check."""
    pk, pv = layer.present["key"], layer.present["value"]
    found = [
        n for n in g.graph.node
        if n.op_type == "MultiHeadAttention" and n.domain == "com.microsoft" and len(n.input) > 2
        and _to_present(g, n.input[1], pk) and _to_present(g, n.input[2], pv)
    ]  # fmt: skip
    if not found:
        return False
    if len(found) != 1:
        raise g.refuse(f"layer {layer.index}: {len(found)} MultiHeadAttention nodes read '{pk}'")
    node = found[0]
    ins = list(node.input) + [""] * 10
    for index, what in _MHA_UNTAKEN_INPUTS.items():
        if ins[index]:
            raise g.refuse(f"{g.name(node)}: input {index} ({what}) is not taken by the paged attention")
    if any(node.output[1:]):
        raise g.refuse(f"{g.name(node)}: outputs 1-3 (present, qk) are not taken by the paged attention")
    heads = int(_attr(node, "num_heads", 0))
    if heads <= 0 or heads % layer.kv_heads:
        raise g.refuse(
            f"{g.name(node)}: num_heads={heads} is not a multiple of the {layer.kv_heads} KV heads"
        )
    layer.mha, layer.q_heads, layer.q = node, heads, ins[0]
    scale = float(_attr(node, "scale", 0.0))
    layer.scale = scale if scale else float(1.0 / np.sqrt(layer.head_dim))
    return True


def _walk_to_cache(g: GraphIndex, name: str, present: str, factors: list | None) -> tuple[int, bool] | None:
    """Follow ``name`` back through repeat_kv ops, transposes of the last two axes and (when
    ``factors`` is a list) scalar Mul/Div to ``present``: (transposes, ok) or None."""
    transposes = 0
    for _ in range(32):
        if name == present:
            return transposes, True
        node = g.producer.get(name)
        if node is None:
            return None
        if node.op_type in _REPEAT or node.op_type == "Cast":  # a cast: an fp16 export's SDPA in f32
            name = node.input[0]
        elif node.op_type == "Transpose" and _swaps_last_two(_attr(node, "perm", [])):
            transposes += 1
            name = node.input[0]
        elif factors is not None and node.op_type in ("Mul", "Div"):
            side = _scalar_side(g, node)
            if side is None:
                return None
            factors.append((node.input[1 - side], node.op_type == "Div"))
            name = node.input[side]
        else:
            return None
    return None


def _swaps_last_two(perm) -> bool:
    """A transpose of the last two axes alone (rank 3 too: SDPA exports fold batch and heads)."""
    perm = list(perm)
    n = len(perm)
    return n >= 2 and perm == [*range(n - 2), n - 1, n - 2]


def _scalar_side(g: GraphIndex, node: onnx.NodeProto) -> int | None:
    """For a Mul/Div by a scalar: the index of the other (path) input; None when neither input is a
    one-element tensor (a Div's path must be its dividend)."""
    for side in (0, 1):
        other = node.input[1 - side]
        if node.op_type == "Div" and side == 1:
            continue
        if _is_scalar(g, other):
            return side
    return None


def _is_scalar(g: GraphIndex, name: str) -> bool:
    const = g.constant(name)
    if const is not None:
        return const.size == 1
    # a scale computed from shapes (Shape -> Cast -> Sqrt -> Div): its value comes from the probe run
    node = g.producer.get(name)
    return node is not None and _shape_only(g, name, 0)


def _shape_only(g: GraphIndex, name: str, depth: int) -> bool:
    """True when ``name`` is computed from constants and Shape nodes alone (no tensor values)."""
    return _computed_from(g, name, None, depth, 24)


def _match_attention(g: GraphIndex, layer: Layer, mask: str | None = None) -> None:
    pk, pv = layer.present["key"], layer.present["value"]
    fused = [
        n for n in g.graph.node
        if n.op_type == "Attention" and n.domain in ("", "ai.onnx") and len(n.input) > 2
        and _walk_to_cache(g, n.input[2], pv, None) == (0, True)
    ]  # fmt: skip
    if fused:
        _match_fused_attention(g, layer, fused, mask)
        return
    pvs = [
        n for n in g.graph.node
        if n.op_type == "MatMul" and _walk_to_cache(g, n.input[1], pv, None) == (0, True)
    ]  # fmt: skip
    if len(pvs) != 1:
        users = ", ".join(g.name(n) for n in g.consumers.get(pv, [])) or "nothing"
        raise g.refuse(
            f"layer {layer.index}: expected one MatMul of attention probabilities with '{pv}' (read by "
            f"{users}), found {len(pvs)}"
        )
    layer.pv = pvs[0]
    layer.out_cast = _v_cast(g, layer.pv.input[1], pv)
    probs = _through_guard(g, layer.pv.input[0])
    soft = g.producer.get(probs)
    if soft is None or soft.op_type != "Softmax" or _attr(soft, "axis", -1) not in (-1, 3):
        what = g.name(soft) if soft is not None else f"input '{probs}'"
        raise g.refuse(
            f"layer {layer.index}: {g.name(layer.pv)} multiplies V by {what}, not by a Softmax over the "
            "last axis"
        )
    scores, factors, masks = _scores(g, soft.input[0], layer, [], [], 0)
    if scores is None:
        raise g.refuse(
            f"layer {layer.index}: the input of {g.name(soft)} is not Q·K^T of '{pk}' through scale "
            f"factors and a mask: {factors}"
        )
    qf: list = []
    q = scores.input[0]
    for _ in range(8):
        node = g.producer.get(q)
        if node is None or node.op_type not in ("Mul", "Div"):
            break
        side = _scalar_side(g, node)
        if side is None:
            break
        qf.append((node.input[1 - side], node.op_type == "Div"))
        q = node.input[side]
    layer.q, layer.factors, layer.mask_nodes = q, factors + qf, masks
    layer.guard = _empty_row_guard(g, layer.pv.output[0], mask)


def _match_fused_attention(g: GraphIndex, layer: Layer, found: list, mask: str | None) -> None:
    """ONNX ``Attention`` (opset 23: torch's dynamo exporter writes SDPA so) over the present K/V,
    4-D (Q [batch, q_heads, seq, head_dim]), its scale an attribute, its mask the additive or boolean
    input 3; its own past inputs, ``is_causal``, ``softcap`` and the extra outputs are refused."""
    pk = layer.present["key"]
    if len(found) != 1:
        raise g.refuse(f"layer {layer.index}: {len(found)} Attention nodes read '{layer.present['value']}'")
    node = found[0]
    if _walk_to_cache(g, node.input[1], pk, None) != (0, True):
        raise g.refuse(
            f"layer {layer.index}: {g.name(node)} reads '{layer.present['value']}' but not '{pk}' as K"
        )
    extra = [x for x in node.input[4:] if x] + [x for x in node.output[1:] if x]
    window = max(_attr(node, "left_window_size", -1), _attr(node, "right_window_size", -1)) >= 0
    why = (
        f"inputs/outputs {extra} (its own past K/V, nonpad_kv_seqlen or the QK output)" if extra
        else "is_causal = 1" if _attr(node, "is_causal", 0)
        else "a softcap" if _attr(node, "softcap", 0.0)
        else "3-D Q/K/V" if _attr(node, "q_num_heads", 0) or _attr(node, "kv_num_heads", 0)
        else "a sliding window" if window
        else None
    )  # fmt: skip
    if why:
        raise g.refuse(
            f"layer {layer.index}: {g.name(node)} has {why}: the paged build takes the 4-D form only"
        )
    scale = _attr(node, "scale", None)
    if scale is None:
        scale = 1.0 / float(np.sqrt(layer.head_dim))
    name = f"{node.name or 'attention'}/mcpc_scale"
    g.model.graph.initializer.append(numpy_helper.from_array(np.array(scale, np.float32), name))
    g.inits[name] = g.model.graph.initializer[-1]
    layer.pv, layer.q, layer.factors = node, node.input[0], [(name, False)]
    layer.mask_nodes = [node] if len(node.input) > 3 and node.input[3] else []
    layer.guard = _empty_row_guard(g, node.output[0], mask)


def _empty_row_guard(g: GraphIndex, out: str, mask: str | None) -> onnx.NodeProto | None:
    """The ``Where(cond, 0, attention)`` torch's SDPA export puts after the attention to zero query
    rows that see no key (``cond`` computed from the attention mask and shapes alone), or None.  A
    paged decoder's rows always see their own token, so the paged build drops it."""
    users = g.consumers.get(out, [])
    if len(users) != 1 or users[0].op_type != "Where" or users[0].input[2] != out:
        return None
    node = users[0]
    zero = g.constant(node.input[1])
    if zero is None or zero.size != 1 or float(zero.reshape(-1)[0]) != 0.0:
        return None
    return node if _from_mask(g, node.input[0], mask, 0) else None


def _from_mask(g: GraphIndex, name: str, mask: str | None, depth: int) -> bool:
    """True when ``name`` is computed from the attention mask, constants and shapes alone."""
    return _computed_from(g, name, mask, depth, 48)


def _computed_from(g: GraphIndex, name: str, mask: str | None, depth: int, limit: int) -> bool:
    """True when ``name`` is computed from ``mask`` (when given), constants and Shape nodes alone,
    looking at most ``limit`` producers deep."""
    if depth > limit:
        return False
    if (mask is not None and name == mask) or g.constant(name) is not None:
        return True
    node = g.producer.get(name)
    if node is None:
        return False
    if node.op_type == "Shape":
        return True
    return all(_computed_from(g, x, mask, depth + 1, limit) for x in node.input if x)


def _v_cast(g: GraphIndex, name: str, present: str) -> int | None:
    """The ``to`` of the Cast nearest the V matmul on V's path from ``present`` (Optimum's fp16
    export multiplies the f32 probabilities by V cast to f32), None when V is not cast: the paged
    attention computes in the cache's dtype and its result is cast to that dtype, as the matmul's was."""
    while name != present:
        node = g.producer[name]
        if node.op_type == "Cast":
            return int(_attr(node, "to", 0))
        name = node.input[0]
    return None


def _through_guard(g: GraphIndex, name: str) -> str:
    """Skip SDPA's NaN guard ``Where(IsNaN(p), 0, p)`` and casts between Softmax and the V matmul."""
    for _ in range(4):
        node = g.producer.get(name)
        if node is None:
            return name
        if node.op_type in _CAST_LIKE:
            name = node.input[0]
        elif node.op_type == "Where":
            cond = g.producer.get(node.input[0])
            if cond is None or cond.op_type != "IsNaN" or cond.input[0] != node.input[2]:
                return name
            zero = g.constant(node.input[1])
            if zero is None or zero.size != 1 or float(zero.reshape(())) != 0.0:
                return name
            name = node.input[2]
        else:
            return name
    return name


def _scores(g: GraphIndex, name: str, layer: Layer, factors: list, masks: list, depth: int):
    """Walk from the Softmax input back to the scores MatMul: (matmul, scale factors, mask nodes),
    or (None, why, None)."""
    if depth > 12:
        return None, "too many ops between the scores and the Softmax", None
    node = g.producer.get(name)
    if node is None:
        return None, f"'{name}' is a graph input", None
    if node.op_type == "MatMul":
        kf: list = []
        walked = _walk_to_cache(g, node.input[1], layer.present["key"], kf)
        if walked != (1, True):
            return None, f"{g.name(node)} does not multiply by the transposed K cache", None
        return node, factors + kf, masks
    if node.op_type in _CAST_LIKE:
        return _scores(g, node.input[0], layer, factors, masks, depth + 1)
    if node.op_type in ("Mul", "Div"):
        side = _scalar_side(g, node)
        if side is None:
            return None, f"{g.name(node)} scales the scores by a non-scalar", None
        f = [*factors, (node.input[1 - side], node.op_type == "Div")]
        return _scores(g, node.input[side], layer, f, masks, depth + 1)
    if node.op_type in ("Add", "Where"):
        sides = (0, 1) if node.op_type == "Add" else (1, 2)
        whys = []
        for side in sides:
            found = _scores(g, node.input[side], layer, factors, [*masks, node], depth + 1)
            if found[0] is not None:
                return found
            whys.append(found[1])
        return None, "; ".join(whys), None
    return None, f"{g.name(node)} is neither a scale, a mask nor a cast", None


# -- the rewrite --------------------------------------------------------------------------------------
def rewrite(
    model: onnx.ModelProto,
    dec: DecoderGraph,
    scales: list[float],
    block: int = 64,
    positions: dict[str, list[int]] | None = None,
) -> onnx.ModelProto:
    """``model`` with each layer's attention on the paged cache (see the module docstring); ``scales``
    are the layers' attention scales.  ``positions`` maps the output of each position-table Slice
    by the past length (``past_length_slices``, verified by the caller) to the axes to unsqueeze
    after the Gather of the table at ``position_ids`` that replaces it (an input ``position_ids``
    [batch, seq] is added when the model has none; ``dec.positions`` names it then).
    UnsupportedError naming a node that still reads the past, a present K/V or the attention mask
    afterwards."""
    g = GraphIndex(model)
    if any(layer.gqa is not None and _attr(layer.gqa, "do_rotary", 0) for layer in dec.layers):
        dec.positions = dec.positions or "position_ids"  # GQA's RoPE at positions the host gives
    nodes = _attention_nodes(g, dec, scales, block)
    nodes, extra_inits = _past_dims(nodes, dec)
    if positions:
        dec.positions = dec.positions or "position_ids"
        nodes, inits = _gather_positions(nodes, dec.positions, positions)
        extra_inits += inits
    gone = {n for layer in dec.layers for n in (*layer.past.values(), *layer.present.values())}
    if dec.mask:
        gone.add(dec.mask)
    keep = _live(nodes, dec.logits)
    for node in keep:
        bad = [x for x in node.input if x in gone]
        if bad:
            what = "the attention mask" if bad[0] == dec.mask else "the past K/V (or its length)"
            raise g.refuse(
                f"{g.name(node)} reads '{bad[0]}' outside the attention the paged cache replaces: it "
                f"depends on {what}, which a paged decoder does not have (positions computed from the "
                "past length are taken only as a Slice of a constant table: else export position_ids)"
            )
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(keep)
    out.graph.initializer.extend(extra_inits)
    inputs = [vi for vi in model.graph.input if vi.name not in gone]
    if dec.positions and all(vi.name != dec.positions for vi in inputs):
        ids = next(vi for vi in inputs if vi.name == dec.ids)
        pos = helper.make_tensor_value_info(dec.positions, onnx.TensorProto.INT64, None)
        pos.type.tensor_type.shape.CopyFrom(ids.type.tensor_type.shape)
        inputs.append(pos)
    del out.graph.input[:]
    out.graph.input.extend(inputs)
    for name in KV_INPUTS:
        out.graph.input.append(helper.make_tensor_value_info(name, onnx.TensorProto.INT32, [f"{name}_dim"]))
    outputs = [o for o in model.graph.output if o.name == dec.logits]
    del out.graph.output[:]
    out.graph.output.extend(outputs)
    del out.graph.value_info[:]
    if not any(o.domain == DOMAIN for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    return out


def _attention_nodes(g: GraphIndex, dec: DecoderGraph, scales: list[float], block: int) -> list:
    """The graph's nodes with each layer's Concat pair dropped and its V matmul replaced by the
    KV stores and the paged attention."""
    replaced = {id(layer.pv): layer for layer in dec.layers if layer.pv is not None}
    replaced.update({id(layer.mha): layer for layer in dec.layers if layer.mha is not None})
    dropped = {id(layer.concat[k]) for layer in dec.layers if layer.gqa is None for k in ("key", "value")}
    gqa = {id(layer.gqa): layer for layer in dec.layers if layer.gqa is not None}
    dropped |= {id(layer.guard) for layer in dec.layers if layer.guard is not None}
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    shared: dict[str, tuple[str, str]] = {}  # RoPE tables gathered at the positions, once per cache
    for node in g.graph.node:
        if id(node) in dropped:
            continue
        if id(node) in gqa:
            layer = gqa[id(node)]
            pos = dec.positions or "position_ids"
            nodes += _gqa_nodes(g, layer, scales[layer.index], block, pos, inits, shared)
            continue
        layer = replaced.get(id(node))
        if layer is None:
            nodes.append(node)
            continue
        tag = f"mcpc_kv/layer{layer.index}"
        q, attn_out = layer.q, (layer.guard or node).output[0]
        if layer.mha is not None:  # [B, S, Nq·H] in and out
            nq, h = layer.q_heads, layer.head_dim
            shape_in, shape_out = f"{tag}/q_shape", f"{tag}/out_shape"
            inits.append(numpy_helper.from_array(np.array([0, 0, nq, h], np.int64), shape_in))
            inits.append(numpy_helper.from_array(np.array([0, 0, nq * h], np.int64), shape_out))
            nodes.append(
                helper.make_node("Reshape", [layer.q, shape_in], [f"{tag}/q_bsnh"], name=f"{tag}/q_bsnh")
            )
            nodes.append(helper.make_node("Transpose", [f"{tag}/q_bsnh"], [f"{tag}/q"], name=f"{tag}/q",
                                          perm=[0, 2, 1, 3]))  # fmt: skip
            q, attn_out = f"{tag}/q", f"{tag}/attention"
        for kind, short in (("key", "k"), ("value", "v")):
            nodes.append(
                helper.make_node(
                    "KVStore", [layer.new[kind], "kv_slot"], [], name=f"{tag}/store_{short}", domain=DOMAIN,
                    layer=layer.index, kind=short,
                )
            )  # fmt: skip
        if layer.out_cast is not None and layer.mha is None:  # V was cast before the matmul
            cast_to, attn_out = attn_out, f"{tag}/attention"
        nodes.append(
            helper.make_node(
                "PagedAttention", [q, "kv_gather", "kv_start", "kv_len"], [attn_out],
                name=f"{tag}/attention", domain=DOMAIN, layer=layer.index, kv_heads=layer.kv_heads,
                scale=float(scales[layer.index]), block_size=block,
            )
        )  # fmt: skip
        if layer.out_cast is not None and layer.mha is None:
            cast = helper.make_node("Cast", [attn_out], [cast_to], name=f"{tag}/cast", to=layer.out_cast)
            nodes.append(cast)
        if layer.mha is not None:
            back = f"{tag}/out_bsnh"
            nodes.append(helper.make_node("Transpose", [attn_out], [back], name=back, perm=[0, 2, 1, 3]))
            out_shape = f"{tag}/out_shape"
            nodes.append(helper.make_node("Reshape", [back, out_shape], [node.output[0]], name=f"{tag}/out"))
    if inits:  # constants of the GQA replacements, as Constant nodes ahead of everything
        nodes = [
            helper.make_node("Constant", [], [t.name], name=f"{t.name}/const", value=t) for t in inits
        ] + nodes
    return nodes


def _gqa_nodes(
    g: GraphIndex, layer: Layer, scale: float, block: int, positions: str, inits: list, shared: dict
) -> list:
    """Standard ONNX nodes and ``mcpc.kv`` nodes for one GroupQueryAttention (``layer.gqa``): Q, K, V
    cut from the packed input (or taken from inputs 0-2) as [batch, heads, seq, head]; RoPE from
    the cos/sin caches gathered at ``positions`` (halves, or pairs when rotary_interleaved; a
    rotary dim below the head size leaves the rest); K and V stored to the cache; the paged
    attention of Q; the result back to [batch, seq, heads · head] as the node's output 0.

    Halves RoPE reads tables widened at build time, ``[cos, cos]`` and ``[−sin, sin]`` per position
    (gathered once for all layers sharing the caches: ``shared``), so that each of Q and K costs two
    products and one sum over the rotary width: x·cos₂ + swap(x)·sin₂, swap(x) = [x₂, x₁], which is
    x₁·cos − x₂·sin, x₂·cos + x₁·sin exactly."""
    node = layer.gqa
    ins = list(node.input) + [""] * 12
    tag = f"mcpc_kv/layer{layer.index}"
    nq, nkv, h = layer.q_heads, layer.kv_heads, layer.head_dim
    out: list[onnx.NodeProto] = []

    def const(name: str, values) -> str:
        full = f"{tag}/{name}"
        inits.append(numpy_helper.from_array(np.array(values, np.int64), full))
        return full

    def add(op: str, inputs: list[str], name: str, **attrs) -> str:
        y = f"{tag}/{name}"
        out.append(helper.make_node(op, inputs, [y], name=y, **attrs))
        return y

    def cut(x: str, lo: int, hi: int, axis: int, name: str, step: int = 1) -> str:
        args = [x, const(f"{name}_lo", [lo]), const(f"{name}_hi", [hi]), const(f"{name}_ax", [axis])]
        return add("Slice", [*args, const(f"{name}_st", [step])], name)

    def heads_first(x: str, n: int, name: str) -> str:
        r = add("Reshape", [x, const(f"{name}_shape", [0, 0, n, h])], f"{name}_bsnh")
        return add("Transpose", [r], name, perm=[0, 2, 1, 3])

    if not ins[1]:  # packed [B, S, (Nq + 2 Nkv) H]
        q3 = cut(ins[0], 0, nq * h, 2, "q3")
        k3 = cut(ins[0], nq * h, (nq + nkv) * h, 2, "k3")
        v3 = cut(ins[0], (nq + nkv) * h, (nq + 2 * nkv) * h, 2, "v3")
    else:
        q3, k3, v3 = ins[0], ins[1], ins[2]
    q, k, v = heads_first(q3, nq, "q"), heads_first(k3, nkv, "k"), heads_first(v3, nkv, "v")
    if _attr(node, "do_rotary", 0):
        interleaved = bool(_attr(node, "rotary_interleaved", 0))
        if interleaved:
            cos = add("Unsqueeze", [add("Gather", [ins[7], positions], "cos_g"), const("ax1", [1])], "cos")
            sin = add("Unsqueeze", [add("Gather", [ins[8], positions], "sin_g"), const("ax1b", [1])], "sin")
            q = _gqa_rope(add, cut, const, q, cos, sin, h, layer, interleaved, "q")
            k = _gqa_rope(add, cut, const, k, cos, sin, h, layer, interleaved, "k")
        else:
            key = f"{ins[7]}|{ins[8]}"
            if key not in shared:
                c, sn = g.constant(ins[7]), g.constant(ins[8])
                tables = []
                for name, table in (
                    ("cos2", np.concatenate([c, c], 1)),
                    ("sin2", np.concatenate([-sn, sn], 1)),
                ):
                    full = f"{tag}/{name}_table"
                    inits.append(numpy_helper.from_array(np.ascontiguousarray(table), full))
                    gathered = add("Gather", [full, positions], f"{name}_g")
                    tables.append(add("Unsqueeze", [gathered, const(f"{name}_ax", [1])], name))
                shared[key] = (tables[0], tables[1])
            cos2, sin2 = shared[key]
            q = _gqa_rope_halves(add, cut, q, cos2, sin2, h, layer.rope_half, "q")
            k = _gqa_rope_halves(add, cut, k, cos2, sin2, h, layer.rope_half, "k")
    for kind, x in (("k", k), ("v", v)):
        out.append(
            helper.make_node(
                "KVStore", [x, "kv_slot"], [], name=f"{tag}/store_{kind}", domain=DOMAIN, layer=layer.index,
                kind=kind,
            )
        )  # fmt: skip
    attn = f"{tag}/attention"
    out.append(
        helper.make_node(
            "PagedAttention", [q, "kv_gather", "kv_start", "kv_len"], [attn], name=attn, domain=DOMAIN,
            layer=layer.index, kv_heads=nkv, scale=float(scale), block_size=block,
        )
    )  # fmt: skip
    t = add("Transpose", [attn], "out_bsnh", perm=[0, 2, 1, 3])
    out.append(helper.make_node("Reshape", [t, const("out_shape", [0, 0, nq * h])], [node.output[0]],
                                name=f"{tag}/out"))  # fmt: skip
    return out


def _gqa_rope_halves(add, cut, x: str, cos2: str, sin2: str, h: int, half: int, name: str) -> str:
    """Halves RoPE of ``x`` [B, N, S, H] with the widened tables [B, 1, S, 2·half] (``_gqa_nodes``)."""
    rot = 2 * half
    xr = cut(x, 0, rot, 3, f"{name}_rot") if rot < h else x
    x1, x2 = cut(xr, 0, half, 3, f"{name}_x1"), cut(xr, half, rot, 3, f"{name}_x2")
    swap = add("Concat", [x2, x1], f"{name}_sw", axis=3)
    a, b = add("Mul", [xr, cos2], f"{name}_c"), add("Mul", [swap, sin2], f"{name}_s")
    y = add("Add", [a, b], f"{name}_rope")
    if rot < h:
        y = add("Concat", [y, cut(x, rot, h, 3, f"{name}_pass")], f"{name}_full", axis=3)
    return y


def _gqa_rope(
    add, cut, const, x: str, cos: str, sin: str, h: int, layer: Layer, interleaved: bool, name: str
):
    """Interleaved RoPE of ``x`` [B, N, S, H] with cos/sin [B, 1, S, R/2]: the pairs (x[2k], x[2k+1])
    as ONNX Runtime's GQA rotates them."""
    half = int(layer.rope_half)
    rot = 2 * half
    xr = cut(x, 0, rot, 3, f"{name}_rot") if rot < h else x
    if interleaved:
        x1, x2 = cut(xr, 0, rot, 3, f"{name}_x1", 2), cut(xr, 1, rot, 3, f"{name}_x2", 2)
    else:
        x1, x2 = cut(xr, 0, half, 3, f"{name}_x1"), cut(xr, half, rot, 3, f"{name}_x2")
    o1 = add("Sub", [add("Mul", [x1, cos], f"{name}_a"), add("Mul", [x2, sin], f"{name}_b")], f"{name}_o1")
    o2 = add("Add", [add("Mul", [x2, cos], f"{name}_c"), add("Mul", [x1, sin], f"{name}_d")], f"{name}_o2")
    if interleaved:
        pair = [
            add("Unsqueeze", [o, const(f"{name}_ax4{i}", [4])], f"{name}_p{i}")
            for i, o in enumerate((o1, o2))
        ]
        pairs = add("Concat", pair, f"{name}_pairs", axis=4)
        y = add("Reshape", [pairs, const(f"{name}_rs", [0, 0, 0, rot])], f"{name}_rope")
    else:
        y = add("Concat", [o1, o2], f"{name}_rope", axis=3)
    if rot < h:
        y = add("Concat", [y, cut(x, rot, h, 3, f"{name}_pass")], f"{name}_full", axis=3)
    return y


def past_length_slices(model: onnx.ModelProto, dec: DecoderGraph) -> list[onnx.NodeProto]:
    """The Slices of a constant table whose start is computed from a past input's shape, among the
    nodes the rewritten graph still needs: candidates for positions ``past .. past + seq`` taken
    from a table (RoPE cos/sin, learned positions).  The caller verifies what they compute."""
    g = GraphIndex(model)
    past = {n for layer in dec.layers for n in layer.past.values()}
    keep = _live(_attention_nodes(g, dec, [1.0] * len(dec.layers), 64), dec.logits)
    found = []
    for node in keep:
        if node.op_type != "Slice" or g.constant(node.input[0]) is None or len(node.input) < 3:
            continue
        if _shape_only(g, node.input[1], 0) and _reads_shape_of(g, node.input[1], past, 0):
            found.append(node)
    return found


def _reads_shape_of(g: GraphIndex, name: str, inputs: set[str], depth: int) -> bool:
    node = g.producer.get(name)
    if node is None or depth > 24:
        return False
    if node.op_type == "Shape":
        return node.input[0] in inputs
    return any(_reads_shape_of(g, x, inputs, depth + 1) for x in node.input if x)


def _past_dims(nodes, dec: DecoderGraph):
    """Replace each Shape of a past input that leaves out its sequence axis (exporters read the
    batch size there) by the same dims from ``input_ids`` (batch) and constants (heads, head_dim)."""
    past = {n: layer for layer in dec.layers for n in layer.past.values()}
    out, inits = [], []
    for node in nodes:
        layer = past.get(node.input[0]) if node.op_type == "Shape" and node.input else None
        start, end = int(_attr(node, "start", 0)), _attr(node, "end", None)
        axes = list(range(4))[start : None if end is None else int(end)]
        if layer is None or 2 in axes or not axes:
            out.append(node)
            continue
        parts = []
        for axis in axes:
            name = f"{node.output[0]}/mcpc_dim{axis}"
            if axis == 0:
                out.append(
                    helper.make_node("Shape", [dec.ids], [name], name=f"{node.name}/batch", start=0, end=1)
                )
            else:
                value = layer.kv_heads if axis == 1 else layer.head_dim
                inits.append(numpy_helper.from_array(np.array([value], np.int64), name))
            parts.append(name)
        out.append(helper.make_node("Concat", parts, [node.output[0]], name=f"{node.name}/dims", axis=0))
    return out, inits


def _gather_positions(nodes, positions_input: str, positions: dict[str, list[int]]):
    """Replace each Slice(table, past, past + seq) named in ``positions`` by Gather(table,
    position_ids) [batch, seq, ...] unsqueezed at the given axes (so it broadcasts as before)."""
    out, inits = [], []
    for node in nodes:
        axes = positions.get(node.output[0]) if node.op_type == "Slice" else None
        if axes is None:
            out.append(node)
            continue
        y = node.output[0]
        gathered = f"{y}/mcpc_positions" if axes else y
        out.append(
            helper.make_node(
                "Gather", [node.input[0], positions_input], [gathered], name=f"{node.name}/positions"
            )
        )
        if axes:
            axes_name = f"{y}/mcpc_axes"
            inits.append(numpy_helper.from_array(np.array(axes, np.int64), axes_name))
            out.append(
                helper.make_node("Unsqueeze", [gathered, axes_name], [y], name=f"{node.name}/unsqueeze")
            )
    return out, inits


def _live(nodes: list[onnx.NodeProto], output: str) -> list[onnx.NodeProto]:
    """The nodes the output or a KV store needs, in order."""
    need = {output}
    keep = []
    for node in reversed(nodes):
        if node.domain == DOMAIN and node.op_type == "KVStore" or any(o in need for o in node.output):
            keep.append(node)
            need.update(x for x in node.input if x)
    return keep[::-1]
