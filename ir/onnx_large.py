"""Models over 2 GB: protobuf cannot serialise a ModelProto past 2 GB, so nothing on the import or
decoder paths may call ``SerializeToString``, ``onnx.checker.check_model`` or
``onnx.shape_inference.infer_shapes`` on a whole model held in memory.

* ``light_model(proto)``: the graph without its initializers' data (each initializer becomes a
  graph input of its type and shape) - for type/rank inference, which needs no weights;
* ``ort_session(proto, opts)``: an ONNX Runtime session of an in-memory model, from its bytes when
  they fit, else from a copy written with external data to a temporary folder (removed once the
  session has read it).
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import onnx

# protobuf's hard limit is 2 GiB; a margin for the framing of the message
PROTO_LIMIT = 2**31 - 2**24


def too_large(proto: onnx.ModelProto) -> bool:
    """Whether ``proto`` is past what protobuf serialises (its ``ByteSize`` itself raises there)."""
    from google.protobuf.message import EncodeError

    try:
        return proto.ByteSize() >= PROTO_LIMIT
    except EncodeError:
        return True


def light_model(
    proto: onnx.ModelProto, keep_elements: int | None = None, value_info: bool = True
) -> onnx.ModelProto:
    """A copy of ``proto``'s graph (nodes, inputs, outputs, opsets, functions, and value_info unless
    ``value_info`` is false) in which each initializer is a graph input of its dtype and dims
    instead of data — but those of at most ``keep_elements`` elements, kept as they are (shape data
    for ONNX's data propagation).  Its size is the nodes' and the kept tensors' (Constant nodes
    keep their values); for inference of types and ranks, not values."""
    m = onnx.ModelProto()
    m.ir_version = proto.ir_version
    m.opset_import.extend(proto.opset_import)
    m.functions.extend(proto.functions)
    g, src = m.graph, proto.graph
    g.name = src.name
    g.node.extend(src.node)
    g.input.extend(src.input)
    g.output.extend(src.output)
    if value_info:
        g.value_info.extend(src.value_info)
    listed = {i.name for i in src.input}
    for init in src.initializer:
        if keep_elements is not None and math.prod(init.dims) <= keep_elements:
            g.initializer.append(init)
        elif init.name not in listed:
            g.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    return m


def ort_session(model: onnx.ModelProto, opts, providers=("CPUExecutionProvider",)):
    """``onnxruntime.InferenceSession`` of ``model``: from its serialised bytes under protobuf's
    2 GB limit, else saved with its tensors as external data in a temporary folder and opened by
    path (``model`` is copied first: saving with external data edits the proto it is given)."""
    import onnxruntime as ort

    if not too_large(model):
        return ort.InferenceSession(model.SerializeToString(), opts, providers=list(providers))
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    with tempfile.TemporaryDirectory(prefix="mcpc-ort-") as tmp:
        path = Path(tmp) / "model.onnx"
        onnx.save_model(copy, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location="model.onnx.data", size_threshold=1024)  # fmt: skip
        del copy
        return ort.InferenceSession(str(path), opts, providers=list(providers))
