"""The simulator's Python API: load a .mcpb, run an entry point on inputs, get outputs and a profile.

    program = load_program("model.mcpb")
    result = run_program(program, {"x": x}, entry="main", trace=True)
    result.outputs["y"], result.profile["cycles"], result.trace_events

Imports only the .mcpb contract (mcpc.arch) and numpy/ml_dtypes: never onnx or the compiler.
Each run starts from zeroed SRAM, DRAM holding the constants and the inputs, and zeroed scalar
registers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mcpc.arch.dtypes import FLOAT_DTYPES, NUMPY_DTYPES
from mcpc.arch.isa import ENGINES
from mcpc.errors import InputError, SimTrap

from . import fastpath, numeric
from .chain import chain_latency
from .loader import LoadedProgram, from_program, load_program
from .machine import N_REGS, PACKED, Machine, nbytes, pack4, unpack4
from .profile import build_profile, trace_events
from .timing import Deadlock, Faulted, simulate

__all__ = ["LoadedProgram", "SimResult", "from_program", "load_program", "random_inputs", "run_program"]


@dataclass
class SimResult:
    """Outputs named as the model's outputs, the profile dict, and trace events when asked for."""

    outputs: dict[str, np.ndarray]
    profile: dict
    trace_events: list | None = None


def _bindings(program: LoadedProgram, entry: str) -> tuple[range, dict]:
    entries = program.entries
    if entry not in entries:
        raise InputError(
            f"{program.source}: no entry point {entry!r} (entries: {', '.join(entries) or 'none'})"
        )
    start, count = entries[entry]
    stop = start + count
    for idx in range(start, stop):  # dispatch ends with the first halt
        if program.mnemonics[idx] == "halt":
            stop = idx + 1
            break
    io = program.io.get(entry, {}) if isinstance(program.io, dict) else {}
    return range(start, stop), io


def _layout(b: dict) -> tuple[np.dtype, tuple[int, ...], int]:
    """(numpy dtype, shape, DRAM address) of an I/O binding.  The loader validated every binding
    (``loader._check_binding``: known dtype, concrete shape, a region of exactly its bytes inside
    DRAM), so nothing here can be out of range."""
    return NUMPY_DTYPES[b["dtype"]], tuple(b["shape"]), b["dram"]


def _coerce(name: str, value, dt: np.dtype, shape: tuple[int, ...], binding_dtype: str) -> np.ndarray:
    arr = np.asarray(value)
    if arr.shape != shape:
        raise InputError(f"input {name!r}: shape {arr.shape} does not match the program's {shape}")
    if arr.dtype == dt:
        return np.ascontiguousarray(arr)
    if arr.dtype.kind in "biuf":
        # A lossless conversion (float64 data for an f32 input, int32 ids for an i64 input) is fine.
        with np.errstate(all="ignore"):
            conv = arr.astype(dt)
            exact = np.array_equal(conv.astype(arr.dtype), arr, equal_nan=arr.dtype.kind == "f")
        if exact:
            return np.ascontiguousarray(conv)
    raise InputError(
        f"input {name!r}: dtype {arr.dtype} cannot be converted losslessly to the program's {binding_dtype}"
    )


def _check_range(b: dict, arr: np.ndarray) -> None:
    """Refuse values outside the binding's ``valid_range: [low, high)`` (e.g. an i64 input the
    program narrows to i32): computing on them would silently give a wrong answer."""
    bounds = b.get("valid_range")
    if not bounds or arr.size == 0:
        return
    low, high = bounds
    lo, hi = arr.min(), arr.max()
    if lo < low or hi >= high:
        bad = lo if lo < low else hi
        raise InputError(
            f"input {b['name']!r}: value {bad} is outside the range [{low}, {high}) the program "
            "supports for it (an i64 input is computed as i32 on the NPU)"
        )


def run_program(
    program: LoadedProgram,
    inputs: dict[str, np.ndarray],
    entry: str = "main",
    trace: bool = False,
    timing_only: bool = False,
    registers: dict[int, int] | None = None,
    max_cycles: int | None = None,
    machine: Machine | None = None,
    recs: list | None = None,
    observe: dict | None = None,
    preset: list[tuple[int, np.ndarray]] | None = None,
) -> SimResult:
    """Run entry point ``entry`` on ``inputs`` (name -> array) and collect outputs and the profile.

    With ``timing_only`` no value is computed: the inputs are checked (names, shapes, dtypes,
    ranges) but not stored, and the outputs dict is empty; cycles, profile and trace are exactly
    those of the functional run (costs are static, or follow register values, which a timing-only
    run still computes, or the window lengths a ``vattn`` reads: for a program with one, the inputs
    are written to DRAM and the loads of its window tables run, ``LoadedProgram.timing_recs``).
    Traps that depend on data (a gather index out of range, an integer to a
    negative power) are not detected in that mode.

    ``max_cycles`` stops a runaway program: an instruction that would issue later traps (SimTrap).

    ``preset``: (DRAM address, bytes) written into a timing-only run's scratch machine before it
    starts (``Session.timing_dram``: e.g. the KV descriptor table whose sizes ``kvdecomp`` charges).

    ``observe`` maps an instruction index to ``f(machine)``, called right after that instruction
    executes (``mcpc check --per-node`` reads intermediate values there); cycles are unchanged and
    the run starts from a fresh machine.

    ``registers`` sets scalar registers (number -> s32 value) before the first instruction: a
    low-level hook for run-time extents until programs declare host registers by name.  A run with
    registers set always starts from a fresh machine (the reuse of ``fastpath`` assumes the
    registers start at zero).

    ``machine``: run a functional run on this machine as it is (``Session`` keeps one across
    runs, restored by itself, for the persistent buffers), with ``recs`` (default: the program's
    ``session_recs``); None: the program's own machine, restored.

    An entry that reads host registers (section HREG) refuses to run unless ``registers`` sets
    every one of them, within its declared range (``Session.run`` sets them by name).

    Raises InputError for an unknown entry, a missing or mis-shaped input (named), and SimTrap
    (naming the instruction address, mnemonic and ONNX node) when the program traps or deadlocks.
    """
    order, io = _bindings(program, entry)
    src = program.source
    t = program.target
    for reg, value in (registers or {}).items():
        if not (0 < reg < N_REGS) or not -(1 << 31) <= value < 1 << 31:
            raise InputError(f"register r{reg} = {value}: registers are r1..r{N_REGS - 1}, values s32")
    unset = [
        f"{h['name']} (r{h['reg']})"
        for h in program.program.host_registers
        if entry in h["entries"] and h["reg"] not in (registers or {})
    ]
    if unset:
        raise InputError(
            f"{src}: entry {entry!r} reads host register(s) {', '.join(unset)}, which are not set "
            "(mcpc sim run --set-reg NAME=VALUE, Session.run(registers={NAME: VALUE}))"
        )
    for h in program.program.host_registers:  # the compiler proved its offsets for these ranges only
        value = (registers or {}).get(h["reg"])
        if value is not None and not h["min"] <= value <= h["max"]:
            raise InputError(
                f"{src}: host register {h['name']} (r{h['reg']}) = {value} is outside its declared "
                f"range [{h['min']}, {h['max']}]"
            )
    in_bindings = io.get("inputs", [])
    missing = [b["name"] for b in in_bindings if b["name"] not in inputs]
    if missing:
        names = ", ".join(b["name"] for b in in_bindings)
        raise InputError(f"inputs are missing {', '.join(missing)} (entry {entry!r} needs {names})")
    writes = []
    for b in in_bindings:
        dt, shape, addr = _layout(b)
        arr = _coerce(b["name"], inputs[b["name"]], dt, shape, b["dtype"])
        _check_range(b, arr)
        raw = pack4(arr.reshape(-1)) if b["dtype"] in PACKED else arr.view(np.uint8).reshape(-1)
        writes.append((addr, raw))
    plan = None
    if timing_only:
        m, recs = Machine(program.dram_size, t.sram.size_bytes), program.timing_recs()
        for addr, raw in preset or ():  # persistent bytes the host gives a timing-only run
            m.dram[addr : addr + raw.size] = raw
        if program.has_data_costs:  # vattn's cost follows the window table loaded from the inputs
            for addr, raw in writes:
                m.dram[addr : addr + raw.size] = raw
    elif machine is not None:
        m, recs = machine, recs or program.session_recs()
        for addr, raw in writes:
            m.dram[addr : addr + raw.size] = raw
    else:
        if not registers and not observe:
            plan = fastpath.plan(program, entry, order, [(a, a + raw.size) for a, raw in writes])
        if plan is None:  # a fresh machine: the constants copied in, everything else zero
            m, recs = Machine(program.dram_size, t.sram.size_bytes), program.recs
            consts = np.frombuffer(program.program.constants, dtype=np.uint8)
            for dram, offset, length in program.const_places:
                m.dram[dram : dram + length] = consts[offset : offset + length]
        else:  # the program's machine, restored to the same state
            m, recs = fastpath.machine_for_run(program, plan), plan.recs
            for addr, raw in writes:
                fastpath.wrote(program, addr, addr + raw.size)
        for addr, raw in writes:
            m.dram[addr : addr + raw.size] = raw
    if observe and not timing_only:
        recs = _observed(recs, observe)
    m.numeric = []  # a program's machine is reused from run to run
    for reg, value in (registers or {}).items():
        m.regs[reg] = int(value)
    try:
        # numpy's own overflow warnings would be noise: the numeric guards count and attribute them
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            if plan is not None:  # a recorded schedule replayed without the event loop
                issue, done, stall, tokens_left = fastpath.run(plan, recs, order, m, max_cycles)
            else:
                issue, done, stall, tokens_left = simulate(recs, order, m, max_cycles)
    except Faulted as exc:
        raise SimTrap(f"{src}: {program.describe(exc.index)}: {exc.message}") from None
    except Deadlock as exc:
        blocked = "; ".join(
            f"{program.describe(idx)} waits for a token from {'/'.join(ENGINES[s] for s in srcs)}"
            for idx, srcs in exc.blocked
        )
        raise SimTrap(f"{src}: token deadlock in entry {entry!r}: {blocked}") from None
    outputs = {}
    for b in [] if timing_only else io.get("outputs", []):
        dt, shape, addr = _layout(b)
        count = int(np.prod(shape, dtype=np.int64))
        size = nbytes(b["dtype"], count)
        if b["dtype"] in PACKED:
            flat = unpack4(m.dram[addr : addr + size], b["dtype"], count)
        else:
            flat = np.frombuffer(m.dram, dtype=dt, count=count, offset=addr).copy()
        outputs[b["name"]] = flat.reshape(shape)
    program.record_extents()
    chain = chain_latency(program, order, program._chains)
    profile = build_profile(program, entry, order, issue, done, stall, chain_cycles=chain)
    profile["tokens_left"] = tokens_left
    # no values in a timing-only run: nothing to check (None, not a "clean" that was never checked)
    profile["numeric"] = None if timing_only else numeric.report(program, m.numeric, outputs)
    events = trace_events(program, entry, order, issue) if trace else None
    return SimResult(outputs=outputs, profile=profile, trace_events=events)


def _observed(recs: list[tuple], observe: dict) -> list[tuple]:
    """``recs`` with ``observe[i](machine)`` run after instruction i's own executor."""
    out = list(recs)
    for idx, fn in observe.items():
        r = out[idx]

        def run(machine, args, _exec=r[3], _fn=fn):
            _exec(machine, args)
            _fn(machine)

        out[idx] = (*r[:3], run, *r[4:])
    return out


def random_inputs(program: LoadedProgram, entry: str = "main", seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs for ``entry``: floats ~ normal(0, 1) in the binding dtype, i1 random bools,
    integers uniform in [0, 2) unless the binding gives ``range: [low, high)`` (or ``low``/``high``).
    """
    _, io = _bindings(program, entry)
    rng = np.random.default_rng(seed)
    out = {}
    for b in io.get("inputs", []):
        dt, shape, _ = _layout(b)
        name = b["dtype"]
        if name in FLOAT_DTYPES:
            out[b["name"]] = rng.standard_normal(shape, dtype=np.float32).astype(dt)
        elif name == "i1":
            out[b["name"]] = rng.integers(0, 2, shape).astype(np.bool_)
        else:
            low, high = b.get("range") or (b.get("low", 0), b.get("high", 2))
            out[b["name"]] = rng.integers(int(low), int(high), shape).astype(dt)
    return out
