"""Packed 4-bit operands (two per byte, element 2j in the low nibble) in SRAM and in I/O bindings."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from simprog import build, loaded
from test_sim_exec import RNG, get, machine, put, run

from mcpc.sim.api import run_program
from mcpc.sim.machine import Fault


def _nibbles(vals: np.ndarray) -> np.ndarray:
    """Pack a 2-D array of 4-bit values two per byte along rows (element 2j in the low nibble)."""
    nib = (vals.astype(np.int8) & 0xF).astype(np.uint8)
    if nib.shape[1] % 2:
        nib = np.concatenate([nib, np.zeros((nib.shape[0], 1), np.uint8)], axis=1)
    return nib[:, 0::2] | (nib[:, 1::2] << 4)


@pytest.mark.parametrize("dtype", ["i4", "u4"])
def test_packed_4bit_operands_read_and_write(dtype):
    m = machine()
    lo, hi = (-8, 8) if dtype == "i4" else (0, 16)
    w = RNG.integers(lo, hi, (3, 7))
    put(m, 0, _nibbles(w), row_stride=8)  # 7 values per row in 4 bytes, rows 8 bytes apart
    run(
        m,
        "vun",
        func="copy",
        in_dtype=dtype,
        out_dtype="f16",
        dst=0x100,
        src=0,
        rows=3,
        cols=7,
        dst_stride=7,
        src_stride=16,
    )
    np.testing.assert_array_equal(get(m, 0x100, 3, 7, "f16"), w.astype(np.float16))
    # write 5 values per row: the 6th nibble (high half of byte 2) must survive
    m.sram[0x200:0x210] = 0xAB
    run(
        m,
        "vun",
        func="copy",
        in_dtype="f16",
        out_dtype=dtype,
        dst=0x200,
        src=0x100,
        rows=2,
        cols=5,
        dst_stride=16,
        src_stride=7,
    )
    raw = m.sram[0x200:0x210].reshape(2, 8)
    np.testing.assert_array_equal(raw[:, :3] & 0xF, _nibbles(w[:2, :5])[:, :3] & 0xF)
    np.testing.assert_array_equal(raw[:, :2] >> 4, _nibbles(w[:2, :5])[:, :2] >> 4)
    assert (raw[:, 2] >> 4 == 0xA).all() and (raw[:, 3:] == 0xAB).all()
    with pytest.raises(Fault, match="odd row stride"):
        run(m, "vun", func="copy", in_dtype=dtype, dst=0x300, src=0, rows=2, cols=2, src_stride=3)


def test_packed_4bit_inputs_and_outputs_through_dram():
    io = {"inputs": {"w": ("i4", (3, 5))}, "outputs": {"y": ("i4", (3, 5))}}
    _, addr = build("halt", **io)
    code = f"""
    load dram={addr["w"]} sram=0 rows=1 row_bytes=8 signal=EX
    vbini func=mul in_dtype=i4 out_dtype=i4 dst=0x40 src0=0 imm=-1.0 rows=1 cols=15 wait=LD signal=ST
    store dram={addr["y"]} sram=0x40 rows=1 row_bytes=8 wait=EX
    halt
    """
    w = RNG.integers(-7, 8, (3, 5)).astype(ml_dtypes.int4)
    res = run_program(loaded(build(code, **io)[0]), {"w": w})
    assert res.outputs["y"].dtype == ml_dtypes.int4
    np.testing.assert_array_equal(res.outputs["y"].astype(np.int8), -w.astype(np.int8))
