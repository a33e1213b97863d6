"""Program state in the IR: globals, host registers, offset load/store; text, verifier, interpreter."""

import numpy as np
import pytest

from mcpc.errors import InputError, VerifyError
from mcpc.ir import parse_module, print_module
from mcpc.ir.interpreter import ModuleState, interpret
from mcpc.passes import PassContext, PassManager, build_pipeline, load_all_passes

RING = """module @ring {
  global @buf : tensor<8x4xf32>
  host_reg @pos {max = 7, min = 0}
  func @append(%row: tensor<1x4xf32>) -> ("total": tensor<1x4xf32>, "last": tensor<1x4xf32>) {
    %0 = mcp.host_reg {name = "pos"} : () -> tensor<i32>
    mcp.global_store %row, %0 {global = "buf"} : (tensor<1x4xf32>, tensor<i32>) -> ()
    %1 = mcp.constant {value = dense<[0]> : tensor<i32>} : () -> tensor<i32>
    %2 = mcp.global_load %1 {global = "buf"} : (tensor<i32>) -> tensor<8x4xf32>
    %3 = mcp.reduce_sum %2 {axes = [0], keepdims = true} : (tensor<8x4xf32>) -> tensor<1x4xf32>
    %4 = mcp.scalar %0 {func = "max", imm = 1} : (tensor<i32>) -> tensor<i32>
    %5 = mcp.scalar %4 {func = "sub", imm = 1} : (tensor<i32>) -> tensor<i32>
    %6 = mcp.global_load %5 {global = "buf"} : (tensor<i32>) -> tensor<1x4xf32>
    mcp.return %3, %6 : (tensor<1x4xf32>, tensor<1x4xf32>) -> ()
  }
}
"""


def test_state_text_round_trips():
    module = parse_module(RING)
    assert print_module(module) == RING
    assert print_module(parse_module(print_module(module))) == RING
    assert module.globals["buf"].type.shape == (8, 4)
    assert (module.host_regs["pos"].min, module.host_regs["pos"].max) == (0, 7)


def test_interpreter_keeps_globals_between_runs_and_matches_numpy():
    module = parse_module(RING)
    state, ref = ModuleState(module), np.zeros((8, 4), np.float32)
    rng = np.random.default_rng(0)
    for step in range(19):  # more than the capacity: the ring wraps twice
        row = rng.integers(-50, 50, (1, 4)).astype(np.float32)  # exact sums in any order
        pos = step % 8
        out = interpret(module, {"row": row}, "append", state, {"pos": pos})
        ref[pos] = row[0]
        np.testing.assert_array_equal(out["total"], ref.sum(axis=0, keepdims=True, dtype=np.float32))
        np.testing.assert_array_equal(out["last"], ref[max(pos, 1) - 1 : max(pos, 1)])
    state.reset()
    assert not state.globals["buf"].any()


def test_registers_are_checked_by_name_and_range():
    module = parse_module(RING)
    row = np.zeros((1, 4), np.float32)
    with pytest.raises(InputError, match="not set"):
        interpret(module, {"row": row}, "append")
    with pytest.raises(InputError, match=r"outside its declared range \[0, 7\]"):
        interpret(module, {"row": row}, "append", registers={"pos": 8})
    with pytest.raises(InputError, match="unknown host register"):
        interpret(module, {"row": row}, "append", registers={"pos": 1, "nope": 2})


@pytest.mark.parametrize(
    "edit, message",
    [
        ("{max = 7, min = 0}", None),
        ("{max = 8, min = 0}", r"can reach outside global @buf"),
        ("{max = 7, min = -1}", r"can reach outside global @buf"),
        ("{max = 7, min = 9}", r"must be non-empty"),
    ],
)
def test_verifier_proves_offsets_inside_the_buffer(edit, message):
    text = RING.replace("{max = 7, min = 0}", edit)
    if message is None:
        parse_module(text)
    else:
        with pytest.raises(VerifyError, match=message):
            parse_module(text)


def test_verifier_names_undeclared_state_and_bad_types():
    with pytest.raises(VerifyError, match="no global @other"):
        store = '{global = "buf"} : (tensor<1x4xf32>, tensor<i32>)'
        parse_module(RING.replace(store, store.replace("buf", "other")))
    with pytest.raises(VerifyError, match="no host register @len"):
        parse_module(RING.replace('{name = "pos"}', '{name = "len"}'))
    with pytest.raises(VerifyError, match="not a row block of global @buf"):
        parse_module(RING.replace("global @buf : tensor<8x4xf32>", "global @buf : tensor<8x5xf32>"))
    wraps = RING.replace('{func = "max", imm = 1}', '{func = "mul", imm = 2147483647}')
    with pytest.raises(VerifyError, match="can leave s32"):
        parse_module(wraps)


def test_passes_keep_the_store_and_do_not_fold_state():
    module = parse_module(RING)
    load_all_passes()
    pm = PassManager(build_pipeline("fold-constants,dce"))
    module = pm.run(module, PassContext())
    names = [op.name for op in module.functions["append"].ops]
    assert "mcp.global_store" in names and names.count("mcp.global_load") == 2
