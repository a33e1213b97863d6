"""Epilogue fusion: elementwise consumers of a matmul computed on its SRAM tiles — the grouping
rules, bit-exactness with the interpreter on the unfused IR, race freedom, fewer kernels."""

from __future__ import annotations

import numpy as np
import pytest
from test_lower_vector import compile_check, random_inputs

from mcpc.arch.isa import decode_program
from mcpc.arch.target import load_target
from mcpc.backend import BackendOptions, compile_to_program
from mcpc.backend.compile import fusion_plan
from mcpc.backend.memory import plan_dram
from mcpc.ir import DTYPES, Function, Module, TensorType, dtype_from_name, ops
from mcpc.ir.interpreter import interpret
from mcpc.sim.api import from_program, run_program

A100 = "mcp2026-a100"


def t(shape, dtype):
    return TensorType(tuple(shape), dtype_from_name(dtype))


def const(fn, arr):
    return fn.append(ops.ConstantOp([], {"value": arr})).result


def build(args, body, tile=(16, 32, 16)):
    """A module whose ``body(fn, args, mm)`` gets a matmul helper ``mm(a, b, out)`` (tiled with
    ``tile``: ragged output tiles and several K tiles) and returns the function's outputs."""
    fn = Function("main", [t(s, d) for _, s, d in args], [n for n, _, _ in args])

    def mm(a, b, out=None, trans_b=False):
        attrs = {"trans_b": trans_b, "out": DTYPES[out or a.type.dtype.name], "tile": list(tile)}
        return fn.append(ops.MatMulOp([a, b], attrs, loc="mm")).result

    outs = body(fn, fn.args, mm)
    fn.append(ops.ReturnOp(outs))
    fn.result_names = [f"y{i}" for i in range(len(outs))]
    m = Module("fusion")
    m.add_function(fn)
    m.verify()
    return m


def _bias_gelu(fn, a, mm, dt):
    x, w = a
    bias = const(fn, np.linspace(-1, 1, 72).astype(x.type.dtype.np_dtype))
    y = fn.append(ops.AddOp([mm(x, w), bias], loc="bias")).result
    return [fn.append(ops.GeluOp([y], loc="gelu")).result]


def _scale_residual(fn, a, mm, dt):
    x, w, res = a
    s = const(fn, np.array(0.125, dtype=x.type.dtype.np_dtype))
    y = fn.append(ops.MulOp([s, mm(x, w)])).result  # scalar constant on the left: vbini rev
    y = fn.append(ops.SubOp([res, y])).result  # chain value second: res - y
    return [fn.append(ops.DivOp([y, const(fn, np.array(3.0, dtype=x.type.dtype.np_dtype))])).result]


def _row_scale_cast(fn, a, mm, dt):
    x, w, rows = a
    y = fn.append(ops.MulOp([mm(x, w, trans_b=True), rows])).result  # one value per row
    y = fn.append(ops.CastOp([y], {"to": DTYPES["f32"]})).result
    return [fn.append(ops.ReluOp([y])).result]


def _batched_f32_out(fn, a, mm, dt):
    x, w, res = a
    y = fn.append(ops.AddOp([mm(x, w, out="f32"), res])).result  # res broadcast over the batch
    y = fn.append(ops.TanhOp([y])).result
    return [fn.append(ops.MaxOp([y, const(fn, np.array(-0.25, dtype=np.float32))])).result]


def _per_batch_row(fn, a, mm, dt):
    x, w, res, full = a
    y = fn.append(ops.SubOp([mm(x, w), res])).result  # one row per batch: stride 0 within a batch
    return [fn.append(ops.MulOp([full, y])).result]  # a whole [batch, rows, N] operand


CASES = {
    "bias_gelu": (_bias_gelu, lambda d: [("x", (40, 48), d), ("w", (48, 72), d)]),
    "scale_residual": (
        _scale_residual, lambda d: [("x", (40, 48), d), ("w", (48, 72), d), ("r", (40, 72), d)]
    ),
    "row_scale_cast": (
        _row_scale_cast, lambda d: [("x", (2, 40, 48), d), ("w", (72, 48), d), ("r", (40, 1), d)]
    ),
    "batched_f32_out": (
        _batched_f32_out, lambda d: [("x", (3, 40, 48), d), ("w", (48, 72), d), ("r", (1, 40, 72), "f32")]
    ),
    # one weight matrix: the tiles' rows (16) run across the batches' 40 rows, so the epilogue
    # operands' tiles are loaded batch by batch
    "per_batch_row": (
        _per_batch_row,
        lambda d: [("x", (3, 40, 48), d), ("w", (48, 72), d), ("r", (3, 1, 72), d), ("f", (3, 40, 72), d)],
    ),
}  # fmt: skip


# row_scale_cast casts to f32: with f32 operands there is no cast to fuse, so that pair is not built.
@pytest.mark.parametrize(
    "case,dtype",
    [(c, d) for c in sorted(CASES) for d in ("f32", "f16", "bf16") if (c, d) != ("row_scale_cast", "f32")],
)
def test_fused_epilogue_is_bit_exact_and_one_kernel(case, dtype):
    body, args = CASES[case]
    module = build(args(dtype), lambda fn, a, mm: body(fn, a, mm, dtype))
    inputs = random_inputs(module)
    _, instrs, program = compile_check(module, inputs, target=A100)  # bits, races, SRAM
    assert program.meta["fuse_epilogue"] is True
    plan = fusion_plan(module.main, load_target(A100), (2, 2))
    assert len(plan.groups) == 1 and len(plan.absorbed) == len(module.main.ops) - sum(
        isinstance(op, (ops.ConstantOp, ops.ReturnOp, ops.MatMulOp)) for op in module.main.ops
    )
    # against one kernel per op through DRAM (keep-in-sram would leave the intermediates' stores out too)
    off = compile_to_program(
        module, load_target(A100), BackendOptions(fuse_epilogue=False, keep_in_sram=False)
    )
    stores = [i for i in instrs if i.op == "store"]
    assert 0 < len(stores) < sum(i.op == "store" for i in decode_program(off.text))
    out = program.io["main"]["outputs"][0]["dram"]  # the fused kernel stores only the result
    assert all(out <= i.dram for i in stores)


def test_epilogue_instructions_are_attributed_to_their_ops():
    body, args = CASES["bias_gelu"]
    module = build(args("f16"), lambda fn, a, mm: body(fn, a, mm, "f16"))
    program = compile_to_program(module, load_target(A100))
    ops_of = {
        (i.op, (d or {}).get("onnx_node"))
        for i, d in zip(program.instructions(), program.debug, strict=False)
    }
    assert ("matmul", "mm") in ops_of and ("vbin", "bias") in ops_of and ("vun", "gelu") in ops_of


def _two_matmuls(fn, a, mm):
    x, w = a
    y = mm(x, w)
    z = mm(x, w)  # defined after the first matmul: cannot be its epilogue's operand
    u = fn.append(ops.AddOp([y, z])).result
    v = fn.append(ops.ReluOp([u])).result
    twice = fn.append(ops.MulOp([v, v])).result  # v has two uses: the chain stops before
    return [twice, fn.append(ops.ExpOp([mm(x, w)])).result]


def test_grouping_rules():
    module = build([("x", (8, 16), "f16"), ("w", (16, 8), "f16")], _two_matmuls)
    fn = module.main
    plan = fusion_plan(fn, load_target(A100), (2, 2))
    mms = [op for op in fn.ops if isinstance(op, ops.MatMulOp)]
    # 1st: add reads z (later) -> no group; 2nd: add(y, z) + relu, not the mul (v used twice);
    # 3rd: exp, although its result is a function output (the chain's last value may be one).
    assert mms[0] not in plan.groups
    assert [type(e.op) for e in plan.groups[mms[1]].epilogue] == [ops.AddOp, ops.ReluOp]
    assert [type(e.op) for e in plan.groups[mms[2]].epilogue] == [ops.ExpOp]
    assert all(plan.positions[e.op] == plan.positions[mms[1]] for e in plan.groups[mms[1]].epilogue)
    compile_check(module, target=A100)


def test_matmul_output_that_is_a_function_output_is_not_fused():
    module = build(
        [("x", (8, 16), "f32"), ("w", (16, 8), "f32")],
        lambda fn, a, mm: [y := mm(*a), fn.append(ops.ReluOp([y])).result],
    )
    assert not fusion_plan(module.main, load_target(A100), (2, 2)).groups
    compile_check(module, target=A100)


def test_liveness_follows_the_group_position():
    """The fused kernel writes its result while it still reads A: the planner must not give the
    result A's bytes, although in function order the result is born after A's last use."""
    module = build([("x", (8, 16), "f32"), ("w", (16, 16), "f32")], _a_dies_at_matmul)
    fn = module.main
    plan = fusion_plan(fn, load_target(A100), (2, 2))
    assert plan.groups
    dram = plan_dram(module, plan.positions)
    a = next(op for op in fn.ops if isinstance(op, ops.MatMulOp)).operands[0]
    res = next(iter(plan.groups.values())).result
    lo, hi = dram.placements[a], dram.placements[a] + a.type.nbytes
    assert dram.placements[res] >= hi or dram.placements[res] + res.type.nbytes <= lo
    compile_check(module, target=A100)


def _a_dies_at_matmul(fn, a, mm):
    x, w = a
    h = fn.append(ops.ReluOp([x])).result  # scratch, last read by the matmul
    y = fn.append(ops.ExpOp([mm(h, w)])).result  # in function order, free to take h's bytes
    return [fn.append(ops.AddOp([y, y])).result]


def test_option_off_is_unfused_and_same_bits():
    body, args = CASES["scale_residual"]
    module = build(args("f16"), lambda fn, a, mm: body(fn, a, mm, "f16"))
    tgt = load_target(A100)
    inputs = random_inputs(module)
    runs = {}
    for fuse in (True, False):
        for keep in (True, False):  # fusion's saving is measured against the DRAM round trips
            prog = compile_to_program(module, tgt, BackendOptions(fuse_epilogue=fuse, keep_in_sram=keep))
            assert prog.meta["fuse_epilogue"] is fuse
            runs[fuse, keep] = run_program(from_program(prog), inputs)
    want = interpret(module, inputs)["y0"]
    for r in runs.values():
        assert np.array_equal(r.outputs["y0"].view(np.uint8), want.view(np.uint8))
    runs = {fuse: runs[fuse, False] for fuse in (True, False)}
    assert runs[True].profile["cycles"] < runs[False].profile["cycles"]
    assert runs[True].profile["dram_write_bytes"] < runs[False].profile["dram_write_bytes"]


def test_fused_kernel_too_big_for_sram_falls_back_unfused():
    body, args = CASES["scale_residual"]
    module = build(args("f32"), lambda fn, a, mm: body(fn, a, mm, "f32"), tile=(40, 72, 48))
    # room for the plain matmul kernel (and the elementwise kernels), not for the fused one
    small = [f"sram.size_bytes={2 * (40 * 48 + 48 * 72) * 4 + 2 * 40 * 72 * 4 + 8192}", "sram.bank_bytes=64"]
    tgt = load_target(A100, small)
    assert not fusion_plan(module.main, tgt, (2, 2)).groups
    compile_check(module, target=A100, overrides=small)


@pytest.mark.parametrize("target", ["mcp2026-a100", "mcp2026-a10", "mcp2026-edge"])
def test_encoder_block_fused_same_bits_fewer_cycles_and_dram_bytes(tmp_path, target):
    import onnx

    import mcpc
    from mcpc.backend.hazards import check_hazards
    from mcpc.examples import causal_mask, encoder_block

    path = tmp_path / "encoder.onnx"
    onnx.save(encoder_block(), path)
    x = np.random.default_rng(5).standard_normal((1, 64, 256)).astype(np.float32)
    inputs = {"x": x, "mask": causal_mask(64)}
    module = mcpc.compile(path, target=target, qat_config="fp16.yaml").module
    runs = {}
    for fuse in (True, False):
        for keep in (True, False):
            opts = BackendOptions(fuse_epilogue=fuse, keep_in_sram=keep)
            prog = compile_to_program(module, load_target(target), opts)
            check_hazards(decode_program(prog.text))
            runs[fuse, keep] = run_program(from_program(prog), inputs)
    want = runs[False, False].outputs["y"]
    for r in runs.values():
        assert np.array_equal(r.outputs["y"].view(np.uint8), want.view(np.uint8))
    # fusion against one kernel per op, intermediates through DRAM (keep-in-sram off)
    on, off = runs[True, False].profile, runs[False, False].profile
    assert on["cycles"] < off["cycles"]
    assert on["dram_read_bytes"] + on["dram_write_bytes"] < off["dram_read_bytes"] + off["dram_write_bytes"]


def test_pass_option_turns_fusion_off(tmp_path):
    import onnx

    import mcpc
    from mcpc.examples import mlp

    path = tmp_path / "mlp.onnx"
    onnx.save(mlp(), path)
    off = mcpc.compile(
        path, qat_config="fp32.yaml", passes="dce,tile-matmul,npu-schedule{fuse-epilogue=false}"
    )
    assert off.module.attrs["fuse_epilogue"] is False and off.program.meta["fuse_epilogue"] is False
    on = mcpc.compile(path, qat_config="fp32.yaml")
    assert on.program.meta["fuse_epilogue"] is True
    # fewer kernels: counted with intermediates through DRAM (kept in SRAM, the unfused kernels
    # read and write their operands in place, and on this MLP come to as many instructions)
    keep_off = "dce,tile-matmul,npu-schedule{keep-in-sram=false%s}"
    off = mcpc.compile(path, qat_config="fp32.yaml", passes=keep_off % ",fuse-epilogue=false")
    on = mcpc.compile(path, qat_config="fp32.yaml", passes=keep_off % "")
    assert len(on.program.text) < len(off.program.text)
