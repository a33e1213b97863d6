"""Shapes at ONNX import: binding the graph inputs' symbolic dims, and ONNX's own shape inference.

``bind_input_shapes`` turns ``--shape``/``--dim`` bindings into a static shape per real graph input
(InputError naming the input, dim position and dim param, and how to bind it, when one stays
symbolic).  ``_onnx_shapes`` runs ONNX's shape inference on the bound model, which the importer
uses only to cross-check its own inference.  ``mcpc.ir.onnx_import`` re-exports these names.
"""

from __future__ import annotations

import math

import onnx

from mcpc.errors import InputError, UnsupportedError

_SHAPE_DATA_MAX_ELEMENTS = 4096  # initializers this small are kept for ONNX's data propagation


def _graph_inputs(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    """Graph inputs that are real inputs (initializers listed as inputs are constants)."""
    inits = {t.name for t in graph.initializer}
    return [i for i in graph.input if i.name not in inits]


def bind_input_shapes(
    graph: onnx.GraphProto, label: str, shapes: dict[str, tuple[int, ...]], dims: dict[str, int]
) -> dict[str, tuple[int, ...]]:
    """Static shape of every real graph input after binding, or InputError naming what is unbound.

    A whole-input binding also teaches the dim params it covers (``shapes={"ids": (1, 128)}`` on
    ``ids: [batch, seq]`` binds ``seq=128`` for every other input); conflicting bindings are errors.
    """
    inputs = _graph_inputs(graph)
    names = [i.name for i in inputs]
    for name in shapes:
        if name not in names:
            raise InputError(f"{label}: --shape given for '{name}', which is not an input (inputs: {names})")
    learned = {k: int(v) for k, v in dims.items()}
    for inp in inputs:
        if inp.name not in shapes:
            continue
        want = tuple(int(d) for d in shapes[inp.name])
        tt = inp.type.tensor_type
        if tt.HasField("shape"):
            if len(tt.shape.dim) != len(want):
                raise InputError(
                    f"{label}: --shape {inp.name}={'x'.join(map(str, want))} has rank {len(want)}, "
                    f"but the input has rank {len(tt.shape.dim)}"
                )
            for pos, (d, w) in enumerate(zip(tt.shape.dim, want, strict=True)):
                if d.HasField("dim_value") and d.dim_value != w:
                    raise InputError(
                        f"{label}: --shape {inp.name}: dim {pos} is fixed to {d.dim_value} by the model, "
                        f"not {w}"
                    )
                if d.HasField("dim_param") and d.dim_param:
                    if learned.setdefault(d.dim_param, w) != w:
                        raise InputError(
                            f"{label}: dim '{d.dim_param}' is bound to both {learned[d.dim_param]} and {w} "
                            f"(input '{inp.name}', dim {pos})"
                        )
    bound: dict[str, tuple[int, ...]] = {}
    for inp in inputs:
        if inp.name in shapes:
            bound[inp.name] = tuple(int(d) for d in shapes[inp.name])
            continue
        if not inp.type.HasField("tensor_type"):
            raise UnsupportedError(
                f"{label}: input '{inp.name}' is not a tensor (sequences/maps are unsupported)"
            )
        tt = inp.type.tensor_type
        if not tt.HasField("shape"):
            raise InputError(
                f"{label}: input '{inp.name}' has an unknown rank; bind it with "
                f"--shape {inp.name}=1x128 (e.g.)"
            )
        shape = []
        for pos, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value"):
                shape.append(d.dim_value)
            elif d.dim_param and d.dim_param in learned:
                shape.append(learned[d.dim_param])
            else:
                param = f"'{d.dim_param}'" if d.dim_param else "(unnamed)"
                pattern = "x".join(_dim_hint(d, i == pos, learned) for i, d in enumerate(tt.shape.dim))
                how = f"--dim {d.dim_param}=N or " if d.dim_param else ""
                raise InputError(
                    f"{label}: input '{inp.name}' dim {pos} is symbolic {param}; bind it with "
                    f"{how}--shape {inp.name}={pattern}"
                )
        bound[inp.name] = tuple(shape)
    for pos_name, value in learned.items():
        if value < 0:
            raise InputError(f"{label}: dim '{pos_name}' bound to a negative size {value}")
    return bound


def _dim_hint(d, is_this: bool, learned: dict[str, int]) -> str:
    """How one dim reads in the suggested ``--shape`` value: its size when known, N for the one
    being reported, its param name (or ?) for other unknowns."""
    if is_this:
        return "N"
    if d.HasField("dim_value"):
        return str(d.dim_value)
    return str(learned.get(d.dim_param, d.dim_param or "?"))


def _onnx_shapes(
    proto: onnx.ModelProto, bound: dict[str, tuple[int, ...]], label: str = "model"
) -> dict[str, list[int | None]]:
    """ONNX's own shape inference on the bound model: name -> dims (None where unknown).

    Used as a cross-check of our inference; failures of ONNX inference are not fatal, except a
    type error ONNX's strict inference finds (an input of a type the op does not accept, an output
    declared with another element type than the graph computes): that model is not valid ONNX,
    and is refused as bad input naming the node (``_refuse_type_errors``).
    """
    # A light copy: small initializers (shape data for data_prop) are kept, large ones become typed
    # inputs, so weights are never copied (and multi-GB models stay under protobuf's 2 GB limit).
    # Exporter value_info is dropped: it may hold stale symbolic dims.
    m = onnx.ModelProto()
    m.ir_version = proto.ir_version
    m.opset_import.extend(proto.opset_import)
    g = proto.graph
    m.graph.node.extend(g.node)
    m.graph.input.extend(g.input)
    m.graph.output.extend(g.output)
    listed = {i.name for i in g.input}
    for init in g.initializer:
        if math.prod(init.dims) <= _SHAPE_DATA_MAX_ELEMENTS:
            m.graph.initializer.append(init)
        elif init.name not in listed:
            m.graph.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, init.dims))
    for inp in m.graph.input:
        if inp.name in bound and inp.type.HasField("tensor_type"):
            shape = inp.type.tensor_type.shape
            del shape.dim[:]
            for d in bound[inp.name]:
                shape.dim.add().dim_value = d
    for out in m.graph.output:
        if out.type.HasField("tensor_type"):
            out.type.tensor_type.ClearField("shape")
    try:
        m = onnx.shape_inference.infer_shapes(m, strict_mode=True, data_prop=True)
    except onnx.shape_inference.InferenceError as e:
        _refuse_type_errors(str(e), label)
        try:
            m = onnx.shape_inference.infer_shapes(m, strict_mode=False, data_prop=True)
        except Exception:
            return {}
    except Exception:
        return {}
    found: dict[str, list[int | None]] = {}
    for vi in list(m.graph.value_info) + list(m.graph.output):
        tt = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and tt.HasField("shape"):
            found[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    return found


# Strict inference failures that mean the model itself is inconsistent (not that inference is
# incomplete, e.g. an op ONNX cannot infer): refused as bad input.
_TYPE_ERROR_MARKS = ("[TypeInferenceError]", "type mismatch", "elem type", "Type Error")


def _refuse_type_errors(message: str, label: str) -> None:
    first = message.strip().splitlines()[0] if message.strip() else message
    if any(mark in message for mark in _TYPE_ERROR_MARKS):
        raise InputError(f"{label}: not a valid ONNX model: {first}")
