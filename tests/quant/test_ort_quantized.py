"""ONNX Runtime's own quantizers' output compiles and runs: ``quantize_static`` QDQ models (int8
weights fused into matmul_w4a16, activation QuantizeLinear/DequantizeLinear as vector code) and
``MatMulNBits`` models; the simulator matches ONNX Runtime (normalized max error <= 1e-3)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from e2e_util import compile_and_run, norm_max_err  # noqa: E402
from onnxruntime import quantization  # noqa: E402

from mcpc.examples import encoder_block, mlp  # noqa: E402
from mcpc.ir.interpreter import interpret  # noqa: E402


class _Reader(quantization.CalibrationDataReader):
    def __init__(self, samples: list[dict[str, np.ndarray]]):
        self.samples = iter(samples)

    def get_next(self):
        return next(self.samples, None)


def _quantize_static(
    tmp_path: Path, model: onnx.ModelProto, samples, per_channel: bool, act: str
) -> onnx.ModelProto:
    src, dst = tmp_path / "f32.onnx", tmp_path / "qdq.onnx"
    onnx.save(model, src)
    quantization.quantize_static(
        str(src), str(dst), _Reader(samples), quant_format=quantization.QuantFormat.QDQ,
        per_channel=per_channel, activation_type=getattr(quantization.QuantType, act),
        weight_type=quantization.QuantType.QInt8,
    )  # fmt: skip
    return onnx.load(str(dst))


@pytest.mark.parametrize("per_channel, act", [(False, "QUInt8"), (True, "QInt8")])
def test_quantize_static_mlp(tmp_path, per_channel, act):
    model = mlp(batch=4, d_in=64, d_hidden=128, d_out=32)
    rng = np.random.default_rng(0)
    samples = [{"x": rng.standard_normal((4, 64)).astype(np.float32)} for _ in range(8)]
    qdq = _quantize_static(tmp_path, model, samples, per_channel, act)
    assert sum(n.op_type == "QuantizeLinear" for n in qdq.graph.node) >= 2
    x = rng.standard_normal((4, 64)).astype(np.float32)
    sim, _, ref, result = compile_and_run(tmp_path, qdq, {"x": x})
    names = [op.name for op in result.module.main.ops]
    assert names.count("mcp.matmul_w4a16") == 2 and "mcp.quantize" not in names  # int8 weights fused
    np.testing.assert_array_equal(sim["y"], interpret(result.module, {"x": x})["y"])
    err = norm_max_err(sim["y"], ref["y"])
    assert err <= 1e-3, err


def test_quantize_static_encoder_block(tmp_path):
    """Every MatMul of a transformer block quantized, the activation x activation ones included."""
    model = encoder_block(hidden=64, heads=2, seq=16, causal_mask_input=False, ffn=128)
    rng = np.random.default_rng(1)
    samples = [{"x": rng.standard_normal((1, 16, 64)).astype(np.float32)} for _ in range(8)]
    qdq = _quantize_static(tmp_path, model, samples, True, "QUInt8")
    x = rng.standard_normal((1, 16, 64)).astype(np.float32)
    sim, _, ref, result = compile_and_run(tmp_path, qdq, {"x": x})
    assert [op.name for op in result.module.main.ops].count("mcp.matmul_w4a16") == 6
    err = norm_max_err(sim["y"], ref["y"])
    assert err <= 1e-3, err
