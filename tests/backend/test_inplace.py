"""Operands read and results written in place in the resident area (``backend/inplace.py``): the
copies in and out of slots are folded where the computes can address the buffers themselves, kept
where anything else touches the slot, and the program's bits do not change."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import mcpc
import mcpc.backend.compile as backend_compile
from mcpc.arch.isa import Instr, decode_program
from mcpc.arch.target import load_target
from mcpc.backend import BackendOptions, compile_to_program
from mcpc.backend.emitter import Emitter
from mcpc.backend.inplace import CopyMap, operands
from mcpc.backend.residency import Resident, ResidentPlan, forward
from mcpc.backend.schedule import Kernel, Step, check_hazards, schedule
from mcpc.sim.api import random_inputs, run_program
from mcpc.sim.loader import from_program

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from llama_decode import LlamaConfig, llama_decode_step  # noqa: E402

ROW = 256  # bytes of one value: 64 f32


def _dma(op: str, sram: int, dram: int) -> Instr:
    return Instr(op, dict(dram=dram, sram=sram, rows=1, row_bytes=ROW, dram_stride=ROW, sram_stride=ROW))


def _vun(dst: int, src: int, func: str = "neg") -> Instr:
    return Instr("vun", dict(func=func, in_dtype="f32", out_dtype="f32", dst=dst, src=src, rows=1, cols=64))


def _vbin(dst: int, a: int, b: int) -> Instr:
    return Instr("vbin", dict(func="add", in_dtype="f32", out_dtype="f32", dst=dst, src0=a, src1=b, rows=1,
                              cols=64))  # fmt: skip


def _step(slot_in: int, src: int, computes: list, slot_out: int, dst: int) -> Step:
    return Step([_dma("load", slot_in, src)], computes, [_dma("store", slot_out, dst)])


def _chain(consumer_computes, output: bool = False):
    """Kernel 0 loads the input (DRAM 0), negates it into its output slot and stores value V
    (DRAM 4096); kernel 1 loads V into its input slot, runs ``consumer_computes(in_slot, out_slot)``
    and stores DRAM 8192.  V is kept in SRAM at 0."""
    p_in, p_out, c_in, c_out = 65536, 65536 + ROW, 131072, 131072 + ROW
    producer = Kernel(
        [Step([_dma("load", p_in, 0)], [_vun(p_out, p_in)], [_dma("store", p_out, 4096)])], 1, 1
    )
    consumer = Kernel(
        [Step([_dma("load", c_in, 4096)], consumer_computes(c_in, c_out), [_dma("store", c_out, 8192)])], 1, 1
    )
    plan = ResidentPlan(size=ROW, values=[Resident(0, 4096, ROW, 0, 1, output)])
    forward([producer, consumer], [0, 1], plan, Emitter(load_target("mcp2026-a100")))
    check_hazards(schedule([producer, consumer], prefetch=True, early_compute=True))
    return producer.steps[0], consumer.steps[0], plan


def test_copy_map_moves_rows_into_the_buffer():
    flat = CopyMap(slot=1000, slot_stride=0, home=64, home_stride=0, rows=1, row_bytes=512)
    assert flat.map(1000, 1, 512, 0) == (64, 0)
    assert flat.map(1000 + 128, 3, 64, 128) == (64 + 128, 128)  # strides of a contiguous copy stay
    assert flat.map(1000 + 500, 1, 16, 0) is None  # past the copied bytes
    assert flat.map(990, 1, 16, 0) is None
    # 4 rows of 64 bytes, dense in the slot, 256 bytes apart in the buffer (a column tile)
    tile = CopyMap(slot=2048, slot_stride=64, home=0, home_stride=256, rows=4, row_bytes=64)
    assert tile.map(2048, 4, 64, 64) == (0, 256)
    assert tile.map(2048 + 64 + 8, 2, 32, 128) == (256 + 8, 512)  # every other row, from byte 8
    assert tile.map(2048 + 32, 1, 64, 0) is None  # straddles two rows of the copy
    assert tile.map(2048, 1, 256, 0) is None  # one run of bytes over rows that are apart
    assert tile.map(2048, 4, 64, 96) is None  # a stride that is no multiple of the copy's
    assert tile.map(2048, 5, 64, 64) is None  # one row too many


def test_operands_follow_the_spec_accesses():
    mm = Instr("matmul", dict(a=0, b=1024, c=4096, m=1, n=64, k=64, a_stride=64, b_stride=64, c_stride=64,
                              in_dtype="f16", acc=1))  # fmt: skip
    got = [(f, s, lo, hi, w) for f, s, lo, hi, _, _, _, w in operands(mm)]
    c = ("c", "c_stride", 4096, 4096 + 256)
    assert got == [("a", "a_stride", 0, 128, False), ("b", "b_stride", 1024, 1024 + 64 * 128, False),
                   (*c, False), (*c, True)]  # fmt: skip
    assert operands(Instr("setq", dict(scale_ptr=64))) is None  # its pointers are not operands


def test_copies_fold_into_the_computes():
    prod, cons, plan = _chain(lambda i, o: [_vbin(o, i, i)])
    assert plan.forwarded_loads == 1 and plan.left_out_stores == 1
    # the producer negates straight into V's buffer; the consumer adds from it: no copy is left
    assert prod.computes == [_vun(0, 65536)] and not prod.stores and prod.slot_out
    assert cons.computes == [_vbin(131072 + ROW, 0, 0)] and not cons.loads and cons.slot_in


def test_a_compute_writing_its_input_slot_keeps_the_copy_in():
    # in place in the slot: reading the buffer instead would leave the store reading stale bytes
    _, cons, _ = _chain(lambda i, o: [_vun(i, i, "exp"), _vun(o, i)])
    assert [x.op for x in cons.computes] == ["vun"] * 3 and cons.computes[0].fields["func"] == "copy"
    assert cons.computes[0].fields["src"] == 0 and cons.computes[1] == _vun(131072, 131072, "exp")


def test_a_stored_output_keeps_its_slot():
    # V is a function output: its store stays and reads the output slot, so the slot is written
    prod, cons, _ = _chain(lambda i, o: [_vbin(o, i, i)], output=True)
    assert [x.fields["func"] for x in prod.computes] == ["neg", "copy"] and prod.stores
    assert prod.computes[0] == _vun(65536 + ROW, 65536)
    assert cons.computes == [_vbin(131072 + ROW, 0, 0)]  # the consumer still reads it in place


def test_a_copy_step_becomes_one_copy_between_buffers():
    # a DMA copy step (load, store, no compute: slice, transpose, concat) reading V and writing W
    em = Emitter(load_target("mcp2026-a100"))
    producer = Kernel([_step(65536, 0, [_vun(65536 + ROW, 65536)], 65536 + ROW, 4096)], 1, 1)
    copier = Kernel([Step([_dma("load", 131072, 4096)], [], [_dma("store", 131072, 8192)])], 1, 1)
    user = Kernel([_step(196608, 8192, [_vun(196608 + ROW, 196608)], 196608 + ROW, 12288)], 1, 1)
    values = [Resident(0, 4096, ROW, 0, 1), Resident(ROW, 8192, ROW, 1, 2)]
    forward([producer, copier, user], [0, 1, 2], ResidentPlan(size=2 * ROW, values=values), em)
    (copy,) = copier.steps[0].computes
    assert copy.fields["func"] == "copy" and (copy.fields["src"], copy.fields["dst"]) == (0, ROW)
    assert user.steps[0].computes == [_vun(196608 + ROW, ROW)]
    check_hazards(schedule([producer, copier, user], prefetch=True, early_compute=True))


TINY = LlamaConfig(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, ffn=96, vocab=128, max_pos=64)


@pytest.mark.parametrize("target", ["mcp2026-a100", "mcp2026-edge"])
def test_decode_step_same_bits_fewer_instructions_and_cycles(target, tmp_path, monkeypatch):
    path = tmp_path / "decode.onnx"
    onnx.save(llama_decode_step(TINY), path)
    module = mcpc.compile(path, target=target, qat_config="fp16.yaml", dims={"past": 8}).module
    tgt = load_target(target)
    runs = {}
    for in_place in (True, False):
        monkeypatch.setattr(backend_compile, "forward", functools.partial(forward, in_place=in_place))
        prog = compile_to_program(module, tgt, BackendOptions())
        instrs = decode_program(prog.text)
        check_hazards(instrs)
        loaded = from_program(prog)
        runs[in_place] = (instrs, run_program(loaded, random_inputs(loaded, "main", seed=5)))
    (on, r_on), (off, r_off) = runs[True], runs[False]
    for name, want in r_off.outputs.items():
        assert np.array_equal(r_on.outputs[name].view(np.uint8), want.view(np.uint8)), name
    copies = [sum(i.op == "vun" and i.fields["func"] == "copy" for i in x) for x in (on, off)]
    assert copies[0] < copies[1] / 2, copies
    assert r_on.profile["cycles"] < r_off.profile["cycles"]


def test_a_setq_pointer_into_the_slot_keeps_the_copy():
    # setq's pointers are read at run time by later instructions: the slot must hold its bytes then
    def setq(ptr):
        return lambda i, o: [Instr("setq", dict(scale_ptr=ptr, group_size=32)), _vbin(o, i, i)]

    _, cons, _ = _chain(setq(131072 + 64))
    assert [x.op for x in cons.computes] == ["vun", "setq", "vbin"]
    _, cons, _ = _chain(setq(4 * ROW))  # elsewhere: nothing stops the fold
    assert [x.op for x in cons.computes] == ["setq", "vbin"] and cons.computes[1] == _vbin(131072 + ROW, 0, 0)
