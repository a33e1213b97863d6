"""The token discipline: balance, no deadlock, and no cross-engine race for any kernel shape."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcpc.arch.isa import EX, LD, ST, Instr
from mcpc.backend.schedule import (
    Kernel,
    ScheduleError,
    Step,
    check_hazards,
    replay_tokens,
    schedule,
    schedule_with_debug,
)

ROW = 64  # bytes per synthetic buffer


def load(sram: int, dram: int) -> Instr:
    return Instr("load", dict(dram=dram, sram=sram, rows=1, row_bytes=ROW, dram_stride=ROW, sram_stride=ROW))


def store(sram: int, dram: int) -> Instr:
    return Instr("store", dict(dram=dram, sram=sram, rows=1, row_bytes=ROW, dram_stride=ROW, sram_stride=ROW))


def copy(dst: int, src: int, acc_src: int | None = None) -> Instr:
    """An EX op reading ``src`` (and ``acc_src``) and writing ``dst`` (f32, 16 elements = ROW bytes)."""
    if acc_src is None:
        return Instr("vun", dict(dst=dst, src=src, rows=1, cols=16, dst_stride=16, src_stride=16))
    return Instr("vbin", dict(dst=dst, src0=src, src1=acc_src, rows=1, cols=16, dst_stride=16,
                              s0_stride=16, s1_stride=16))  # fmt: skip


def build_kernel(shape: list[tuple[bool, bool, bool]], in_slots: int, out_slots: int, src: int, dst: int,
                 sram_base: int = 0) -> Kernel:  # fmt: skip
    """A kernel following the scheduler's contract: step (has_load, has_compute, has_store).

    Loads read DRAM ``src + i*ROW`` into input slot r; computes read their input slot (if any)
    and accumulate into the output slot of their group; stores write DRAM ``dst + g*ROW``; a
    copy step (load + store, no compute) stores straight from its input slot.
    """
    ins = [sram_base + i * ROW for i in range(in_slots)]
    outs = [sram_base + (in_slots + i) * ROW for i in range(out_slots)]
    scratch = sram_base + (in_slots + out_slots) * ROW  # persistent: never touched by DMA
    steps, r, g = [], 0, 0
    for i, (has_l, has_c, has_s) in enumerate(shape):
        step = Step()
        slot_in = ins[r % in_slots]
        if has_l:
            step.loads.append(load(slot_in, src + i * ROW))
        if has_c:
            reads = slot_in if has_l else scratch
            step.computes.append(copy(outs[g % out_slots], reads, outs[g % out_slots]))
            step.computes.append(copy(scratch, reads))
        if has_s:
            from_slot = slot_in if (has_l and not has_c) else outs[g % out_slots]
            step.stores.append(store(from_slot, dst + g * ROW))
            g += 1
        r += int(has_l)
        steps.append(step)
    return Kernel(steps, in_slots, out_slots)


step_shape = st.tuples(st.booleans(), st.booleans(), st.booleans()).filter(any)


@st.composite
def kernel_shapes(draw):
    shape = draw(st.lists(step_shape, min_size=1, max_size=9))
    if any(s for _, _, s in shape) and not shape[-1][2]:
        shape.append((draw(st.booleans()), True, True))
    return shape


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(kernel_shapes(), st.integers(1, 3), st.integers(1, 3)), min_size=1, max_size=4))
def test_any_kernel_sequence_is_balanced_and_race_free(kernels):
    built = []
    for idx, (shape, ins, outs) in enumerate(kernels):
        # kernel k reads what kernel k-1 wrote (DRAM RAW across the boundary) and reuses SRAM
        built.append(build_kernel(shape, ins, outs, src=idx * 4096, dst=(idx + 1) * 4096))
    instrs = schedule(built)
    check_hazards(instrs)  # raises on deadlock, unbalanced tokens or a race


def test_every_token_is_popped_replay():
    k = build_kernel([(True, True, True)] * 5, 2, 2, 0, 4096)
    instrs = schedule([k, build_kernel([(True, True, True)] * 3, 1, 1, 4096, 8192)])
    pushed = {(e, d): 0 for e in range(3) for d in range(3)}
    popped = dict(pushed)
    for i in instrs:
        for d in range(3):
            pushed[(i.engine, d)] += i.signal >> d & 1
            popped[(d, i.engine)] += i.wait >> d & 1
    assert pushed == popped
    replay_tokens(instrs)


def test_double_buffered_loads_run_ahead_by_one_slot():
    instrs = schedule([build_kernel([(True, True, True)] * 4, 2, 2, 0, 4096)])
    loads = [i for i in instrs if i.op == "load"]
    assert [bool(i.wait >> EX & 1) for i in loads] == [False, False, True, True]
    assert all(i.signal == 1 << EX for i in loads)
    single = schedule([build_kernel([(True, True, True)] * 4, 1, 1, 0, 4096)])
    assert [bool(i.wait >> EX & 1) for i in single if i.op == "load"] == [False, True, True, True]


def test_kernel_boundary_waits_for_the_producers_last_store():
    a = build_kernel([(True, True, True)] * 2, 2, 2, 0, 4096)
    b = build_kernel([(True, True, True)] * 2, 2, 2, 4096, 8192)
    instrs = schedule([a, b])
    stores = [i for i in instrs if i.op == "store"]
    first_b_load = [i for i in instrs if i.op == "load"][2]
    assert stores[1].signal >> LD & 1 and first_b_load.wait >> ST & 1
    assert not stores[-1].signal  # nothing after the last kernel


def test_step_without_compute_gets_a_nop_carrying_tokens():
    k = Kernel([Step([load(0, 0)], [], [store(0, 4096)])], 1, 1)
    instrs = schedule([k])
    assert [i.op for i in instrs] == ["load", "nop", "store"]
    assert instrs[1].wait == 1 << LD and instrs[1].signal == 1 << ST
    check_hazards(instrs)


def test_copy_steps_release_their_slot_from_the_store_engine():
    instrs = schedule([build_kernel([(True, False, True)] * 4, 2, 2, 0, 4096)])
    check_hazards(instrs)
    loads = [i for i in instrs if i.op == "load"]
    assert loads[2].wait == 1 << ST  # slot 0 is free once step 0's store has read it


def test_checker_finds_a_missing_token():
    instrs = schedule([build_kernel([(True, True, True)] * 4, 2, 2, 0, 4096)])
    # drop the EX->LD release of step 0 and the matching wait: balanced, deadlock-free, but racy
    k = next(i for i, x in enumerate(instrs) if x.op == "load" and x.wait >> EX & 1)
    rel = next(i for i, x in enumerate(instrs) if x.engine == EX and x.signal >> LD & 1)
    broken = list(instrs)
    broken[k] = broken[k].replace(wait=broken[k].wait & ~(1 << EX))
    broken[rel] = broken[rel].replace(signal=broken[rel].signal & ~(1 << LD))
    with pytest.raises(ScheduleError, match="race"):
        check_hazards(broken)
    with pytest.raises(ScheduleError, match="unbalanced"):
        replay_tokens(instrs[:-1])  # without the last store, its EX->ST token is never popped


def test_checker_finds_a_deadlock():
    instrs = schedule([build_kernel([(True, True, True)] * 2, 2, 2, 0, 4096)])
    instrs[0] = instrs[0].replace(wait=1 << ST)
    with pytest.raises(ScheduleError, match="deadlock"):
        replay_tokens(instrs)


def test_kernel_contract_is_validated():
    with pytest.raises(ValueError, match="not a LD"):
        Kernel([Step(loads=[store(0, 0)])])
    with pytest.raises(ValueError, match="must end with a step that stores"):
        Kernel([Step([load(0, 0)], [copy(64, 0)], [store(64, 0)]), Step(computes=[copy(64, 0)])])
    with pytest.raises(ValueError, match="slots"):
        Kernel([], in_slots=0)


def test_debug_records_follow_their_kernel():
    a = build_kernel([(True, True, True)], 1, 1, 0, 4096)
    a.debug = {"ir_op": "mcp.add", "onnx_node": "n0", "op_type": "Add"}
    b = build_kernel([(True, False, True)], 1, 1, 4096, 8192)
    b.debug = {"ir_op": "mcp.transpose", "onnx_node": "n1", "op_type": "Transpose"}
    instrs, dbg = schedule_with_debug([a, b])
    assert len(dbg) == len(instrs)
    assert [d["onnx_node"] for d in dbg] == ["n0"] * 4 + ["n1"] * 3  # the nop belongs to n1


# -- cross-kernel prefetch ---------------------------------------------------------------------------
HALF = 4096  # synthetic SRAM half: kernel k lives at (k % 2) * HALF


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(kernel_shapes(), st.integers(1, 3), st.integers(1, 3), st.integers(0, 3), st.booleans()),
        min_size=1,
        max_size=5,
    )
)
def test_prefetch_any_kernel_sequence_is_balanced_and_race_free(kernels):
    built = []
    for idx, (shape, ins, outs, src, same_half) in enumerate(kernels):
        # reads the output of kernel idx-1-src (or a weight region when that is before the start);
        # SRAM alternates halves unless same_half puts it over the previous kernel
        base = 0 if same_half else (idx % 2) * HALF
        src_at = (idx - src) * 65536 if src <= idx else (1 << 24) + idx * 65536
        built.append(build_kernel(shape, ins, outs, src=src_at, dst=(idx + 1) * 65536, sram_base=base))
    for prefetch in (True, False):
        check_hazards(schedule(built, prefetch=prefetch))  # deadlock, balance, races


def _loads_of(instrs, lo, hi):
    return [i for i in instrs if i.op == "load" and lo <= i.fields["dram"] < hi]


def test_independent_loads_of_the_next_kernel_wait_for_nothing():
    a = build_kernel([(True, True, True)] * 2, 2, 2, src=0, dst=65536)
    b = build_kernel([(True, True, True)] * 2, 2, 2, src=1 << 20, dst=2 * 65536, sram_base=HALF)
    instrs = schedule([a, b])
    check_hazards(instrs)
    assert not any(i.wait for i in _loads_of(instrs, 1 << 20, 1 << 21))  # weights: no wait at all
    assert not any(i.signal >> LD & 1 for i in instrs if i.op == "store")  # nobody waits for a's end
    barrier = schedule([a, b], prefetch=False)
    assert _loads_of(barrier, 1 << 20, 1 << 21)[0].wait == 1 << ST


def test_a_load_reading_the_previous_kernels_output_waits_for_its_end():
    a = build_kernel([(True, True, True)] * 2, 2, 2, src=0, dst=65536)
    b = build_kernel([(True, True, True)] * 2, 2, 2, src=65536, dst=2 * 65536, sram_base=HALF)
    instrs = schedule([a, b])
    check_hazards(instrs)
    assert _loads_of(instrs, 65536, 2 * 65536)[0].wait == 1 << ST
    assert [i.signal >> LD & 1 for i in instrs if i.op == "store"] == [0, 1, 0, 0]


def test_free_loads_of_a_step_move_before_dependent_ones():
    a = build_kernel([(True, True, True)], 1, 1, src=0, dst=65536)
    dep, weight = load(HALF, 65536), load(HALF + ROW, 1 << 20)
    b = Kernel([Step([dep, weight], [copy(HALF + 2 * ROW, HALF)], [store(HALF + 2 * ROW, 1 << 21)])], 1, 1)
    instrs = schedule([a, b])
    check_hazards(instrs)
    b_loads = [i for i in instrs if i.op == "load"][1:]
    assert [i.fields["dram"] for i in b_loads] == [1 << 20, 65536]
    assert b_loads[0].wait == 0 and b_loads[1].wait == 1 << ST


def test_a_kernel_over_the_sram_of_the_one_before_the_last_waits_for_it():
    a = build_kernel([(True, True, True)], 1, 1, src=1 << 20, dst=65536)
    b = build_kernel([(True, True, True)], 1, 1, src=1 << 21, dst=2 * 65536, sram_base=HALF)
    c = build_kernel([(True, True, True)], 1, 1, src=3 << 20, dst=3 * 65536)  # a's half again
    instrs = schedule([a, b, c])
    check_hazards(instrs)
    stores = [i for i in instrs if i.op == "store"]
    assert stores[0].signal >> LD & 1 and not stores[1].signal >> LD & 1
    assert _loads_of(instrs, 3 << 20, 4 << 20)[0].wait == 1 << ST


def test_checker_finds_a_missing_cross_kernel_dependency():
    a = build_kernel([(True, True, True)] * 2, 2, 2, src=0, dst=65536)
    b = build_kernel([(True, True, True)] * 2, 2, 2, src=65536, dst=2 * 65536, sram_base=HALF)
    instrs = schedule([a, b])
    k = next(n for n, i in enumerate(instrs) if i.op == "load" and i.wait >> ST & 1)
    e = next(n for n, i in enumerate(instrs) if i.op == "store" and i.signal >> LD & 1)
    broken = list(instrs)
    broken[k] = broken[k].replace(wait=broken[k].wait & ~(1 << ST))
    broken[e] = broken[e].replace(signal=broken[e].signal & ~(1 << LD))
    with pytest.raises(ScheduleError, match="race: .* store .* load .* dram"):
        check_hazards(broken)


def test_checker_orders_register_writes_and_register_offset_reads():
    # setr runs on EX, the load reading r1 on LD: without a token the load may see the old value.
    setr = Instr("setr", dict(reg=1, value=64))
    reg = load(0, 0).replace(dram_reg=1)
    with pytest.raises(ScheduleError, match="race: #0 setr .* #1 load .* reg r1"):
        check_hazards([setr, reg])
    check_hazards([setr.replace(signal=1 << LD), reg.replace(wait=1 << EX)])


# Double buffering over DRAM tiles addressed through registers: r1 and r2 hold the DRAM offsets
# of the two buffers' next tiles, advanced by salu on EX after each buffer's load has been used.
REG_DOUBLE_BUFFER = """
setr  reg=1 value=0 signal=LD
setr  reg=2 value=256 signal=LD
load  dram=0x10000 dram_reg=1 sram=0x0 rows=1 row_bytes=256 wait=EX signal=EX
load  dram=0x10000 dram_reg=2 sram=0x100 rows=1 row_bytes=256 wait=EX signal=EX
vun   func=exp dst=0x1000 src=0x0 rows=1 cols=64 wait=LD signal=ST
salu  func=add rd=1 rs1=1 simm=512 signal=LD
vun   func=exp dst=0x1100 src=0x100 rows=1 cols=64 wait=LD signal=ST
salu  func=add rd=2 rs1=2 simm=512 signal=LD
load  dram=0x10000 dram_reg=1 sram=0x0 rows=1 row_bytes=256 wait=EX signal=EX
load  dram=0x10000 dram_reg=2 sram=0x100 rows=1 row_bytes=256 wait=EX signal=EX
store dram={y0} sram=0x1000 rows=1 row_bytes=256 wait=EX signal=EX
store dram=0x20100 sram=0x1100 rows=1 row_bytes=256 wait=EX signal=EX
vun   func=exp dst=0x1000 src=0x0 rows=1 cols=64 wait=LD|ST signal=ST
vun   func=exp dst=0x1100 src=0x100 rows=1 cols=64 wait=LD|ST signal=ST
store dram=0x20200 sram=0x1000 rows=1 row_bytes=256 wait=EX
store dram=0x20300 sram=0x1100 rows=1 row_bytes=256 wait=EX
halt
"""


def test_register_offset_double_buffering_is_accepted():
    from mcpc.arch.asm import parse_asm
    from mcpc.backend.hazards import DRAM_ANY, footprint, register_values

    instrs = parse_asm(REG_DOUBLE_BUFFER.format(y0="0x20000"))
    check_hazards(instrs)
    regs = register_values(instrs)
    assert (regs[8][1], regs[9][2]) == (512, 768)  # the third and fourth tiles
    assert ("dram", 0x10000 + 512, 0x10000 + 768, False) in footprint(instrs[8], regs[8])
    # Without known register values a register-offset access may touch any DRAM byte.
    assert ("dram", *DRAM_ANY, False) in footprint(instrs[8])


def test_register_offset_hazards_are_found():
    from mcpc.arch.asm import parse_asm

    # The first store writes the tile the third load reads (r1 = 512 then): no token orders them.
    instrs = parse_asm(REG_DOUBLE_BUFFER.format(y0="0x10200"))
    with pytest.raises(ScheduleError, match="race: #8 load .* #10 store .* dram"):
        check_hazards(instrs)
    # The third load no longer waits for the salu advancing r1: it may read the old offset.
    instrs = parse_asm(REG_DOUBLE_BUFFER.format(y0="0x20000"))
    instrs[5] = instrs[5].replace(signal=0)
    instrs[8] = instrs[8].replace(wait=0)
    with pytest.raises(ScheduleError, match="race: #5 salu .* #8 load .* same reg r1"):
        check_hazards(instrs)


def test_kernels_may_not_use_registers_the_token_rules_do_not_order():
    Kernel([Step(loads=[load(0, 0).replace(dram_reg=2)])])  # set by the entry's register kernel
    with pytest.raises(ValueError, match="setr uses scalar registers"):
        Kernel([Step(computes=[Instr("setr", dict(reg=1, value=4))])])
    with pytest.raises(ValueError, match="register kernel holds setr/salu computes only"):
        Kernel(
            [Step(loads=[load(0, 0)], computes=[Instr("setr", dict(reg=1, value=4))])], sets_registers=True
        )


def test_a_register_kernel_is_waited_for_by_the_first_load_after_it():
    """A load offset by a register that the register kernel computes is ordered after it (the
    register hazard check passes) even though the two kernels share no SRAM or DRAM."""
    regs = Kernel(
        [Step(computes=[Instr("salu", dict(func="mul", rd=2, rs1=1, rs2=0, simm=64))])], sets_registers=True
    )
    copy = Kernel([Step(loads=[load(0, 4096).replace(dram_reg=2)], stores=[store(0, 8192)])])
    instrs = schedule([regs, copy])
    check_hazards(instrs, regs=[0, None] + [0] * 14)
    assert instrs[0].signal and instrs[1].wait  # EX -> LD token: the load waits for the salu
