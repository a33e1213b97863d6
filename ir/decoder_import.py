"""A decoder build: one ONNX graph with past -> one module with entries ``prefill`` and ``decode``
over a paged KV cache (``docs/decoding.md``).

``import_decoder`` recognises and rewrites the graph (``ir/decoder_graph.py``), then imports the
rewritten graph once per entry with the token dims bound — ``prefill``: [B, C] with C the prefill
chunk, ``decode``: [B, 1] — and puts both functions in one module beside the state they share:

* ``global @kv_k_<i>``, ``@kv_v_<i>`` : ``[Hkv · (NB+1) · 64, D]`` per layer (the activation dtype;
  block NB is the trash block padding rows write to), written by ``mcp.kv_store`` and read by
  ``mcp.paged_attention``;
* ``host_reg @kv_blocks {min = 0, max = B·MB}``: the entries of ``kv_gather`` in use this call;
* ``host_reg @prefill_rows {min = 1, max = B·C}`` (when B·C > 1): the leading token rows a
  ``prefill`` call computes (its function's ``row_extent`` attribute, ``backend/row_extent.py``).

The handlers of the rewrite's ``mcpc.kv`` nodes live here and declare that state as they import.
The result's ``decoder`` dict is META["decoder"] of the program (``kv_dtype`` filled in once the
pipeline has chosen the storage dtype).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from mcpc.errors import InputError, UnsupportedError, UsageError
from mcpc.ir import ops
from mcpc.ir.core import GlobalDecl, HostRegDecl, Module
from mcpc.ir.decoder_graph import (
    DOMAIN,
    DecoderGraph,
    GraphIndex,
    alias_past_inputs,
    past_length_slices,
    recognise,
    rewrite,
)
from mcpc.ir.dtypes import F32
from mcpc.ir.onnx_handlers import DOMAIN_HANDLERS
from mcpc.ir.types import TensorType

BLOCK = 64
KV_BLOCKS_REG = "kv_blocks"
PREFILL_ROWS_REG = "prefill_rows"


@dataclass(frozen=True)
class DecoderBuild:
    """The sizes of a decoder build: ``max_seq`` tokens a sequence may reach, ``max_batch``
    sequences a call, ``kv_blocks`` cache blocks (default max_batch · ⌈max_seq / 64⌉) and the
    ``prefill_chunk`` rows a prefill call takes per sequence (default min(64, max_seq))."""

    max_seq: int
    max_batch: int = 1
    kv_blocks: int | None = None
    prefill_chunk: int | None = None

    def __post_init__(self):
        for key in ("max_seq", "max_batch", "kv_blocks", "prefill_chunk"):
            v = getattr(self, key)
            if v is not None and (not isinstance(v, int) or v < 1):
                raise UsageError(f"--{key.replace('_', '-')} must be a positive integer, got {v!r}")
        if self.prefill_chunk is not None and self.prefill_chunk > self.max_seq:
            raise UsageError(f"--prefill-chunk {self.prefill_chunk} exceeds --max-seq {self.max_seq}")
        if self.kv_blocks is not None and self.kv_blocks < self.blocks_per_seq:
            raise UsageError(
                f"--kv-blocks {self.kv_blocks} holds fewer than the {self.blocks_per_seq} blocks of 64 "
                f"tokens one sequence of --max-seq {self.max_seq} needs"
            )

    @property
    def blocks_per_seq(self) -> int:
        return -(-self.max_seq // BLOCK)

    @property
    def num_blocks(self) -> int:
        return self.kv_blocks if self.kv_blocks is not None else self.max_batch * self.blocks_per_seq

    @property
    def chunk(self) -> int:
        return self.prefill_chunk if self.prefill_chunk is not None else min(64, self.max_seq)

    @property
    def gather(self) -> int:
        """Entries of ``kv_gather``: every block of every sequence of a call."""
        return self.max_batch * self.blocks_per_seq


@dataclass
class DecoderModule:
    """``import_decoder``'s result: the module, the META descriptor, what was recognised, and the
    original graph (for the self-check; MatMulNBits at accuracy_level 0, ``_exact_reference``)."""

    module: Module
    decoder: dict[str, Any]
    graph: DecoderGraph
    original: onnx.ModelProto
    scales: list[float] = field(default_factory=list)
    checks: list[dict] = field(default_factory=list)  # the self-checks' measured errors


def import_decoder(
    model: str | Path | onnx.ModelProto, build: DecoderBuild, *, dram_bytes=None
) -> DecoderModule:
    """Recognise, rewrite and import ``model`` as a two-entry decoder module (see the module
    docstring).  UnsupportedError names what does not fit the pattern."""
    from mcpc.ir.onnx_import import _load, import_onnx

    proto, label, name = _load(model)
    if proto.functions:
        proto = onnx.inliner.inline_local_functions(proto)
    elif proto is model:  # the caller's proto: the rewrite below edits its copy
        proto = onnx.ModelProto()
        proto.CopyFrom(model)
    from mcpc.ir.merged_decoder import select_cache_branch

    merged = select_cache_branch(proto)  # a merged decoder (use_cache_branch, If): its with-past branch
    alias_past_inputs(proto)
    dec = recognise(proto)
    scales = attention_scales(proto, dec)
    slices = past_length_slices(proto, dec)
    positions = position_slices(proto, dec, slices) if slices else None
    rewritten = rewrite(proto, dec, scales, BLOCK, positions)
    _check_token_dims(proto, dec, build)
    _check_position_tables(rewritten, dec, build)
    # the handlers read the cache sizes from the nodes: one rewrite serves both entries
    for node in rewritten.graph.node:
        if node.domain == DOMAIN:
            node.attribute.append(onnx.helper.make_attribute("rows", (build.num_blocks + 1) * BLOCK))
            node.attribute.append(onnx.helper.make_attribute("max_blocks", build.gather))
    module = Module(name)
    for entry, seq in (("prefill", build.chunk), ("decode", 1)):
        b, rows = build.max_batch, build.max_batch * seq
        shapes = {dec.ids: (b, seq), "kv_slot": (rows,), "kv_gather": (build.gather,)}
        shapes.update({"kv_start": (rows,), "kv_len": (rows,)})
        if dec.positions:
            shapes[dec.positions] = (b, seq)
        part = import_onnx(rewritten, shapes, None, dram_bytes=dram_bytes)
        if part.attrs.get("import_notes"):
            module.attrs["import_notes"] = part.attrs["import_notes"]
        fn = part.main
        fn.name = entry
        module.add_function(fn)
        module.globals.update(part.globals)
        module.host_regs.update(part.host_regs)
        if entry == "prefill" and rows > 1:  # the token rows in use: backend/row_extent.py
            fn.attrs["row_extent"] = {"reg": PREFILL_ROWS_REG, "rows": rows}
            module.host_regs[PREFILL_ROWS_REG] = HostRegDecl(PREFILL_ROWS_REG, 1, rows)
    module.verify()
    decoder = _descriptor(module, dec, build)
    from mcpc.ir.exporter_family import convention_line, decoder_convention, exporter_family

    conv = decoder_convention(dec, merged) | {"exporter": exporter_family(proto)["family"]}
    decoder["convention"] = conv | {"line": convention_line(conv, conv["exporter"])}
    eos = eos_ids(model) if isinstance(model, (str, Path)) else None
    if eos is not None:
        decoder["eos_ids"], decoder["eos_source"] = eos
    return DecoderModule(module, decoder, dec, _exact_reference(proto), scales)


def batch_dim_names(model: str | Path | onnx.ModelProto) -> list[str]:
    """The names the exporter gave the batch dim of a decoder graph: the symbolic dim 0 of each
    [batch, length] integer input - the token ids, the attention mask, the positions (``batch`` for
    the TorchScript fixtures, ``batch_size`` for Optimum and GenAI, the dynamo exporter's ``s<N>``,
    the mask's own symbol included; never a float input's, whose layout is not known), in input
    order.  A
    ``--max-seq`` build takes ``--dim NAME=B`` for any of them as ``--max-batch B``.  Reads the
    graph's inputs only (no external data); [] for a file it cannot read (the build says why)."""
    if isinstance(model, onnx.ModelProto):
        graph = model.graph
    else:
        try:
            graph = onnx.load(str(model), load_external_data=False).graph
        except Exception:  # noqa: BLE001 - the build's own load reports an unreadable file
            return []
    init = {t.name for t in graph.initializer}
    names: list[str] = []
    for vi in graph.input:
        t = vi.type.tensor_type
        ints = t.elem_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32)
        dims = t.shape.dim if vi.name not in init and ints else []
        if len(dims) == 2 and dims[0].dim_param and dims[0].dim_param not in names:
            names.append(dims[0].dim_param)
    return names


def eos_ids(model: str | Path) -> tuple[list[int], str] | None:
    """The end-of-sequence ids of the model at path ``model`` and the file beside it that gives them,
    the way the model's own generation loop finds them:

    * ONNX Runtime GenAI's ``genai_config.json`` (``model.eos_token_id``);
    * else Hugging Face's ``generation_config.json`` (``eos_token_id``; Optimum writes it beside
      model.onnx) - when it is there transformers' ``generate`` reads only it, so a file without
      the key means no end-of-sequence id;
    * else ``config.json`` (``eos_token_id``, or that of its ``text_config`` / ``decoder`` /
      ``generator`` part): transformers' ``GenerationConfig.from_model_config``, used by
      ``from_pretrained`` when there is no generation_config.json.

    Each value is an int or a list of ints (null: none).  None when no file gives ids.
    InputError for a file that is there but unreadable or whose ids are not token ids."""
    import json

    folder = Path(model).parent
    for fname in ("genai_config.json", "generation_config.json", "config.json"):
        f = folder / fname
        if not f.is_file():
            continue
        try:
            cfg = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InputError(f"{f}: cannot read the end-of-sequence ids: {exc}") from None
        if not isinstance(cfg, dict):
            raise InputError(f"{f}: not a JSON object, cannot read the end-of-sequence ids")
        key, value = _eos_field(cfg, fname)
        if value is None:
            if fname == "config.json":
                return None
            if fname == "generation_config.json" or key is not None:
                return None  # the file the loop reads has no end-of-sequence id
            continue
        ids = value if isinstance(value, list) else [value]
        if not ids or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
            raise InputError(f"{f}: {key} is {value!r}, not a token id or a list of them")
        return list(dict.fromkeys(int(i) for i in ids)), f.name
    return None


def _eos_field(cfg: dict, fname: str) -> tuple[str | None, Any]:
    """(the key path read, its value) of ``eos_token_id`` in one config file (see ``eos_ids``)."""
    if fname == "genai_config.json":
        model = cfg.get("model")
        return ("model.eos_token_id", model.get("eos_token_id")) if isinstance(model, dict) else (None, None)
    if fname == "generation_config.json" or cfg.get("eos_token_id") is not None:
        return "eos_token_id", cfg.get("eos_token_id")
    for part in ("text_config", "decoder", "generator"):
        sub = cfg.get(part)
        if isinstance(sub, dict) and sub.get("eos_token_id") is not None:
            return f"{part}.eos_token_id", sub["eos_token_id"]
    return "eos_token_id", None


def _exact_reference(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` as the self-check's ONNX Runtime reference: MatMulNBits at accuracy_level 0, no
    value_info.

    At level 4 ONNX Runtime's CPU kernel rounds activations to int8 per block, which the import
    does not model (it multiplies exactly, and says so in an import note); the self-check holds
    the rewrite to the graph's exact arithmetic, so the reference multiplies exactly too."""
    nodes = [n for n in proto.graph.node if n.op_type == "MatMulNBits" and n.domain == "com.microsoft"]
    if not any(a.name == "accuracy_level" and a.i for n in nodes for a in n.attribute) and not len(
        proto.graph.value_info
    ):
        return proto
    exact = onnx.ModelProto()
    exact.CopyFrom(proto)
    # exporter value_info may hold stale symbolic dims (the GenAI builder's fp16 graph names its
    # repeated K/V 'sequence_length', which makes ONNX Runtime fail a decode step): dropped
    del exact.graph.value_info[:]
    for n in exact.graph.node:
        if n.op_type == "MatMulNBits" and n.domain == "com.microsoft":
            for a in n.attribute:
                if a.name == "accuracy_level":
                    a.i = 0
    return exact


def _check_position_tables(model: onnx.ModelProto, dec: DecoderGraph, build: DecoderBuild) -> None:
    """UsageError when a table gathered at the positions (learned positions, RoPE tables) has fewer
    rows than --max-seq: a position past it would index outside the table at run time."""
    if not dec.positions:
        return
    g = GraphIndex(model)
    for node in g.consumers.get(dec.positions, []):
        table = g.constant(node.input[0]) if node.op_type == "Gather" else None
        if table is not None and node.input[1] == dec.positions and table.shape[0] < build.max_seq:
            raise UsageError(
                f"{g.name(node)} gathers '{node.input[0]}' ({table.shape[0]} positions) at "
                f"'{dec.positions}': --max-seq {build.max_seq} exceeds the model's positions"
            )


def _check_token_dims(proto, dec: DecoderGraph, build: DecoderBuild) -> None:
    for vi in proto.graph.input:
        if vi.name not in (dec.ids, dec.positions):
            continue
        dims = vi.type.tensor_type.shape.dim
        if len(dims) != 2:
            raise UnsupportedError(f"input '{vi.name}' has rank {len(dims)}, expected [batch, seq]")
        for d, want, what in zip(dims, (build.max_batch, None), ("batch", "seq"), strict=True):
            if d.HasField("dim_value") and want is not None and d.dim_value != want:
                raise UsageError(
                    f"input '{vi.name}' has a fixed {what} of {d.dim_value}, but the build asks for "
                    f"--max-batch {want}"
                )
            if d.HasField("dim_value") and want is None:
                raise UnsupportedError(
                    f"input '{vi.name}' has a fixed sequence dim {d.dim_value}: a decoder build binds it "
                    "(prefill chunk, 1 for decode); export it with a symbolic sequence dim"
                )


def position_slices(proto: onnx.ModelProto, dec: DecoderGraph, slices) -> dict[str, list[int]]:
    """For each Slice of a constant table by the past length (``past_length_slices``): verify on two
    ONNX Runtime probes that it takes rows ``past .. past + seq`` of axis 0 (else UnsupportedError
    naming it), and return the axes at which the replacing Gather [batch, seq, ...] is unsqueezed
    so that it broadcasts against its consumers as the slice did."""
    from mcpc.decoder_check import run_original

    g = GraphIndex(proto)
    names = [n for node in slices for n in node.input[1:3]]
    probes = {
        (p, s): run_original(proto, dec, batch=1, past=p, seq=s, extra=names) for p, s in ((3, 2), (6, 1))
    }
    ranks = _ranks(proto)
    out: dict[str, list[int]] = {}
    for node in slices:
        what = f"node '{node.name or node.op_type}' (Slice of '{node.input[0]}' by the past length)"
        axes = g.constant(node.input[3]) if len(node.input) > 3 and node.input[3] else np.array([0])
        steps = g.constant(node.input[4]) if len(node.input) > 4 and node.input[4] else np.array([1])
        if (
            axes is None
            or steps is None
            or axes.reshape(-1).tolist() != [0]
            or steps.reshape(-1).tolist() != [1]
        ):
            raise UnsupportedError(f"{what}: only a slice of axis 0 with step 1 is read as positions")
        for (p, s), vals in probes.items():
            got = [vals[x].reshape(-1).tolist() for x in node.input[1:3]]
            if got != [[p], [p + s]]:
                raise UnsupportedError(
                    f"{what}: takes rows {got[0]}..{got[1]} for a past of {p} and {s} new tokens, not the "
                    f"positions {p}..{p + s}: the paged build cannot give it a past length"
                )
        table = g.constant(node.input[0]).ndim
        want = set()
        for user in g.consumers.get(node.output[0], []):
            others = [x for x in user.input if x != node.output[0]]
            if user.op_type not in ("Mul", "Add", "Sub", "Div") or len(others) != 1 or others[0] not in ranks:
                raise UnsupportedError(
                    f"{what}: its rows are read by node '{user.name or user.op_type}' ({user.op_type}), not "
                    "by an elementwise op with a batched operand: per-sequence positions cannot replace it"
                )
            want.add(ranks[others[0]])
        if len(want) != 1 or min(want) <= table:
            raise UnsupportedError(f"{what}: its users' operands of rank {sorted(want)} carry no batch axis")
        out[node.output[0]] = list(range(1, want.pop() - table))
    return out


def _ranks(proto: onnx.ModelProto) -> dict[str, int]:
    from mcpc.ir.onnx_large import light_model

    try:  # without the weights: a model over 2 GB cannot be serialised for inference
        inferred = onnx.shape_inference.infer_shapes(light_model(proto), strict_mode=False)
    except Exception:  # noqa: BLE001 - no ranks: the caller refuses what it cannot place
        return {}
    vis = [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]
    return {
        vi.name: len(vi.type.tensor_type.shape.dim) for vi in vis if vi.type.tensor_type.HasField("shape")
    }


def attention_scales(proto: onnx.ModelProto, dec: DecoderGraph) -> list[float]:
    """Each layer's attention scale: the product of its constant factors (a Div divides), f32.

    Factors computed from shapes (``1/sqrt(head_dim)`` from a Shape) are evaluated by ONNX Runtime
    on a one-token probe; a factor that is not one value is refused, naming the tensor."""
    g = GraphIndex(proto)
    values: dict[str, np.ndarray] = {}
    pending = []
    for layer in dec.layers:
        for tensor, _ in layer.factors:
            c = g.constant(tensor)
            if c is not None:
                values[tensor] = c
            else:
                pending.append(tensor)
    if pending:
        from mcpc.decoder_check import run_original

        values.update(run_original(proto, dec, batch=1, past=1, seq=1, extra=pending))
    scales = []
    for layer in dec.layers:
        if layer.scale is not None:  # an attribute gives it (GroupQueryAttention)
            scales.append(float(np.float32(layer.scale)))
            continue
        s = np.float64(1.0)
        for tensor, divides in layer.factors:
            v = np.asarray(values[tensor])
            if v.size != 1 or not np.isfinite(v).all() or float(v.reshape(())) == 0:
                raise UnsupportedError(
                    f"layer {layer.index}: the attention scale factor '{tensor}' is not one finite non-zero "
                    f"value (shape {list(v.shape)})"
                )
            x = float(v.reshape(()))
            s = s / x if divides else s * x
        scales.append(float(np.float32(s)))
    return scales


def _descriptor(module: Module, dec: DecoderGraph, build: DecoderBuild) -> dict[str, Any]:
    decode = module.functions["decode"]
    attn = [op for op in decode.ops if isinstance(op, ops.PagedAttentionOp)]
    q = attn[0].operands[0].type.shape
    logits = decode.outputs[decode.result_names.index(dec.logits)].type
    return {
        "max_seq": build.max_seq,
        "max_batch": build.max_batch,
        "block": BLOCK,
        "kv_blocks": build.num_blocks,
        "prefill_chunk": build.chunk,
        "layers": len(dec.layers),
        "kv_heads": dec.layers[0].kv_heads,
        "q_heads": int(q[1]),
        "head_dim": dec.layers[0].head_dim,
        "kv_dtype": module.globals["kv_k_0"].type.dtype.name,
        "vocab": int(logits.shape[-1]),
        "logits": dec.logits,
        "inputs": {"ids": dec.ids, "positions": dec.positions},
        "kv_quant": None,
        "prefill_rows": PREFILL_ROWS_REG if PREFILL_ROWS_REG in module.host_regs else None,
    }


HEAT_GLOBAL = "kv_heat"


def enable_attention_heat(module: Module) -> dict[str, Any]:
    """Make every ``mcp.paged_attention`` of a decoder module write its attention heat into one f32
    global ``@kv_heat`` [layers · P, Hq] (P = the gathered positions at capacity, B·MB·64): layer
    i's rows are [i·P, (i+1)·P), row i·P + j the heat of gathered position j per query head
    (ir/ops_kv.py).  For the KV policies and the dynamic window that read the model's attention
    (docs/decoding.md); returns META ``decoder.heat``: ``{"global", "positions"}``."""
    attn = [op for fn in module.functions.values() for op in fn.ops if isinstance(op, ops.PagedAttentionOp)]
    if not attn:
        raise UnsupportedError("attention heat: the module has no mcp.paged_attention")
    caps = {op.operands[1].type.shape[0] * int(op.attrs["block_size"]) for op in attn}
    hqs = {op.operands[0].type.shape[1] for op in attn}
    if len(caps) != 1 or len(hqs) != 1:
        raise UnsupportedError(
            f"attention heat: the layers gather {sorted(caps)} positions of {sorted(hqs)} query heads"
        )
    (cap,), (hq,) = caps, hqs
    layers = []
    for op in attn:
        name = op.attrs["k_global"]
        if not name.startswith("kv_k_") or not name[5:].isdigit():
            raise UnsupportedError(f"attention heat: {op.describe()} reads @{name}, not a layer's kv_k_<i>")
        layers.append(int(name[5:]))
    n = max(layers) + 1
    module.globals[HEAT_GLOBAL] = GlobalDecl(HEAT_GLOBAL, TensorType((n * cap, hq), F32))
    for op, layer in zip(attn, layers, strict=True):
        op.attrs["heat_global"], op.attrs["heat_row"] = HEAT_GLOBAL, layer * cap
    return {"global": HEAT_GLOBAL, "positions": cap}


def kv_global(layer: int, kind: str) -> str:
    """The name of layer ``layer``'s K (``kind`` "k") or V ("v") cache global."""
    return f"kv_{kind}_{layer}"


# -- the importer's handlers of the rewrite's nodes ------------------------------------------------------
def _declare(ctx, name: str, t: TensorType) -> None:
    have = ctx.module.globals.get(name)
    if have is not None and have.type != t:
        raise InputError(f"{ctx.where()}: cache global @{name} is {have.type} elsewhere, {t} here")
    ctx.module.globals[name] = GlobalDecl(name, t)


def _kv_store(ctx, ins):
    new, slot = ins
    new = ctx.value(new)
    b, h, s, d = new.type.shape
    name = kv_global(int(ctx.attr("layer")), ctx.attr("kind"))
    _declare(ctx, name, TensorType((h * int(ctx.attr("rows")), d), new.type.dtype))
    ctx.emit(ops.KVStoreOp, [new, slot], {"global": name}, fold=False)
    return []


def _paged_attention(ctx, ins):
    q, gather, start, length = ins
    q = ctx.value(q)
    layer, kv = int(ctx.attr("layer")), int(ctx.attr("kv_heads"))
    reg = HostRegDecl(KV_BLOCKS_REG, 0, int(ctx.attr("max_blocks")))
    ctx.module.host_regs[KV_BLOCKS_REG] = reg
    n = ctx.emit(ops.HostRegOp, [], {"name": KV_BLOCKS_REG}, fold=False)
    attrs = {
        "k_global": kv_global(layer, "k"), "v_global": kv_global(layer, "v"), "kv_heads": kv,
        "scale": float(ctx.attr("scale")), "block_size": int(ctx.attr("block_size")),
    }  # fmt: skip
    if q.type.rank != 4 or q.type.shape[1] % kv:
        raise UnsupportedError(
            f"{ctx.where()}: Q of layer {layer} is {q.type}, not [batch, q_heads, seq, head_dim] with the "
            f"query heads a multiple of the {kv} KV heads"
        )
    return [ctx.emit(ops.PagedAttentionOp, [q, gather, start, length, n], attrs, fold=False)]


DOMAIN_HANDLERS[DOMAIN, "KVStore"] = _kv_store
DOMAIN_HANDLERS[DOMAIN, "PagedAttention"] = _paged_attention
