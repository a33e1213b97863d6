"""Quantized weights end to end: DequantizeLinear(int4/int8 constants) -> MatMul compiles to
matmul_w4a16 (the dequantize fused, the packed codes stored and streamed); the simulator equals
the IR interpreter bit for bit and ONNX Runtime within float rounding."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import mcpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from e2e_util import compile_and_run, norm_max_err  # noqa: E402
from qmodels import qdq_mlp  # noqa: E402

from mcpc.arch.isa import decode_program  # noqa: E402
from mcpc.arch.mcpb import read_mcpb  # noqa: E402
from mcpc.ir.interpreter import interpret  # noqa: E402


def _ops(result) -> list[str]:
    return [op.name for op in result.module.main.ops]


@pytest.mark.parametrize(
    "dtype, block, symmetric, trans",
    [("i4", 32, True, False), ("u4", 32, False, True), ("i4", 0, False, False), ("i8", 0, True, True)],
)
@pytest.mark.parametrize("config", ["fp32.yaml", "fp16.yaml"])
def test_quantized_mlp_compiles_to_matmul_w4a16(tmp_path, dtype, block, symmetric, trans, config):
    model = qdq_mlp(dtype=dtype, block=block, symmetric=symmetric, transposed_last=trans)
    x = np.random.default_rng(1).standard_normal((2, 3, 64)).astype(np.float32)
    sim, _, ref, result = compile_and_run(tmp_path, model, {"x": x}, qat_config=config)
    ops = _ops(result)
    assert ops.count("mcp.matmul_w4a16") == 2 and "mcp.dequantize" not in ops and "mcp.matmul" not in ops
    # the compiled IR is the definition: the simulator computes its bits
    np.testing.assert_array_equal(sim["y"], interpret(result.module, {"x": x})["y"])
    assert norm_max_err(sim["y"], ref["y"]) < (1e-5 if config == "fp32.yaml" else 5e-3)


def test_packed_codes_are_what_is_stored(tmp_path):
    """The .mcpb holds the int4 codes (half a byte per weight) and the program streams them with
    matmul_w4a16: the binary is far smaller than the fp32 weights'."""
    model = qdq_mlp(dims=(256, 512, 256), dtype="i4", block=32, symmetric=True, batch=(1,))
    x = np.random.default_rng(2).standard_normal((1, 256)).astype(np.float32)
    sim, _, ref, result = compile_and_run(tmp_path, model, {"x": x}, qat_config="fp16.yaml")
    prog = read_mcpb(next(tmp_path.glob("*.mcpb")))
    ops = [i.op for i in decode_program(prog.text)]
    assert "matmul_w4a16" in ops and "setq" in ops and "matmul" not in ops
    weights = 2 * 256 * 512
    assert len(prog.constants) <= weights * (0.5 + 2 / 32) + 4096  # codes + f16 scales (+ small)
    assert norm_max_err(sim["y"], ref["y"]) < 5e-3


@pytest.mark.parametrize("dtype, symmetric", [("i4", True), ("u4", False), ("i8", False)])
@pytest.mark.parametrize("config", ["fp32.yaml", "fp16.yaml"])
def test_quantized_tied_embedding_gathers_packed_rows(tmp_path, dtype, symmetric, config):
    """The Gather reads the quantized table's packed rows and vdequant dequantizes only them; the
    tied LM head streams the same codes through matmul_w4a16: the table is stored once, packed."""
    from qmodels import quantized_tied_lm

    model = quantized_tied_lm(dtype=dtype, symmetric=symmetric)
    ids = np.array([[3, 95, 0, 41, 3]], np.int64)
    sim, _, ref, result = compile_and_run(tmp_path, model, {"ids": ids}, qat_config=config)
    names = _ops(result)
    assert names.count("mcp.matmul_w4a16") == 1 and names.count("mcp.dequantize") == 1
    assert "mcp.matmul" not in names
    np.testing.assert_array_equal(sim["logits"], interpret(result.module, {"ids": ids})["logits"])
    assert norm_max_err(sim["logits"], ref["logits"]) < (1e-5 if config == "fp32.yaml" else 5e-3)
    prog = read_mcpb(next(tmp_path.glob("*.mcpb")))
    assert "vdequant" in [i.op for i in decode_program(prog.text)]
    table_bytes = 96 * 64 * (0.5 if dtype != "i8" else 1)
    assert len(prog.constants) < table_bytes * 1.5 + 4096  # one packed copy (+ scales, zero points)


@pytest.mark.parametrize("per_channel", [True, False])
def test_int4_activations_fp8_weights_run_on_vmmul_q4f8(tmp_path, per_channel):
    """QuantizeLinear(int4) -> DequantizeLinear -> MatMul <- DequantizeLinear(fp8): fuse-scales folds
    the two dequantizations into one fused scale per column; vmmul.q4f8 computes it."""
    from qmodels import qdq_q4f8_linear

    model = qdq_q4f8_linear(per_channel=per_channel)
    x = np.random.default_rng(4).standard_normal((4, 64)).astype(np.float32)
    sim, _, ref, result = compile_and_run(tmp_path, model, {"x": x})
    assert _ops(result).count("mcp.matmul_qa") == 1 and "mcp.matmul" not in _ops(result)
    prog = read_mcpb(next(tmp_path.glob("*.mcpb")))
    assert "vmmul.q4f8" in [i.op for i in decode_program(prog.text)]
    np.testing.assert_array_equal(sim["y"], interpret(result.module, {"x": x})["y"])
    assert norm_max_err(sim["y"], ref["y"]) < 1e-5


def test_quantized_programs_are_race_free(tmp_path):
    """The token bits order every access of the quantized kernels, the scale and zero-point tiles
    read through the QParam pointers included (hazards.qparam_reads), with and without double
    buffering, on a shape split into several tiles."""
    from qmodels import qdq_q4f8_linear, quantized_tied_lm

    from mcpc.backend.hazards import check_hazards, qparam_reads

    models = {
        "w4": qdq_mlp(dims=(256, 512, 256), dtype="u4", block=32, symmetric=False, batch=(40,)),
        "tied": quantized_tied_lm(dtype="u4", symmetric=False),
        "q4f8": qdq_q4f8_linear(k=256, n=512, rows=40),
    }
    for name, model in models.items():
        path = tmp_path / f"{name}.onnx"
        onnx.save(model, path)
        for sched in ("npu-schedule", "npu-schedule{double-buffer=false}"):
            passes = (
                f"fold-constants,fuse-scales,fuse-dequantize-matmul,expand-quantize,dce,tile-matmul,{sched}"
            )
            out = tmp_path / f"{name}.mcpb"
            mcpc.compile(path, target="mcp2026-edge", qat_config="fp32.yaml", passes=passes, output=out)
            instrs = decode_program(read_mcpb(out).text)
            assert qparam_reads(instrs)  # the indirect reads are modelled
            check_hazards(instrs)
