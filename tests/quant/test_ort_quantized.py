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
    # int8 activations x int8 weights on the int8 MACs, one fused scale per column
    assert names.count("mcp.matmul_qa") == 2 and "mcp.quantize" not in names and "mcp.matmul" not in names
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
    names = [op.name for op in result.module.main.ops]
    # the 6 linears on matmul_i8; the activation x activation products (QK^T, PV) stay float matmuls
    # of dequantized activations
    assert names.count("mcp.matmul_qa") == 6 and names.count("mcp.matmul") == 2
    err = norm_max_err(sim["y"], ref["y"])
    assert err <= 1e-3, err


def _matmul_nbits(model: onnx.ModelProto, symmetric: bool, bits: int = 4) -> onnx.ModelProto:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    q = MatMulNBitsQuantizer(model, bits=bits, block_size=32, is_symmetric=symmetric, accuracy_level=0)
    q.process()
    return q.model.model


@pytest.mark.parametrize("symmetric", [True, False])
def test_matmul_nbits_encoder_block(tmp_path, symmetric):
    model = encoder_block(hidden=64, heads=2, seq=16, causal_mask_input=False, ffn=128)
    q = _matmul_nbits(model, symmetric)
    assert sum(n.op_type == "MatMulNBits" for n in q.graph.node) == 6
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 16, 64)).astype(np.float32)
    for config, bound in (("fp32.yaml", 1e-3), ("fp16.yaml", 5e-3)):
        sim, _, ref, result = compile_and_run(
            tmp_path, q, {"x": x}, qat_config=config, name=f"nbits-{config}"
        )
        assert [op.name for op in result.module.main.ops].count("mcp.matmul_w4a16") == 6
        np.testing.assert_array_equal(sim["y"], interpret(result.module, {"x": x})["y"])
        err = norm_max_err(sim["y"], ref["y"])
        assert err <= bound, (config, err)


def test_matmul_nbits_act_order_g_idx_is_refused(tmp_path):
    from onnx import helper

    from mcpc.errors import UnsupportedError
    from mcpc.ir.onnx_import import import_onnx

    q = _matmul_nbits(encoder_block(hidden=64, heads=2, seq=16, causal_mask_input=False, ffn=128), True)
    node = next(n for n in q.graph.node if n.op_type == "MatMulNBits")
    k = next(a.i for a in node.attribute if a.name == "K")
    perm = np.random.default_rng(0).permutation(np.arange(k) // 32).astype(np.int32)
    q.graph.initializer.append(helper.make_tensor("gidx", onnx.TensorProto.INT32, [k], perm.tolist()))
    while len(node.input) < 5:
        node.input.append("")
    node.input[4] = "gidx"
    with pytest.raises(UnsupportedError, match=r"MatMulNBits.*g_idx reorders the blocks"):
        import_onnx(q)


def test_mcpc_check_passes_on_a_matmul_nbits_model(tmp_path):
    """The user's path: mcpc compile, then mcpc check against ONNX Runtime (exit 0)."""
    from click.testing import CliRunner

    from mcpc.cli import cli

    q = _matmul_nbits(encoder_block(hidden=64, heads=2, seq=16, causal_mask_input=False, ffn=128), True)
    onnx.save(q, tmp_path / "nbits.onnx")
    x = np.random.default_rng(5).standard_normal((1, 16, 64)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    prog = tmp_path / "nbits.mcpb"
    built = CliRunner().invoke(
        cli, ["compile", str(tmp_path / "nbits.onnx"), "-c", "fp32.yaml", "-o", str(prog)]
    )
    assert built.exit_code == 0, built.output
    checked = CliRunner().invoke(cli, ["check", str(tmp_path / "nbits.onnx"), str(prog), "--inputs",
                                       str(tmp_path / "in.npz")])  # fmt: skip
    assert checked.exit_code == 0, checked.output
