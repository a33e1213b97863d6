"""Row extents of a decoder build's ``prefill`` entry: the work of a call follows the token rows
it takes, not the ``--prefill-chunk`` capacity (``docs/decoding.md``, "Prefill row extents").

A function carrying ``attrs["row_extent"] = {"reg": NAME, "rows": R}`` takes R token rows a call
(R = B · C, row r = b · C + t) of which the host register NAME holds how many lead: rows
``[0, r[NAME])`` are in use, the rest are padding (the host fills a call's sequences from batch
slot 0 on, so the padding of a call is its trailing rows; a sequence shorter than C before the
last one leaves padding rows inside the extent, computed as today).

``token_axes`` follows the token rows through the function: for each value, the axes that index
them (size-1 axes dropped; their sizes multiply to R, batch before sequence), or None when the
value does not depend on the rows.  Every op reading a token-indexed value must be *row-local* —
row r of its result depends on row r of its operands only (elementwise ops, matmuls with the rows
in A's rows or in B's columns, reductions and normalisations along other axes, reshapes and
transposes that keep the rows, slices, concats and gathers along other axes, ``mcp.kv_store``,
``mcp.paged_attention``); then a
row beyond the extent that is not computed can only reach rows beyond the extent.  An op that is
not known to be row-local makes the analysis refuse the function (``RowExtent.reason``) and the
entry keeps its capacity costs, as before.

``RowExtent.count(value, first, row_elems)`` gives a lowering the register holding the run-time
row count of a tile whose rows are ``row_elems`` consecutive elements of ``value`` (row-major)
starting at row ``first``: a *prefix* value (its token axes contiguous, every axis before them of
size 1) has its rows in use as the first ``r[NAME] · prod(shape[after the token axes:])``
elements, so when ``row_elems`` divides that per-token size k the tile's count is ``k · r[NAME] −
first``, clamped to the tile by the instruction (``docs/isa.md``, "Run-time extents").  The
register is computed once in the entry's register kernel (``salu mul`` for k, ``salu add`` for
the offset); 0 (the capacity, as before) when the value is not a prefix value, the rows do not
divide, or the registers are exhausted.
"""

from __future__ import annotations

import math
from typing import Any

from mcpc.ir import ops

Axes = tuple[int, ...]

_ELEMENTWISE = (ops.BinaryOp, ops.UnaryOp, ops.CastOp, ops.SelectOp, ops.BroadcastOp)
_MATMULS = (ops.MatMulOp, ops.MatMulW4A16Op, ops.MatMulQAOp)


class NotRowLocal(Exception):
    """An op reading token rows that the analysis cannot show to be row-local."""


def _norm(shape: tuple[int, ...], axes: Axes) -> Axes | None:
    out = tuple(a for a in axes if shape[a] != 1)
    return out or None


def _shift(axes: Axes, src_rank: int, dst_rank: int) -> Axes:
    return tuple(a + dst_rank - src_rank for a in axes)


def _reshape(src: tuple[int, ...], dst: tuple[int, ...], axes: Axes) -> Axes | None:
    lo, hi = axes[0], axes[-1] + 1
    if list(axes) != [a for a in range(lo, hi) if src[a] != 1]:
        raise NotRowLocal("a reshape of token rows that are not contiguous")
    p_lo, p_hi = math.prod(src[:lo]), math.prod(src[:hi])
    prefix = [math.prod(dst[:i]) for i in range(len(dst) + 1)]
    los = [i for i, p in enumerate(prefix) if p == p_lo]
    his = [i for i, p in enumerate(prefix) if p == p_hi and los and i > max(los)]
    if not his:
        raise NotRowLocal("a reshape that splits the token rows")
    return _norm(dst, tuple(range(max(los), min(his))))


def _matmul_axes(op: Any, ins: list[Axes | None]) -> Axes:
    """Token axes of ``mcp.matmul a, b``'s result: out[..., m, n] = sum_k a[..., m, k] b[..., k, n]
    (b[..., n, k] when ``trans_b``), batch axes broadcast.  Row-local when no operand has token rows
    along its contraction axis and the token axes of both operands are the same result axes: rows
    of A become the result's M (and batch) axes, columns of B its N (and batch) axes — B holds the
    rows when positions are the right operand, as in RoPE's angles ``inv_freq[:, None] @
    positions[None, :]`` (Hugging Face Optimum's exports)."""
    out = op.results[0].type
    trans_b = bool(op.attrs.get("trans_b"))
    mapped = set()
    for side, (v, axes) in enumerate(zip(op.operands, ins, strict=True)):
        if axes is None:
            continue
        r = v.type.rank
        contraction = r - 1 if side == 0 or trans_b else r - 2
        if contraction in axes:
            raise NotRowLocal("token rows along a matmul's contraction axis")
        res = []
        for a in axes:
            if a < r - 2:  # a batch axis: aligned from the right with the result's batch axes
                res.append(a + out.rank - r)
            elif side == 0:  # A's M axis
                res.append(out.rank - 2)
            else:  # B's N axis
                res.append(out.rank - 1)
        for a, x in zip(axes, res, strict=True):
            if v.type.shape[a] != out.shape[x]:
                raise NotRowLocal("token rows broadcast")
        mapped.add(tuple(res))
    if len(mapped) != 1:
        raise NotRowLocal("token rows in both matmul operands on different axes")
    return next(iter(mapped))


def _result_axes(op: Any, tok: dict) -> list[Axes | None]:
    """Token axes of each result of ``op`` given its operands' (NotRowLocal when not row-local)."""
    ins = [tok.get(v) for v in op.operands]
    if not any(a is not None for a in ins):
        return [None] * len(op.results)
    rank = [v.type.rank for v in op.operands]
    if isinstance(op, _ELEMENTWISE):
        out = op.results[0].type
        mapped = {_shift(a, r, out.rank) for a, r in zip(ins, rank, strict=True) if a is not None}
        if len(mapped) != 1:
            raise NotRowLocal("operands whose token rows lie on different axes")
        (axes,) = mapped
        for v, a in zip(op.operands, ins, strict=True):
            if a is not None and any(v.type.shape[x - out.rank + v.type.rank] != out.shape[x] for x in axes):
                raise NotRowLocal("token rows broadcast")
        return [axes]
    if isinstance(op, ops.MatMulOp):
        return [_matmul_axes(op, ins)]
    if isinstance(op, _MATMULS):  # B is a weight: token rows in it are not row-local
        if any(a is not None for a in ins[1:]):
            raise NotRowLocal("token rows in a matmul's weight operand")
        a = ins[0]
        if rank[0] - 1 in a:
            raise NotRowLocal("token rows along a matmul's contraction axis")
        return [_shift(a, rank[0], op.results[0].type.rank)]
    if isinstance(op, ops.ReshapeOp):
        return [_reshape(op.operands[0].type.shape, op.results[0].type.shape, ins[0])]
    if isinstance(op, ops.TransposeOp):
        perm = [int(p) for p in op.attrs["perm"]]
        out = tuple(j for j, p in enumerate(perm) if p in ins[0])
        if [perm[j] for j in out] != sorted(perm[j] for j in out):
            raise NotRowLocal("a transpose reordering the token axes")
        return [out]
    if isinstance(op, ops.SliceOp):
        shape = op.operands[0].type.shape
        for a in ins[0]:
            s, e, st = (int(op.attrs[k][a]) for k in ("starts", "ends", "steps"))
            if (s, min(e, shape[a]), st) != (0, shape[a], 1):
                raise NotRowLocal("a slice of the token rows")
        return [ins[0]]
    if isinstance(op, ops.ConcatOp):
        axis = int(op.attrs["axis"]) % op.results[0].type.rank
        mapped = {a for a in ins if a is not None}
        if len(mapped) != 1 or axis in next(iter(mapped)):
            raise NotRowLocal("a concat along the token rows")
        return [next(iter(mapped))]
    if isinstance(op, ops.GatherOp):
        axis = int(op.attrs["axis"]) % rank[0]
        data, idx = ins
        if data is not None and idx is not None:
            raise NotRowLocal("a gather of token rows at token-indexed positions")
        if idx is not None:
            return [tuple(axis + a for a in idx)]
        if axis in data:
            raise NotRowLocal("a gather along the token rows")
        return [tuple(a if a < axis else a + rank[1] - 1 for a in data)]
    if isinstance(op, (ops.SoftmaxOp, ops.LogSoftmaxOp, ops.LayerNormOp, ops.TopKOp)):
        axis = int(op.attrs["axis"]) % rank[0]
        reach = range(axis, rank[0]) if isinstance(op, ops.LayerNormOp) else (axis,)
        if any(a in ins[0] for a in reach) or any(a is not None for a in ins[1:]):
            raise NotRowLocal("a normalisation along the token rows")
        return [ins[0]] * len(op.results)
    if isinstance(op, ops.ReduceOp):
        axes = {int(a) % rank[0] for a in op.attrs["axes"]}
        if axes & set(ins[0]):
            raise NotRowLocal("a reduction over the token rows")
        if op.attrs["keepdims"]:
            return [ins[0]]
        return [tuple(a - sum(1 for x in axes if x < a) for a in ins[0])]
    if isinstance(op, (ops.QuantizeOp, ops.DequantizeOp)):
        x = ins[0]
        if x is None:
            raise NotRowLocal("token-indexed quantization parameters of a value without token rows")
        axis, block = int(op.attrs["axis"]) % rank[0], int(op.attrs["block_size"])
        if axis in x and block > 0:
            raise NotRowLocal("quantization blocks along the token rows")
        for v, a in zip(op.operands[1:], ins[1:], strict=True):
            per_row = axis in x and block == 0 and v.type.rank == 1  # one scale per token row
            if a is not None and not per_row and a != x:
                raise NotRowLocal("quantization parameters indexed by other token axes")
        return [x]
    if isinstance(op, ops.KVStoreOp):
        return []
    if isinstance(op, ops.PagedAttentionOp):
        if ins[1] is not None:
            raise NotRowLocal("token-indexed block ids")
        return [ins[0]]
    if isinstance(op, ops.ReturnOp):
        return []
    raise NotRowLocal("an op the row-extent analysis does not know to be row-local")


def token_axes(fn: Any, rows: int) -> dict[Any, Axes | None]:
    """The token axes of every value of ``fn`` (module docstring); the arguments carrying the rows
    are those with a leading shape [B, C] or [R] of R = ``rows`` elements (ids, positions, the
    per-row KV tables) — the decoder build's inputs.  NotRowLocal names the op that breaks it."""
    tok: dict[Any, Axes | None] = {}
    for a in fn.args:
        shape = a.type.shape
        if a.type.rank in (1, 2) and math.prod(shape) == rows and rows > 1:
            tok[a] = _norm(shape, tuple(range(a.type.rank)))
    for op in fn.ops:
        try:
            outs = _result_axes(op, tok)
        except NotRowLocal as exc:
            raise NotRowLocal(f"{op.describe()}: {exc}") from None
        for v, axes in zip(op.results, outs, strict=False):
            tok[v] = axes
    return tok


class RowExtent:
    """The row extent of one entry while it is lowered (module docstring): ``count`` hands out
    registers; ``instructions`` are the ``salu``s computing them, for the register kernel."""

    def __init__(self, fn: Any, host_reg: int, free: list[int], emitter: Any):
        spec = fn.attrs.get("row_extent") or {}
        self.rows = int(spec.get("rows", 0))
        self.host_reg, self.free, self.emitter = host_reg, list(free), emitter
        self.instructions: list = []
        self._regs: dict[tuple[int, int], int] = {(1, 0): host_reg}
        self.reason = ""
        self.tok: dict[Any, Axes | None] = {}
        self.counted = 0  # instructions given a register
        self.fallbacks = 0  # tiles left at capacity for want of a register
        try:
            self.tok = token_axes(fn, self.rows)
        except NotRowLocal as exc:
            self.reason = str(exc)

    @property
    def active(self) -> bool:
        return not self.reason and self.rows > 1

    def per_token(self, value: Any) -> int:
        """Elements of ``value`` per token row when it is a prefix value, else 0."""
        axes = self.tok.get(value) if self.active else None
        if not axes:
            return 0
        shape = value.type.shape
        lo, hi = axes[0], axes[-1] + 1
        inside = (shape[a] for a in range(lo, hi) if a not in axes)
        if any(shape[a] != 1 for a in range(lo)) or any(d != 1 for d in inside):
            return 0
        return math.prod(shape[hi:])

    def count(self, value: Any, first: int, row_elems: int) -> int:
        """The register holding the run-time row count of a tile of ``value`` starting at row
        ``first`` of ``row_elems`` elements a row (module docstring); 0 for the capacity."""
        per = self.per_token(value)
        if not per or row_elems <= 0 or per % row_elems:
            return 0
        return self._reg(per // row_elems, first)

    def _reg(self, k: int, first: int) -> int:
        key = (k, first)
        if key in self._regs:
            self.counted += 1
            return self._regs[key]
        base = self._regs.get((k, 0))
        need = (base is None) + (first != 0)
        if len(self.free) < need:
            self.fallbacks += 1
            return 0
        if base is None:
            base = self._regs[(k, 0)] = self.free.pop(0)
            self.instructions.append(
                self.emitter.emit("salu", func="mul", rd=base, rs1=self.host_reg, rs2=0, simm=k)
            )
        if first:
            r = self._regs[key] = self.free.pop(0)
            add = self.emitter.emit("salu", func="add", rd=r, rs1=base, rs2=0, simm=-first)
            self.instructions.append(add)
        self.counted += 1
        return self._regs[key]


def row_extent(module: Any, fn: Any, ctx: Any) -> RowExtent | None:
    """The row extent of ``fn`` while it is lowered (None when it has none); needs the register
    kernel built first (its free registers, ``ctx.free_registers``)."""
    spec = fn.attrs.get("row_extent")
    if not spec:
        return None
    from mcpc.backend.lower_state import host_register_numbers

    reg = host_register_numbers(module)[spec["reg"]]
    return RowExtent(fn, reg, ctx.free_registers, ctx.emitter)


def with_extent_registers(prologue: Any, ctx: Any) -> Any:
    """The register kernel ``prologue`` (None: none yet) with the ``salu``s of ``ctx.extent``'s
    registers appended: they run before every op of the entry, as the other registers do."""
    ext = ctx.extent
    if ext is None or not ext.instructions:
        return prologue
    from mcpc.backend.emitter import debug_context
    from mcpc.backend.schedule import Kernel, Step

    if prologue is None:
        return Kernel([Step(computes=list(ext.instructions))], ctx.in_slots, ctx.out_slots,
                      sets_registers=True, debug=dict(debug_context(None)))  # fmt: skip
    step = prologue.steps[0]
    prologue.steps[0] = Step(step.loads, [*step.computes, *ext.instructions], step.stores)
    return prologue


def extent_record(ext: RowExtent | None) -> dict | None:
    """META ``decoder.row_extent[entry]``: the register, the instructions given a run-time count
    and those left at capacity for want of a register, or why the entry has no extent."""
    if ext is None:
        return None
    if not ext.active:
        return {"rows": ext.rows, "refused": ext.reason}
    return {"rows": ext.rows, "counted": ext.counted, "registers": len(ext._regs), "fallbacks": ext.fallbacks}


def refused_optimisations(decoder: dict | None) -> list[dict]:
    """The row-extent optimisations a decoder build's META (``decoder``) records as refused or
    incomplete, each ``{"optimisation", "entry", "reason", "cost"}`` for the compile summary: an
    entry whose analysis refused (it names the op and its ONNX node) runs every call at its row
    capacity; tiles left without a register run at capacity too.  [] when nothing was refused."""
    found = []
    for entry, rec in ((decoder or {}).get("row_extent") or {}).items():
        rows = rec.get("rows")
        if rec.get("refused"):
            found.append({
                "optimisation": "run-time row extents",
                "entry": entry,
                "reason": rec["refused"],
                "cost": f"every {entry} call computes all {rows} token rows of its capacity, a prompt of "
                f"n tokens costing the work of {rows} (up to {rows}x in the row-proportional ops)",
            })  # fmt: skip
        elif rec.get("fallbacks"):
            found.append({
                "optimisation": "run-time row extents",
                "entry": entry,
                "reason": f"{rec['fallbacks']} tile(s) found no free register",
                "cost": f"those tiles compute all {rows} token rows of the capacity",
            })  # fmt: skip
    return found
