"""The lowering table and the context every lowering receives.

A lowering is ``fn(op, ctx) -> Kernel | list[Kernel]`` registered for one or more op classes with
``@register_lowering(OpClass, ...)``.  It reads operands from DRAM and writes its results to DRAM
(addresses from ``ctx.dram``), tiles through an SRAM arena from ``ctx.arena()`` so that every
tile fits ``ctx.sram_budget`` with ``ctx.in_slots`` / ``ctx.out_slots`` buffers, and builds its
instructions with ``ctx.emitter.emit``.  Token bits are assigned later by ``schedule``.

Ops that need no code are not lowered: ``mcp.constant`` (its bytes are in CNST), ``mcp.return``
(outputs are bound in IOBD) and the aliasing ops of ``memory.ALIAS_OPS`` (``mcp.reshape``: its
result shares its operand's DRAM bytes).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mcpc.backend.emitter import Emitter
from mcpc.backend.memory import SramArena, rows_bytes, rows_that_fit
from mcpc.backend.schedule import Kernel, Step
from mcpc.errors import DoesNotFit, does_not_fit

Lowering = Callable[[Any, "LoweringContext"], "Kernel | list[Kernel]"]
LOWERINGS: dict[type, Lowering] = {}

# Modules that register lowerings (imported by ``load_lowerings``); a listed module that does not
# exist yet is skipped so the backend helpers can land independently.
LOWERING_MODULES: tuple[str, ...] = (
    "mcpc.backend.lower_matmul",
    "mcpc.backend.lower_qmatmul",
    "mcpc.backend.lower_vector",
    "mcpc.backend.lower_shape",
    "mcpc.backend.lower_nn",
    "mcpc.backend.lower_state",
    "mcpc.backend.lower_kv",
)


def register_lowering(*op_types: type) -> Callable[[Lowering], Lowering]:
    """Decorator: ``fn`` lowers every op class in ``op_types`` (TypeError when one already has one)."""

    def deco(fn: Lowering) -> Lowering:
        for t in op_types:
            previous = LOWERINGS.get(t)
            if previous is not None and previous is not fn:
                raise TypeError(f"{t.__name__} already lowered by {previous.__module__}.{previous.__name__}")
            LOWERINGS[t] = fn
        return fn

    return deco


def load_lowerings() -> dict[type, Lowering]:
    """Import every existing module of ``LOWERING_MODULES``; return the (filled) ``LOWERINGS``."""
    for name in LOWERING_MODULES:
        if importlib.util.find_spec(name) is not None:
            importlib.import_module(name)
    return LOWERINGS


def lowering_for(op: Any) -> Lowering | None:
    """The lowering of ``op``'s class (or of its nearest registered base class)."""
    for cls in type(op).__mro__:
        if cls in LOWERINGS:
            return LOWERINGS[cls]
    return None


@dataclass
class LoweringContext:
    """What a lowering may consult: the target, the DRAM plan, constants, SRAM budget, emitter.

    ``placements`` maps each IR value to its DRAM byte address (filled by ``memory.plan_dram``);
    ``constants`` maps values defined by ``mcp.constant`` (and reshapes of them) to their arrays.
    ``globals`` maps each module global to its DRAM address (``global_types`` to its type),
    ``registers`` each global access op to the register holding its byte offset, and each
    ``mcp.paged_attention`` to its (block count, K/V rows in use) registers
    (``lower_state.register_kernel``).
    ``extent`` gives a tile of token rows its run-time row count register (``row_extent.py``).
    ``sram_base`` / ``sram_budget`` are the SRAM region the op's kernels may use (the compile
    driver moves it so that consecutive kernels can live in disjoint regions, see
    ``compile.py``); lowerings must allocate SRAM only through ``arena()``.
    Guarantees to lowerings: every operand and result of the op being lowered has a placement;
    ``sram_peak`` is the highest SRAM byte (exclusive) planned by the kernels built so far.
    """

    target: Any
    emitter: Emitter
    double_buffer: bool = True
    placements: dict[Any, int] = field(default_factory=dict)
    constants: dict[Any, np.ndarray] = field(default_factory=dict)
    sram_budget: int = 0
    sram_peak: int = 0
    sram_base: int = 0
    globals: dict[str, int] = field(default_factory=dict)  # persistent buffer -> DRAM address
    global_types: dict[str, Any] = field(default_factory=dict)  # persistent buffer -> its TensorType
    registers: dict[Any, int] = field(default_factory=dict)  # global access op -> byte-offset register
    free_registers: list[int] = field(default_factory=list)  # left by the register kernel
    # the entry's row extent (``backend/row_extent.RowExtent``; None: every count is the capacity)
    extent: Any = None

    def __post_init__(self) -> None:
        if not self.sram_budget:
            self.sram_budget = int(self.target.sram.size_bytes)

    @property
    def in_slots(self) -> int:
        """Input slots per kernel: 2 with double buffering, else 1."""
        return 2 if self.double_buffer else 1

    @property
    def out_slots(self) -> int:
        """Output slots per kernel: 2 with double buffering, else 1."""
        return 2 if self.double_buffer else 1

    @property
    def align(self) -> int:
        """SRAM allocation granularity (the target's bank size)."""
        return int(self.target.sram.bank_bytes)

    def dram(self, value: Any) -> tuple[int, Any]:
        """``(byte address, TensorType)`` of ``value`` in DRAM (row-major, densely packed)."""
        return self.placements[value], value.type

    def constant(self, value: Any) -> np.ndarray | None:
        """The array of ``value`` when it is a compile-time constant, else None."""
        return self.constants.get(value)

    def arena(self) -> SramArena:
        """A fresh SRAM arena over this op's region (``sram_base``, ``sram_budget`` bytes)."""
        return SramArena(self.sram_budget, self.align, self.sram_base)

    def rows_that_fit(
        self,
        in_row_bytes: Sequence[int],
        out_row_bytes: Sequence[int],
        persistent: int = 0,
        max_rows: int | None = None,
    ) -> int:
        """Largest row tile whose in/out slot buffers (per-row byte sizes) plus ``persistent``
        bytes fit the SRAM budget with this context's slot counts; 0 when one row does not fit."""
        return rows_that_fit(
            self.sram_budget, self.align, self.in_slots, self.out_slots,
            in_row_bytes, out_row_bytes, persistent, max_rows,
        )  # fmt: skip

    def row_bytes_needed(self, in_row_bytes: Sequence[int], out_row_bytes: Sequence[int]) -> int:
        """SRAM bytes of one row of each buffer: what ``rows_that_fit`` found too big when it returns 0."""
        return rows_bytes(1, self.align, self.in_slots, self.out_slots, in_row_bytes, out_row_bytes)

    def does_not_fit(self, op: Any, what: str, need: int) -> DoesNotFit:
        """The user error for ``op``'s ``what`` needing ``need`` bytes of SRAM: by how much, and
        the ``--set sram.size_bytes`` that would hold it."""
        t = self.target
        return does_not_fit(
            f"{op.describe()}: {what}", need, t.sram.size_bytes, "SRAM", "sram.size_bytes", f"target {t.name}"
        )

    def stream_in_slots(self, load_steps: int, rows: int, need: Callable[[int], int]) -> int:
        """Input slots of a kernel with ``load_steps`` loading steps over ``rows`` rows, whose SRAM
        is ``need(in_slots)`` bytes: ``in_slots``, or for a few-row kernel (at most the target's
        ``mac.stream_max_rows``: its steps stream weights, the DRAM bound) with double buffering
        whose every step can have a slot of its own within the budget and half the scratchpad,
        one slot per step: all its weight tiles then load ahead of its computes, as far as the
        kernels before it allow (the tiles, hence the bits, stay).  Not a deeper ring short of
        that: a kernel spanning more SRAM waits longer for the kernels before it to free it, and
        the load queue, in order, waits with it."""
        n = self.in_slots
        if not self.double_buffer or rows > self.target.mac.stream_max_rows or load_steps <= n:
            return n
        cap = min(self.sram_budget, int(self.target.sram.size_bytes) // 2)
        return load_steps if need(load_steps) <= cap else n

    def kernel(self, steps: list[Step], arena: SramArena | None = None, in_slots: int = 0) -> Kernel:
        """A Kernel with this context's slot counts (``in_slots`` overrides the input slots);
        records the arena's region and peak as its SRAM use."""
        used = arena.peak if arena is not None else 0
        base = arena.base if arena is not None else self.sram_base
        self.sram_peak = max(self.sram_peak, base + used)
        return Kernel(steps, in_slots or self.in_slots, self.out_slots, sram_bytes=used, sram_base=base)

    def rows_reg(self, value: Any, first: int, row_elems: int) -> int:
        """The register of the run-time row count of a tile of ``value``'s rows ``first`` … of
        ``row_elems`` elements each (``row_extent.RowExtent.count``); 0 = the tile's capacity."""
        return self.extent.count(value, first, row_elems) if self.extent is not None else 0
