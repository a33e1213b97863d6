"""mcp.matmul lowering and the tile-matmul pass: bit-exact with the interpreter, and the timing
physics (compute-bound near peak MACs, M = 1 near DRAM bandwidth, double buffering pays)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mcpc.arch.target import load_target
from mcpc.backend import compile_to_program
from mcpc.backend.schedule import check_hazards
from mcpc.errors import PassError
from mcpc.ir import DTYPES, Function, Module, TensorType
from mcpc.ir.interpreter import interpret
from mcpc.ir.ops import MatMulOp, ReturnOp
from mcpc.passes import PassContext, load_all_passes
from mcpc.passes.tile_matmul import TileMatmulPass, choose_tile, slot_bytes
from mcpc.sim.api import from_program, run_program

TARGETS = ("mcp2026-a100", "mcp2026-a10", "mcp2026-edge")


def matmul_module(a_shape, b_shape, dtype="f32", out=None, trans_b=False, tile=None) -> Module:
    d = DTYPES[dtype]
    f = Function("main", [TensorType(a_shape, d), TensorType(b_shape, d)], ["a", "b"])
    attrs = {"trans_b": trans_b, "out": DTYPES[out or dtype]}
    if tile is not None:
        attrs["tile"] = list(tile)
    mm = f.append(MatMulOp(f.args, attrs, loc="mm"))
    f.append(ReturnOp([mm.result]))
    f.result_names = ["y"]
    m = Module("t")
    m.add_function(f)
    m.verify()
    return m


def inputs_for(module: Module, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        a.name: rng.standard_normal(a.type.shape, dtype=np.float32).astype(a.type.dtype.np_dtype)
        for a in module.main.args
    }


def run(module: Module, target, double_buffer=True, inputs=None):
    prog = compile_to_program(module, target, {"double_buffer": double_buffer})
    inputs = inputs if inputs is not None else inputs_for(module)
    res = run_program(from_program(prog), inputs)
    return prog, res, inputs


def assert_bit_exact(module, target, double_buffer=True):
    prog, res, inputs = run(module, target, double_buffer)
    ref = interpret(module, inputs)["y"]
    got = res.outputs["y"]
    assert got.dtype == ref.dtype and got.shape == ref.shape
    assert np.array_equal(got.view(np.uint8), ref.view(np.uint8)), "not bit-exact with the interpreter"
    return prog, res


CASES = [
    # a shape, b shape, dtype, out, trans_b, tile
    ((5, 7), (7, 3), "f32", None, False, None),
    ((33, 70), (70, 45), "f32", None, False, (16, 32, 24)),  # ragged tiles, 3 K steps
    ((2, 33, 70), (45, 70), "f16", "f32", True, (16, 32, 24)),  # broadcast B, trans_b, f16 in f32 out
    ((3, 1, 9, 20), (2, 20, 6), "f16", None, False, (4, 4, 8)),  # broadcast both, f16 out via vun copy
    ((1, 64), (64, 130), "bf16", None, False, (1, 64, 16)),  # M = 1
    ((2, 3, 40, 16), (2, 3, 24, 16), "f32", "f16", True, (0, 0, 0)),  # whole dims, f32 in f16 out
]


@pytest.mark.parametrize("double_buffer", [True, False])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}-{c[2]}-{c[5]}")
def test_matmul_bit_exact_with_interpreter(case, double_buffer):
    a, b, dt, out, trans_b, tile = case
    prog, _ = assert_bit_exact(
        matmul_module(a, b, dt, out, trans_b, tile), load_target("mcp2026-edge"), double_buffer
    )
    check_hazards(prog.instructions()[:-1])  # every SRAM/DRAM conflict ordered by tokens


@pytest.mark.parametrize("target_name", TARGETS)
def test_tiled_by_the_pass_bit_exact_on_every_target(target_name):
    target = load_target(target_name)
    m = matmul_module((2, 300, 520), (520, 200), "f16", "f16")
    TileMatmulPass().apply(m, PassContext(target=target))
    tile = m.main.ops[0].attrs["tile"]
    assert len(tile) == 3 and all(t >= 1 for t in tile)
    prog, res = assert_bit_exact(m, target)
    assert prog.memory_map["sram_peak_bytes"] <= target.sram.size_bytes
    assert res.profile["peak_sram_bytes"] <= target.sram.size_bytes


@pytest.mark.parametrize("target_name", TARGETS)
@pytest.mark.parametrize("shape", [(1, 8192, 8192), (4096, 4096, 4096), (77, 3000, 1000), (8, 64, 50000)])
def test_pass_tiles_fit_sram_and_are_deterministic(target_name, shape):
    target = load_target(target_name)
    m, n, k = shape
    for dt, out in (("f16", "f16"), ("f32", "f32"), ("f16", "f32")):
        tile = choose_tile(1, m, n, k, dt, out, target)
        assert tile == choose_tile(1, m, n, k, dt, out, target)
        assert all(1 <= t <= min(d, 65535) for t, d in zip(tile, (m, n, k), strict=True))
        assert slot_bytes(*tile, dt, out, target.sram.bank_bytes) <= target.sram.size_bytes


def test_pass_is_registered_and_needs_a_target():
    from mcpc.passes import REGISTRY

    load_all_passes()
    assert REGISTRY.get("tile-matmul") is TileMatmulPass
    with pytest.raises(PassError, match="tile-matmul needs a target"):
        TileMatmulPass().apply(matmul_module((4, 4), (4, 4)), PassContext())


def test_untiled_matmul_too_big_for_sram_names_the_op():
    target = load_target("mcp2026-edge")
    m = matmul_module((1024, 1024), (1024, 1024))
    with pytest.raises(PassError, match=r"mcp.matmul \(ONNX node 'mm'\).*run the tile-matmul pass"):
        compile_to_program(m, target)


def test_instruction_stream_follows_the_tile():
    target = load_target("mcp2026-edge")
    m = matmul_module((40, 50), (50, 30), tile=(16, 32, 20))
    prog = compile_to_program(m, target)
    mm = [i for i in prog.instructions() if i.op == "matmul"]
    assert len(mm) == math.ceil(40 / 16) * math.ceil(30 / 32) * math.ceil(50 / 20)
    assert [i.acc for i in mm[:3]] == [0, 1, 1] and [i.k for i in mm[:3]] == [20, 20, 10]
    assert {d["onnx_node"] for d in prog.debug[:-1]} == {"mm"}


# -- timing physics ---------------------------------------------------------------------------------
def efficiency(target_name, shape, dtype="f16", double_buffer=True):
    target = load_target(target_name)
    m, n, k = shape
    mod = matmul_module((m, k), (k, n), dtype)
    TileMatmulPass().apply(mod, PassContext(target=target))
    _, res, _ = run(mod, target, double_buffer)
    p = res.profile
    macs = m * n * k / p["cycles"] / target.macs_per_cycle_for(dtype)
    dram = (p["dram_read_bytes"] + p["dram_write_bytes"]) / p["cycles"] / target.dram_bytes_per_cycle
    return macs, dram, p


# Square sizes that are multiples of each target's array (rows x cols); a dim that is not (4096 on
# an array 864 columns wide) also pays for the partly filled last column of tiles.
SQUARE = {"mcp2026-a100": 3456, "mcp2026-a10": 2304, "mcp2026-edge": 2048}


@pytest.mark.parametrize(
    "target_name",
    ["mcp2026-a100", "mcp2026-a10", pytest.param("mcp2026-edge", marks=pytest.mark.slow)],
)
def test_large_square_matmul_is_compute_bound_near_peak(target_name):
    s = SQUARE[target_name]
    macs, dram, p = efficiency(target_name, (s, s, s))
    assert macs >= 0.90, f"{macs:.3f} of peak MACs"
    assert p["engines"]["EX"]["busy"] >= 0.9 * p["cycles"]


# One-row matmuls streaming enough weights that the first load and the last compute (which
# nothing overlaps: 992 + 5 x 864-column passes on a100) are small against the stream.
ONE_ROW = {"mcp2026-a100": (1, 8192, 8192), "mcp2026-a10": (1, 8192, 4096), "mcp2026-edge": (1, 8192, 4096)}


@pytest.mark.parametrize("target_name", TARGETS)
def test_one_row_matmul_is_dram_bound_near_bandwidth(target_name):
    macs, dram, _ = efficiency(target_name, ONE_ROW[target_name])
    assert dram >= 0.90, f"{dram:.3f} of DRAM bandwidth"
    assert macs < 0.05


@pytest.mark.parametrize("target_name", TARGETS)
def test_double_buffering_off_adds_cycles(target_name):
    _, _, on = efficiency(target_name, (256, 1024, 2048))
    _, _, off = efficiency(target_name, (256, 1024, 2048), double_buffer=False)
    assert off["cycles"] > on["cycles"] * 1.1


def test_pass_option_turns_double_buffering_off_without_changing_bits():
    from mcpc.passes import build_pipeline

    target = load_target("mcp2026-a10")
    runs = []
    for text in ("tile-matmul,npu-schedule", "tile-matmul,npu-schedule{double-buffer=false}"):
        mod = matmul_module((256, 1024), (1024, 512), "f16")
        for p in build_pipeline(text):
            p.apply(mod, PassContext(target=target))
        prog, res, _ = run(mod, target, double_buffer=None)  # None: follow the module attribute
        runs.append((mod.main.ops[0].attrs["tile"], prog.meta["double_buffer"], res))
    (tile_on, db_on, on), (tile_off, db_off, off) = runs
    assert tile_on == tile_off and (db_on, db_off) == (True, False)
    assert off.profile["cycles"] > on.profile["cycles"]
    assert np.array_equal(on.outputs["y"].view(np.uint8), off.outputs["y"].view(np.uint8))


def test_few_row_matmul_loads_all_its_tiles_ahead():
    """A one-row matmul cut into 12 tiles whose slots all fit gets one input slot per step: no load
    waits for a compute to hand its slot back, and the bits stay; with more rows, or a scratchpad
    too small for all its tiles, it keeps two slots (the loads of step r + 2 wait for step r)."""
    from mcpc.arch.isa import decode_program

    def slot_waits(prog) -> int:
        return sum(x.op == "load" and bool(x.wait) for x in decode_program(prog.text))

    t = load_target("mcp2026-a100")
    prog, _ = assert_bit_exact(matmul_module((1, 256), (256, 192), "f16", tile=(1, 64, 64)), t)
    assert slot_waits(prog) == 0
    rows = matmul_module((32, 256), (256, 192), "f16", tile=(32, 64, 64))  # beyond stream_max_rows
    prog, _ = assert_bit_exact(rows, t)
    assert slot_waits(prog) == 12 - 2
    small = load_target("mcp2026-a100", ["sram.size_bytes=262144"])  # half of it holds 3 of 6 tiles
    prog, _ = assert_bit_exact(matmul_module((1, 1024), (1024, 192), "f16", tile=(1, 192, 192)), small)
    assert slot_waits(prog) == 6 - 2


@pytest.mark.parametrize(("dtype", "trans_b"), [("f16", False), ("bf16", True), ("f32", False)])
def test_batched_rows_against_one_weight_read_it_once(dtype, trans_b):
    """[4, 8, K] x [K, N] (one weight matrix): the 32 rows of all batches form M, so the kernel
    reads the weight's bytes once (not once per batch), bit-exact with the interpreter."""
    k, n = 256, 384
    module = matmul_module((4, 8, k), (n, k) if trans_b else (k, n), dtype, trans_b=trans_b)
    ctx = PassContext(target=load_target("mcp2026-a100"))
    module = TileMatmulPass().apply(module, ctx)
    tm = module.main.ops[0].attrs["tile"][0]
    assert tm > 8, "the tile's rows run over the batches"
    prog, res = assert_bit_exact(module, load_target("mcp2026-a100"))
    es = DTYPES[dtype].bits // 8
    a_bytes, w_bytes = 4 * 8 * k * es, k * n * es
    tile_n = module.main.ops[0].attrs["tile"][1]
    row_tiles = -(-32 // tm)
    # A is read once per column tile, the weight once per row tile (one here): never 4x the weight
    assert res.profile["dram_read_bytes"] == a_bytes * -(-n // tile_n) + w_bytes * row_tiles
    assert row_tiles == 1 and res.profile["dram_read_bytes"] < 2 * w_bytes
