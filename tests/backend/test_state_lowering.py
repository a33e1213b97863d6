"""Lowering of program state: the register kernel, register-offset DMA, hazards per region."""

import numpy as np
import pytest

import mcpc
from mcpc.arch.isa import N_REGS
from mcpc.backend.compile import persistent_ranges
from mcpc.backend.hazards import ScheduleError, check_hazards
from mcpc.errors import UnsupportedError
from mcpc.ir import parse_module
from mcpc.ir.printer import format_tensor
from mcpc.sim import Session, fastpath

W = np.random.default_rng(0).integers(-3, 4, (64, 64)).astype(np.float32)
STEP = f"""module @kv {{
  global @cache : tensor<16x64xf32>
  host_reg @pos {{max = 15, min = 0}}
  func @step(%x: tensor<1x64xf32>) -> ("y": tensor<1x64xf32>, "cached": tensor<16x64xf32>) {{
    %0 = mcp.host_reg {{name = "pos"}} : () -> tensor<i32>
    mcp.global_store %x, %0 {{global = "cache"}} : (tensor<1x64xf32>, tensor<i32>) -> ()
    %1 = mcp.constant {{value = {format_tensor(W)}}} : () -> tensor<64x64xf32>
    %2 = mcp.matmul %x, %1 {{out = f32}} : (tensor<1x64xf32>, tensor<64x64xf32>) -> tensor<1x64xf32>
    %3 = mcp.constant {{value = dense<[0]> : tensor<i32>}} : () -> tensor<i32>
    %4 = mcp.global_load %3 {{global = "cache"}} : (tensor<i32>) -> tensor<16x64xf32>
    mcp.return %2, %4 : (tensor<1x64xf32>, tensor<16x64xf32>) -> ()
  }}
}}
"""


@pytest.fixture(scope="module")
def step():
    return mcpc.compile(parse_module(STEP), qat_config="fp32").program


def test_weight_loads_do_not_wait_for_a_store_into_a_persistent_buffer(step):
    instrs = step.instructions()[:-1]
    regions = persistent_ranges(step.memory_map["regions"])
    (cache,) = regions
    regs = [None if r == 1 else 0 for r in range(N_REGS)]
    kv_store = next(i for i, x in enumerate(instrs) if x.op == "store" and x.fields["dram_reg"])
    weight_load = next(
        i
        for i, x in enumerate(instrs)
        if x.op == "load" and x.fields["dram"] < len(step.constants) and i > kv_store
    )
    assert instrs[weight_load].wait == 0  # prefetched: the store's region is not the weights'
    check_hazards(instrs, regs=regs, regions=regions)  # every conflict inside the region ordered
    with pytest.raises(ScheduleError, match="race"):  # the all-of-DRAM model would order them
        check_hazards(instrs, regs=regs)
    reload = next(i for i, x in enumerate(instrs) if x.op == "load" and x.fields["dram_reg"])
    assert cache[0] <= instrs[reload].fields["dram"] < cache[1]


def test_the_register_kernel_comes_first_and_writes_each_register_once(step):
    instrs = step.instructions()
    head = [x for x in instrs if x.op in ("setr", "salu")]
    assert instrs[: len(head)] == head  # the entry's register kernel
    written = [x.fields.get("rd") or x.fields.get("reg") for x in head]
    assert len(written) == len(set(written)) and 1 not in written  # r1 is the host register


def test_the_program_computes_what_numpy_does(step):
    session = Session(step)
    rng = np.random.default_rng(2)
    cache = np.zeros((16, 64), np.float32)
    for pos in (3, 15, 0, 3):
        x = rng.integers(-3, 4, (1, 64)).astype(np.float32)
        out = session.run({"x": x}, registers={"pos": pos})
        cache[pos] = x
        np.testing.assert_array_equal(out["y"], x @ W)
        np.testing.assert_array_equal(out["cached"], cache)
    # from the second run on, the session runs fastpath's plan (weights prepared once)
    assert fastpath.state(session.program).plans["step"] is not None


def test_too_many_scalar_registers_are_refused():
    ops = "\n".join(
        f'    %{i + 1} = mcp.scalar %{i} {{func = "add", imm = 0}} : (tensor<i32>) -> tensor<i32>'
        for i in range(16)
    )
    text = f"""module @m {{
  global @g : tensor<4xf32>
  host_reg @p {{max = 0, min = 0}}
  func @main() -> ("y": tensor<1xf32>) {{
    %0 = mcp.host_reg {{name = "p"}} : () -> tensor<i32>
{ops}
    %17 = mcp.global_load %16 {{global = "g"}} : (tensor<i32>) -> tensor<1xf32>
    mcp.return %17 : (tensor<1xf32>) -> ()
  }}
}}
"""
    with pytest.raises(UnsupportedError, match="more than 15 scalar registers"):
        mcpc.compile(parse_module(text), qat_config="fp32")


def test_a_host_register_used_as_data_is_refused_not_read_as_zeros():
    text = """module @m {
  host_reg @p {max = 3, min = 0}
  func @main() -> ("y": tensor<i32>) {
    %0 = mcp.host_reg {name = "p"} : () -> tensor<i32>
    %1 = mcp.add %0, %0 : (tensor<i32>, tensor<i32>) -> tensor<i32>
    mcp.return %1 : (tensor<i32>) -> ()
  }
}
"""
    with pytest.raises(UnsupportedError, match="only mcp.scalar and the offsets"):
        mcpc.compile(parse_module(text), qat_config="fp32")


def test_accesses_at_one_offset_share_their_byte_offset_register():
    """Thirty layers' K and V rows written at one position take one register, not sixty."""
    stores = "\n".join(
        f'    mcp.global_store %x, %0 {{global = "{kv}{i}"}} : (tensor<1x8xf16>, tensor<i32>) -> ()'
        for i in range(30)
        for kv in "kv"
    )
    globals_ = "\n".join(f"  global @{kv}{i} : tensor<64x8xf16>" for i in range(30) for kv in "kv")
    text = f"""module @m {{
{globals_}
  host_reg @pos {{max = 63, min = 0}}
  func @decode(%x: tensor<1x8xf16>) -> () {{
    %0 = mcp.host_reg {{name = "pos"}} : () -> tensor<i32>
{stores}
    mcp.return : () -> ()
  }}
}}
"""
    program = mcpc.compile(parse_module(text), qat_config="fp32").program
    head = [i for i in program.instructions() if i.op in ("setr", "salu")]
    assert len(head) == 1
    session = Session(program)
    x = np.arange(8, dtype=np.float16)[None]
    session.run({"x": x}, registers={"pos": 63})
    np.testing.assert_array_equal(session.persistent_buffer("v29")[63], x[0])
