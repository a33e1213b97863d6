"""quantize-weights: the IR contract (codes, scale, zero point -> dequantize -> matmul in the
weight's layout), the tied embedding read from the same quantized table, overrides, INT6 in int8
containers, fp8 weights, activation quantize/dequantize pairs, calibration, and the interpreter
holding the quantized IR's output to x @ dequant(W)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from quant_models import tiny_lm, token_batches

from mcpc.arch import numerics as nx
from mcpc.errors import InputError
from mcpc.ir import ops, print_module
from mcpc.ir.interpreter import interpret
from mcpc.ir.onnx_import import import_onnx
from mcpc.passes import PassContext, PassManager, build_pipeline, load_all_passes
from mcpc.passes.calibration import CalibrationData, load_calibration, run_collecting
from mcpc.passes.quantize_weights import find_layers
from mcpc.passes.weight_stats import weight_stats
from mcpc.qat_configs import load_config, parse_config
from mcpc.qat_configs.quantization import LmHead

load_all_passes()

W4 = load_config("qat_w4a16.yaml")
# qat_w4a16 with its LM head quantized too (the default keeps it in float)
W4_HEAD = W4.model_copy(
    update={"quantization": W4.quantization.model_copy(update={"lm_head": LmHead(keep=False)})}
)


def _config(quantization: str, weights: str = "i4", activations: str = "f32", pipeline: str = "quant-fp32"):
    text = (
        f"schema: 1\nname: t\nprecision: {{weights: {weights}, activations: {activations}, "
        "accumulate: f32}\n"
        f"pipeline: {pipeline}\ncheck: {{min_cosine: 0.9}}\nquantization:\n{quantization}"
    )
    return parse_config(text, "t.yaml")


def _quantize(model, config, calib=None, pipeline="fold-constants,quantize-weights"):
    module = import_onnx(model)
    ctx = PassContext(config=config)
    if calib is not None:
        ctx.notes["calibration"] = calib
    module = PassManager(build_pipeline(pipeline)).run(module, ctx)
    return module, ctx.notes["quantization"]


def _dequantized(op: ops.DequantizeOp) -> np.ndarray:
    codes, scale, zp = (v.owner.value for v in op.operands)
    axis, block = op.attrs["axis"], op.attrs["block_size"]
    s = nx.expand_qparam(scale, codes.shape, axis, block)
    z = nx.expand_qparam(zp, codes.shape, axis, block)
    return nx.dequantize(codes, s, z, "f32")


def _feeds(seed=3):
    return {"ids": token_batches(1, seed=seed)}


def test_w4a16_ir_contract_on_a_tied_lm():
    module, report = _quantize(tiny_lm(), W4_HEAD)
    func = module.main
    deqs = {op.loc: op for op in func.ops if isinstance(op, ops.DequantizeOp)}
    mm = [op for op in func.ops if isinstance(op, ops.MatMulOp)]
    # every matmul reads a dequantize of constants, in the layout it read before (LM head: trans_b)
    assert [m.operands[1].owner.loc for m in mm] == ["up", "down", "embed"]
    assert [m.attrs["trans_b"] for m in mm] == [False, False, True]
    for m in mm:
        d = m.operands[1].owner
        assert isinstance(d, ops.DequantizeOp)
        codes, scale, zp = (v.owner for v in d.operands)
        assert all(isinstance(c, ops.ConstantOp) for c in (codes, scale, zp))
        assert codes.value.dtype == ml_dtypes.int4 and zp.value.dtype == ml_dtypes.int4
        assert scale.value.dtype == np.float16 and not zp.value.astype(np.int8).any()  # symmetric
        assert d.attrs["block_size"] == 32 and d.attrs["axis"] == (1 if m.attrs["trans_b"] else 0)
    # the short last group of W2 (K = 80: 32 + 32 + 16)
    assert deqs["down"].operands[1].type.shape == (3, 64)
    # the tied table is stored once: the gather reads the LM head's dequantize of the same codes
    (gather,) = [op for op in func.ops if isinstance(op, ops.GatherOp)]
    assert gather.operands[0] is mm[2].operands[1]
    assert not any(
        isinstance(op, ops.ConstantOp) and op.value.dtype == np.float32 and op.value.shape == (50, 64)
        for op in func.ops
    )
    rows = report["functions"]["main"]["layers"]
    assert [(r["layer"], r["precision"], r["algorithm"], r["tied_gathers"]) for r in rows] == [
        ("up", "i4", "mse", 0),
        ("down", "i4", "mse", 0),
        ("lm_head", "i4", "mse", 1),
    ]
    assert report["calibration"] is None


def test_quantized_ir_output_is_x_times_dequantized_weights():
    """The interpreter on the quantized IR equals the f32 model run with each weight replaced by
    dequant(codes, scale, zero point) — bit for bit — and the embedding rows are the dequantized rows."""
    model = tiny_lm()
    module, _ = _quantize(model, W4_HEAD)
    reference = PassManager(build_pipeline("fold-constants")).run(import_onnx(model))
    layers = find_layers(reference.main)
    by_loc = {op.loc: op.operands[1].owner for op in module.main.ops if isinstance(op, ops.MatMulOp)}
    replace = {}
    for layer in layers:
        replace[id(layer.const.result)] = _dequantized(by_loc[layer.matmuls[0].loc])
    feeds = _feeds()
    got = interpret(module, feeds)["logits"]
    want = run_collecting(reference.main, feeds, replace=replace)[0]
    np.testing.assert_array_equal(got, want)
    # and not the float model's output (the weights did change)
    assert not np.array_equal(got, interpret(reference, feeds)["logits"])
    # one numpy cross-check of the arithmetic: logits = h1 @ dequant(E)^T
    table = _dequantized(by_loc["lm_head"])
    h = {}
    run_collecting(
        module.main, feeds, watch={id(module.main.ops[-2].operands[0]): lambda a: h.setdefault("h", a)}
    )
    np.testing.assert_allclose(got, h["h"] @ table.T, rtol=1e-5, atol=1e-5)


def test_fp16_pipeline_keeps_codes_and_converts_the_rest():
    module = import_onnx(tiny_lm())
    pipeline = "fold-constants,quantize-weights,convert-precision{dtype=f16},dce"
    module = PassManager(build_pipeline(pipeline)).run(module, PassContext(config=W4_HEAD))
    deqs = [op for op in module.walk() if isinstance(op, ops.DequantizeOp)]
    assert {str(d.result.type.dtype) for d in deqs} == {"f16"}
    assert {str(d.operands[0].type.dtype) for d in deqs} == {"i4"}
    stats = weight_stats(module)
    assert stats["weights"] == 3 and stats["params"] == 64 * 80 * 2 + 64 * 50
    # codes 4 bits + one f16 scale and one i4 zero point per 32 weights (W2's short group: more)
    assert 4.625 <= stats["bits_per_weight"] < 4.7


def test_override_keeps_the_lm_head_and_int6_sits_in_int8_containers():
    cfg = _config(
        "  weights: {bits: 6, group_size: 16, symmetric: false, algorithm: rtn}\n"
        "  overrides:\n    - {pattern: lm_head, keep: true}\n    - {pattern: 'do*', bits: 8}\n",
        weights="u8",
    )
    module, report = _quantize(tiny_lm(), cfg)
    rows = {r["layer"]: r for r in report["functions"]["main"]["layers"]}
    assert rows["lm_head"]["precision"] == "f32 (kept)" and rows["lm_head"]["algorithm"] == "none"
    assert (rows["up"]["precision"], rows["down"]["precision"]) == ("u6", "u8")
    deqs = {op.loc: op for op in module.walk() if isinstance(op, ops.DequantizeOp)}
    assert set(deqs) == {"up", "down"}
    up_codes = deqs["up"].operands[0].owner.value
    assert up_codes.dtype == np.uint8 and up_codes.max() <= 63 and up_codes.max() > 15
    assert deqs["down"].operands[0].owner.value.max() > 63
    assert deqs["up"].operands[2].owner.value.any()  # asymmetric: real zero points
    # the kept LM head still reads the float table the gather reads
    lm = [op for op in module.walk() if isinstance(op, ops.MatMulOp)][-1]
    assert isinstance(lm.operands[1].owner, ops.ConstantOp)
    assert rows["up"]["bytes"] == 64 * 80 + 4 * 80 * 2 + 4 * 80


def test_the_lm_head_stays_float_by_default_tied_or_not():
    """qat_w4a16 leaves the LM head in the float build dtype, found by structure: a weight tied to
    the embedding gather, or a matmul whose output width is the embedding's row count (the
    vocabulary) and whose result reaches the model output through a bias and a reshape.  A last
    matmul of another width is an ordinary layer; ``lm_head: {keep: false, bits: 8}`` quantizes
    the head at 8 bits, and an override naming it still wins."""
    module, report = _quantize(tiny_lm(), W4)
    rows = {r["layer"]: r for r in report["functions"]["main"]["layers"]}
    assert [(n, r["lm_head"], r["algorithm"]) for n, r in rows.items()] == [
        ("up", False, "mse"),
        ("down", False, "mse"),
        ("lm_head", True, "none"),
    ]
    assert rows["lm_head"]["precision"] == "f16 (kept)" and rows["lm_head"]["bytes"] == 50 * 64 * 2
    lm = [op for op in module.main.ops if isinstance(op, ops.MatMulOp)][-1]
    (gather,) = [op for op in module.main.ops if isinstance(op, ops.GatherOp)]
    assert isinstance(lm.operands[1].owner, ops.ConstantOp)  # the float table, for both readers
    assert gather.operands[0].owner is lm.operands[1].owner

    untied = {r["layer"]: r for r in _quantize(tiny_lm(untied=True), W4)[1]["functions"]["main"]["layers"]}
    assert untied["lm_head"]["lm_head"] and untied["lm_head"]["algorithm"] == "none"
    assert not untied["lm_head"]["tied_gathers"]
    other = {
        r["layer"]: r for r in _quantize(tiny_lm(untied=True, out=40), W4)[1]["functions"]["main"]["layers"]
    }
    assert not other["lm_head"]["lm_head"] and other["lm_head"]["precision"] == "i4"

    head8 = _config(
        "  weights: {bits: 4, group_size: 32, algorithm: rtn}\n  lm_head: {keep: false, bits: 8}\n"
    )
    rows = {r["layer"]: r for r in _quantize(tiny_lm(), head8)[1]["functions"]["main"]["layers"]}
    assert (rows["up"]["precision"], rows["lm_head"]["precision"]) == ("i4", "i8")
    wins = _config(
        "  weights: {bits: 4, group_size: 32, algorithm: rtn}\n"
        "  overrides:\n    - {pattern: lm_head, bits: 8}\n"
    )
    rows = {r["layer"]: r for r in _quantize(tiny_lm(), wins)[1]["functions"]["main"]["layers"]}
    assert rows["lm_head"]["precision"] == "i8"


def test_fp8_weights_and_int4_activations():
    cfg = _config(
        "  weights: {format: f8e4m3fn, bits: 8, group_size: 0, scale_dtype: f32, algorithm: rtn}\n"
        "  activations: {dtype: i4, where: all}\n  calibration: {method: minmax}\n"
        "  lm_head: {keep: false}\n",
        weights="f8e4m3fn",
        activations="i4",
    )
    calib = CalibrationData(tuple({"ids": token_batches(4)[i : i + 1]} for i in range(4)), "test")
    module, report = _quantize(tiny_lm(), cfg, calib)
    quants = [op for op in module.walk() if isinstance(op, ops.QuantizeOp)]
    assert len(quants) == 3 and {q.result.type.dtype.name for q in quants} == {"i4"}
    for q in quants:  # quantize -> dequantize with the same calibrated scale and zero point -> matmul
        (deq,) = [op for op in module.walk() if q.result in op.operands]
        assert isinstance(deq, ops.DequantizeOp) and deq.operands[1:] == q.operands[1:]
        assert float(q.operands[1].owner.value) > 0
    weights = [m.operands[1].owner for m in module.walk() if isinstance(m, ops.MatMulOp)]
    assert {w.operands[0].owner.value.dtype for w in weights} == {np.dtype(ml_dtypes.float8_e4m3fn)}
    # fp8 codes: the largest magnitude of each output channel maps to 448
    w = weights[0]
    assert np.abs(w.operands[0].owner.value.astype(np.float32)).max(axis=0).tolist() == [448.0] * 80
    # and the quantized model's output still follows the float one
    feeds = _feeds()
    ref = interpret(import_onnx(tiny_lm()), feeds)["logits"]
    got = interpret(module, feeds)["logits"]
    cos = float((ref * got).sum() / np.linalg.norm(ref) / np.linalg.norm(got))
    assert 0.9 < cos < 0.99999
    assert len(report["functions"]["main"]["activations"]) == 3


def test_calibration_files_and_errors(tmp_path):
    func = import_onnx(tiny_lm()).main
    np.savez(tmp_path / "a.npz", ids=token_batches(5))
    data = load_calibration(tmp_path / "a.npz", func)
    assert data.samples == 5 and len(data.batches) == 5
    assert data.batches[0]["ids"].shape == (1, 8) and data.batches[0]["ids"].dtype == np.int64
    (tmp_path / "dir").mkdir()
    np.savez(tmp_path / "dir" / "0.npz", ids=token_batches(3).astype(np.int32))
    np.savez(tmp_path / "dir" / "1.npz", ids=token_batches(2))
    assert load_calibration(tmp_path / "dir", func).samples == 5
    assert load_calibration(tmp_path / "dir", func, samples=2).samples == 2
    np.savez(tmp_path / "bad.npz", input_ids=token_batches(2))
    with pytest.raises(
        InputError, match=r"bad\.npz: no array for input\(s\) 'ids'.*'input_ids' name no input"
    ):
        load_calibration(tmp_path / "bad.npz", func)
    np.savez(tmp_path / "shape.npz", ids=token_batches(2, seq=9))
    with pytest.raises(InputError, match=r"'ids' has shape \[2, 9\]; expected \[samples, 8\]"):
        load_calibration(tmp_path / "shape.npz", func)
    np.savez(tmp_path / "float.npz", ids=token_batches(2).astype(np.float32))
    with pytest.raises(InputError, match="'ids' is float32, the input is int64"):
        load_calibration(tmp_path / "float.npz", func)
    with pytest.raises(InputError, match="no such calibration file"):
        load_calibration(tmp_path / "missing.npz", func)


def test_pass_without_a_quantization_section_is_refused():
    from mcpc.errors import PassError

    with pytest.raises(PassError, match="no quantization: section"):
        PassManager(build_pipeline("quantize-weights")).run(import_onnx(tiny_lm()), PassContext())


def test_golden_ir_of_one_small_matmul():
    """Input IR -> expected IR for an 8x4 weight, RTN, group 4, symmetric, f16 scales."""
    src = """module @m {
  func @main(%x: tensor<2x8xf32>) -> ("y": tensor<2x4xf32>) {
    %0 = mcp.constant {value = dense<"0x0000803F000000400000404000008040000080BF000000C0000040C0000080C00000003F0000C03F000020400000604000000000000000000000803E000080BE000080400000404000000040000080BF000010C1000000410000003F0000803F0000A0400000A0C00000C0400000E0C00000803F000000000000000000000000"> : tensor<8x4xf32>} : () -> tensor<8x4xf32> loc("w")
    %1 = mcp.matmul %x, %0 {out = f32, tile = [], trans_b = false} : (tensor<2x8xf32>, tensor<8x4xf32>) -> tensor<2x4xf32> loc("mm")
    mcp.return %1 : (tensor<2x4xf32>) -> ()
  }
}
"""  # noqa: E501 - IR text
    from mcpc.ir import parse_module

    cfg = _config("  weights: {bits: 4, group_size: 4, symmetric: true, algorithm: rtn}\n")
    module = parse_module(src)
    module = PassManager(build_pipeline("quantize-weights")).run(module, PassContext(config=cfg))
    got = print_module(module)
    assert got == GOLDEN, got
    assert print_module(parse_module(got)) == got  # the quantized IR round-trips through the text form


GOLDEN = """module @m {
  func @main(%x: tensor<2x8xf32>) -> ("y": tensor<2x4xf32>) {
    %0 = mcp.constant {value = dense<"0x7777888864770001D4FD881F54880100"> : tensor<8x4xi4>} : () -> tensor<8x4xi4> loc("w")
    %1 = mcp.constant {value = dense<[0.125, 0.25, 0.375, 0.5, 1.125, -1.0, -0.75, 0.875]> : tensor<2x4xf16>} : () -> tensor<2x4xf16> loc("w")
    %2 = mcp.constant {value = dense<[0, 0, 0, 0, 0, 0, 0, 0]> : tensor<2x4xi4>} : () -> tensor<2x4xi4> loc("w")
    %3 = mcp.dequantize %0, %1, %2 {axis = 0, block_size = 4, out = f32} : (tensor<8x4xi4>, tensor<2x4xf16>, tensor<2x4xi4>) -> tensor<8x4xf32> loc("w")
    %4 = mcp.matmul %x, %3 {out = f32, tile = [], trans_b = false} : (tensor<2x8xf32>, tensor<8x4xf32>) -> tensor<2x4xf32> loc("mm")
    mcp.return %4 : (tensor<2x4xf32>) -> ()
  }
}
"""  # noqa: E501 - IR text


def test_a_resumed_run_equals_a_full_run_with_the_weight_replaced():
    """Sensitivity resumes the float run at a weight's first use: the same outputs as running the
    whole function with that weight replaced."""
    module = PassManager(build_pipeline("fold-constants")).run(import_onnx(tiny_lm()))
    func = module.main
    feeds = _feeds()
    env: dict = {}
    ref = run_collecting(func, feeds, keep=env)
    assert np.array_equal(ref[0], interpret(module, feeds)["logits"])
    for layer in find_layers(func):
        key = id(layer.const.result)
        other = (layer.const.value * np.float32(1.01)).astype(np.float32)
        first = min(i for i, op in enumerate(func.ops) if any(id(v) == key for v in op.operands))
        full = run_collecting(func, feeds, replace={key: other})
        resumed = run_collecting(func, feeds, start=first, env={**env, key: other})
        np.testing.assert_array_equal(full[0], resumed[0])
        assert not np.array_equal(full[0], ref[0])


def test_run_collecting_hands_function_arguments_to_their_watchers():
    """A matmul reading a graph input directly is calibrated: the argument's values reach its
    watcher (they were never seen: GPTQ then raised 'no calibration inputs', exit 70)."""
    module = import_onnx(tiny_lm())
    seen = []
    arg = module.main.args[0]
    run_collecting(module.main, _feeds(), watch={id(arg): seen.append})
    assert len(seen) == 1 and np.array_equal(seen[0], _feeds()["ids"])
