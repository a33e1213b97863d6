"""ONNX Runtime's 4-bit weight quantizer as a reference: run ``MatMulNBitsQuantizer`` on a model and
read back each ``com.microsoft.MatMulNBits`` node's unpacked codes, scales and zero points in our
(K, N) layout."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper


def ort_quantize(model: onnx.ModelProto, block_size: int, symmetric: bool) -> onnx.ModelProto:
    """The model after ``MatMulNBitsQuantizer(..., bits=4, accuracy_level=0).process()``."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    q = MatMulNBitsQuantizer(model, bits=4, block_size=block_size, is_symmetric=symmetric, accuracy_level=0)
    q.process()
    return q.model.model


def _nibbles(raw: np.ndarray) -> np.ndarray:
    """uint8 bytes -> their nibbles along the last axis, low nibble first."""
    return np.stack([raw & 0xF, raw >> 4], axis=-1).reshape(*raw.shape[:-1], -1)


def unpack_matmul_nbits(model: onnx.ModelProto) -> dict[str, dict]:
    """For each MatMulNBits node (by its original weight name, the initializer name minus ``_Q4``):
    ``codes`` (K, N) uint8 in [0, 15], ``scales`` (n_blocks, N), ``zero_points`` (n_blocks, N) uint8
    (8 for every block when the node has none: MatMulNBits' implicit symmetric zero point)."""
    inits = {t.name: t for t in model.graph.initializer}
    out = {}
    for node in model.graph.node:
        if node.op_type != "MatMulNBits":
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        k, n, block = attrs["K"], attrs["N"], attrs["block_size"]
        n_blocks = -(-k // block)
        b = numpy_helper.to_array(inits[node.input[1]])  # (N, n_blocks, block/2)
        codes = _nibbles(b.reshape(n, n_blocks * (block // 2)))[:, :k].T
        scales = numpy_helper.to_array(inits[node.input[2]]).reshape(n, n_blocks).T
        if len(node.input) > 3 and node.input[3]:
            zraw = numpy_helper.to_array(inits[node.input[3]]).reshape(n, -1)
            zps = _nibbles(zraw)[:, :n_blocks].T
        else:
            zps = np.full((n_blocks, n), 8, np.uint8)
        out[node.input[1].removesuffix("_Q4")] = {"codes": codes, "scales": scales, "zero_points": zps}
    return out
