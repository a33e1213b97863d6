"""ISA v2 additions in the simulator: round/silu, argmax, vtopk, salu, setq, gather dram_reg and
run-time extents (a row count from a register), each against numpy and the shared numerics."""

from __future__ import annotations

import numpy as np
import pytest
from simprog import build, loaded

from mcpc.arch import numerics as nx
from mcpc.arch.asm import parse_asm
from mcpc.arch.isa import ISA, LIVE, Instr
from mcpc.arch.target import load_target
from mcpc.errors import InputError
from mcpc.sim import execute, timing
from mcpc.sim.api import run_program
from mcpc.sim.execute import compile_instr
from mcpc.sim.machine import Machine

TARGET = load_target("mcp2026-edge")
RNG = np.random.default_rng(11)


def machine() -> Machine:
    return Machine(1 << 16, TARGET.sram.size_bytes)


def put(m: Machine, addr: int, arr: np.ndarray) -> None:
    raw = np.ascontiguousarray(arr).view(np.uint8).reshape(-1)
    m.sram[addr : addr + raw.size] = raw


def get(m: Machine, addr: int, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    dt = nx.NUMPY_DTYPES[dtype]
    n = int(np.prod(shape))
    return m.sram[addr : addr + n * dt.itemsize].view(dt).reshape(shape).copy()


def run(m: Machine, op: str, **fields) -> None:
    fn, args, _ = compile_instr(Instr(op, fields), TARGET)
    fn(m, args)


def test_every_live_spec_names_a_handler_and_a_cost():
    assert set(execute.COMPILERS) == set(LIVE) and set(timing.COSTS) == set(LIVE)
    for m in LIVE:
        assert execute.COMPILERS[m].__name__ == ISA[m].execute and timing.COSTS[m].__name__ == ISA[m].cost


def test_a_spec_without_its_handler_fails_to_resolve():
    from mcpc.arch.isa import resolve

    with pytest.raises(RuntimeError, match="without a execute function: .*vun"):
        resolve("execute", {k: v for k, v in vars(execute).items() if k != "compile_vun"})


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("func", ["round", "silu"])
def test_new_unary_functions_match_the_interpreter_numerics(func, dtype):
    x = (RNG.standard_normal((5, 12)) * 4).astype(np.float32)
    x[0, :6] = [0.5, 1.5, 2.5, -0.5, -2.5, -0.0]
    x = x.astype(nx.NUMPY_DTYPES[dtype])
    m = machine()
    put(m, 0, x)
    run(m, "vun", func=func, in_dtype=dtype, out_dtype=dtype, dst=0x1000, src=0, rows=5, cols=12,
        dst_stride=12, src_stride=12)  # fmt: skip
    got = get(m, 0x1000, (5, 12), dtype)
    want = nx.unary(func, x, dtype)
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))  # bit-exact
    x64 = x.astype(np.float64)
    ref = np.rint(x64) if func == "round" else x64 / (1 + np.exp(-x64))
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=1e-2 if dtype != "f32" else 1e-6, atol=1e-6)
    if func == "round":
        assert list(got[0, :6].astype(np.float32)) == [0, 2, 2, -0.0, -2, -0.0]
        assert np.signbit(got[0, 3]) and np.signbit(got[0, 5])


def test_argmax_takes_the_first_maximum_and_nan_wins():
    x = RNG.standard_normal((4, 9)).astype(np.float32)
    x[1, 2] = x[1, 6] = 50.0  # a tie: the first index
    x[2, 5] = np.nan
    m = machine()
    put(m, 0, x)
    run(m, "vred", func="argmax", in_dtype="f32", out_dtype="i32", dst=0x1000, src=0, rows=4, cols=9,
        src_stride=9)  # fmt: skip
    got = get(m, 0x1000, (4,), "i32")
    np.testing.assert_array_equal(got, np.argmax(x, axis=1))
    assert got[1] == 2 and got[2] == 5


def _topk_reference(x: np.ndarray, k: int, largest: bool) -> tuple[np.ndarray, np.ndarray]:
    vals, idxs = [], []
    for row in x.astype(np.float64):

        def key(j, row=row):
            v = row[j]
            if np.isnan(v):
                return (0 if largest else 1, 0.0, j)
            return (1 if largest else 0, -v if largest else v, j)

        order = sorted(range(len(row)), key=key)[:k]
        idxs.append(order)
        vals.append(x[len(vals)][order])
    return np.array(vals), np.array(idxs)


@pytest.mark.parametrize("dtype", ["f32", "f16", "i32", "i8"])
@pytest.mark.parametrize("largest", [1, 0])
def test_topk_values_and_indices_match_onnx_order(dtype, largest):
    rows, cols, k = 5, 13, 4
    if dtype.startswith("f"):
        x = RNG.integers(-3, 4, (rows, cols)).astype(np.float32)  # many ties
        x[0, 3] = np.nan
        x[1, 0] = -0.0
    else:
        x = RNG.integers(-100, 100, (rows, cols))
        x[2, :] = 7  # all equal: indices 0..k-1
    x = x.astype(nx.NUMPY_DTYPES[dtype])
    m = machine()
    put(m, 0, x)
    run(m, "vtopk", dtype=dtype, dst=0x1000, idx=0x2000, src=0, rows=rows, cols=cols, topk_k=k,
        src_stride=cols, dst_stride=k, idx_stride=k, largest=largest)  # fmt: skip
    vals, idx = get(m, 0x1000, (rows, k), dtype), get(m, 0x2000, (rows, k), "i32")
    want_vals, want_idx = _topk_reference(x, k, bool(largest))
    np.testing.assert_array_equal(idx, want_idx)
    np.testing.assert_array_equal(vals, want_vals.astype(vals.dtype))
    nv, ni = nx.topk(x, k, bool(largest), dtype)
    np.testing.assert_array_equal(vals.view(np.uint8), nv.view(np.uint8))
    np.testing.assert_array_equal(idx, ni)


def test_topk_k_larger_than_the_row_traps_and_costs_k_passes():
    fn, args, _ = compile_instr(Instr("vtopk", dict(dst=0x100, idx=0x200, rows=1, cols=3, topk_k=4)), TARGET)
    with pytest.raises(Exception, match="topk_k=4 of rows of 3"):
        fn(machine(), args)
    one = timing.instr_cost(Instr("vtopk", dict(rows=64, cols=64, topk_k=1)), TARGET)
    four = timing.instr_cost(Instr("vtopk", dict(rows=64, cols=64, topk_k=4)), TARGET)
    # k passes occupy the engine; the pipeline latency is paid once, after the last
    assert four.busy == 4 * one.busy and four.tail == one.tail == TARGET.vector.latency


@pytest.mark.parametrize(
    "func,a,b,want",
    [("add", 5, 7, 12), ("add", 2**31 - 1, 1, -(2**31)), ("sub", 3, 10, -7), ("mul", 65536, 65536, 0),
     ("mul", -3, 7, -21), ("min", -4, 2, -4), ("max", -4, 2, 2), ("eq", 3, 3, 1), ("ne", 3, 3, 0),
     ("lt", -1, 0, 1), ("le", 2, 2, 1), ("gt", 2, 2, 0), ("ge", 2, 2, 1)],
)  # fmt: skip
def test_salu_register_and_immediate_operands(func, a, b, want):
    m = machine()
    m.regs[2], m.regs[3] = a, b - 100
    run(m, "salu", func=func, rd=1, rs1=2, rs2=3, simm=100)  # second operand = r3 + simm
    assert m.regs[1] == want == nx.scalar_alu(func, a, b)
    run(m, "salu", func=func, rd=4, rs1=2, simm=b)  # rs2 = r0: an immediate
    assert m.regs[4] == want


def test_setq_sets_the_whole_qparam_group():
    m = machine()
    run(m, "setq", scale_a=0.5, scale_w=0.25, scale_o=2.0, zp_ptr=0x40, scale_ptr=0x80, group_size=32)
    assert m.qparams == (0.5, 0.25, 2.0, 0x40, 0x80, 32)
    assert timing.instr_cost(Instr("setq", {}), TARGET).busy == 1


def test_gather_table_base_offset_by_a_register():
    table = np.arange(64, dtype=np.float32).reshape(16, 4)
    m = machine()
    m.dram[0x100 : 0x100 + table.nbytes] = table.view(np.uint8).reshape(-1)
    put(m, 0, np.array([2, 0, 1], dtype=np.int32))
    m.regs[5] = 4 * 16  # the table starts at row 4 (16-byte rows)
    run(m, "gather", dram=0x100, dram_reg=5, sram_idx=0, count=3, row_bytes=16, dram_stride=16,
        sram=0x400, sram_stride=16, limit=4)  # fmt: skip
    np.testing.assert_array_equal(get(m, 0x400, (3, 4), "f32"), table[[6, 4, 5]])


# -- run-time extents -----------------------------------------------------------------------------
CAP, COLS = 256, 64
EXTENT = """
salu  func=min rd=1 rs1=2 simm={cap} signal=LD
load  dram={x} sram=0x0 rows={cap} row_bytes=256 dram_stride=256 sram_stride=256 rows_reg=1 wait=EX signal=EX
vun   func=exp in_dtype=f32 out_dtype=f32 dst=0x10000 src=0x0 rows={cap} cols=64 dst_stride=64 src_stride=64 rows_reg=1 wait=LD
vbini func=mul in_dtype=f32 out_dtype=f32 dst=0x10000 src0=0x10000 imm=0.5 rows={cap} cols=64 dst_stride=64 s0_stride=64 rows_reg=1
vred  func=sum in_dtype=f32 out_dtype=f32 dst=0x20000 src=0x10000 rows={cap} cols=64 src_stride=64 rows_reg=1
vred  func=argmax in_dtype=f32 out_dtype=i32 dst=0x20400 src=0x10000 rows={cap} cols=64 src_stride=64 rows_reg=1 signal=ST
store dram={y} sram=0x20000 rows=1 row_bytes={capb} dram_stride=0 sram_stride=0 wait=EX
store dram={z} sram=0x20400 rows=1 row_bytes={capb} dram_stride=0 sram_stride=0
halt
"""  # noqa: E501
EXTENT_IO = {
    "inputs": {"x": ("f32", (CAP, COLS))},
    "outputs": {"y": ("f32", (CAP,)), "z": ("i32", (CAP,))},
    "target": "mcp2026-edge",
}


def _extent_program():
    _, addrs = build("halt", **EXTENT_IO)
    text = EXTENT.format(cap=CAP, capb=CAP * 4, x=addrs["x"], y=addrs["y"], z=addrs["z"])
    return loaded(build(text, **EXTENT_IO)[0])


def test_one_program_follows_a_host_set_length():
    """The same binary at several lengths: numpy's results for the first L rows, nothing beyond,
    and cycles that grow with L (the work actually done)."""
    program = _extent_program()
    x = RNG.standard_normal((CAP, COLS)).astype(np.float32)
    cycles = []
    for length in (1, 40, 150, 256, 1000):
        res = run_program(program, {"x": x}, registers={2: length})
        n = min(length, CAP)
        want = (np.exp(x[:n].astype(np.float64)) * 0.5).astype(np.float32)
        np.testing.assert_allclose(res.outputs["y"][:n], want.sum(axis=1), rtol=1e-5)
        np.testing.assert_array_equal(res.outputs["z"][:n], np.argmax(want, axis=1))
        assert not res.outputs["y"][n:].any() and not res.outputs["z"][n:].any()
        assert res.profile["dram_read_bytes"] == n * COLS * 4
        cycles.append(res.profile["cycles"])
    assert cycles[0] < cycles[1] < cycles[2] < cycles[3] == cycles[4]  # 1000 is clamped to the capacity


def test_the_extent_register_is_ordered_by_tokens():
    """r1 is written on EX and read by the load on LD: the hazard checker demands the token."""
    from mcpc.backend.hazards import ScheduleError, check_hazards

    _, addrs = build("halt", **EXTENT_IO)
    text = EXTENT.format(cap=CAP, capb=CAP * 4, x=addrs["x"], y=addrs["y"], z=addrs["z"])
    check_hazards(parse_asm(text), regs=[0, None, None] + [0] * 13)
    racy = text.replace("simm=256 signal=LD", "simm=256").replace(
        "rows_reg=1 wait=EX signal=EX", "rows_reg=1 signal=EX"
    )
    with pytest.raises(ScheduleError, match="race: #0 salu .* #1 load .* reg r1"):
        check_hazards(parse_asm(racy), regs=[0, None, None] + [0] * 13)


def test_an_extent_costs_exactly_what_the_same_instruction_with_that_count_costs():
    program = _extent_program()
    x = np.ones((CAP, COLS), np.float32)
    for length in (5, 33):
        dyn = run_program(program, {"x": x}, registers={2: length}).profile
        _, addrs = build("halt", **EXTENT_IO)
        fixed = EXTENT.replace("rows={cap} ", f"rows={length} ").replace(" rows_reg=1", "")
        text = fixed.format(cap=CAP, capb=CAP * 4, x=addrs["x"], y=addrs["y"], z=addrs["z"])
        static = run_program(loaded(build(text, **EXTENT_IO)[0]), {"x": x}, registers={2: length}).profile
        assert dyn["cycles"] == static["cycles"]
        assert dyn["engines"] == static["engines"]


def test_negative_length_does_nothing_and_bad_registers_are_refused():
    program = _extent_program()
    res = run_program(program, {"x": np.ones((CAP, COLS), np.float32)}, registers={2: -5})
    assert not res.outputs["y"].any()
    with pytest.raises(InputError, match="r0"):
        run_program(program, {"x": np.ones((CAP, COLS), np.float32)}, registers={0: 1})


def test_extent_text_round_trips():
    text = "load dram=0x40 sram=0x0 rows=8 row_bytes=4 rows_reg=3\nsalu func=ge rd=2 rs1=1 rs2=4 simm=-7\n"
    instrs = parse_asm(text)
    assert instrs[0].rows_reg == 3 and instrs[1].simm == -7 and instrs[1].func == "ge"


def test_matmul_rows_and_gather_count_from_registers():
    """m_reg and count_reg: the product and the gather cover only the rows the register names."""
    a = RNG.standard_normal((8, 16)).astype(np.float32)
    b = RNG.standard_normal((16, 8)).astype(np.float32)
    m = machine()
    put(m, 0, a)
    put(m, 0x1000, b)
    put(m, 0x3000, np.full((8, 8), 7.0, np.float32))
    m.regs[3] = 5
    from mcpc.sim.timing import instr_cost

    mm = Instr("matmul", dict(a=0, b=0x1000, c=0x3000, m=8, n=8, k=16, a_stride=16, b_stride=8, c_stride=8,
                              m_reg=3))  # fmt: skip
    assert execute.extent_register(mm) == 3
    ext_fn, ext_args = execute.compile_extent(mm, TARGET, instr_cost, None)
    ext_fn(m, ext_args)
    c = get(m, 0x3000, (8, 8), "f32")
    np.testing.assert_array_equal(c[:5], nx.matmul_tile(a[:5], b))
    assert (c[5:] == 7.0).all()
    assert ext_args[-1][0] == instr_cost(Instr("matmul", dict(m=5, n=8, k=16)), TARGET)

    table = np.arange(32, dtype=np.float32).reshape(8, 4)
    m.dram[: table.nbytes] = table.view(np.uint8).reshape(-1)
    put(m, 0x5000, np.array([3, 1, 6, 2], dtype=np.int32))
    put(m, 0x6000, np.zeros((4, 4), np.float32))
    m.regs[4] = 2
    gather = Instr("gather", dict(dram=0, sram_idx=0x5000, count=4, row_bytes=16, dram_stride=16, sram=0x6000,
                                  sram_stride=16, limit=8, count_reg=4))  # fmt: skip
    g_fn, g_args = execute.compile_extent(gather, TARGET, instr_cost, None)
    g_fn(m, g_args)
    got = get(m, 0x6000, (4, 4), "f32")
    np.testing.assert_array_equal(got[:2], table[[3, 1]])
    assert not got[2:].any()
    assert g_args[-1][0].dram_read == 2 * 16


def test_every_twin_names_a_numerics_kernel():
    import re

    for m in LIVE:
        for name in re.findall(r"numerics\.(\w+)", ISA[m].twin):
            assert callable(getattr(nx, name, None)), (m, name)
