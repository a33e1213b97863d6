"""The precision policy of convert-precision: a norm's square/mean/rsqrt and a written-out softmax's
exp/sum/div stay f32 in an fp16 build (recognized by structure), with minimal casts; the config
and the pass option choose the kinds."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from conftest import make_model, norm_max_err, vi
from numeric_models import large_inputs, llama_block
from onnx import helper, numpy_helper

from mcpc.errors import ConfigError, UsageError
from mcpc.ir import parse_module, print_module
from mcpc.ir.interpreter import interpret
from mcpc.ir.onnx_import import import_onnx
from mcpc.passes import PassContext, PassManager, build_pipeline, load_all_passes
from mcpc.qat_configs import load_config, parse_config

load_all_passes()


def _fp16(model, islands="all", config=None):
    pm = PassManager(build_pipeline(f"fold-constants,convert-precision{{dtype=f16,islands={islands}}},dce"))
    return pm.run(import_onnx(model), PassContext(config=config))


def _ops_by_loc(module):
    skip = ("mcp.cast", "mcp.constant", "mcp.return")
    return {op.loc: op for op in module.main.ops if op.name not in skip}


def test_rmsnorm_and_softmax_stay_f32_and_the_build_is_right(ort_run):
    model, feeds = llama_block(), large_inputs()
    module = _fp16(model)
    ops = _ops_by_loc(module)
    for norm in ("ln1", "ln2", "ln_f"):
        for step in ("pow", "mean", "add_eps", "sqrt", "div"):
            assert ops[f"{norm}.{step}"].result.type.dtype.name == "f32", f"{norm}.{step}"
        assert ops[f"{norm}.scale"].result.type.dtype.name == "f16"  # cast back after the division
    for step in ("exp", "ssum", "probs"):
        assert ops[step].result.type.dtype.name == "f32"
    for step in ("masked", "smax", "shifted", "q", "fc1", "y"):
        assert ops[step].result.type.dtype.name == "f16"
    casts = Counter((op.loc, op.attrs["to"].name) for op in module.main.ops if op.name == "mcp.cast")
    # into f32 once per island (ln1 squares the f32 input itself), back to f16 once per island
    assert casts == Counter(
        {
            ("x", "f16"): 1,
            ("ln1.div", "f16"): 1,
            ("exp", "f32"): 1,
            ("probs", "f16"): 1,
            ("ln2.pow", "f32"): 1,
            ("ln2.div", "f16"): 1,
            ("ln_f.pow", "f32"): 1,
            ("ln_f.div", "f16"): 1,
            ("y", "f32"): 1,
        }
    )
    y, ref = interpret(module, feeds)["y"], ort_run(model, feeds)["y"]
    assert np.isfinite(y).all() and norm_max_err(y, ref) < 5e-3
    text = print_module(module)  # the f32 constants the islands read back print and parse
    assert print_module(parse_module(text)) == text


@pytest.mark.parametrize("how", ["option", "config"])
def test_without_the_policy_the_square_overflows(how, ort_run):
    model, feeds = llama_block(), large_inputs()
    if how == "option":
        module = _fp16(model, islands="none")
    else:
        text = (
            load_config("fp16")
            .model_dump_json(by_alias=True)
            .replace('"f32_islands":["norm_stats","softmax_sum"]', '"f32_islands":[]')
        )
        config = parse_config(text, "off.yaml")
        assert config.precision.f32_islands == []
        module = _fp16(model, islands="config", config=config)
    ops = _ops_by_loc(module)
    assert ops["ln1.pow"].result.type.dtype.name == "f16"
    y, ref = interpret(module, feeds)["y"], ort_run(model, feeds)["y"]
    assert norm_max_err(y, ref) > 0.5  # x² = inf, x / inf = 0: the norms output zeros


def test_default_config_and_option_keep_every_kind():
    module = _fp16(llama_block(), islands="config", config=load_config("fp16"))
    assert _ops_by_loc(module)["ln1.pow"].result.type.dtype.name == "f32"
    module = _fp16(llama_block(), islands="config", config=None)  # no config: every kind
    assert _ops_by_loc(module)["ssum"].result.type.dtype.name == "f32"
    module = _fp16(llama_block(), islands="softmax_sum")
    ops = _ops_by_loc(module)
    assert ops["ssum"].result.type.dtype.name == "f32" and ops["ln1.pow"].result.type.dtype.name == "f16"


def _norm_model(square: str, inverse: str, exponent: float = 2.0):
    """x → square → ReduceMean → Add eps → (Sqrt → Div | Sqrt → Reciprocal → Mul) → y."""
    nodes = []
    inits = [
        numpy_helper.from_array(np.array([-1], np.int64), "axes"),
        numpy_helper.from_array(np.float32(1e-6), "eps"),
        numpy_helper.from_array(np.float32(exponent), "e"),
    ]
    if square == "mul":
        nodes.append(helper.make_node("Mul", ["x", "x"], ["sq"], name="square"))
    else:
        nodes.append(helper.make_node("Pow", ["x", "e"], ["sq"], name="square"))
    nodes += [
        helper.make_node("ReduceMean", ["sq", "axes"], ["m"], name="mean"),
        helper.make_node("Add", ["m", "eps"], ["me"], name="add_eps"),
        helper.make_node("Sqrt", ["me"], ["s"], name="root"),
    ]
    if inverse == "div":
        nodes.append(helper.make_node("Div", ["x", "s"], ["y"], name="normalize"))
    else:
        nodes.append(helper.make_node("Reciprocal", ["s"], ["r"], name="inverse"))
        nodes.append(helper.make_node("Mul", ["x", "r"], ["y"], name="normalize"))
    return make_model(nodes, [vi("x", [4, 32])], [vi("y", [4, 32])], inits, opset=18)


@pytest.mark.parametrize("square,inverse", [("pow", "div"), ("mul", "div"), ("pow", "reciprocal")])
def test_norm_patterns_are_recognized_by_structure(square, inverse, ort_run):
    model = _norm_model(square, inverse)
    module = _fp16(model)
    ops = _ops_by_loc(module)
    assert all(op.result.type.dtype.name == "f32" for op in ops.values())
    x = {"x": (np.random.default_rng(0).standard_normal((4, 32)) * 600).astype(np.float32)}
    y = interpret(module, x)["y"]
    assert norm_max_err(y, ort_run(model, x)["y"]) < 2e-3


def test_a_cube_is_not_a_norm():
    ops = _ops_by_loc(_fp16(_norm_model("pow", "div", exponent=3.0)))
    assert all(op.result.type.dtype.name == "f16" for op in ops.values())


def test_written_out_layer_norm_variance_stays_f32():
    from mcpc.examples import decoder_block

    module = PassManager(build_pipeline("fold-constants,convert-precision{dtype=f16},dce")).run(
        import_onnx(decoder_block(hidden=64, heads=2), dims={"seq": 8})
    )
    pows = [op for op in module.main.ops if op.name == "mcp.pow"]
    assert len(pows) == 2 and all(op.result.type.dtype.name == "f32" for op in pows)


def test_bad_island_kinds_are_refused():
    with pytest.raises(UsageError, match="unknown f32 island kind 'norms'.*norm_stats, softmax_sum"):
        build_pipeline("convert-precision{islands=norms}")
    text = load_config("fp16").model_dump_json(by_alias=True)
    for bad, words in (('["norms"]', "unknown f32 island kind 'norms'"), ('"norm_stats"', "expected a list")):
        broken = text.replace('["norm_stats","softmax_sum"]', bad)
        with pytest.raises(ConfigError, match=rf"bad.yaml: precision.f32_islands: .*{words}"):
            parse_config(broken, "bad.yaml")


def test_an_island_reads_an_f32_only_op_without_a_round_trip_through_f16(f32_only_op):
    text = """module @m {
  func @main(%x: tensor<4x8xf32>) -> ("y": tensor<4x1xf32>) {
    %0 = test.f32_only %x : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %1 = mcp.constant {value = dense<[2.0]> : tensor<f32>} : () -> tensor<f32>
    %2 = mcp.pow %0, %1 : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
    %3 = mcp.reduce_mean %2 {axes = [-1], keepdims = true} : (tensor<4x8xf32>) -> tensor<4x1xf32>
    mcp.return %3 : (tensor<4x1xf32>) -> ()
  }
}
"""
    module = PassManager(build_pipeline("convert-precision{dtype=f16},dce")).run(parse_module(text))
    pow_op = next(op for op in module.main.ops if op.name == "mcp.pow")
    # its f32 result itself: a cast to f16 and back would turn values beyond 65504 into inf
    assert pow_op.operands[0].owner.name == "test.f32_only"
