"""``mcpc inspect-model``: what an ONNX model asks of mcpc, before any compile.

``describe_model(path)`` reads the model (weights stay on disk: external data is not loaded) and
returns a JSON-ready dict: inputs and outputs with dtypes and symbolic dims, the opset imports,
an op histogram split into what the importer supports and what it does not, the refused nodes
grouped by (domain, op type, opset, reason) with count and first node exactly as the importer's
error lists them (``mcpc.ir.onnx_support.unsupported_groups``), initializer bytes with a tensor
used by several nodes, or stored twice under one external-data location, counted once, and the
ready-to-paste ``--dim`` line.  ``format_model`` renders it as text.
"""

from __future__ import annotations

import math
import shlex
from collections import Counter
from pathlib import Path
from typing import Any

from mcpc.errors import InputError

_EXTERNAL = 1  # onnx.TensorProto.EXTERNAL
_PACKED_4BIT = (21, 22, 23)  # UINT4, INT4, FLOAT4E2M1: two per byte


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _dtype_name(elem_type: int) -> str:
    from onnx import TensorProto

    return (
        TensorProto.DataType.Name(elem_type) if elem_type in TensorProto.DataType.values() else str(elem_type)
    )


def _value(vi) -> dict[str, Any]:
    """One graph input or output: name, ONNX dtype, mcpc dtype (None: unsupported), dims."""
    from mcpc.errors import UnsupportedError
    from mcpc.ir.onnx_handlers import onnx_dtype

    if not vi.type.HasField("tensor_type"):
        return {"name": vi.name, "dtype": "not a tensor", "mcpc_dtype": None, "shape": None}
    tt = vi.type.tensor_type
    try:
        ours = onnx_dtype(tt.elem_type).name
    except UnsupportedError:
        ours = None
    shape = None
    if tt.HasField("shape"):
        shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]
    return {"name": vi.name, "dtype": _dtype_name(tt.elem_type), "mcpc_dtype": ours, "shape": shape}


def _tensor_bytes(t) -> int:
    from onnx import TensorProto, helper

    if t.data_type in (TensorProto.UNDEFINED, TensorProto.STRING):
        return 0
    n = math.prod(t.dims)
    if t.data_type in _PACKED_4BIT:
        return (n + 1) // 2
    try:
        size = helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except (KeyError, TypeError, ValueError):
        size = 0
    return n * size


def _load(path: Path):
    import onnx

    if not path.is_file():
        raise InputError(f"{path}: no such ONNX file")
    try:  # weights stay on disk: sizes come from the tensor headers
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # protobuf DecodeError, ...
        raise InputError(
            f"{path}: cannot read ONNX model (truncated or not ONNX?): {_first_line(e)}"
        ) from None
    if not proto.graph.node and not proto.graph.output:
        raise InputError(f"{path}: cannot read ONNX model: the file holds no graph (truncated or not ONNX?)")
    return proto


def describe_model(path: str | Path) -> dict[str, Any]:
    """Everything ``inspect-model`` reports about the ONNX model at ``path`` (see the module doc)."""
    import onnx

    from mcpc.ir.exporter_family import exporter_family
    from mcpc.ir.onnx_import import MAX_OPSET, MIN_OPSET
    from mcpc.ir.onnx_shapes import (
        _graph_inputs,
        binding_names,
        dim_expression,
        dim_line,
        expression_names,
        fix_numeric_dims,
        input_dims,
        may_be_empty,
    )
    from mcpc.ir.onnx_support import domain_opsets, import_hints, unsupported_groups

    path = Path(path)
    proto = _load(path)
    fix_numeric_dims(proto.graph)
    if proto.functions:
        proto = onnx.inliner.inline_local_functions(proto)
    graph = proto.graph
    opsets = [{"domain": o.domain or "ai.onnx", "version": o.version} for o in proto.opset_import]
    default = next((o["version"] for o in opsets if o["domain"] == "ai.onnx"), None)
    inputs = _graph_inputs(graph)
    dims = input_dims(graph)
    ranks = {
        i.name: len(i.type.tensor_type.shape.dim) for i in inputs if i.type.tensor_type.HasField("shape")
    }
    dim_info = {
        name: {
            "uses": [{"input": i, "axis": a} for i, a in where],
            "may_be_zero": all(may_be_empty(graph, i, a, ranks[i]) for i, a in where),
            "derived_from": expression_names(tree) if (tree := dim_expression(name)) is not None else None,
        }
        for name, where in dims.items()
    }

    counts: Counter = Counter((node.domain or "ai.onnx", node.op_type) for node in graph.node)
    groups = unsupported_groups(graph, domain_opsets(proto))
    unsupported: dict[tuple[str, str], list[str]] = {}
    for g in groups:
        unsupported.setdefault((g["domain"], g["op_type"]), []).extend(g["nodes"])
    ops = [
        {
            "domain": domain,
            "op_type": op_type,
            "count": n,
            "supported": (domain, op_type) not in unsupported,
            "unsupported_nodes": unsupported.get((domain, op_type), []),
        }
        for (domain, op_type), n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    ]

    readers: Counter = Counter(n for node in graph.node for n in set(node.input))
    seen_external: set[tuple] = set()
    total, stored = 0, 0
    for t in graph.initializer:
        nbytes = _tensor_bytes(t)
        total += nbytes
        if t.data_location == _EXTERNAL:
            ext = {e.key: e.value for e in t.external_data}
            where = (ext.get("location"), ext.get("offset", "0"), ext.get("length", str(nbytes)))
            if where in seen_external:
                continue
            seen_external.add(where)
        stored += nbytes
    info = {
        "model": str(path),
        "graph": graph.name,
        "producer": " ".join(p for p in (proto.producer_name, proto.producer_version) if p),
        "ir_version": proto.ir_version,
        "opsets": opsets,
        "opset": default,
        "opset_supported": default is not None and MIN_OPSET <= default <= MAX_OPSET,
        "supported_opsets": [MIN_OPSET, MAX_OPSET],
        "inputs": [_value(i) for i in inputs],
        "outputs": [_value(o) for o in graph.output],
        "dims": dim_info,
        "dim_line": dim_line(binding_names(dims)),
        "exporter": exporter_family(proto),
        "nodes": len(graph.node),
        "ops": ops,
        "unsupported_nodes": sum(len(v) for v in unsupported.values()),
        "unsupported": [{k: v for k, v in g.items() if k != "nodes"} for g in groups],
        "unsupported_hints": import_hints(groups),
        "initializers": {
            "count": len(graph.initializer),
            "bytes": stored,
            "bytes_listed": total,
            "shared": sum(1 for t in graph.initializer if readers[t.name] > 1),
        },
    }
    info["decoder"] = _decoder_line(proto, path)  # last: it drops the nodes renaming a past input
    return info


def _decoder_line(proto, path: Path) -> dict[str, Any]:
    """Whether the graph is a decoder with past a ``--max-seq`` build takes: ``{"line"}`` the
    compile command to use, or ``{"reason"}`` why not (``ir/decoder_graph.recognise``).  Edits
    ``proto`` in place (``alias_past_inputs``), as the build does."""
    import shlex

    from mcpc.errors import McpcError
    from mcpc.ir.decoder_graph import alias_past_inputs, recognise

    names = {i.name for i in proto.graph.input}
    if not any(n.startswith("past") for n in names):
        return {"reason": "no past K/V inputs"}
    from mcpc.ir.merged_decoder import select_cache_branch

    try:
        merged = select_cache_branch(proto)
        alias_past_inputs(proto)
        dec = recognise(proto)
    except McpcError as e:
        return {"reason": _first_line(e)}
    except Exception as e:  # noqa: BLE001 - a description never fails on the recogniser
        return {"reason": f"{type(e).__name__}: {_first_line(e)}"}
    batch = _batch_dim(proto, dec.ids)
    given = f"--dim {shlex.quote(f'{batch}=1')} " if batch else ""
    line = {"line": f"mcp-compile --max-seq N {given}{shlex.quote(str(path))}"}
    if batch:
        line["batch"] = batch
    if merged:
        line["note"] = (
            "a merged decoder: a --max-seq build takes its use_cache_branch=true branch (the one with "
            "past); a compile without --max-seq refuses its If"
        )
    return line


def _batch_dim(proto, ids: str) -> str | None:
    """The symbolic batch dim of the token-ids input (what ``--dim NAME=B`` of a build binds)."""
    for vi in proto.graph.input:
        if vi.name == ids:
            dims = vi.type.tensor_type.shape.dim
            return dims[0].dim_param or None if len(dims) else None
    return None


def _shape_text(shape) -> str:
    if shape is None:
        return "unknown rank"
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]" if shape else "scalar"


def format_model(info: dict[str, Any]) -> str:
    """``describe_model``'s result as the text ``mcpc inspect-model`` prints."""
    from mcpc.ir.onnx_support import group_text

    lines = [
        f"{info['model']}: graph '{info['graph']}'"
        + (f", made by {info['producer']}" if info["producer"] else "")
    ]
    lo, hi = info["supported_opsets"]
    ok = "supported" if info["opset_supported"] else f"NOT supported (mcpc reads {lo} to {hi})"
    others = ", ".join(f"{o['domain']} {o['version']}" for o in info["opsets"] if o["domain"] != "ai.onnx")
    lines.append(f"opset: ai.onnx {info['opset']} ({ok})" + (f"; also {others}" if others else ""))
    exp = info.get("exporter")
    if exp:
        lines.append(f"exporter: {exp['family']} ({exp['evidence']})")
    for kind in ("inputs", "outputs"):
        lines.append(f"{kind}:")
        for v in info[kind]:
            dtype = v["dtype"] + ("" if v["mcpc_dtype"] else " (unsupported dtype)")
            lines.append(f"  {v['name']}  {dtype}  {_shape_text(v['shape'])}")
    if info["dims"]:
        lines.append("symbolic dims:")
        for name, d in info["dims"].items():
            uses = ", ".join(f"{u['input']} dim {u['axis']}" for u in d["uses"])
            zero = "; may be 0 (only concatenated along it or its shape read)" if d["may_be_zero"] else ""
            derived = f"; derived from {', '.join(d['derived_from'])}" if d.get("derived_from") else ""
            lines.append(f"  {name}: {uses}{zero}{derived}")
        lines.append(f"bind them with: {info['dim_line']}")
    else:
        lines.append("symbolic dims: none (every input shape is fixed)")
    dec = info.get("decoder") or {}
    if dec.get("line"):
        lines.append(f"a decoder with past: build it for generation with: {dec['line']}")
        if dec.get("batch"):
            bind = shlex.quote(dec["batch"] + "=B")
            lines.append(f"  (--dim {bind}: B sequences a call, the same as --max-batch B)")
        if dec.get("note"):
            lines.append(f"  ({dec['note']})")
    elif dec.get("reason") and dec["reason"] != "no past K/V inputs":
        lines.append(f"not a --max-seq decoder: {dec['reason']}")
    n_unsup, ops = info["unsupported_nodes"], info["ops"]
    lines.append(
        f"ops: {info['nodes']} nodes, {len(info['ops'])} op types; "
        + (f"{n_unsup} node(s) unsupported" if n_unsup else "all supported")
    )
    names = [o["op_type"] if o["domain"] == "ai.onnx" else f"{o['domain']}.{o['op_type']}" for o in ops]
    width = max([28, *map(len, names)])
    for name, op in zip(names, ops, strict=True):
        mark = "ok" if op["supported"] else f"UNSUPPORTED ({len(op['unsupported_nodes'])})"
        lines.append(f"  {name:<{width}} {op['count']:>6}  {mark}")
        for g in info["unsupported"]:
            if (g["domain"], g["op_type"]) == (op["domain"], op["op_type"]):
                lines.append(f"      {group_text(g)}")
    lines += [f"  {hint}" for hint in info["unsupported_hints"]]
    init = info["initializers"]
    lines.append(
        f"initializers: {init['count']} tensors, {init['bytes']} bytes ({init['bytes'] / 2**20:.2f} MiB)"
        + (f", {init['shared']} read by several nodes (counted once)" if init["shared"] else "")
        + (
            f"; {init['bytes_listed'] - init['bytes']} more bytes listed twice in external data"
            if init["bytes_listed"] != init["bytes"]
            else ""
        )
    )
    return "\n".join(lines) + "\n"
