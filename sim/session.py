"""A simulator session: one program, one machine, persistent buffers kept from run to run.

    session = Session("decoder.mcpb")          # or a LoadedProgram, a Program, a CompileResult
    out = session.run({"row": x}, entry="append", registers={"pos": 3})
    session.last_profile["cycles"]
    session.reset()                             # zero the persistent buffers

A program without persistent regions or host registers runs as ``run_program`` runs it (the
program's machine, reused by ``fastpath``).  Otherwise a ``Session`` keeps one machine of its
own.  Before each functional run it restores what the previous run
may have changed outside the persistent regions — the DRAM bytes its stores can write (static
addresses from the decoded stores, plus the whole region of any register-offset store outside a
persistent region), the inputs it wrote, SRAM below the entry's peak, the registers and the
QParam group — to the documented initial state (constants, zeros), so every run starts as
``run_program``'s would except that the persistent regions (``kind: persistent`` in MMAP) hold
what the runs before left there.  Nothing else is copied per run: no fresh DRAM image, no copy
of the constants; from an entry's second run its records are ``fastpath``'s plan (constant
matmul operands prepared once).  Register-offset stores are confined to the region holding their base address
(a trap otherwise, ``LoadedProgram.session_recs``).  A timing-only run computes no value and runs
on a scratch machine: the persistent buffers are not changed by it.

Host registers are set by the names the program declares (section HREG); values outside the
declared range, unknown names and registers an entry reads but the run does not set are refused
(InputError).  A Session runs one entry at a time (not from several threads).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from mcpc.arch.mcpb import Program
from mcpc.errors import InputError

from . import fastpath
from .api import run_program
from .loader import LoadedProgram, from_program, load_program
from .machine import Machine


def _loaded(program: Any) -> LoadedProgram:
    if isinstance(program, LoadedProgram):
        return program
    if isinstance(program, (str, os.PathLike)):
        return load_program(Path(program))
    if isinstance(program, Program):
        return from_program(program)
    inner = getattr(program, "program", None)  # mcpc.compile's CompileResult
    if isinstance(inner, Program):
        return from_program(inner, str(getattr(program, "output", None) or "<compiled program>"))
    raise InputError(
        "Session needs a .mcpb path, a loaded program, a Program or a compile result, "
        f"not {type(program).__name__}"
    )


def named_registers(program: LoadedProgram, entry: str, registers: dict[str, Any] | None) -> dict[int, int]:
    """Host register values by declared name -> register numbers.  InputError for an unknown
    name, a value that is not an integer or lies outside the declared range, and a register that
    ``entry`` reads but ``registers`` does not set."""
    src = program.source
    declared = {h["name"]: h for h in program.program.host_registers}
    out = {}
    for name, value in (registers or {}).items():
        h = declared.get(name)
        if h is None:
            have = ", ".join(declared) or "none"
            raise InputError(f"{src}: unknown host register {name!r} (declared: {have})")
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise InputError(f"{src}: host register {name}: value {value!r} is not an integer")
        if not h["min"] <= int(value) <= h["max"]:
            raise InputError(
                f"{src}: host register {name}: value {int(value)} is outside its declared range "
                f"[{h['min']}, {h['max']}]"
            )
        out[h["reg"]] = int(value)
    missing = [h["name"] for h in declared.values() if entry in h["entries"] and h["reg"] not in out]
    if missing:
        raise InputError(
            f"{src}: entry {entry!r} reads host register(s) {', '.join(missing)}, which are not set"
        )
    return out


class Session:
    """Runs the entries of one program on one machine whose persistent buffers live on."""

    def __init__(self, program: Any):
        self.program = _loaded(program)
        p = self.program
        self.host_registers: dict[str, dict] = {h["name"]: h for h in p.program.host_registers}
        regions = p.memory_map.get("regions") or []
        self.persistent = [
            (r["dram"], r["dram"] + r["bytes"])
            for r in regions
            if r.get("kind") == "persistent" and r["bytes"]
        ]
        self._volatile: dict[str, list[tuple[int, int]]] = {}  # per entry, on its first run
        self._state = fastpath.State(p)  # its restore(): zeros and the constants
        self._machine: Machine | None = None
        self._dirty: list[tuple[int, int]] = []
        self._sram_hi = 0
        self.last_profile: dict | None = None
        self._confined: dict[str, tuple[list, list]] = {}  # entry -> (plan records, confined copy)
        # Persistent buffers (by name) a timing-only run starts with, e.g. the KV descriptor table
        # whose sizes kvdecomp charges; a timing-only run keeps no machine, so the host sets them here.
        self.timing_dram: dict[str, np.ndarray] = {}

    @property
    def entries(self) -> list[str]:
        return list(self.program.entries)

    def _store_ranges(self, entry: str) -> list[tuple[int, int]]:
        """DRAM bytes the entry's stores may write, outside the persistent regions."""
        p = self.program
        start, count = p.entries[entry]
        regions = p.memory_map.get("regions") or []
        out = []
        for idx in range(start, start + count):
            if p.mnemonics[idx] not in ("store", "scatter"):
                continue
            f = p.instr(idx).fields
            lo = f["dram"]
            if p.mnemonics[idx] == "scatter":  # any row of its table (limit checked at execution)
                hi = lo + ((f["limit"] - 1) * f["dram_stride"] + f["row_bytes"] if f["limit"] else 0)
            else:
                hi = lo + ((f["rows"] - 1) * f["dram_stride"] + f["row_bytes"] if f["rows"] else 0)
            if f["dram_reg"]:  # confined to the region holding its base (session_recs)
                home = next((r for r in regions if r["dram"] <= lo < r["dram"] + r["bytes"]), None)
                lo, hi = (home["dram"], home["dram"] + home["bytes"]) if home else (lo, lo)
            out.append((lo, hi))
        return self._minus_persistent(out)

    def _minus_persistent(self, ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
        out = []
        for lo, hi in ranges:
            pieces = [(lo, hi)]
            for a, b in self.persistent:
                pieces = [q for x, y in pieces for q in ((x, min(y, a)), (max(x, b), y)) if q[1] > q[0]]
            out += pieces
        return out

    def _entry(self, entry: str | None) -> str:
        names = self.entries
        if entry is None:
            if len(names) == 1:
                return names[0]
            raise InputError(
                f"{self.program.source}: the program has {len(names)} entry points ({', '.join(names)}): "
                "name the one to run (entry=..., mcpc sim run --entry NAME)"
            )
        if entry not in names:
            raise InputError(
                f"{self.program.source}: no entry point {entry!r} (entries: {', '.join(names) or 'none'})"
            )
        return entry

    def register_numbers(self, entry: str, registers: dict[str, Any] | None) -> dict[int, int]:
        """Named host register values -> register numbers, checked against the declarations."""
        return named_registers(self.program, entry, registers)

    def _prepare(self, entry: str) -> Machine:
        """The session's machine in the initial state of a run of ``entry`` (inputs not written)."""
        p, st = self.program, self._state
        if self._machine is None:
            m = self._machine = st.machine = Machine(p.dram_size, p.target.sram.size_bytes)
            for dram, offset, length in st.places:
                m.dram[dram : dram + length] = st.consts[offset : offset + length]
        else:
            m = self._machine
            for lo, hi in fastpath._merge(self._dirty):
                st.restore(lo, hi)
            m.sram[: self._sram_hi] = 0
            m.regs[:] = [0] * len(m.regs)
            m.qparams = Machine(0, 0).qparams
        start, count = p.entries[entry]
        if entry not in self._volatile:
            self._volatile[entry] = self._store_ranges(entry)
        self._dirty = list(self._volatile[entry])
        self._sram_hi = int(p.sram_hi[start : start + count].max()) if count else 0
        return m

    def run(
        self,
        inputs: dict[str, np.ndarray],
        entry: str | None = None,
        registers: dict[str, int] | None = None,
        timing_only: bool = False,
        trace: bool = False,
        max_cycles: int | None = None,
    ) -> dict[str, np.ndarray]:
        """Run ``entry`` (optional when the program has one) on ``inputs`` with the host registers
        ``registers`` (by declared name); return the outputs (empty for a timing-only run).  The
        profile is ``last_profile`` (and the trace events ``last_trace`` when ``trace``)."""
        entry = self._entry(entry)
        regs = self.register_numbers(entry, registers)
        if timing_only or not (self.persistent or regs):
            # nothing to keep (or no value computed): the program's own machine and its fast path
            preset = self._timing_preset() if timing_only else None
            result = run_program(
                self.program, inputs, entry, trace, timing_only, regs, max_cycles, preset=preset
            )
        else:
            io = self.program.io.get(entry, {})
            m = self._prepare(entry)
            spans = [(b["dram"], b["dram"] + b["bytes"]) for b in io.get("inputs", [])]
            self._dirty += self._minus_persistent(spans)  # restored before the next run, whatever happens
            recs = self._records(entry, spans)
            result = run_program(
                self.program, inputs, entry, trace, False, regs, max_cycles, machine=m, recs=recs
            )
        self.last_profile = result.profile
        self.last_trace = result.trace_events
        return result.outputs

    def _timing_preset(self) -> list[tuple[int, np.ndarray]] | None:
        """``timing_dram`` as (DRAM address, bytes) of the persistent buffers it names."""
        if not self.timing_dram:
            return None
        regions = {r.get("name"): r for r in self.program.memory_map.get("regions") or []}
        out = []
        for name, arr in self.timing_dram.items():
            r = regions.get(name)
            raw = np.ascontiguousarray(arr).view(np.uint8).reshape(-1)
            if r is None or r.get("kind") != "persistent" or raw.size > r["bytes"]:
                raise InputError(f"{self.program.source}: timing_dram {name!r}: no persistent buffer it fits")
            out.append((int(r["dram"]), raw))
        return out

    def _records(self, entry: str, input_spans: list[tuple[int, int]]) -> list[tuple]:
        """The functional records of ``entry``: ``fastpath``'s plan when it has one (constant
        matmul operands prepared once, loads only they read skipped), else the program's, with
        register-offset stores confined either way."""
        p = self.program
        start, count = p.entries[entry]
        stop = next((i + 1 for i in range(start, start + count) if p.mnemonics[i] == "halt"), start + count)
        plan = fastpath.plan(p, entry, range(start, stop), input_spans)
        if plan is None:
            return p.session_recs()
        base = plan.recs
        cached = self._confined.get(entry)
        if cached is None or cached[0] is not base:
            cached = self._confined[entry] = (base, p.confine_stores(base))
        return cached[1]

    def reset(self) -> None:
        """Zero the persistent buffers (as when the program was loaded)."""
        if self._machine is not None:
            for lo, hi in self.persistent:
                self._machine.dram[lo:hi] = 0

    def persistent_view(self, name: str) -> np.ndarray:
        """Persistent buffer ``name`` as a writable view of the session's DRAM (flat, its dtype):
        what the host changes there the next run reads.  Only after a functional run."""
        region = next(
            (r for r in self.program.memory_map.get("regions") or []
             if r.get("kind") == "persistent" and r.get("name") == name),
            None,
        )  # fmt: skip
        if region is None or self._machine is None:
            raise InputError(f"{self.program.source}: no persistent buffer {name!r} in this session yet")
        from mcpc.arch.dtypes import NUMPY_DTYPES

        raw = self._machine.dram[region["dram"] : region["dram"] + region["bytes"]]
        return raw.view(NUMPY_DTYPES[region.get("dtype", "u8")])

    def persistent_buffer(self, name: str) -> np.ndarray:
        """A copy of persistent buffer ``name`` as its dtype and shape (zeros before any run)."""
        from mcpc.arch.dtypes import NUMPY_DTYPES, unpack_nibbles

        region = next(
            (r for r in self.program.memory_map.get("regions") or []
             if r.get("kind") == "persistent" and r.get("name") == name),
            None,
        )  # fmt: skip
        if region is None:
            raise InputError(f"{self.program.source}: no persistent buffer {name!r}")
        raw = (
            self._machine.dram[region["dram"] : region["dram"] + region["bytes"]].copy()
            if self._machine is not None
            else np.zeros(region["bytes"], np.uint8)
        )
        dtype, shape = region.get("dtype", "u8"), tuple(region.get("shape", [region["bytes"]]))
        count = int(np.prod(shape, dtype=np.int64))
        if dtype in ("i4", "u4"):
            return unpack_nibbles(raw, dtype, count).reshape(shape)
        return raw.view(NUMPY_DTYPES[dtype])[:count].reshape(shape)
