"""Step costs of the served model: what one iteration of the serving loop costs on the target.

``StepCost`` is the interface the simulator schedules against (cycles, plus the clock to turn them
into seconds); ``ServedShape`` is what the build allows (batch, sequence, chunk, KV pool).  Three
sources:

- ``AnalyticCost``: a linear formula from a cost file (``kind: analytic``), for tests and for
  what-if questions before a program exists;
- ``CostGrid``: the costs measured once at grid points by a *measurer* (a callable running
  timing-only steps of the compiled program: ``measure("decode", active, context)`` with every
  active sequence at ``context`` tokens, ``measure("prefill", chunk, past)``), bilinearly
  interpolated, with its interpolation error measured at the cell centres and cached to a JSON
  file (``kind: cost_grid``);
- ``ExactCost``: the measurer itself, per step (memoised).

Decode is interpolated over (active sequences, mean context = total KV tokens / active), a rectangle
whose every point is a real state; prefill over (chunk length, past), past clamped to
``max_seq - prefill_chunk`` (linear extrapolation beyond, where only a chunk shorter than the
build's can be).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal, Protocol

import numpy as np
from pydantic import Field

from mcpc.errors import ConfigError
from mcpc.fileio import write_atomic

from .config import Section, load_yaml, validate

Measurer = Callable[[str, int, int], float]


class Measured(float):
    """A measurer's answer: the cycles of the step (the float), with the DRAM bytes it read."""

    dram_bytes: float | None

    def __new__(cls, cycles: float, dram_bytes: float | None = None):
        out = super().__new__(cls, cycles)
        out.dram_bytes = None if dram_bytes is None else float(dram_bytes)
        return out


@dataclass(frozen=True)
class ServedShape:
    """What the build serves: batch, longest sequence, prefill chunk, KV pool and its bytes."""

    max_batch: int
    max_seq: int
    prefill_chunk: int
    kv_blocks: int
    block: int = 64
    kv_bytes_per_token: int = 0


class StepCost(Protocol):
    """Cycles of one decode call and one prefill call; ``clock_hz`` turns cycles into seconds.
    A cost that knows the DRAM bytes of a step also has ``dram_bytes_per_s`` (not None) and
    ``decode_bytes`` / ``prefill_bytes`` of the same arguments."""

    clock_hz: float

    def decode_cost(self, active_seqs: int, total_kv_tokens: int) -> float: ...

    def prefill_cost(self, chunk_len: int, past: int) -> float: ...


# -- analytic ----------------------------------------------------------------------------------


class _DecodeTerms(Section):
    base: float = Field(ge=0)
    per_seq: float = Field(default=0, ge=0)
    per_kv_token: float = Field(default=0, ge=0)


class _PrefillTerms(Section):
    base: float = Field(ge=0)
    per_token: float = Field(default=0, ge=0)
    per_attended: float = Field(default=0, ge=0, description="per (query, key) pair of attention")


class _ShapeSpec(Section):
    max_batch: int = Field(ge=1)
    max_seq: int = Field(ge=2)
    prefill_chunk: int = Field(ge=1)
    kv_blocks: int | None = Field(default=None, ge=1)
    block: int = Field(default=64, ge=1)
    kv_bytes_per_token: int = Field(default=0, ge=0)

    def shape(self) -> ServedShape:
        blocks = self.kv_blocks or self.max_batch * -(-self.max_seq // self.block)
        return ServedShape(
            self.max_batch,
            self.max_seq,
            min(self.prefill_chunk, self.max_seq),
            blocks,
            self.block,
            self.kv_bytes_per_token,
        )


class _DramSpec(Section):
    gbps: float = Field(gt=0, description="DRAM bandwidth, GB/s (1e9 bytes)")
    weight_bytes: int = Field(ge=0, description="bytes of weights every call reads")


class AnalyticSpec(_ShapeSpec):
    """A cost file ``kind: analytic``: cycles = the linear terms below, at ``clock_mhz``; with
    ``dram``, a call reads the weights plus the KV bytes of the positions it attends."""

    kind: Literal["analytic"]
    clock_mhz: float = Field(gt=0)
    decode: _DecodeTerms
    prefill: _PrefillTerms
    dram: _DramSpec | None = None


@dataclass(frozen=True)
class AnalyticCost:
    """decode = base + per_seq·active + per_kv_token·total_kv_tokens;
    prefill = base + per_token·chunk + per_attended·(chunk·past + chunk·(chunk + 1)/2)."""

    clock_hz: float
    decode: _DecodeTerms
    prefill: _PrefillTerms
    dram: _DramSpec | None = None
    kv_bytes_per_token: int = 0

    @property
    def dram_bytes_per_s(self) -> float | None:
        return None if self.dram is None else self.dram.gbps * 1e9

    def decode_bytes(self, active_seqs: int, total_kv_tokens: int) -> float:
        return self.dram.weight_bytes + total_kv_tokens * self.kv_bytes_per_token

    def prefill_bytes(self, chunk_len: int, past: int) -> float:
        return self.dram.weight_bytes + (past + chunk_len) * self.kv_bytes_per_token

    def decode_cost(self, active_seqs: int, total_kv_tokens: int) -> float:
        d = self.decode
        return d.base + d.per_seq * active_seqs + d.per_kv_token * total_kv_tokens

    def prefill_cost(self, chunk_len: int, past: int) -> float:
        p = self.prefill
        attended = chunk_len * past + chunk_len * (chunk_len + 1) / 2
        return p.base + p.per_token * chunk_len + p.per_attended * attended

    def measure(self, kind: str, x: int, y: int) -> float:
        """A measurer over this formula (decode: ``y`` is each sequence's context)."""
        if kind == "decode":
            cycles, nbytes = self.decode_cost(x, x * y), self.dram and self.decode_bytes(x, x * y)
        else:
            cycles, nbytes = self.prefill_cost(x, y), self.dram and self.prefill_bytes(x, y)
        return Measured(cycles, nbytes)


# -- measured grid -----------------------------------------------------------------------------


def _axis(lo: int, hi: int, points: int, powers: bool = False) -> list[int]:
    if powers:
        vals = {lo, hi} | {1 << k for k in range(hi.bit_length()) if lo <= 1 << k <= hi}
    else:
        vals = set(np.linspace(lo, hi, max(points, 2)).round().astype(int).tolist())
    return sorted(int(v) for v in vals)


def _interp2(xs: np.ndarray, ys: np.ndarray, table: np.ndarray, x: float, y: float) -> float:
    """Bilinear on a rectangular grid; linear extrapolation outside it."""

    def cell(axis, v):
        if len(axis) == 1:
            return 0, 0, 0.0
        i = int(np.clip(np.searchsorted(axis, v, side="right") - 1, 0, len(axis) - 2))
        return i, i + 1, (v - axis[i]) / (axis[i + 1] - axis[i])

    i0, i1, tx = cell(xs, x)
    j0, j1, ty = cell(ys, y)
    top = table[i0, j0] * (1 - ty) + table[i0, j1] * ty
    bottom = table[i1, j0] * (1 - ty) + table[i1, j1] * ty
    return float(top * (1 - tx) + bottom * tx)


@dataclass
class CostGrid:
    """Step costs measured at grid points and interpolated; ``error`` holds the interpolation error
    measured at the cell centres (relative to the measured cost there)."""

    clock_hz: float
    shape: ServedShape
    decode_active: list[int]
    decode_context: list[int]
    decode_cycles: list[list[float]]
    prefill_chunk: list[int]
    prefill_past: list[int]
    prefill_cycles: list[list[float]]
    error: dict
    source: dict
    decode_bytes_table: list[list[float]] | None = None  # DRAM bytes read at each point
    prefill_bytes_table: list[list[float]] | None = None
    dram_bytes_per_s: float | None = None

    def __post_init__(self):
        self._d = (np.asarray(self.decode_active, float), np.asarray(self.decode_context, float),
                   np.asarray(self.decode_cycles, float))  # fmt: skip
        self._p = (np.asarray(self.prefill_chunk, float), np.asarray(self.prefill_past, float),
                   np.asarray(self.prefill_cycles, float))  # fmt: skip
        if (
            self.dram_bytes_per_s is None
            or self.decode_bytes_table is None
            or self.prefill_bytes_table is None
        ):
            self.dram_bytes_per_s = None
        else:
            self._db = (*self._d[:2], np.asarray(self.decode_bytes_table, float))
            self._pb = (*self._p[:2], np.asarray(self.prefill_bytes_table, float))

    def decode_bytes(self, active_seqs: int, total_kv_tokens: int) -> float:
        return _interp2(*self._db, active_seqs, total_kv_tokens / max(active_seqs, 1))

    def prefill_bytes(self, chunk_len: int, past: int) -> float:
        return _interp2(*self._pb, chunk_len, past)

    def decode_cost(self, active_seqs: int, total_kv_tokens: int) -> float:
        return _interp2(*self._d, active_seqs, total_kv_tokens / max(active_seqs, 1))

    def prefill_cost(self, chunk_len: int, past: int) -> float:
        return _interp2(*self._p, chunk_len, past)

    @classmethod
    def measure(
        cls,
        measurer: Measurer,
        shape: ServedShape,
        clock_hz: float,
        points: int = 9,
        source: dict | None = None,
        progress: Callable[[int, int], None] | None = None,
        dram_bytes_per_s: float | None = None,
    ) -> CostGrid:
        """Measure the grid (``points`` per length axis; powers of two for the batch axis) and its
        error at every cell centre; ``progress(done, total)`` after each measurement.  The DRAM
        bytes of each point are kept when every answer carries them (``Measured``) and
        ``dram_bytes_per_s`` is given."""
        s = shape
        d_a = _axis(1, s.max_batch, points, powers=True)
        d_c = _axis(1, s.max_seq, points)
        p_c = _axis(1, s.prefill_chunk, min(points, s.prefill_chunk), powers=False)
        p_p = _axis(0, max(s.max_seq - s.prefill_chunk, 0), points)
        mids = lambda axis: [(a + b) // 2 for a, b in zip(axis, axis[1:], strict=False) if b - a > 1]  # noqa: E731
        jobs = [("decode", a, c) for a in d_a for c in d_c] + [("prefill", c, p) for c in p_c for p in p_p]
        checks = [("decode", a, c) for a in mids(d_a) or d_a for c in mids(d_c)]
        checks += [("prefill", c, p) for c in mids(p_c) or p_c for p in mids(p_p)]
        total, done, seen, nbytes = len(jobs) + len(checks), 0, {}, {}
        for job in jobs + checks:
            if job not in seen:
                v = measurer(*job)
                seen[job] = float(v)
                nbytes[job] = getattr(v, "dram_bytes", None)
            done += 1
            if progress:
                progress(done, total)
        grid = cls(
            clock_hz, shape, d_a, d_c, [[seen[("decode", a, c)] for c in d_c] for a in d_a],
            p_c, p_p, [[seen[("prefill", c, p)] for p in p_p] for c in p_c], {}, source or {},
        )  # fmt: skip
        if dram_bytes_per_s and all(nbytes[j] is not None for j in jobs):
            grid.decode_bytes_table = [[nbytes[("decode", a, c)] for c in d_c] for a in d_a]
            grid.prefill_bytes_table = [[nbytes[("prefill", c, p)] for p in p_p] for c in p_c]
            grid.dram_bytes_per_s = float(dram_bytes_per_s)
            grid.__post_init__()
        errors = {"decode": [], "prefill": []}
        for kind, x, y in checks:
            est = grid.decode_cost(x, x * y) if kind == "decode" else grid.prefill_cost(x, y)
            errors[kind].append(abs(est - seen[(kind, x, y)]) / max(seen[(kind, x, y)], 1e-9))
        grid.error = {
            f"{k}_{stat}": float(fn(v)) if v else 0.0
            for k, v in errors.items()
            for stat, fn in (("max_rel", np.max), ("mean_rel", np.mean))
        }
        grid.error["checked_points"] = len(checks)
        return grid

    def to_json(self) -> dict:
        return {
            "kind": "cost_grid",
            "version": GRID_VERSION,
            "clock_hz": self.clock_hz,
            "dram_bytes_per_s": self.dram_bytes_per_s,
            "shape": asdict(self.shape),
            "decode": {
                "active": self.decode_active,
                "context": self.decode_context,
                "cycles": self.decode_cycles,
                "bytes": self.decode_bytes_table,
            },
            "prefill": {
                "chunk": self.prefill_chunk,
                "past": self.prefill_past,
                "cycles": self.prefill_cycles,
                "bytes": self.prefill_bytes_table,
            },
            "error": self.error,
            "source": self.source,
        }

    def save(self, path: Path) -> None:
        write_atomic(path, json.dumps(self.to_json(), indent=1) + "\n")


class _GridAxes(Section):
    cycles: list[list[float]]
    bytes: list[list[float]] | None = None
    active: list[int] | None = None
    context: list[int] | None = None
    chunk: list[int] | None = None
    past: list[int] | None = None


GRID_VERSION = 2  # 2: DRAM bytes beside the cycles; a version-1 grid is measured again


class GridSpec(Section):
    kind: Literal["cost_grid"]
    version: Literal[2]
    clock_hz: float = Field(gt=0)
    dram_bytes_per_s: float | None = Field(default=None, gt=0)
    shape: _ShapeSpec
    decode: _GridAxes
    prefill: _GridAxes
    error: dict = Field(default_factory=dict)
    source: dict = Field(default_factory=dict)


def _grid_from(spec: GridSpec, source: str) -> CostGrid:
    d, p = spec.decode, spec.prefill
    axes = (("decode", d.active, d.context, d.cycles), ("prefill", p.chunk, p.past, p.cycles))
    for name, xs, ys, table in axes:
        if xs is None or ys is None:
            keys = "active and context" if name == "decode" else "chunk and past"
            raise ConfigError(f"{source}: {name}: needs {keys}")
        if not xs or not ys or sorted(set(xs)) != xs or sorted(set(ys)) != ys:
            raise ConfigError(f"{source}: {name}: grid axes must be non-empty and strictly increasing")
        for key, tab in (("cycles", table), ("bytes", (d if name == "decode" else p).bytes)):
            if tab is not None and (len(tab) != len(xs) or any(len(row) != len(ys) for row in tab)):
                raise ConfigError(f"{source}: {name}.{key}: expected {len(xs)} rows of {len(ys)} values")
    return CostGrid(
        spec.clock_hz, spec.shape.shape(), d.active, d.context, d.cycles, p.chunk, p.past, p.cycles,
        dict(spec.error), dict(spec.source), d.bytes, p.bytes, spec.dram_bytes_per_s,
    )  # fmt: skip


def load_cost_file(path: Path) -> tuple[StepCost, ServedShape]:
    """A cost file: ``kind: analytic`` (YAML or JSON) or a cached ``kind: cost_grid``."""
    data = load_yaml(path, "cost file")
    kind = data.get("kind")
    if kind == "analytic":
        spec = validate(AnalyticSpec, data, str(path))
        cost = AnalyticCost(
            spec.clock_mhz * 1e6, spec.decode, spec.prefill, spec.dram, spec.kv_bytes_per_token
        )
        return cost, spec.shape()
    if kind == "cost_grid":
        if data.get("version") == 1:
            raise ConfigError(
                f"{path}: version 1 cost grid: it holds no DRAM bytes; measure it again (sim serve on the "
                "program writes a version-2 grid)"
            )
        grid = _grid_from(validate(GridSpec, data, str(path)), str(path))
        return grid, grid.shape
    raise ConfigError(f"{path}: kind: expected analytic or cost_grid, got {kind!r}")


class ExactCost:
    """Every step measured by ``measurer`` (memoised: a step's cost depends on its shape only)."""

    def __init__(self, measurer: Measurer, clock_hz: float, dram_bytes_per_s: float | None = None):
        self.clock_hz, self.dram_bytes_per_s = clock_hz, dram_bytes_per_s
        self._measure, self._memo = measurer, {}

    def _get(self, key):
        if key not in self._memo:
            self._memo[key] = self._measure(*key)
        return float(self._memo[key])

    def _bytes(self, key) -> float:
        self._get(key)
        return self._memo[key].dram_bytes

    def decode_bytes(self, active_seqs: int, total_kv_tokens: int) -> float:
        return self._bytes(("decode", active_seqs, round(total_kv_tokens / max(active_seqs, 1))))

    def prefill_bytes(self, chunk_len: int, past: int) -> float:
        return self._bytes(("prefill", chunk_len, past))

    def decode_cost(self, active_seqs: int, total_kv_tokens: int) -> float:
        # the measurer places every sequence at one context; the mean keeps the total
        return self._get(("decode", active_seqs, round(total_kv_tokens / max(active_seqs, 1))))

    def prefill_cost(self, chunk_len: int, past: int) -> float:
        return self._get(("prefill", chunk_len, past))


def file_digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
