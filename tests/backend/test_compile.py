"""compile_to_program: sections, determinism, options, errors, several entries, compile report."""

from __future__ import annotations

import numpy as np
import pytest

from mcpc.arch.mcpb import program_bytes, read_mcpb, write_mcpb
from mcpc.arch.target import load_target
from mcpc.backend import BackendOptions, compile_report, compile_to_program
from mcpc.backend.compile import TOLERANCES, check_lowerable
from mcpc.backend.lowering import LOWERINGS, load_lowerings
from mcpc.errors import UnsupportedError
from mcpc.ir import DTYPES, Function, Module, TensorType
from mcpc.ir.interpreter import interpret
from mcpc.ir.ops import AddOp, ConstantOp, MatMulOp, ReluOp, ReshapeOp, ReturnOp, SoftmaxOp
from mcpc.passes import PassContext
from mcpc.passes.tile_matmul import TileMatmulPass
from mcpc.sim.api import from_program, load_program, run_program

F32, F16 = DTYPES["f32"], DTYPES["f16"]
TARGETS = ("mcp2026-a100", "mcp2026-a10", "mcp2026-edge")


def mlp(name="main", dtype=F32, hidden=48) -> Function:
    """x[8,32] -> relu(x @ w1 + b1) @ w2 + b2 -> reshape [8*16]; two outputs (y and the hidden h)."""
    rng = np.random.default_rng(1)
    np_dt = dtype.np_dtype
    f = Function(name, [TensorType((8, 32), dtype)], ["x"])

    def const(shape, loc):
        return f.append(ConstantOp([], {"value": rng.standard_normal(shape).astype(np_dt)}, loc=loc)).result

    w1, b1, w2, b2 = (
        const((32, hidden), "w1"),
        const((hidden,), "b1"),
        const((hidden, 16), "w2"),
        const((16,), "b2"),
    )
    h = f.append(MatMulOp([f.args[0], w1], loc="fc1")).result
    h = f.append(AddOp([h, b1], loc="fc1_bias")).result
    h = f.append(ReluOp([h], loc="relu")).result
    y = f.append(MatMulOp([h, w2], loc="fc2")).result
    y = f.append(AddOp([y, b2], loc="fc2_bias")).result
    y = f.append(ReshapeOp([y], {"shape": [8 * 16]}, loc="flatten")).result
    f.append(ReturnOp([y, h]))
    f.result_names = ["y", "h"]
    return f


def module(*funcs, precision="fp32", target="mcp2026-edge") -> Module:
    m = Module("m")
    for f in funcs or (mlp(),):
        m.add_function(f)
    m.attrs["precision"] = precision
    TileMatmulPass().apply(m, PassContext(target=load_target(target)))
    m.verify()
    return m


@pytest.mark.parametrize("target_name", TARGETS)
def test_mlp_runs_bit_exact_and_fits_sram(target_name):
    target = load_target(target_name)
    m = module(target=target_name)
    prog = compile_to_program(m, target)
    x = np.random.default_rng(0).standard_normal((8, 32)).astype(np.float32)
    res = run_program(from_program(prog), {"x": x})
    ref = interpret(m, {"x": x})
    for name in ("y", "h"):
        assert np.array_equal(res.outputs[name].view(np.uint8), ref[name].view(np.uint8)), name
    assert 0 < prog.memory_map["sram_peak_bytes"] <= target.sram.size_bytes
    assert res.profile["peak_sram_bytes"] <= target.sram.size_bytes


def test_sections_are_filled():
    m = module(precision="fp32")
    prog = compile_to_program(
        m, load_target("mcp2026-edge"), BackendOptions(passes=("dce",), source_model="mlp.onnx")
    )
    instrs = prog.instructions()
    assert prog.entries == [{"name": "main", "start": 0, "count": len(instrs)}]
    assert instrs[-1].op == "halt" and len(prog.debug) == len(instrs)
    nodes = {d["onnx_node"] for d in prog.debug}
    assert {
        "fc1",
        "fc1_bias",
        "relu",
        "fc2",
        "fc2_bias",
    } <= nodes and "flatten" not in nodes  # alias: no code
    assert {d["op_type"] for d in prog.debug if d["onnx_node"] == "fc1"} == {"matmul"}
    io = prog.io["main"]
    assert [b["name"] for b in io["inputs"]] == ["x"] and [b["name"] for b in io["outputs"]] == ["y", "h"]
    assert io["outputs"][0]["shape"] == [128] and io["outputs"][0]["onnx_dtype"] == 1
    kinds = [r["kind"] for r in prog.memory_map["regions"]]
    assert kinds[0] == "const" and "input" in kinds and "output" in kinds
    assert prog.memory_map["regions"][0]["bytes"] == len(prog.constants) > 0
    assert prog.meta["precision"] == "fp32" and prog.meta["tolerances"] == TOLERANCES["fp32"]
    assert prog.meta["passes"] == ["dce"] and prog.meta["source_model"] == "mlp.onnx"
    assert prog.target_name == "mcp2026-edge"


def test_fp16_build_records_its_tolerances_and_driver_options_are_accepted():
    m = module(mlp(dtype=F16), precision="fp16")
    prog = compile_to_program(m, load_target("mcp2026-edge"))
    assert prog.meta["precision"] == "fp16" and prog.meta["tolerances"] == TOLERANCES["fp16"]
    driver = {"precision": "fp16", "tolerances": {"rtol": 0.05, "atol": None}, "passes": ["a", "b"],
              "source_model": None, "qat_config": object(), "double_buffer": False}  # fmt: skip
    opts = BackendOptions.coerce(driver)
    assert opts == BackendOptions(double_buffer=False, precision="fp16", rtol=0.05, passes=("a", "b"))
    prog = compile_to_program(m, load_target("mcp2026-edge"), driver)
    assert (
        prog.meta["tolerances"] == {"rtol": 0.05} and prog.meta["double_buffer"] is False
    )  # replaces the defaults


def test_same_module_gives_byte_identical_programs(tmp_path):
    target = load_target("mcp2026-a10")
    a = program_bytes(compile_to_program(module(target="mcp2026-a10"), target))
    b = program_bytes(compile_to_program(module(target="mcp2026-a10"), target))
    assert a == b
    prog = compile_to_program(module(), load_target("mcp2026-edge"))
    write_mcpb(tmp_path / "p.mcpb", prog)
    assert program_bytes(read_mcpb(tmp_path / "p.mcpb")) == program_bytes(prog)
    res = run_program(load_program(tmp_path / "p.mcpb"), {"x": np.ones((8, 32), np.float32)})
    assert res.outputs["y"].shape == (128,)


def test_double_buffer_option_changes_slots_not_results():
    m = module()
    target = load_target("mcp2026-edge")
    x = {"x": np.random.default_rng(3).standard_normal((8, 32)).astype(np.float32)}
    on = compile_to_program(m, target, BackendOptions(double_buffer=True))
    off = compile_to_program(m, target, BackendOptions(double_buffer=False))
    assert off.memory_map["sram_peak_bytes"] < on.memory_map["sram_peak_bytes"]
    r_on, r_off = (run_program(from_program(p), x).outputs["y"] for p in (on, off))
    assert np.array_equal(r_on, r_off)


def test_several_functions_become_entries():
    m = module(mlp("prefill"), mlp("decode", hidden=24))
    prog = compile_to_program(m, load_target("mcp2026-edge"))
    names = [e["name"] for e in prog.entries]
    assert names == ["prefill", "decode"]
    assert prog.entries[1]["start"] == prog.entries[0]["count"]
    loaded = from_program(prog)
    x = {"x": np.ones((8, 32), np.float32)}
    for entry in names:
        out = run_program(loaded, x, entry=entry).outputs
        assert np.array_equal(out["y"], interpret(m, x, func=entry)["y"])


def test_op_without_lowering_is_unsupported_naming_op_and_node(monkeypatch):
    # Hide the softmax lowering (every real op has one): the error must name the op and the node.
    load_lowerings()
    monkeypatch.delitem(LOWERINGS, SoftmaxOp)
    f = Function("main", [TensorType((4, 8), F32)], ["x"])
    y = f.append(SoftmaxOp([f.args[0]], loc="/layers.0/Softmax")).result
    f.append(ReturnOp([y]))
    f.result_names = ["y"]
    m = Module("m")
    m.add_function(f)
    with pytest.raises(UnsupportedError, match=r"mcp.softmax \(ONNX node '/layers.0/Softmax'\)"):
        check_lowerable(m)
    with pytest.raises(UnsupportedError, match="no lowering"):
        compile_to_program(m, load_target("mcp2026-edge"))


def test_i64_inputs_are_bound_as_i64():
    f = Function("main", [TensorType((2, 3), DTYPES["i64"])], ["ids"])
    f.append(ReturnOp([f.args[0]]))
    f.result_names = ["same"]
    m = Module("m")
    m.add_function(f)
    prog = compile_to_program(m, load_target("mcp2026-edge"))
    (b,) = prog.io["main"]["inputs"]
    assert b["dtype"] == "i64" and b["bytes"] == 48 and b["onnx_dtype"] == 7
    assert prog.io["main"]["outputs"][0]["dram"] == b["dram"]  # an output that is an input: same bytes
    ids = np.arange(6, dtype=np.int64).reshape(2, 3)
    assert np.array_equal(run_program(from_program(prog), {"ids": ids}).outputs["same"], ids)


def test_compile_report():
    prog = compile_to_program(module(), load_target("mcp2026-edge"))
    rep = compile_report(prog)
    assert rep["weight_bytes"] == len(prog.constants) and rep["target"] == "mcp2026-edge"
    assert rep["instructions"] == sum(rep["instructions_per_mnemonic"].values())
    assert rep["instructions_per_mnemonic"]["matmul"] >= 2 and rep["instructions_per_mnemonic"]["halt"] == 1
    assert rep["sram"]["peak_bytes"] == prog.memory_map["sram_peak_bytes"]
    assert rep["dram"]["bytes_per_kind"]["const"] == len(prog.constants)
