"""The backend entry point: a verified IR module -> an ``arch.mcpb.Program`` for one target.

``compile_to_program`` checks that every op has a lowering, plans DRAM, lowers each op of each
function in program order into kernels, schedules them (token bits), ends each entry point with
``halt`` and fills every section of the container.  It is deterministic: the same module and
options give the same Program, hence a byte-identical ``.mcpb``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, fields
from importlib import metadata
from typing import Any

from mcpc.arch.isa import INSTR_BYTES, Instr, encode_program
from mcpc.arch.mcpb import Program
from mcpc.backend.emitter import NO_NODE, Emitter
from mcpc.backend.fusion import FusionGroup, FusionPlan, plan_fusion
from mcpc.backend.lower_matmul import epilogue_sram_bytes, matmul_kernel
from mcpc.backend.lower_state import host_register_records, register_kernel
from mcpc.backend.lowering import LoweringContext, load_lowerings, lowering_for
from mcpc.backend.memory import ALIAS_OPS, plan_dram
from mcpc.backend.residency import ResidentPlan, forward, plan_residents
from mcpc.backend.row_extent import extent_record, row_extent, with_extent_registers
from mcpc.backend.schedule import Kernel, schedule_with_debug
from mcpc.errors import DoesNotFit, PassError, UnsupportedError, does_not_fit
from mcpc.ir.ops import ConstantOp, HostRegOp, MatMulOp, ReturnOp, ScalarOp

# Default check tolerances per build precision, used when the options give none (``mcpc check``
# reads them from META; the shipped QAT configs' ``check:`` sections carry the same values).
TOLERANCES: dict[str, dict[str, float]] = {
    "fp32": {"max_norm_err": 1e-4, "min_cosine": 0.99999, "min_top1": 0.99},
    "fp16": {"max_norm_err": 5e-2, "min_cosine": 0.999, "min_top1": 0.99},
}
CHECK_KEYS = ("max_norm_err", "min_cosine", "min_top1", "rtol", "atol")
# HostRegOp and ScalarOp are computed by each entry's register kernel (lower_state.register_kernel).
_NO_CODE = (ConstantOp, ReturnOp, HostRegOp, ScalarOp, *ALIAS_OPS)


@dataclass(frozen=True)
class BackendOptions:
    """Backend settings.

    ``double_buffer``: two SRAM slots per kernel input/output so loads overlap compute (False:
    one slot, for comparison); None follows ``module.attrs["double_buffer"]`` (set by the
    npu-schedule pass option), default True.  ``prefetch``: consecutive kernels get disjoint
    SRAM regions when they fit, so that a kernel's loads that wait for nothing still pending
    (weights, inputs, finished results) run during the previous kernel (False: every kernel
    boundary is a full barrier, for comparison); None follows ``module.attrs["prefetch"]`` (the
    npu-schedule pass option), default True.  ``fuse_epilogue``: elementwise ops consuming a
    matmul's result alone are computed on its output tiles in SRAM (``backend/fusion.py``)
    instead of in kernels of their own (False: one kernel per op, for comparison); None follows
    ``module.attrs["fuse_epilogue"]`` (the npu-schedule pass option), default True.
    ``keep_in_sram``: intermediates that fit a resident area of SRAM are copied there by their
    producer and read on chip by later kernels instead of reloaded from DRAM
    (``backend/residency.py``; False: every kernel reloads its operands from DRAM); None follows
    ``module.attrs["keep_in_sram"]``, default True.  None of the four changes bits.
    ``precision`` overrides what META records (default: ``module.attrs["precision"]``); the check
    tolerances (``max_norm_err``, ``min_cosine``, ``min_top1``, ``rtol``, ``atol``; mcpc.check)
    that are set replace the precision's defaults;
    ``passes`` and ``source_model`` are recorded in META as given, and ``decoder`` (a decoder
    build's descriptor) as META["decoder"]."""

    double_buffer: bool | None = None
    prefetch: bool | None = None
    fuse_epilogue: bool | None = None
    keep_in_sram: bool | None = None
    precision: str | None = None
    max_norm_err: float | None = None
    min_cosine: float | None = None
    min_top1: float | None = None
    rtol: float | None = None
    atol: float | None = None
    passes: tuple[str, ...] = ()
    source_model: str | None = None
    decoder: dict | None = None  # META["decoder"] of a decoder build (ir/decoder_import.py)

    @classmethod
    def coerce(cls, options: BackendOptions | Mapping[str, Any] | None) -> BackendOptions:
        """Options from a BackendOptions, None, or a mapping of the driver's keys: the field names
        plus ``tolerances: {max_norm_err, min_cosine, min_top1, rtol, atol}`` (other keys, e.g.
        ``qat_config``, are ignored)."""
        if options is None:
            return cls()
        if isinstance(options, cls):
            return options
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in options.items() if k in known and v is not None}
        tol = options.get("tolerances") or {}
        for key in CHECK_KEYS:
            kw.setdefault(key, tol.get(key))
        if "passes" in kw:
            kw["passes"] = tuple(kw["passes"])
        return cls(**kw)


def _version() -> str:
    try:
        return metadata.version("mcpc")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0+unknown"


def check_lowerable(module: Any) -> None:
    """UnsupportedError naming the first op (and its ONNX node) that has no lowering."""
    load_lowerings()
    for fn in module.functions.values():
        for op in fn.ops:
            if not isinstance(op, _NO_CODE) and lowering_for(op) is None:
                raise UnsupportedError(
                    f"backend: {op.describe()} in func @{fn.name} has no lowering for the MCP 2026 "
                    "ISA in this version"
                )


def compile_to_program(
    module: Any, target: Any, options: BackendOptions | Mapping[str, Any] | None = None
) -> Program:
    """Compile a verified IR ``module`` for ``target`` into a Program (one entry per function).

    Assumes the module verifies and its matmuls carry the ``tile`` the interpreter follows (the
    ``tile-matmul`` pass sets it; ``[]`` means whole dims, which must then fit SRAM).  Raises
    UnsupportedError for an op without lowering, PassError naming the op when a kernel cannot
    fit SRAM or a field overflows its encoding.
    """
    opts = BackendOptions.coerce(options)
    module.verify()
    check_lowerable(module)
    double_buffer = opts.double_buffer
    if double_buffer is None:
        double_buffer = bool(module.attrs.get("double_buffer", True))
    fuse = opts.fuse_epilogue
    if fuse is None:
        fuse = bool(module.attrs.get("fuse_epilogue", True))
    slots = (2, 2) if double_buffer else (1, 1)
    fusion = {
        fn.name: fusion_plan(fn, target, slots) if fuse else FusionPlan() for fn in module.functions.values()
    }
    positions = {op: i for f in fusion.values() for op, i in f.positions.items()}
    plan = plan_dram(module, positions)
    if plan.size > target.dram.size_bytes:
        raise does_not_fit(
            "the program (weights, inputs, outputs and intermediates)",
            plan.size,
            target.dram.size_bytes,
            "DRAM",
            "dram.size_bytes",
            f"target {target.name}",
        )
    em = Emitter(target)
    prefetch = opts.prefetch
    if prefetch is None:
        prefetch = bool(module.attrs.get("prefetch", True))
    keep = opts.keep_in_sram
    if keep is None:
        keep = bool(module.attrs.get("keep_in_sram", True))
    ctx = LoweringContext(target, em, double_buffer, plan.placements, plan.constants, globals=plan.globals)
    ctx.global_types = {g.name: g.type for g in getattr(module, "globals", {}).values()}
    text: list[Instr] = []
    debug: list[dict] = []
    entries, io = [], {}
    extents: dict[str, dict | None] = {}
    for fn in module.functions.values():
        ctx.registers = {}
        ctx.free_registers = []
        prologue = register_kernel(module, fn, ctx)
        ctx.extent = row_extent(module, fn, ctx)
        residents = ResidentPlan()
        if keep:
            reserve = resident_reserve(fn, target, slots, fusion[fn.name])
            residents = plan_residents(fn, plan.placements, fusion[fn.name].positions, ctx.align, reserve)
        kernels, kpos = _lower_with_residents(fn, ctx, prefetch, keep, fusion[fn.name], residents)
        prologue = with_extent_registers(prologue, ctx)
        extents[fn.name] = extent_record(ctx.extent)
        ctx.extent = None
        if prologue is not None:  # sets the registers before every op (position -1)
            kernels, kpos = [prologue, *kernels], [-1, *kpos]
        regions = persistent_ranges(plan.regions)
        forward(kernels, kpos, residents, em, regions)
        ctx.sram_peak = max(ctx.sram_peak, residents.size)
        instrs, dbg = schedule_with_debug(kernels, prefetch, regions, early_compute=keep)
        instrs.append(Instr("halt", {}))
        dbg.append(None)
        entries.append({"name": fn.name, "start": len(text), "count": len(instrs)})
        text.extend(instrs)
        debug.extend(dict(d) if d is not None else dict(NO_NODE) for d in dbg)
        io[fn.name] = {
            "inputs": [_binding(a.name, a, plan) for a in fn.args],
            "outputs": [_binding(n, v, plan) for n, v in zip(fn.result_names, fn.outputs, strict=True)],
        }
    precision = opts.precision or str(module.attrs.get("precision", "fp32"))
    tol = {k: float(getattr(opts, k)) for k in CHECK_KEYS if getattr(opts, k) is not None}
    tol = tol or dict(TOLERANCES.get(precision, TOLERANCES["fp32"]))
    meta = {
        "compiler_version": _version(),
        "precision": precision,
        "tolerances": tol,
        "passes": list(opts.passes),
        "source_model": opts.source_model,
        "double_buffer": double_buffer,
        "prefetch": prefetch,
        "fuse_epilogue": fuse,
        "keep_in_sram": keep,
    }
    if opts.decoder is not None:
        meta["decoder"] = dict(opts.decoder)
        if any(extents.values()):
            meta["decoder"]["row_extent"] = {k: v for k, v in extents.items() if v}
    memory_map = {
        "dram_size": plan.size,
        "regions": plan.regions,
        "sram_peak_bytes": ctx.sram_peak,
        "sram_size_bytes": int(target.sram.size_bytes),
        "buffers": plan.buffers,
    }
    return Program.for_target(
        target, encode_program(text), constants=plan.cnst, entries=entries, io=io,
        memory_map=memory_map, debug=debug, meta=meta, host_registers=host_register_records(module),
    )  # fmt: skip


def persistent_ranges(regions: list[dict]) -> list[tuple[int, int]]:
    """DRAM ``[lo, hi)`` of every persistent region: register-offset accesses based in one stay in
    it (the IR verifier proves their offsets, ``ir/state.py``), so hazards are tracked per region."""
    return [(r["dram"], r["dram"] + r["bytes"]) for r in regions if r.get("kind") == "persistent"]


def fusion_plan(fn: Any, target: Any, slots: tuple[int, int]) -> FusionPlan:
    """The epilogue groups of ``fn``: matmuls (non-empty) whose fused kernel fits the target's SRAM
    with ``slots`` input/output slots."""
    size, align = int(target.sram.size_bytes), int(target.sram.bank_bytes)

    def heads(op: Any) -> bool:
        return isinstance(op, MatMulOp) and op.result.type.numel > 0 and op.operands[0].type.shape[-1] > 0

    def fits(group: FusionGroup) -> bool:
        return epilogue_sram_bytes(group.head, group.epilogue, slots, align) <= size

    return plan_fusion(fn, heads, fits)


def _lower_with_residents(
    fn: Any, ctx: LoweringContext, prefetch: bool, keep: bool, fusion: FusionPlan, residents: ResidentPlan
) -> tuple[list[Kernel], list[int]]:
    """Lower ``fn`` in the SRAM above the resident area; if an op does not fit there, the
    function is lowered again without resident values (the whole scratchpad for its kernels)."""
    size = ctx.sram_budget
    counts = ctx.emitter.counts.copy()
    ctx.sram_base, ctx.sram_budget = residents.size, size - residents.size
    try:
        return _lower_function(fn, ctx, "ring" if keep and prefetch else prefetch, fusion)
    except PassError:  # DoesNotFit, or a fixed tile too big for the SRAM left
        if not residents.size:
            raise
        ctx.emitter.counts = counts
        residents.size, residents.values = 0, []
        ctx.sram_base, ctx.sram_budget = 0, size
        return _lower_function(fn, ctx, "ring" if keep and prefetch else prefetch, fusion)
    finally:
        ctx.sram_base, ctx.sram_budget = 0, size


def resident_reserve(fn: Any, target: Any, slots: tuple[int, int], fusion: FusionPlan) -> int:
    """SRAM bytes the resident area of ``fn`` may take: a quarter of the scratchpad, less if a
    matmul's fixed tile (with its epilogue) needs more of the rest."""
    size, align = int(target.sram.size_bytes), int(target.sram.bank_bytes)
    need = 0
    for op in fn.ops:
        if isinstance(op, MatMulOp) and op.result.type.numel > 0 and op.operands[0].type.shape[-1] > 0:
            group = fusion.groups.get(op)
            need = max(need, epilogue_sram_bytes(op, group.epilogue if group else (), slots, align))
    return max(0, min(size // 4, size - need) // align * align)


def _lower_function(
    fn: Any, ctx: LoweringContext, prefetch: bool | str, fusion: FusionPlan
) -> tuple[list[Kernel], list[int]]:
    """The kernels of ``fn`` in order, and each kernel's op position (``fusion.positions``)."""
    kernels: list[Kernel] = []
    kpos: list[int] = []
    index = {op: i for i, op in enumerate(fn.ops)}
    for op in fn.ops:
        if isinstance(op, _NO_CODE) or op in fusion.absorbed:
            continue
        group = fusion.groups.get(op)
        pos = fusion.positions.get(op, index[op])
        if group is not None:
            counts = ctx.emitter.counts.copy()
            try:  # the fused kernel; its ops one by one if it cannot be built
                _lower_op(op, lambda o, c, e=group.epilogue: matmul_kernel(o, c, e), ctx, prefetch, kernels)
                kpos += [pos] * (len(kernels) - len(kpos))
                continue
            except PassError:
                ctx.emitter.counts = counts
        for member in group.ops if group is not None else (op,):
            _lower_op(member, lowering_for(member), ctx, prefetch, kernels)
            kpos += [fusion.positions.get(member, index[member])] * (len(kernels) - len(kpos))
    return kernels, kpos


def _lower_op(op: Any, lower: Any, ctx: LoweringContext, prefetch: bool | str, kernels: list[Kernel]) -> None:
    """Lower ``op`` with ``lower`` into the next SRAM region; append its kernels to ``kernels``."""
    with ctx.emitter.node(op) as context:
        try:
            prev = next((k for k in reversed(kernels) if any(k.steps)), None)
            got = _lower_in_region(op, lower, ctx, prefetch, prev)
        except PassError as exc:
            if exc.message.startswith("backend:") or isinstance(exc, DoesNotFit):
                raise
            raise PassError(f"backend: {op.describe()}: {exc.message}") from None
    for k in [got] if isinstance(got, Kernel) else list(got or []):
        if k.debug is None:
            k.debug = dict(context)
        ctx.sram_peak = max(ctx.sram_peak, k.sram_base + k.sram_bytes)
        kernels.append(k)


def sram_regions(size: int, align: int, prev: tuple[int, int] | None) -> list[tuple[int, int]]:
    """SRAM regions ``(base, bytes)`` to try, in order, for a kernel following one that planned
    ``prev = (base, bytes)`` (None: no previous kernel, or prefetch off).

    First the half of the scratchpad the previous kernel does not touch (consecutive kernels
    alternate halves, so a kernel's loads can run while the previous kernel computes), then the
    larger space beside the previous kernel (a kernel with a fixed tile too big for a half), and
    last the whole scratchpad, which makes the kernel wait for the previous one (see
    ``schedule``).  Every region is ``align``-ed and lies in [0, size).
    """
    half = size // 2 // align * align
    out: list[tuple[int, int]] = []
    if prev is None:
        out.append((0, half))
    else:
        lo, hi = prev[0], -(-(prev[0] + prev[1]) // align) * align
        if hi <= half:
            out.append((half, size - half))
        elif lo >= half:
            out.append((0, half))
        beside = max((hi, size - hi), (0, lo // align * align), key=lambda r: r[1])
        if beside[1] > 0 and beside not in out:
            out.append(beside)
    out.append((0, size))
    return [r for r in out if r[1] > 0]


def ring_regions(size: int, align: int, prev: tuple[int, int] | None) -> list[tuple[int, int]]:
    """SRAM regions ``(base, bytes)`` to try for a kernel following one that planned ``prev``
    (None: the first kernel) when intermediates stay in SRAM: the space after the previous
    kernel (unless less than an eighth of the scratchpad is left), then the whole scratchpad.
    Kernels follow each other around the scratchpad like a ring, so a kernel's SRAM was last
    used many kernels earlier: its loads (the next weights) start as far ahead as SRAM allows,
    and its first compute seldom waits for a store still reading its bytes."""
    cursor = 0 if prev is None else -(-(prev[0] + prev[1]) // align) * align
    out = [(cursor, size - cursor)] if size - cursor >= size // 8 else []
    return [*out, (0, size)]


def _lower_in_region(
    op: Any, lower: Any, ctx: LoweringContext, prefetch: bool | str, prev: Kernel | None
) -> Any:
    """Lower ``op`` into the first region of ``sram_regions`` (``ring_regions`` when ``prefetch``
    is ``"ring"``) its kernels fit (a lowering that does not fit its budget raises PassError, and
    the next, larger region is tried); without prefetch, into the whole SRAM budget."""
    base0, size = ctx.sram_base, ctx.sram_budget
    regions = [(base0, size)]
    if prefetch:
        prev_plan = (prev.sram_base - base0, prev.sram_bytes) if prev is not None else None
        plan = ring_regions if prefetch == "ring" else sram_regions
        regions = [(base0 + b, n) for b, n in plan(size, ctx.align, prev_plan)]
    counts = ctx.emitter.counts.copy()
    try:
        for n, (base, budget) in enumerate(regions):
            ctx.sram_base, ctx.sram_budget = base, budget
            try:
                return lower(op, ctx)
            except PassError:
                if n == len(regions) - 1:
                    raise
                ctx.emitter.counts = counts.copy()  # the failed attempt's instructions are dropped
    finally:
        ctx.sram_base, ctx.sram_budget = base0, size
    raise AssertionError("unreachable")  # pragma: no cover


def _binding(name: str, value: Any, plan: Any) -> dict:
    t = value.type
    binding = {
        "name": name,
        "dtype": t.dtype.name,
        "shape": list(t.shape),
        "dram": plan.placements[value],
        "bytes": t.nbytes,
        "onnx_dtype": t.dtype.onnx,
    }
    if t.dtype.name == "i64" and value.is_argument:
        # The NPU has no 64-bit arithmetic: the program narrows i64 inputs to i32 right away, so
        # the simulator must refuse values that would wrap rather than compute a wrong answer.
        binding["valid_range"] = [-(2**31), 2**31]
    return binding


def compile_report(program: Program) -> dict:
    """What a CI report tracks about a compiled program: weight bytes, instruction counts per
    mnemonic and per entry, the SRAM plan and the DRAM plan (regions and buffer sizes)."""
    instrs = program.instructions()
    mm = program.memory_map or {}
    regions = mm.get("regions", [])
    per_kind = Counter()
    for r in regions:
        per_kind[r.get("kind", "?")] += int(r.get("bytes", 0))
    return {
        "target": program.target_name,
        "weight_bytes": len(program.constants),
        "instructions": len(program.text) // INSTR_BYTES,
        "instructions_per_mnemonic": dict(sorted(Counter(i.op for i in instrs).items())),
        "entries": [dict(e) for e in program.entries],
        "sram": {"peak_bytes": mm.get("sram_peak_bytes"), "size_bytes": mm.get("sram_size_bytes")},
        "dram": {
            "size_bytes": mm.get("dram_size"),
            "bytes_per_kind": dict(sorted(per_kind.items())),
            "regions": regions,
        },  # fmt: skip
    }
