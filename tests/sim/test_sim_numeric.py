"""Numeric guards: per instruction, NaNs produced and overflows (finite operands, infinite result)
are counted and attributed to the ONNX node; infinities that come from infinite operands (a -inf
mask) are not; a non-finite output is always reported; in-place ops are judged on their operands
as they were."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner
from simprog import IO, add_program, build, loaded

from mcpc.arch.mcpb import write_mcpb
from mcpc.sim.api import run_program
from mcpc.sim.cli import sim_group
from mcpc.sim.numeric import all_finite, message


def _numeric(program, x):
    return run_program(loaded(program), {"x": x}).profile["numeric"]


def _full(value, shape=(4, 8)):
    return np.full(shape, value, np.float32)


def test_clean_run_reports_nothing():
    num = _numeric(add_program(), _full(0.5))
    assert num == {
        "clean": True,
        "nans_produced": 0,
        "overflows": 0,
        "faulty_instructions": 0,
        "first": None,
        "nodes": [],
        "outputs": [],
    }
    assert message(num) is None


def test_overflow_is_counted_at_the_instruction_and_node():
    # y = exp(x + x) in f16: exp(20) = 4.9e8 > 65504 overflows in the vun (instruction 2, node n2)
    x = _full(1.0)
    x[0, :3] = 10.0
    num = _numeric(add_program(), x)
    assert num["overflows"] == 3 and num["nans_produced"] == 0 and not num["clean"]
    assert num["first"]["index"] == 2 and num["first"]["node"] == "n2" and num["first"]["mnemonic"] == "vun"
    assert num["nodes"] == [{"node": "n2", "op_type": "Test", "nans": 0, "overflows": 3, "instructions": 1}]
    assert num["outputs"] == [{"name": "y", "nans": 0, "infs": 3}]
    text = message(num)
    assert "instruction 2" in text and "ONNX node n2" in text and "3 overflow(s)" in text
    assert "output 'y' holds 0 NaN(s) and 3 infinite value(s)" in text


def test_minus_inf_from_a_minus_inf_operand_is_no_overflow():
    x = _full(1.0)
    x[:, 0] = -np.inf  # a masked position: x + x = -inf, exp(-inf) = 0
    num = _numeric(add_program(), x)
    assert num["clean"], num


def test_an_infinite_input_is_reported_in_the_output_only():
    x = _full(1.0)
    x[1, 1] = np.inf
    num = _numeric(add_program(), x)
    assert num["overflows"] == 0 and num["nans_produced"] == 0 and num["first"] is None
    assert num["outputs"] == [{"name": "y", "nans": 0, "infs": 1}] and not num["clean"]


SQRT = """
load dram={x} sram=0x0 rows=4 row_bytes=32 dram_stride=32 sram_stride=32 signal=EX
vun func=sqrt in_dtype=f32 out_dtype=f32 dst=0x100 src=0x0 rows=4 cols=8 dst_stride=8 src_stride=8 wait=LD
vbin func=sub in_dtype=f32 out_dtype=f32 dst=0x200 src0=0x100 src1=0x100 rows=4 cols=8 dst_stride=8 s0_stride=8 s1_stride=8
vun func=copy in_dtype=f32 out_dtype=f16 dst=0x300 src=0x200 rows=4 cols=8 dst_stride=8 src_stride=8 signal=ST
store dram={y} sram=0x300 rows=4 row_bytes=16 dram_stride=16 sram_stride=16 wait=EX
halt
"""  # noqa: E501


def _program(code: str, io=IO, **kw):
    _, addrs = build("halt", **io)
    return build(code.format(**{k: v for k, v in addrs.items() if k in ("x", "y")}), **io, **kw)[0]


def test_nans_are_counted_where_produced_not_where_propagated():
    x = _full(4.0)
    x[2, :5] = -1.0  # sqrt(-1) = NaN at instruction 1; the sub and the cast only propagate it
    x[3, 0] = np.inf  # sqrt(inf) = inf (from inf), then inf - inf = NaN: produced at instruction 2
    num = _numeric(_program(SQRT), x)
    assert num["first"]["index"] == 1 and num["first"]["nans"] == 5
    assert [(n["node"], n["nans"], n["overflows"]) for n in num["nodes"]] == [("n1", 5, 0), ("n2", 1, 0)]
    assert num["nans_produced"] == 6 and num["outputs"] == [{"name": "y", "nans": 6, "infs": 0}]


IN_PLACE = """
load dram={x} sram=0x0 rows=4 row_bytes=32 dram_stride=32 sram_stride=32 signal=EX
vbin func=add in_dtype=f32 out_dtype=f32 dst=0x0 src0=0x0 src1=0x0 rows=4 cols=8 dst_stride=8 s0_stride=8 s1_stride=8 wait=LD
vun func=copy in_dtype=f32 out_dtype=f16 dst=0x300 src=0x0 rows=4 cols=8 dst_stride=8 src_stride=8 signal=ST
store dram={y} sram=0x300 rows=4 row_bytes=16 dram_stride=16 sram_stride=16 wait=EX
halt
"""  # noqa: E501


def test_in_place_ops_are_judged_on_their_operands_as_they_were():
    x = _full(1.0)
    x[0, 0] = 3e38  # 3e38 + 3e38 overflows f32: the destination overwrote its operand
    x[1, 0] = -np.inf  # -inf + -inf: from an infinite operand
    x[2, 0] = 40000.0  # 80000 fits f32, the cast to f16 overflows (instruction 2)
    num = _numeric(_program(IN_PLACE), x)
    assert [(n["node"], n["overflows"]) for n in num["nodes"]] == [("n1", 1), ("n2", 1)]


MATMUL = """
load dram={x} sram=0x0 rows=4 row_bytes=32 dram_stride=32 sram_stride=32 signal=EX
matmul a=0x0 b=0x0 c=0x400 m=4 n=4 k=8 a_stride=8 b_stride=8 c_stride=4 in_dtype=f32 acc=0 trans_b=1 wait=LD
vun func=copy in_dtype=f32 out_dtype=f16 dst=0x300 src=0x400 rows=4 cols=4 dst_stride=4 src_stride=4 signal=ST
store dram={y} sram=0x300 rows=4 row_bytes=8 dram_stride=8 sram_stride=8 wait=EX
halt
"""  # noqa: E501


def test_matmul_overflow_rows_and_columns():
    io = {"inputs": {"x": ("f32", (4, 8))}, "outputs": {"y": ("f16", (4, 4))}}
    x = _full(1.0)
    x[0, :] = 1e20  # row 0 · row 0 = 8e40: overflow of the f32 accumulation at C[0, 0] only
    x[3, 0] = np.inf  # row 3 and column 3 of C come from an infinite operand
    num = _numeric(_program(MATMUL, io), x)
    assert num["nodes"][0]["node"] == "n1" and num["nodes"][0]["overflows"] == 1
    # C[0, 1] = 8e20 fits f32 and overflows the f16 cast (with C[0, 2], C[1, 0], C[2, 0])
    assert num["nodes"][1]["node"] == "n2" and num["nodes"][1]["overflows"] == 4


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, np.float32])
def test_all_finite_on_bits_matches_isfinite(dtype):
    rng = np.random.default_rng(0)
    vals = rng.standard_normal(64).astype(np.float32) * 100
    for bad in (None, np.nan, np.inf, -np.inf):
        a = vals.astype(dtype)
        if bad is not None:
            a[17] = bad
        assert all_finite(a) == bool(np.isfinite(a.astype(np.float32)).all())
        assert all_finite(a[::3]) == bool(np.isfinite(a[::3].astype(np.float32)).all())


def test_sim_run_warns_and_strict_exits_7(tmp_path):
    path = tmp_path / "p.mcpb"
    write_mcpb(path, add_program())
    x = _full(1.0)
    x[0, 0] = 10.0
    np.savez(tmp_path / "in.npz", x=x)
    prof = tmp_path / "p.json"
    res = CliRunner().invoke(sim_group, ["run", str(path), "--inputs", str(tmp_path / "in.npz"),
                                         "--profile-json", str(prof)])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "warning: numeric fault" in res.output and "ONNX node n2" in res.output
    assert json.loads(prof.read_text())["numeric"]["overflows"] == 1
    res = CliRunner().invoke(sim_group, ["run", str(path), "--inputs", str(tmp_path / "in.npz"), "--strict"])
    assert res.exit_code == 7, res.output
    assert "error:" in res.output and "instruction 2" in res.output and "Traceback" not in res.output
    np.savez(tmp_path / "ok.npz", x=_full(1.0))
    res = CliRunner().invoke(sim_group, ["run", str(path), "--inputs", str(tmp_path / "ok.npz"), "--strict"])
    assert res.exit_code == 0 and "numeric fault" not in res.output


HALF_ADD = """
load dram={x} sram=0x0 rows=4 row_bytes=16 dram_stride=16 sram_stride=16 signal=EX
vbin func=add in_dtype=f16 out_dtype=f16 dst=0x100 src0=0x0 src1=0x0 rows=4 cols=8 dst_stride=8 s0_stride=8 s1_stride=8 wait=LD signal=ST
store dram={y} sram=0x100 rows=4 row_bytes=16 dram_stride=16 sram_stride=16 wait=EX
halt
"""  # noqa: E501


def test_a_saturated_mask_constant_is_no_overflow():
    # fp16 builds store a -1e9 mask fill as -65504 (the largest finite f16): adding to it may round
    # to -inf, which is the mask doing its job; any other finite operand overflowing is counted
    io = {"inputs": {"x": ("f16", (4, 8))}, "outputs": {"y": ("f16", (4, 8))}}
    x = np.ones((4, 8), np.float16)
    x[0, :2] = -65504.0
    x[1, :3] = -40000.0
    num = run_program(loaded(_program(HALF_ADD, io)), {"x": x}).profile["numeric"]
    assert num["overflows"] == 3 and num["first"]["node"] == "n1"
