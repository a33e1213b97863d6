"""Large elementwise instructions split into parts on worker threads (sim/warm.py): the parts
write the bytes one call writes — row and column broadcasts, in place, one long row, f16 tables —
and an instruction whose destination overlaps a source at another position stays whole."""

from __future__ import annotations

import numpy as np
import pytest
from simprog import build

from mcpc.arch import numerics as nx
from mcpc.sim import execute as ex
from mcpc.sim import fastpath, numeric, warm
from mcpc.sim.api import from_program, run_program

R, C = 256, 512  # R * C = warm.MIN_ELEMENTS: the smallest instruction that is split
IO = {
    "inputs": {"x": ("f32", (R, C)), "r": ("f32", (1, C)), "c": ("f32", (R, 1))},
    "outputs": {"h": ("f16", (R, C)), "e": ("f32", (1, R * C)), "s": ("f32", (R, C))},
}
ROWS = f"rows={R} cols={C} dst_stride={C}"
CODE = """
load dram={x} sram=0x0 rows={R} row_bytes={rb} dram_stride={rb} sram_stride={rb}
load dram={r} sram=0x100000 rows=1 row_bytes={rb}
load dram={c} sram=0x101000 rows=1 row_bytes={cb} signal=EX
vbin func=add in_dtype=f32 out_dtype=f32 dst=0x200000 src0=0x0 src1=0x100000 {rows} s0_stride={C} s1_stride=0 wait=LD
vbin func=mul in_dtype=f32 out_dtype=f32 dst=0x200000 src0=0x200000 src1=0x101000 {rows} s0_stride={C} s1_stride=1 s1_bcast=1
vun func=erf in_dtype=f32 out_dtype=f16 dst=0x300000 src=0x200000 {rows} src_stride={C}
vbini func=mul in_dtype=f16 out_dtype=f16 dst=0x300000 src0=0x300000 imm=0.5 {rows} s0_stride={C}
vun func=exp in_dtype=f32 out_dtype=f32 dst=0x400000 src=0x0 rows=1 cols={n} dst_stride={n} src_stride={n}
vun func=copy in_dtype=f32 out_dtype=f32 dst=0x600000 src=0x200000 {rows} src_stride={C}
vbin func=add in_dtype=f32 out_dtype=f32 dst=0x600080 src0=0x600000 src1=0x0 {rows} s0_stride={C} s1_stride={C} signal=ST
store dram={h} sram=0x300000 rows=1 row_bytes={hb} wait=EX
store dram={e} sram=0x400000 rows=1 row_bytes={fb}
store dram={s} sram=0x600000 rows=1 row_bytes={fb}
halt
"""  # noqa: E501


def _program():
    _, at = build("halt", **IO)
    code = CODE.format(R=R, C=C, rb=C * 4, cb=R * 4, hb=R * C * 2, fb=R * C * 4, n=R * C, rows=ROWS, **at)
    return build(code, **IO)[0]


def _reference(x, r, c):
    a = nx.binary("mul", nx.binary("add", x, r, "f32"), c, "f32")
    h = nx.binary("mul", nx.unary("erf", a, "f16"), np.float16(0.5), "f16")
    e = nx.unary("exp", x.reshape(1, -1), "f32")
    flat = a.reshape(-1).copy()  # the shifted add reads the sources as they were before it
    s = flat.copy()
    s[32:] = nx.binary("add", flat[:-32], x.reshape(-1)[:-32], "f32")
    return {"h": h, "e": e, "s": s.reshape(R, C)}


@pytest.mark.parametrize("parts", [2, 3])
def test_split_instructions_write_the_bytes_of_one_call(parts, monkeypatch):
    monkeypatch.setattr(warm, "PARTS", parts)
    prog = _program()
    program = from_program(prog)
    rng = np.random.default_rng(9)
    for _ in range(3):  # the first run on a fresh machine, then the plan's records
        x = rng.standard_normal((R, C)).astype(np.float32)
        r = rng.standard_normal((1, C)).astype(np.float32)
        c = rng.standard_normal((R, 1)).astype(np.float32)
        out = run_program(program, {"x": x, "r": r, "c": c}).outputs
        for name, want in _reference(x, r, c).items():
            assert out[name].tobytes() == np.ascontiguousarray(want).tobytes(), name
    plan = fastpath.state(program).plans["main"]
    handlers = [numeric.unwrap(rec[3], rec[4]) for rec in plan.recs]
    parts_of = [a for fn, a in handlers if fn is warm._split]
    # add, in-place mul, erf, f16 mul, the long exp row and the copy are split; the shifted add is not
    assert [a[0] for a in parts_of] == [ex._vbin, ex._vbin, ex._vun, ex._vbini, ex._vun, ex._vun]
    assert all(len(a[1]) == parts for a in parts_of)
    assert sum(1 for fn, _ in handlers if fn is ex._vbin) == 1


def test_parts_cover_the_operand_exactly(monkeypatch):
    monkeypatch.setattr(warm, "PARTS", 3)
    f32 = np.dtype(np.float32)
    d = (64, 7, 30000, 120000, 4, f32, None)  # 7 rows of 30000: split by rows, 2 + 2 + 3
    _, (fn, parts) = warm.split(ex._vun, ("exp", d, d, "f32"))
    assert fn is ex._vun
    assert [p[1][:2] for p in parts] == [(64, 2), (64 + 2 * 120000, 2), (64 + 4 * 120000, 3)]
    assert all(p[1] == p[2] for p in parts)  # in place: each part reads what it writes
    row = (64, 1, 300000, 0, 4, f32, None)  # one row: split by columns; a broadcast value stays put
    one = (0, 1, 300000, 0, 0, f32, None)
    _, (_, parts) = warm.split(ex._vbin, ("add", row, one, (2000000, 1, 300000, 0, 4, f32, None), "f32"))
    assert [(p[1][0], p[1][2]) for p in parts] == [(64, 100000), (400064, 100000), (800064, 100000)]
    assert all(p[2] == one[:2] + (100000,) + one[3:] for p in parts)
    assert warm.split(ex._vun, ("exp", d, (68,) + d[1:], "f32")) is None  # overlap at another place
    assert warm.split(ex._vun, ("exp", d[:2] + (10,) + d[3:], d[:2] + (10,) + d[3:], "f32")) is None  # small
    assert warm.split(ex._vred, ("sum", d, d, "f32")) is None  # not elementwise


def test_a_bound_load_follows_the_machine_and_its_register():
    """Views made for one machine are not used on another, nor when the address register is set."""
    from mcpc.sim.machine import Machine

    args = (64, 3, 2, 8, 16, 0x100, 8)  # 2 rows of 8 bytes at DRAM 64 + r3, 16 apart
    cell = [None]
    machines = [Machine(4096, 1024) for _ in range(2)]
    for k, m in enumerate(machines):
        m.dram[:] = np.arange(4096) % 251 + k
    for _ in range(2):
        for k, m in enumerate(machines):
            for r3 in (0, 32, 0):
                m.regs[3] = r3
                m.sram[:] = 0
                warm._bound_dma(m, (ex.LOAD, args, cell))
                want = np.concatenate([m.dram[64 + r3 : 72 + r3], m.dram[80 + r3 : 88 + r3]])
                assert np.array_equal(m.sram[0x100:0x110], want), (k, r3)


def test_a_forked_child_makes_its_own_pool(monkeypatch):
    """After a fork the parent's worker threads do not exist in the child: a split instruction there
    must not wait for them."""
    import os

    monkeypatch.setattr(warm, "PARTS", 2)
    f32 = np.dtype(np.float32)
    m = type("M", (), {})()
    m.sram = np.zeros(R * C * 8, np.uint8)
    d_src, d_dst = (0, R, C, C * 4, 4, f32, None), (R * C * 4, R, C, C * 4, 4, f32, None)
    m.sram[: R * C * 4] = np.arange(R * C, dtype=np.float32).view(np.uint8)
    fn, args = warm.split(ex._vun, ("copy", d_src, d_dst, "f32"))
    fn(m, args)  # the parent's pool exists now
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only when the split copy completes and is right
        import signal

        signal.alarm(60)  # waiting for a thread that does not exist: killed, not hung
        ok = False
        try:
            m.sram[R * C * 4 :] = 0
            fn(m, args)
            ok = np.array_equal(m.sram[R * C * 4 :].view(np.float32), np.arange(R * C, dtype=np.float32))
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
