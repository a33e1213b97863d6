"""Loading a .mcpb: verify it, decode TEXT once, and precompute everything the run loop needs.

A ``LoadedProgram`` holds, per instruction, a record tuple for the event loop (engine, token
masks as tuples, handler, operand descriptors, static cost) plus numpy arrays of static counters
(busy cycles, MACs, DRAM bytes, SRAM extent, node id) that the profiler reduces after the run.
Words that do not decode are kept as trapping records: they fault only if executed.

Assumes the file passed ``mcpc.arch.mcpb.read_mcpb`` (CRCs, digest, entry ranges).  Guarantees
that DRAM regions of the memory map and the constant placement are consistent, and that every I/O
binding is well formed (known dtype, concrete shape, a DRAM region of exactly its size inside DRAM)
(InputError otherwise), so a run never writes outside DRAM or allocates what a corrupt size asks.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import numpy as np

from mcpc.arch.isa import INSTR_BYTES, Instr, decode
from mcpc.arch.mcpb import Program, read_mcpb
from mcpc.arch.numerics import NUMPY_DTYPES
from mcpc.arch.target import Target
from mcpc.errors import InputError, McpcError

from . import numeric
from .decode import fast_decode
from .execute import (
    compile_extent,
    compile_instr,
    data_cost_cell,
    extent_register,
    illegal,
    is_trap,
    timing_twin,
)
from .machine import Fault, nbytes
from .timing import ex_dependencies, instr_cost

NO_NODE = "<unattributed>"


def _mask(mask: int) -> tuple[int, ...]:
    return tuple(e for e in range(3) if mask >> e & 1)


@dataclass
class LoadedProgram:
    """A verified, decoded program ready to run any number of times.

    ``recs[i]`` is instruction i's event-loop record (``instr(i)`` decodes it again, for display);
    ``node_of[i]`` indexes ``nodes`` (``(onnx_node, op_type)``), ``ir_op_of[i]`` indexes ``ir_ops``,
    ``engine_of[i]`` is its engine; ``busy``, ``tail``, ``macs``, ``dram_read``, ``dram_write`` and
    ``sram_hi`` are static per-instruction counters.
    """

    source: str
    program: Program
    target: Target
    recs: list[tuple]
    mnemonics: list[str]
    busy: np.ndarray
    tail: np.ndarray
    macs: np.ndarray
    mac_dtype: list[str | None]
    dram_read: np.ndarray
    dram_write: np.ndarray
    sram_hi: np.ndarray
    node_of: np.ndarray
    engine_of: np.ndarray
    nodes: list[tuple[str, str]]
    ir_op_of: np.ndarray
    ir_ops: list[str]
    const_places: list[tuple[int, int, int]] = field(default_factory=list)  # (dram, cnst offset, bytes)
    # Instructions whose row count a register sets at run time: (index, cell of their last cost).
    extents: list[tuple[int, list]] = field(default_factory=list)
    _timing_recs: list[tuple] | None = field(default=None, repr=False)
    _session_recs: list[tuple] | None = field(default=None, repr=False)
    _register_stores: list[tuple] | None = field(default=None, repr=False)
    _fast: object = field(default=None, repr=False)  # sim/fastpath.State, made on the first run
    _chains: dict = field(default_factory=dict, repr=False)  # sim/chain.py's sweep per entry
    _roof: dict = field(default_factory=dict, repr=False)  # sim/roofline.py's static figures per entry

    def timing_recs(self) -> list[tuple]:
        """``recs`` with every handler replaced by its timing-only twin (built on first use).

        A ``vattn`` is costed from the window lengths it reads: the loads that bring its window
        table stay real loads (a timing-only run writes the inputs to DRAM for them), and a
        ``vattn`` whose table some other instruction writes traps, since its cost would be a guess."""
        if self._timing_recs is None:
            keep, untimed = self._window_table_writers()
            recs = []
            for idx, r in enumerate(self.recs):
                if idx in untimed:
                    recs.append(r[:3] + (_untimed, (untimed[idx],), 1) + r[6:])
                else:
                    recs.append(r[:3] + ((r[3] if idx in keep else timing_twin(r[3])),) + r[4:])
            self._timing_recs = recs
        return self._timing_recs

    @property
    def has_data_costs(self) -> bool:
        """Whether some instruction's cost follows the values it reads (``vattn``, ``kvdecomp``)."""
        return "vattn" in self.mnemonics or "kvdecomp" in self.mnemonics

    def _window_table_writers(self) -> tuple[set[int], dict[int, str]]:
        """The loads that write each ``vattn``'s window table (from register-free DRAM: the inputs
        a timing-only run writes), and the ``vattn``s whose table something else writes."""
        keep: set[int] = set()
        untimed: dict[int, str] = {}
        starts = sorted(start for start, _ in self.entries.values())
        for idx, name in enumerate(self.mnemonics):
            if name not in ("vattn", "kvdecomp"):
                continue
            f = self.instr(idx).fields
            if name == "vattn":
                lo, missing = f["win"], np.ones(8 * (f["rows"] // max(f["share"], 1)), dtype=bool)
            else:  # kvdecomp's block ids (its descriptors are read from DRAM as they are)
                lo, missing = f["sram_idx"], np.ones(4 * f["count"], dtype=bool)
            first = max([s for s in starts if s <= idx], default=0)
            for j in range(idx - 1, first - 1, -1):
                if not missing.any():
                    break
                if self.mnemonics[j] in ("vattn", "halt", "nop", "setr", "salu", "setq"):
                    continue
                try:
                    other = self.instr(j)
                except InputError:
                    continue
                hit = _sram_writes(other, lo, missing.size)
                if hit is None or not (hit & missing).any():
                    continue
                if other.op != "load" or other.fields["dram_reg"] or other.fields["rows_reg"]:
                    untimed[idx] = (
                        f"timing-only: {name}'s index table is written on chip by instruction {j} "
                        f"({other.op}), so its cost cannot be known without values (run functionally)"
                    )
                    break
                keep.add(j)
                missing &= ~hit
        return keep, untimed

    def session_recs(self) -> list[tuple]:
        """``recs`` with every register-offset ``store`` (or ``scatter``, its whole table) confined
        to the memory-map region holding its base address: one that would write outside it faults
        (a ``Session`` keeps DRAM from run to run, so a stray store must not reach the constants or
        another buffer)."""
        if self._session_recs is None:
            self._session_recs = self.confine_stores(self.recs)
        return self._session_recs

    def confine_stores(self, recs: list[tuple]) -> list[tuple]:
        """``recs`` (records of this program) with every register-offset store confined to its
        region (``session_recs``)."""
        if self._register_stores is None:
            regions = [
                (r["dram"], r["dram"] + r["bytes"], str(r.get("name")))
                for r in self.memory_map.get("regions") or []
                if r["bytes"] > 0
            ]
            self._register_stores = []
            for idx, name in enumerate(self.mnemonics):
                if name in ("store", "scatter"):
                    f = self.instr(idx).fields
                    if f["dram_reg"]:
                        n = f["rows"] if name == "store" else f["limit"]  # a scatter: its whole table
                        span = (n - 1) * f["dram_stride"] + f["row_bytes"] if n else 0
                        home = next((r for r in regions if r[0] <= f["dram"] < r[1]), None)
                        lo, hi, what = home or (0, 0, "<none>")
                        self._register_stores.append((idx, (f["dram"], span, f["dram_reg"], lo, hi, what)))
        recs = list(recs)
        for idx, where in self._register_stores:
            r = recs[idx]
            cell = r[4][-1] if r[5] < 0 else None  # a run-time count: the event loop reads its cost last
            recs[idx] = r[:3] + (_confined_store, (r[3], r[4], *where, cell)) + r[5:]
        return recs

    @property
    def meta(self) -> dict:
        return self.program.meta

    @property
    def io(self) -> dict:
        return self.program.io

    @property
    def memory_map(self) -> dict:
        return self.program.memory_map

    @property
    def entries(self) -> dict[str, tuple[int, int]]:
        """Entry name -> (start, count)."""
        return {e["name"]: (e["start"], e["count"]) for e in self.program.entries}

    @property
    def dram_size(self) -> int:
        return int(self.program.memory_map["dram_size"])

    def record_extents(self) -> None:
        """Set the counters of run-time-extent instructions to their last execution's cost, so the
        profile built after a run counts the rows they actually processed."""
        for idx, cell in self.extents:
            c = cell[0]
            self.busy[idx], self.tail[idx], self.macs[idx] = c.busy, c.tail, c.macs
            self.dram_read[idx], self.dram_write[idx] = c.dram_read, c.dram_write

    def instr(self, idx: int) -> Instr:
        """The decoded instruction at ``idx`` (InputError for a word that does not decode)."""
        return decode(self.program.text[idx * INSTR_BYTES : (idx + 1) * INSTR_BYTES], idx)

    def describe(self, idx: int) -> str:
        """``instruction 12 (0x180) matmul, node /attn/MatMul (mcp.matmul)`` for messages."""
        node, op_type = self.nodes[int(self.node_of[idx])]
        ir_op = self.ir_ops[int(self.ir_op_of[idx])]
        what = f"instruction {idx} ({idx * INSTR_BYTES:#x}) {self.mnemonics[idx]}"
        if node != NO_NODE:
            what += f", ONNX node {node}"
            extra = ", ".join(x for x in (op_type, ir_op) if x)
            what += f" ({extra})" if extra else ""
        return what


def _sram_writes(instr: Instr, lo: int, size: int) -> np.ndarray | None:
    """Which bytes of SRAM [lo, lo + size) ``instr`` writes (by its spec's accesses), or None."""
    out = None
    for mem, base, rows, cols, stride, elem, write, _ in instr.spec.access(instr.fields):
        if mem != "sram" or not write or rows <= 0 or cols <= 0:
            continue
        width = int(math.ceil(cols * elem))
        step = int(stride * elem)
        first = 0 if step == 0 else max(0, (lo - base - width) // step)
        last = rows - 1 if step == 0 else min(rows - 1, (lo + size - base) // step + 1)
        for r in range(first, last + 1):
            a, b = base + r * step - lo, base + r * step + width - lo
            if b > 0 and a < size:
                out = np.zeros(size, dtype=bool) if out is None else out
                out[max(a, 0) : min(b, size)] = True
            if step == 0:
                break
    return out


def _untimed(m, x) -> None:
    raise Fault(x[0])


def _confined_store(m, x) -> None:
    fn, args, base, span, reg, lo, hi, what, _ = x
    addr = base + m.regs[reg]
    if addr < lo or addr + span > hi:
        raise Fault(
            f"register-offset store writes DRAM [{addr:#x}, {addr + span:#x}) outside its region "
            f"{what!r} [{lo:#x}, {hi:#x}) (r{reg} = {m.regs[reg]})"
        )
    fn(m, args)


def load_program(path: str | os.PathLike) -> LoadedProgram:
    """Read, verify and decode a .mcpb file (InputError naming the file when it is refused)."""
    return from_program(read_mcpb(path), str(path))


def from_program(program: Program, source: str = "<program>") -> LoadedProgram:
    """Prepare an in-memory Program (as read_mcpb returns it) for running."""
    try:
        target = program.target()
    except McpcError as exc:
        raise InputError(f"{source}: {exc.message}") from None
    text = program.text
    n = len(text) // INSTR_BYTES
    debug = program.debug if isinstance(program.debug, list) else []
    node_index: dict[tuple[str, str], int] = {}
    ir_index: dict[str, int] = {}
    recs, mnemonics, mac_dtype, decoded, costs = [], [], [], [], []
    extents: list[tuple[int, list]] = []
    cols = np.zeros((8, n), dtype=np.int64)  # busy, tail, macs, rd, wr, sram_hi, node, engine
    ir_of = np.zeros(n, dtype=np.int64)
    for idx in range(n):
        info = debug[idx] if idx < len(debug) and isinstance(debug[idx], dict) else {}
        key = (str(info.get("onnx_node") or NO_NODE), str(info.get("op_type") or ""))
        cols[6, idx] = node_index.setdefault(key, len(node_index))
        ir_of[idx] = ir_index.setdefault(str(info.get("ir_op") or ""), len(ir_index))
        word = text[idx * INSTR_BYTES : (idx + 1) * INSTR_BYTES]
        try:
            instr = fast_decode(word)
        except InputError as exc:  # the message then starts with "instruction word: "
            mnemonics.append(f"illegal(opcode {word[0]})")
            mac_dtype.append(None)
            reason = exc.message.split(": ", 1)[-1]
            fn, args, _ = illegal(f"illegal instruction: {reason}")
            recs.append((1, (), (), fn, args, 1, 0, False, ()))
            cols[0, idx], cols[7, idx] = 1, 1
            decoded.append(None)
            costs.append(None)
            continue
        cost = instr_cost(instr, target)
        decoded.append(instr)
        costs.append(cost)
        fn, args, hi = compile_instr(instr, target)
        busy = cost.busy
        cell = data_cost_cell(fn, args)
        if extent_register(instr) and not is_trap(fn):
            fn, args = compile_extent(instr, target, instr_cost, cost)
            busy = -1  # the event loop takes the cost of each execution from args[-1]
            extents.append((idx, args[-1]))
        elif cell is not None:  # a cost that follows the values it reads (vattn): same protocol
            busy = -1
            extents.append((idx, cell))
        else:
            fn, args = numeric.guard(instr, target, idx, fn, args)
        mnemonics.append(instr.op)
        mac_dtype.append(_mac_dtype(instr))
        dma = instr.op in ("load", "store", "gather", "scatter", "kvdecomp")
        recs.append(
            (instr.engine, _mask(instr.wait), _mask(instr.signal), fn, args, busy, cost.tail, dma, ())
        )
        cols[:6, idx] = (cost.busy, cost.tail, cost.macs, cost.dram_read, cost.dram_write, hi)
        cols[7, idx] = instr.engine
    for idx, deps in enumerate(ex_dependencies(decoded, costs)):
        if deps:
            recs[idx] = (*recs[idx][:8], deps)
    loaded = LoadedProgram(
        source=source,
        program=program,
        target=target,
        recs=recs,
        mnemonics=mnemonics,
        busy=cols[0],
        tail=cols[1],
        macs=cols[2],
        mac_dtype=mac_dtype,
        dram_read=cols[3],
        dram_write=cols[4],
        sram_hi=cols[5],
        node_of=cols[6],
        engine_of=cols[7],
        nodes=list(node_index),
        ir_op_of=ir_of,
        ir_ops=list(ir_index),
        extents=extents,
    )
    loaded.const_places = _check_memory_map(loaded)
    _check_io(loaded)
    return loaded


def _check_io(p: LoadedProgram) -> None:
    """Every I/O binding of every entry is well formed and lies inside the program's DRAM."""
    src, io = p.source, p.program.io
    if not isinstance(io, dict):
        raise InputError(f"{src}: section IOBD must map entry names to their bindings")
    entries = p.entries
    for entry, bindings in io.items():
        if entry not in entries:
            raise InputError(f"{src}: section IOBD names {entry!r}, which is not an entry point")
        if not isinstance(bindings, dict):
            raise InputError(f"{src}: section IOBD: the bindings of entry {entry!r} are not a map")
        for kind in ("inputs", "outputs"):
            items = bindings.get(kind, [])
            if not isinstance(items, list):
                raise InputError(f"{src}: section IOBD: {entry}.{kind} is not a list")
            names = set()
            for b in items:
                name = _check_binding(src, f"{entry}.{kind}", b, p.dram_size)
                if name in names:
                    raise InputError(f"{src}: section IOBD: {entry}.{kind} binds {name!r} twice")
                names.add(name)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_binding(src: str, where: str, b, dram_size: int) -> str:
    if not isinstance(b, dict) or not isinstance(b.get("name"), str) or not b["name"]:
        raise InputError(f"{src}: section IOBD: {where} has a malformed binding {b!r}")
    what = f"{src}: I/O binding {b['name']!r} ({where})"
    if not isinstance(b.get("dtype"), str) or b["dtype"] not in NUMPY_DTYPES:
        raise InputError(f"{what} has unknown dtype {b.get('dtype')!r}")
    shape = b.get("shape")
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise InputError(f"{what} has a shape that is not a list of sizes: {shape!r}")
    count = 1
    for d in shape:
        count *= d
    length = nbytes(b["dtype"], count)
    if "bytes" in b and b["bytes"] != length:
        raise InputError(f"{what} declares {b['bytes']!r} bytes, its dtype and shape need {length}")
    addr = b.get("dram")
    if not _is_int(addr) or addr < 0 or addr + length > dram_size:
        raise InputError(f"{what} ({length} bytes at {addr!r}) lies outside DRAM of {dram_size} bytes")
    for key in ("valid_range", "range"):
        bounds = b.get(key)
        if bounds is not None and not (
            isinstance(bounds, list) and len(bounds) == 2 and all(_is_int(v) for v in bounds)
            and bounds[0] < bounds[1]
        ):  # fmt: skip
            raise InputError(f"{what} has a malformed {key} {bounds!r} (expected [low, high))")
    for key in ("low", "high"):
        if key in b and not _is_int(b[key]):
            raise InputError(f"{what} has a malformed {key} {b[key]!r}")
    return b["name"]


def _check_persistent(src: str, regions: list, places: list[tuple[int, int, int]]) -> None:
    """Persistent regions (kept from run to run in a Session, zeroed by reset) have a unique
    name, a ``dtype``/``shape`` matching their bytes when given, and overlap no constant region
    and no other persistent region (a reset would zero what they share)."""
    seen: list[tuple[int, int, str]] = []
    names: set[str] = set()
    for region in regions:
        if region.get("kind") != "persistent":
            continue
        name, lo, hi = region.get("name"), region["dram"], region["dram"] + region["bytes"]
        if not isinstance(name, str) or not name or name in names:
            raise InputError(f"{src}: persistent region {region!r} needs a unique name")
        names.add(name)
        dtype, shape = region.get("dtype"), region.get("shape")
        if dtype is not None or shape is not None:
            ok = isinstance(dtype, str) and dtype in NUMPY_DTYPES and isinstance(shape, list)
            ok = ok and all(_is_int(d) and d >= 0 for d in shape)
            if not ok or nbytes(dtype, int(np.prod(shape, dtype=np.int64))) != region["bytes"]:
                raise InputError(
                    f"{src}: persistent region {name!r}: dtype {dtype!r} and shape {shape!r} do not "
                    f"describe its {region['bytes']} bytes"
                )
        others = [(d, d + n, "a constant region") for d, _, n in places] + seen
        for a, b, what in others:
            if a < hi and lo < b and hi > lo:
                raise InputError(f"{src}: persistent region {name!r} [{lo}, {hi}) overlaps {what}")
        seen.append((lo, hi, f"persistent region {name!r}"))


def _check_memory_map(p: LoadedProgram) -> list[tuple[int, int, int]]:
    """Validate the memory map against the target and CNST; returns where each constant slice goes.

    Constant regions take consecutive slices of CNST in the order listed (or the slice starting at
    the region's ``cnst_offset`` when given); together they must cover CNST exactly.
    """
    src, mm = p.source, p.program.memory_map
    if not isinstance(mm, dict) or not isinstance(mm.get("dram_size"), int) or mm["dram_size"] < 0:
        raise InputError(f"{src}: memory map has no valid dram_size")
    size = mm["dram_size"]
    if size > p.target.dram.size_bytes:
        raise InputError(
            f"{src}: memory map needs {size} bytes of DRAM, target {p.target.name} has "
            f"{p.target.dram.size_bytes}"
        )
    places, offset = [], 0
    regions = mm.get("regions") or []
    if not isinstance(regions, list):
        raise InputError(f"{src}: memory map regions must be a list, not {regions!r}")
    for region in regions:
        ok = isinstance(region, dict) and all(isinstance(region.get(k), int) for k in ("dram", "bytes"))
        if not ok or region["dram"] < 0 or region["bytes"] < 0 or region["dram"] + region["bytes"] > size:
            raise InputError(f"{src}: memory map region {region!r} lies outside DRAM of {size} bytes")
        if region.get("kind") == "const":
            start = region.get("cnst_offset", offset)
            if not isinstance(start, int) or start < 0 or start + region["bytes"] > len(p.program.constants):
                raise InputError(
                    f"{src}: const region {region.get('name')!r} ({region['bytes']} bytes at CNST offset "
                    f"{start}) exceeds the CNST section of {len(p.program.constants)} bytes"
                )
            places.append((region["dram"], start, region["bytes"]))
            offset = start + region["bytes"]
    _check_persistent(src, regions, places)
    covered = sum(b for _, _, b in places)
    if covered < len(p.program.constants):
        raise InputError(
            f"{src}: constant regions of the memory map cover {covered} bytes of a "
            f"{len(p.program.constants)}-byte CNST section"
        )
    return places


def _mac_dtype(instr) -> str | None:
    """The dtype whose MAC rate an instruction runs at (the profile's roofline), None if no MACs."""
    if instr.op in ("matmul", "matmul_w4a16"):
        return instr.in_dtype
    if instr.op == "vattn":  # the slower of the two rates, as attention_cost charges
        return instr.in_dtype if instr.in_dtype == "f32" or instr.kv_dtype != "f32" else instr.kv_dtype
    if instr.op in ("vmmul.q4f8", "matmul_i8"):
        return {"u8": "i8"}.get(instr.q_dtype, instr.q_dtype)
    return None
