"""``tile-matmul``: choose every ``mcp.matmul``'s ``tile = [tm, tn, tk]`` for the target.

The tile is part of the op's semantics (the f32 accumulation order along K, see
``numerics.matmul_2d``): the interpreter and the backend both follow it, so the compiled program
stays bit-exact with the IR.  The choice is a small analytic model of the backend's matmul
kernel on the target (one step = load an A and a B tile, one ``matmul`` instruction; the next
step's loads overlap this step's compute; each output tile is stored once):

* compute of a step = ceil(m/rows)·ceil(n/cols)·k·rows·cols / macs_per_cycle + pipeline_latency,
* DRAM of a step = (A tile + B tile bytes) / dram_bytes_per_cycle, plus the output tile's store,
* a step takes max(compute, DRAM, (compute + DRAM + latency) / 2): with two slots the load of
  step r+2 waits for the compute of step r, which waits for the load of step r to land,
* total ≈ max(Σ compute, Σ DRAM, Σ step) + the first load, the last compute and the last store
  (which nothing overlaps) + two DRAM latencies,

with M all the rows of A when B is one matrix (``MatMulOp.folds_rows``: one weight, batched
activations), as for ``mcp.matmul_w4a16``, else one batch's rows times the batch count,
over tiles that are multiples of the systolic array (tm of ``array_rows``, tn of ``array_cols``,
tk of 64 elements) and split each dim into near-equal parts, restricted to tiles whose double
buffered slots (2 × (A + B) + 2 × output + an f32 accumulator when the output is not f32) fit
the target's SRAM.  Large square matmuls get large tiles (compute-bound, near peak MACs); a
one-row matmul gets steps short enough that the weight stream keeps the DRAM channel busy.

The estimate is deliberately the simulator's earlier matmul charge (whole array passes, one
pipeline latency per step), not the current one (docs/timing.md: rows actually present, latency
on dependency chains): the tile fixes the f32 accumulation order along K, so changing the choice
would change the output bits of programs compiled from the same model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from mcpc.arch.dtypes import DTYPES, tile_bytes
from mcpc.errors import DoesNotFit, PassError, does_not_fit
from mcpc.ir.core import Module
from mcpc.ir.ops import MatMulOp, MatMulQAOp, MatMulW4A16Op
from mcpc.passes.manager import Pass, PassContext, register_pass

# Parts each dim may be split into (more for long dims, via powers of two below).
_PARTS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64)
_MAX_FIELD = 65535  # matmul m/n/k are u16 in the ISA
_K_ALIGN = 64
_SRAM_ALIGN_DEFAULT = 64


def _align(n: int, a: int) -> int:
    return -(-n // a) * a


def _splits(dim: int, unit: int) -> list[int]:
    """Tile sizes that cut ``dim`` into p near-equal parts, rounded up to ``unit``, <= u16."""
    if dim <= unit:
        return [dim]
    units = math.ceil(dim / unit)
    parts = set(_PARTS) | {1 << i for i in range(7, max(units, 1).bit_length() + 1)}
    out = {min(_align(math.ceil(dim / p), unit), dim) for p in parts if p <= units}
    return sorted(t for t in out if 0 < t <= _MAX_FIELD) or [min(unit * (_MAX_FIELD // unit), dim)]


def slot_bytes(tm: int, tn: int, tk: int, in_dtype: str, out_dtype: str, align: int,
               weight: tuple[str, str, int] | None = None) -> int:  # fmt: skip
    """SRAM the backend's matmul kernel needs for a tile with double buffering (in/out slots x2).
    ``weight`` = (codes dtype, scale dtype, group size) for ``mcp.matmul_w4a16``: B is the codes'
    tile, plus a scale and a zero-point tile per slot."""
    w_dtype = weight[0] if weight else in_dtype
    ins = _align(tile_bytes(in_dtype, tm, tk), align) + _align(tile_bytes(w_dtype, tk, tn), align)
    if weight:
        groups = -(-tk // weight[2]) if weight[2] else 1
        ins += _align(tile_bytes(weight[1], groups, tn), align) + _align(
            tile_bytes(w_dtype, tn, groups), align
        )
    total = 2 * ins + 2 * _align(tile_bytes(out_dtype, tm, tn), align)
    if out_dtype != "f32":
        total += _align(tm * tn * 4, align)
    return total


def _pieces(dim: int, t: int) -> list[tuple[int, int]]:
    """(size, count) of the tiles of a dim: full tiles and one remainder."""
    full, rem = divmod(dim, t)
    return [(s, c) for s, c in ((t, full), (rem, 1 if rem else 0)) if c]


def estimate_cycles(batch: int, m: int, n: int, k: int, tile: tuple[int, int, int], in_dtype: str,
                    out_dtype: str, target: Any, w_dtype: str | None = None) -> float:  # fmt: skip
    """The model's cycle estimate of the matmul kernel with ``tile`` (see module doc); ``w_dtype``
    is the dtype of B when it differs from A's (the codes of ``mcp.matmul_w4a16``)."""
    tm, tn, tk = tile
    mac = target.mac
    rows, cols = mac.array_rows, mac.array_cols
    rate = target.macs_per_cycle_for(in_dtype)
    bpc = target.dram_bytes_per_cycle
    es, os_ = DTYPES[in_dtype].elem_bytes, DTYPES[out_dtype].elem_bytes  # 0.5 for packed 4-bit
    ws = DTYPES[w_dtype or in_dtype].elem_bytes
    lat = target.dram_latency_cycles
    sum_c = sum_d = sum_max = 0.0
    last_c = first_d = last_s = 0.0
    for mm, cm in _pieces(m, tm):
        for nn, cn in _pieces(n, tn):
            tiles = batch * cm * cn
            store = mm * nn * os_ / bpc
            for kk, ck in _pieces(k, tk):
                c = (
                    math.ceil(mm / rows) * math.ceil(nn / cols) * kk * rows * cols / rate
                    + mac.pipeline_latency
                )
                d = (mm * kk * es + kk * nn * ws) / bpc
                sum_c += tiles * ck * c
                sum_d += tiles * ck * d
                # two slots: load r+2 waits for compute r, which waits for load r to land
                sum_max += tiles * ck * max(c, d, (c + d + lat) / 2)
                last_c, first_d = max(last_c, c), max(first_d, d)
            sum_d += tiles * store
            last_s = max(last_s, store)
    steady = max(sum_c, sum_d, sum_max)
    return steady + first_d + last_c + last_s + 2 * lat


def choose_tile(batch: int, m: int, n: int, k: int, in_dtype: str, out_dtype: str, target: Any,
                sram_budget: int | None = None,
                weight: tuple[str, str, int] | None = None) -> tuple[int, int, int]:  # fmt: skip
    """The [tm, tn, tk] with the lowest ``estimate_cycles`` whose slots fit the SRAM budget.

    Ties go to fewer K tiles, then larger tiles (deterministic).  Raises PassError when not even
    the smallest tile fits.  ``weight`` (``slot_bytes``) makes B quantized codes: tk is then a
    multiple of twice the group size (each K tile holds whole groups, and a tile of packed
    zero points starts on a byte) or all of K.
    """
    w_dtype = weight[0] if weight else None
    k_unit = math.lcm(_K_ALIGN, 2 * weight[2]) if weight and weight[2] else _K_ALIGN
    budget = sram_budget if sram_budget is not None else target.sram.size_bytes
    align = getattr(target.sram, "bank_bytes", _SRAM_ALIGN_DEFAULT)
    best, best_key = None, None
    for tm in _splits(m, target.mac.array_rows):
        for tn in _splits(n, target.mac.array_cols):
            for tk in _splits(k, k_unit):
                if slot_bytes(tm, tn, tk, in_dtype, out_dtype, align, weight) > budget:
                    continue
                cyc = estimate_cycles(batch, m, n, k, (tm, tn, tk), in_dtype, out_dtype, target, w_dtype)
                key = (cyc, math.ceil(k / tk), -tm * tn)
                if best_key is None or key < best_key:
                    best, best_key = (tm, tn, tk), key
    if best is None:
        # The grid starts at one array tile; shrink below it (slow but correct) before giving up.
        for t in (64, 32, 16, 8, 4, 2, 1):
            tile = (min(m, t), min(n, t), min(k, max(t, k_unit if weight else 1)))
            if weight and tile[1] < n and tile[1] % 2:
                continue
            if slot_bytes(*tile, in_dtype, out_dtype, align, weight) <= budget:
                return tile
        need = slot_bytes(1, 1, 1, in_dtype, out_dtype, align, weight)
        raise does_not_fit(
            f"tile-matmul: a 1x1x1 tile of a {m}x{n}x{k} matmul (double-buffered)",
            need,
            budget,
            "SRAM",
            "sram.size_bytes",
            f"target {target.name}",
        )
    return best


@register_pass
@dataclass(frozen=True)
class TileMatmulPass(Pass):
    """Set ``tile`` on every ``mcp.matmul`` and ``mcp.matmul_w4a16`` for ``ctx.target``.

    Assumes: a valid module and a target in the pass context (PassError naming the pass
    otherwise).  Guarantees: every matmul has ``tile = [tm, tn, tk]`` with 1 <= t <= its dim
    (<= 65535), whose double-buffered kernel fits the target's SRAM; results change only by the
    f32 accumulation order.  Re-running gives the same tiles (a function of shapes and target).

    The tiles assume double-buffered slots whatever ``npu-schedule`` then chooses, so the
    scheduling options change time, never bits.
    """

    name: ClassVar[str] = "tile-matmul"

    def apply(self, module: Module, ctx: PassContext) -> Module:
        target = ctx.target
        if target is None:
            raise PassError("pass tile-matmul needs a target (none in the pass context)")
        for op in module.walk():
            if isinstance(op, (MatMulW4A16Op, MatMulQAOp)):  # quantized codes; all rows of a form M
                a, codes, scale = (v.type for v in op.operands[:3])
                group = int(op.attrs["group_size"]) if isinstance(op, MatMulW4A16Op) else 0
                weight = (codes.dtype.name, scale.dtype.name, group)
                m, batch = math.prod(a.shape[:-1]), 1
            elif isinstance(op, MatMulOp):
                a, weight = op.operands[0].type, None
                m, batch = a.shape[-2], math.prod(op.result.type.shape[:-2])
                if op.folds_rows():  # one weight matrix: all rows of a form M
                    m, batch = m * batch, 1
            else:
                continue
            out = op.result.type
            k, n = a.shape[-1], out.shape[-1]
            if min(m, n, k) == 0:
                continue
            try:
                tile = choose_tile(batch, m, n, k, a.dtype.name, out.dtype.name, target, weight=weight)
            except DoesNotFit as exc:
                raise DoesNotFit(f"{op.describe()}: {exc.message}") from None
            except PassError as exc:
                raise PassError(f"{exc.message} ({op.describe()})") from None
            op.attrs["tile"] = [int(t) for t in tile]
        return module
