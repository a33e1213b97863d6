"""MiniLM-L3 quantized: the W4A16 build's IR (every MatMul weight int4, at most 4.625 bits per weight) and
its ONNX export, which ONNX Runtime runs to our interpreter's output within float rounding and
close to the fp32 model.  Slow (a few seconds of interpreter work on a quiet machine)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from real_model import MINILM, dim_bindings, realistic_inputs

from mcpc import driver
from mcpc.ir import ops
from mcpc.ir.interpreter import interpret

SEQ = 16
POOLED = "461"  # the model's pooled sentence embedding


@pytest.fixture(scope="module")
def model_path():
    try:
        return MINILM.path()
    except LookupError as e:
        pytest.fail(str(e), pytrace=False)


@pytest.mark.slow
def test_w4a16_minilm_export_runs_in_onnx_runtime(model_path, tmp_path):
    import onnxruntime as ort

    model = onnx.load(str(model_path))
    dims = dim_bindings(model, 1, SEQ)
    out = tmp_path / "w4.onnx"
    result = driver.export_onnx(model_path, "qat_w4a16.yaml", out, dims=dims)
    deqs = [op for op in result.module.walk() if isinstance(op, ops.DequantizeOp)]
    assert len(deqs) == 18 and {str(d.operands[0].type.dtype) for d in deqs} == {"i4"}
    # 4 bits a code + an f16 scale per 32 (4.5) + the 4-bit zero points, which the constant pool (and
    # so the weight statistics) stores once per distinct content: a symmetric build's zero points are
    # all the same, so same-shaped weights share one array (4.625 when every weight kept its own)
    assert 4.5 < result.report["weights"]["after"]["bits_per_weight"] <= 4.625
    options = ort.SessionOptions()
    options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    quantized = ort.InferenceSession(str(out), options, providers=["CPUExecutionProvider"])
    fp32 = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    feeds = realistic_inputs(model, 1, SEQ, seed=7)
    got = quantized.run([POOLED], feeds)[0]
    ours = interpret(result.module, feeds)[POOLED]
    assert np.abs(got - ours).max() <= 1e-5 * np.abs(ours).max()
    ref = fp32.run([POOLED], feeds)[0].ravel()
    cos = float(ref @ got.ravel() / np.linalg.norm(ref) / np.linalg.norm(got))
    assert 0.9 < cos < 0.99999  # quantized (not the fp32 model), and still the same embedding
