"""The quantized model back as ONNX (``mcpc export-onnx``): the independent cross-check of our
quantization, run by ONNX Runtime.

The model is the source ONNX graph (converted to opset 21 when older) with each weight that
``quantize-weights`` quantized replaced by the very codes, scales and zero points of the IR:

* a quantized weight initializer ``W`` becomes ``W_q`` (INT4/UINT4, INT8/UINT8 — INT6 in its 8-bit
  container — or FLOAT8E4M3FN), ``W_scale`` and ``W_zp`` feeding ``DequantizeLinear`` (blocked
  along the contracted axis with ``block_size`` = the group size; per-axis along the output axis
  when one group spans the whole contracted axis), whose output replaces every use of ``W`` (so a
  tied embedding's Gather and the LM head's Transpose read the same quantized table);
* scales are written as f32 (an f16 scale is exactly an f32), so ``DequantizeLinear`` yields the
  f32 weight the IR's dequantize computes before the fp16 conversion;
* activation quantization is ``QuantizeLinear`` -> ``DequantizeLinear`` on the matmul's input,
  AWQ's input scale a ``Div`` after it — the order of the IR.

The export is of the quantization, in f32: it matches the IR after ``quantize-weights`` (not the
fp16 build) to float rounding.  A quantized weight that is not an initializer of the model (a
weight computed by the graph, e.g. cast from fp16) is refused naming the layer.
"""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from mcpc.errors import UnsupportedError

OPSET = 21
_ONNX_CODE = {
    "int4": TensorProto.INT4,
    "uint4": TensorProto.UINT4,
    "int8": TensorProto.INT8,
    "uint8": TensorProto.UINT8,
    "float8_e4m3fn": TensorProto.FLOAT8E4M3FN,
}


def _tensor(name: str, a: np.ndarray) -> TensorProto:
    """An initializer of any IR dtype (ml_dtypes int4/uint4/float8 included) for ``a``."""
    kind = np.dtype(a.dtype).name
    if kind in ("int4", "uint4", "float8_e4m3fn"):
        if kind == "float8_e4m3fn":
            return helper.make_tensor(name, _ONNX_CODE[kind], a.shape, a.view(np.uint8).tobytes(), raw=True)
        flat = a.astype(np.int8 if kind == "int4" else np.uint8).ravel().astype(np.int64)
        return helper.make_tensor(name, _ONNX_CODE[kind], a.shape, flat.tolist())
    return numpy_helper.from_array(np.ascontiguousarray(a), name)


def _key(a: np.ndarray) -> tuple:
    a = np.ascontiguousarray(a, np.float32)
    return (a.shape, hashlib.blake2b(a.tobytes(), digest_size=16).digest())


def _node_index(graph) -> dict[str, int]:
    """Node positions by the name the importer gives them (``loc``): their name, else ``OpType_index``."""
    return {n.name or f"{n.op_type}_{i}": i for i, n in enumerate(graph.node)}


def export_quantized(model: onnx.ModelProto, arrays: dict) -> onnx.ModelProto:
    """``model`` with the quantization in ``arrays`` (``ctx.notes["quantized_arrays"]["main"]`` of
    ``quantize-weights``) applied as ONNX opset-21 QDQ; raises UnsupportedError naming a layer
    that cannot be expressed."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), OPSET)
    if opset < OPSET:
        from onnx import version_converter

        model = version_converter.convert_version(model, OPSET)
    else:
        model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    floats = {}
    for init in graph.initializer:
        if init.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE):
            a = numpy_helper.to_array(init)
            if a.ndim == 2:
                floats.setdefault(_key(a), init.name)
    front: list[onnx.NodeProto] = []
    rename: dict[str, str] = {}
    dropped: set[str] = set()
    for d in arrays["weights"]:
        layer, q, wf = d["layer"], d["result"], np.asarray(d["float"], np.float32)
        name, transposed = floats.get(_key(wf)), False
        if name is None:
            name, transposed = floats.get(_key(wf.T)), True
        if name is None:
            raise UnsupportedError(
                f"export-onnx: the weight of layer '{layer.name}' is not an initializer of the model "
                "(computed by the graph), so its quantization cannot be written back"
            )
        if name in dropped:
            continue
        front.extend(_dequantize_nodes(name, layer, q, transposed, graph.initializer))
        rename[name] = f"{name}_dq"
        dropped.add(name)
    index = _node_index(graph)
    before: dict[int, list[onnx.NodeProto]] = {}

    def node_of(loc: str) -> onnx.NodeProto:
        if loc not in index:
            raise UnsupportedError(f"export-onnx: no node '{loc}' in the model for a quantized matmul")
        return graph.node[index[loc]]

    for loc, (scale, zp) in arrays["activations"].items():
        node = node_of(loc)
        x = node.input[0]
        graph.initializer.extend(
            [_tensor(f"{loc}_a_scale", np.asarray(scale, np.float32)), _tensor(f"{loc}_a_zp", zp)]
        )
        before.setdefault(index[loc], []).extend(
            [
                helper.make_node("QuantizeLinear", [x, f"{loc}_a_scale", f"{loc}_a_zp"], [f"{loc}_a_q"]),
                helper.make_node(
                    "DequantizeLinear", [f"{loc}_a_q", f"{loc}_a_scale", f"{loc}_a_zp"], [f"{loc}_a_dq"]
                ),
            ]
        )
        node.input[0] = f"{loc}_a_dq"
    for d in arrays["weights"]:
        q, layer = d["result"], d["layer"]
        if q.in_scale is None:
            continue
        for m in layer.matmuls:
            node = node_of(m.loc)
            x = node.input[0]
            graph.initializer.append(_tensor(f"{m.loc}_awq_s", q.in_scale.astype(np.float32)))
            before.setdefault(index[m.loc], []).append(
                helper.make_node("Div", [x, f"{m.loc}_awq_s"], [f"{m.loc}_awq_x"])
            )
            node.input[0] = f"{m.loc}_awq_x"
    kept = [i for i in graph.initializer if i.name not in dropped]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    new_nodes = list(front)
    for i, n in enumerate(graph.node):
        for j, inp in enumerate(n.input):
            if inp in rename:
                n.input[j] = rename[inp]
        new_nodes.extend(before.get(i, []))
        new_nodes.append(n)
    for out in graph.output:
        if out.name in rename:
            raise UnsupportedError(f"export-onnx: quantized weight '{out.name}' is also a graph output")
    del graph.node[:]
    graph.node.extend(new_nodes)
    onnx.checker.check_model(model)
    return model


def _dequantize_nodes(name, layer, q, transposed: bool, initializers) -> list[onnx.NodeProto]:
    """Initializers for ``name``'s codes / scale / zero point and the DequantizeLinear (plus a
    Transpose when the model holds the weight the other way round) producing ``name_dq``."""
    t = (lambda a: np.ascontiguousarray(a.T)) if layer.trans_b else (lambda a: a)
    codes, scale, zp = t(q.codes), t(np.asarray(q.scales, np.float32)), t(q.zero_points)
    k = q.codes.shape[0]
    if q.block >= k:  # one group: per output channel (ONNX per-axis, 1-D scale)
        axis = 0 if layer.trans_b else 1
        scale, zp = scale.reshape(-1), zp.reshape(-1)
        attrs = {"axis": axis}
    else:
        attrs = {"axis": layer.k_axis, "block_size": int(q.block)}
    initializers.extend(
        [_tensor(f"{name}_q", codes), _tensor(f"{name}_scale", scale), _tensor(f"{name}_zp", zp)]
    )
    out = f"{name}_dq_t" if transposed else f"{name}_dq"
    nodes = [
        helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_scale", f"{name}_zp"], [out], **attrs)
    ]
    if transposed:
        nodes.append(helper.make_node("Transpose", [out], [f"{name}_dq"], perm=[1, 0]))
    return nodes
