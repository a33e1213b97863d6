"""The reference interpreter: THE definition of every MCP IR op's semantics.

Each op has one handler, registered with ``@impl(OpClass)`` for that exact class (a subclass is
not silently run by its parent's handler: a new op needs its own definition).  Handlers are
written as steps of ``mcpc.arch.numerics`` kernels — f32 intermediates, one rounding to the result
dtype — because the simulator runs the same steps with the same kernels on the same tiles, and
the two are held to the same bits.  Shape ops are exact numpy data movement.

Constant folding calls ``evaluate_op``; tests and ``mcpc check`` call ``interpret``.
"""

from __future__ import annotations

from collections.abc import Callable
from math import prod

import ml_dtypes
import numpy as np

from mcpc.arch import numerics as nx
from mcpc.errors import InputError, McpcError, UnsupportedError
from mcpc.ir import ops
from mcpc.ir.core import Module, Operation

Handler = Callable[[Operation, list[np.ndarray]], list[np.ndarray]]
_IMPLS: dict[type[Operation], Handler] = {}


def impl(*op_classes: type[Operation]) -> Callable[[Handler], Handler]:
    """Register the decorated function as the semantics of each listed op class."""

    def register(fn: Handler) -> Handler:
        for cls in op_classes:
            if cls in _IMPLS:
                raise TypeError(f"{cls.name} has two interpreter handlers")
            _IMPLS[cls] = fn
        return fn

    return register


def has_impl(op_class: type[Operation]) -> bool:
    """Whether the interpreter defines ``op_class``."""
    return op_class in _IMPLS


def evaluate_op(op: Operation, args: list[np.ndarray]) -> list[np.ndarray]:
    """Results of ``op`` on ``args`` (one array per operand, of the operand's type).

    Guarantees one array per result with exactly the declared shape and dtype.  Results may share
    memory with ``args`` (reshape, constants): treat them as read-only.  Raises UnsupportedError
    naming the op when it has no handler, InputError for data-dependent faults (gather index out
    of range).
    """
    handler = _IMPLS.get(type(op))
    if handler is None:
        raise UnsupportedError(f"the reference interpreter has no semantics for {op.describe()}")
    results = handler(op, args)
    for i, (r, v) in enumerate(zip(results, op.results, strict=True)):
        if r.shape != v.type.shape or r.dtype != v.type.dtype.np_dtype:
            # a bug in a handler, never a user mistake
            raise McpcError(
                f"interpreter handler of {op.describe()} produced {r.dtype}{list(r.shape)} for "
                f"result #{i} declared {v.type}"
            )
    return results


class ModuleState:
    """The run state of a module with globals: one zero-initialised array per ``global``, kept
    from one ``interpret`` call to the next (a persistent buffer), zeroed again by ``reset``."""

    def __init__(self, module: Module):
        self.globals = {
            g.name: np.zeros(g.type.shape, g.type.dtype.np_dtype) for g in module.globals.values()
        }

    def reset(self) -> None:
        for arr in self.globals.values():
            arr[...] = 0


# (state, registers) of the interpret call running now: read by the handlers of the state ops
_RUN: list[tuple[ModuleState, dict[str, int]]] = []


def host_registers_read(fn) -> list[str]:
    """Names of the host registers ``fn`` reads, in order of first use."""
    return list(dict.fromkeys(op.attrs["name"] for op in fn.ops if isinstance(op, ops.HostRegOp)))


def check_registers(module: Module, fn, registers: dict[str, int] | None) -> dict[str, int]:
    """The host register values of a run of ``fn``: every register it reads must be set, to an
    integer within its declared range, and every name must be declared (InputError otherwise)."""
    registers = dict(registers or {})
    unknown = sorted(n for n in registers if n not in module.host_regs)
    if unknown:
        have = ", ".join(module.host_regs) or "none"
        raise InputError(f"unknown host register(s) {', '.join(unknown)} (declared: {have})")
    for name, value in registers.items():
        reg = module.host_regs[name]
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise InputError(f"host register {name}: value {value!r} is not an integer")
        if not reg.min <= int(value) <= reg.max:
            raise InputError(
                f"host register {name}: value {int(value)} is outside its declared range "
                f"[{reg.min}, {reg.max}]"
            )
    missing = [n for n in host_registers_read(fn) if n not in registers]
    if missing:
        raise InputError(f"func @{fn.name} reads host register(s) {', '.join(missing)}, which are not set")
    return {n: int(v) for n, v in registers.items()}


def interpret(
    module: Module,
    inputs: dict[str, np.ndarray],
    func: str = "main",
    state: ModuleState | None = None,
    registers: dict[str, int] | None = None,
) -> dict[str, np.ndarray]:
    """Run function ``func`` of a valid ``module`` on ``inputs`` (keyed by argument name).

    Each input must have exactly the argument's shape and numpy dtype (no implicit casts: an i64
    argument takes int64 arrays, an int32 array is refused).  Returns fresh arrays keyed by the
    function's result names, in the declared dtypes.  InputError names the offending input.

    ``state`` holds the module's globals across calls (a ``ModuleState``; None: a fresh, zeroed
    one for this call alone); ``registers`` the host register values (name -> int) of this run,
    checked by ``check_registers``.
    """
    if func not in module.functions:
        have = ", ".join("@" + f for f in module.functions) or "none"
        raise InputError(f"module @{module.name} has no function @{func} (functions: {have})")
    fn = module.functions[func]
    fn.verify()
    if module.globals or module.host_regs:
        from mcpc.ir.state import verify_state

        verify_state(module)
    where = f"func @{fn.name}"
    missing = [n for n in fn.arg_names if n not in inputs]
    extra = sorted(n for n in inputs if n not in fn.arg_names)
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing input(s) {', '.join(map(repr, missing))}")
        if extra:
            parts.append(f"unknown input(s) {', '.join(map(repr, extra))}")
        raise InputError(f"{where}: {'; '.join(parts)} (expected: {', '.join(map(repr, fn.arg_names))})")
    env: dict[int, np.ndarray] = {}
    for arg in fn.args:
        a = np.asarray(inputs[arg.name])
        t = arg.type
        if a.dtype != t.dtype.np_dtype or a.shape != t.shape:
            raise InputError(
                f"{where}: input '{arg.name}' is {a.dtype} with shape {list(a.shape)}, "
                f"expected {t.dtype.np_dtype} ({t.dtype.name}) with shape {list(t.shape)}"
            )
        env[id(arg)] = a
    regs = check_registers(module, fn, registers)
    _RUN.append((state if state is not None else ModuleState(module), regs))
    try:
        for op in fn.ops:
            if op.IS_TERMINATOR:
                break
            for r, arr in zip(op.results, evaluate_op(op, [env[id(v)] for v in op.operands]), strict=True):
                env[id(r)] = arr
    finally:
        _RUN.pop()
    return {
        name: np.array(env[id(v)], copy=True) for name, v in zip(fn.result_names, fn.outputs, strict=True)
    }


def _out(op: Operation, i: int = 0) -> str:
    return op.results[i].type.dtype.name


# -- structural and elementwise ------------------------------------------------------------------
@impl(ops.ConstantOp)
def _constant(op, args):
    return [op.attrs["value"]]


_BINARY_OPS = (
    ops.AddOp, ops.SubOp, ops.MulOp, ops.DivOp, ops.PowOp, ops.MaxOp, ops.MinOp, ops.ModOp, ops.FmodOp,
)  # fmt: skip
_COMPARE_OPS = (ops.EqualOp, ops.LessOp, ops.GreaterOp)
_UNARY_OPS = (
    ops.NegOp,
    ops.AbsOp,
    ops.ExpOp,
    ops.TanhOp,
    ops.ErfOp,
    ops.SqrtOp,
    ops.RsqrtOp,
    ops.ReciprocalOp,
    ops.ReluOp,
    ops.SigmoidOp,
    ops.GeluOp,
    ops.SinOp,
    ops.CosOp,
    ops.LogOp,
    ops.FloorOp,
    ops.RoundOp,
    ops.SiluOp,
)


@impl(*_BINARY_OPS, *_COMPARE_OPS)
def _binary(op, args):
    a, b = args
    return [nx.binary(op.func, a, b, _out(op))]


@impl(*_UNARY_OPS)
def _unary(op, args):
    return [nx.unary(op.func, args[0], _out(op))]


@impl(ops.CastOp)
def _cast(op, args):
    return [nx.cast(args[0], _out(op))]


@impl(ops.SelectOp)
def _select(op, args):
    cond, a, b = args
    return [nx.select(cond, a, b, _out(op))]


# -- nn ------------------------------------------------------------------------------------------
@impl(ops.MatMulOp)
def _matmul(op, args):
    a, b = args
    trans_b = op.attrs["trans_b"]
    tile = tuple(op.attrs["tile"]) or None
    m, k = a.shape[-2:]
    n = b.shape[-2] if trans_b else b.shape[-1]
    batch = op.result.type.shape[:-2]
    if op.folds_rows():  # one weight matrix: every batch row of a is a row of one [rows, K] product
        b2 = b.reshape(b.shape[-2:])
        acc2 = nx.matmul_2d(a.reshape(prod(a.shape[:-1]), k), b2.T if trans_b else b2, tile)
        return [nx.cast(acc2.reshape(op.result.type.shape), _out(op))]
    a3 = np.broadcast_to(a, (*batch, *a.shape[-2:])).reshape(-1, m, k)
    b3 = np.broadcast_to(b, (*batch, *b.shape[-2:])).reshape(-1, *b.shape[-2:])
    acc = np.empty((a3.shape[0], m, n), dtype=np.float32)
    for i in range(a3.shape[0]):
        # trans_b is a view: matmul_2d reads b's tiles transposed, the order of sums is unchanged
        acc[i] = nx.matmul_2d(a3[i], b3[i].T if trans_b else b3[i], tile)
    return [nx.cast(acc.reshape(op.result.type.shape), _out(op))]


def _rows(x: np.ndarray, axis: int) -> np.ndarray:
    """``x`` with ``axis`` moved last, as a C-contiguous (rows, cols) array."""
    moved = np.moveaxis(x, axis, -1)
    return np.asarray(moved, order="C").reshape(-1, x.shape[axis])


@impl(ops.SoftmaxOp, ops.LogSoftmaxOp)
def _softmax(op, args):
    (x,) = args
    axis = op.attrs["axis"] % x.ndim
    if x.size == 0:
        return [nx.cast(x, _out(op))]
    x2 = _rows(x, axis)
    m = nx.row_reduce("max", x2, "f32")
    d = nx.binary("sub", x2, m[:, None], "f32")
    e = nx.unary("exp", d, "f32")
    s = nx.row_reduce("sum", e, "f32")
    if isinstance(op, ops.LogSoftmaxOp):
        y = nx.binary("sub", d, nx.unary("log", s, "f32")[:, None], _out(op))
    else:
        y = nx.binary("div", e, s[:, None], _out(op))
    moved_shape = np.moveaxis(x, axis, -1).shape
    return [np.moveaxis(y.reshape(moved_shape), -1, axis)]


@impl(ops.LayerNormOp)
def _layer_norm(op, args):
    x, scale, bias = args
    axis = op.attrs["axis"] % x.ndim
    n = prod(x.shape[axis:])
    if x.size == 0:
        return [nx.cast(x, _out(op))]
    x2 = x.reshape(-1, n)
    count = np.float32(n)
    mean = nx.binary("div", nx.row_reduce("sum", x2, "f32"), count, "f32")
    d = nx.binary("sub", x2, mean[:, None], "f32")
    var = nx.binary("div", nx.row_reduce("sum", nx.binary("mul", d, d, "f32"), "f32"), count, "f32")
    r = nx.unary("rsqrt", nx.binary("add", var, np.float32(op.attrs["epsilon"]), "f32"), "f32")
    y = nx.binary("mul", nx.binary("mul", d, r[:, None], "f32"), scale.reshape(1, n), "f32")
    y = nx.binary("add", y, bias.reshape(1, n), _out(op))
    return [y.reshape(x.shape)]


def _reduce_rows(op: Operation, x: np.ndarray) -> tuple[np.ndarray, int]:
    """``x`` with the reduced axes moved last (original order kept), as (rows, count)."""
    axes = [a % x.ndim for a in op.attrs["axes"]]
    kept = [i for i in range(x.ndim) if i not in axes]
    count = prod(x.shape[a] for a in axes)
    moved = np.transpose(x, kept + sorted(axes))
    # explicit row count: reshape(-1, 0) is ambiguous for an empty reduction
    return np.asarray(moved, order="C").reshape(prod(x.shape[i] for i in kept), count), count


@impl(ops.ReduceSumOp)
def _reduce_sum(op, args):
    x2, _ = _reduce_rows(op, args[0])
    return [nx.row_reduce("sum", x2, _out(op)).reshape(op.result.type.shape)]


@impl(ops.ArgMaxOp)
def _argmax(op, args):
    x2, _ = _reduce_rows(op, args[0])
    return [nx.row_reduce("argmax", x2, _out(op)).reshape(op.result.type.shape)]


@impl(ops.TopKOp)
def _topk(op, args):
    """numerics.topk on ``x`` with ``axis`` moved last, as (rows, n) whole rows (``vtopk``)."""
    x = args[0]
    axis = op.attrs["axis"] % x.ndim
    moved = np.moveaxis(x, axis, -1)
    x2 = np.asarray(moved, order="C").reshape(prod(moved.shape[:-1]), moved.shape[-1])
    vals, idx = nx.topk(x2, op.attrs["k"], op.attrs["largest"], _out(op))
    back = (*moved.shape[:-1], op.attrs["k"])
    return [np.moveaxis(v.reshape(back), -1, axis) for v in (vals, idx)]


@impl(ops.ReduceMeanOp)
def _reduce_mean(op, args):
    x2, count = _reduce_rows(op, args[0])
    s = nx.row_reduce("sum", x2, "f32")
    if count == 0:  # the mean of no elements: 0, as ONNX Runtime returns (not 0/0)
        return [np.zeros(op.result.type.shape, op.result.type.dtype.np_dtype)]
    return [nx.binary("div", s, np.float32(count), _out(op)).reshape(op.result.type.shape)]


@impl(ops.ReduceMaxOp)
def _reduce_max(op, args):
    x2, count = _reduce_rows(op, args[0])
    if count == 0:  # ONNX (opset 18+): the maximum of no elements is the dtype's lowest value
        dt, out = x2.dtype, _out(op)
        if nx.is_float(out):
            lowest = ml_dtypes.finfo(dt).min if out == "f8e4m3fn" else -np.inf  # f8e4m3fn has no inf
        else:
            lowest = ml_dtypes.iinfo(dt).min
        return [np.full(op.result.type.shape, lowest, dtype=dt)]
    return [nx.row_reduce("max", x2, _out(op)).reshape(op.result.type.shape)]


# -- quantization --------------------------------------------------------------------------------
def _qparams(op, args):
    x, scale, zp = args
    axis, block = int(op.attrs["axis"]), int(op.attrs["block_size"])
    return x, nx.expand_qparam(scale, x.shape, axis, block), nx.expand_qparam(zp, x.shape, axis, block)


@impl(ops.QuantizeOp)
def _quantize(op, args):
    x, s, z = _qparams(op, args)
    return [np.asarray(nx.quantize(x, s, z, _out(op), bool(op.attrs["saturate"])))]


@impl(ops.DequantizeOp)
def _dequantize(op, args):
    x, s, z = _qparams(op, args)
    return [np.asarray(nx.dequantize(x, s, z, _out(op)))]


@impl(ops.MatMulW4A16Op)
def _matmul_w4a16(op, args):
    a, codes, scale, zp = args
    trans_b = bool(op.attrs["trans_b"])
    tile = tuple(op.attrs["tile"]) or None
    a_dtype = op.operands[0].type.dtype.name
    # dequantizing is elementwise: the whole dequantized weight, then the tiles of matmul_2d, is
    # what numerics.matmul_wq_tile computes tile by tile (the instruction's kernel)
    w = nx.dequantize_weight(codes, scale, zp, int(op.attrs["group_size"]), trans_b, a_dtype)
    a2 = a.reshape(-1, a.shape[-1])
    acc = nx.matmul_2d(a2, w.T if trans_b else w, tile)
    return [nx.cast(acc.reshape(op.result.type.shape), _out(op))]


@impl(ops.MatMulQAOp)
def _matmul_qa(op, args):
    a, codes, scale, zp = args
    tile = tuple(op.attrs["tile"]) or None
    w = codes.T if op.attrs["trans_b"] else codes
    q_dtype = op.operands[3].type.dtype.name
    a2 = a.reshape(-1, a.shape[-1])
    acc = nx.matmul_qa_2d(a2, w, op.attrs["scale_a"], zp.reshape(()), q_dtype, scale, tile)
    return [nx.cast(acc.reshape(op.result.type.shape), _out(op))]


# -- shape ---------------------------------------------------------------------------------------
@impl(ops.ReshapeOp)
def _reshape(op, args):
    return [args[0].reshape(op.result.type.shape)]


@impl(ops.TransposeOp)
def _transpose(op, args):
    return [np.transpose(args[0], op.attrs["perm"])]


@impl(ops.ConcatOp)
def _concat(op, args):
    return [np.concatenate(args, axis=op.attrs["axis"] % args[0].ndim)]


def _python_slice(start: int, end: int, step: int) -> slice:
    """The Python slice selecting ``range(start, end, step)`` of normalised bounds (never wraps)."""
    if step < 0:
        if start == -1:
            return slice(0, 0)
        return slice(start, None if end == -1 else end, step)
    return slice(start, end, step)


@impl(ops.SliceOp)
def _slice(op, args):
    a = op.attrs
    index = tuple(_python_slice(*b) for b in zip(a["starts"], a["ends"], a["steps"], strict=True))
    return [args[0][index]]


@impl(ops.GatherOp)
def _gather(op, args):
    data, idx = args
    axis = op.attrs["axis"] % data.ndim
    n = data.shape[axis]
    idx = idx.astype(np.int64)
    bad = (idx < -n) | (idx >= n)
    if bad.any():
        raise InputError(
            f"{op.describe()}: index {int(idx[bad].flat[0])} out of range for axis {axis} of size {n}"
        )
    return [np.take(data, np.where(idx < 0, idx + n, idx), axis=axis)]


@impl(ops.BroadcastOp)
def _broadcast(op, args):
    return [np.broadcast_to(args[0], op.result.type.shape)]


# -- program state (ir/ops_state.py) ---------------------------------------------------------------
def _run_state(op) -> tuple[ModuleState, dict[str, int]]:
    if not _RUN:
        raise UnsupportedError(f"{op.describe()} reads run state: it is evaluated only by interpret()")
    return _RUN[-1]


@impl(ops.HostRegOp)
def _host_reg(op, args):
    _, regs = _run_state(op)
    return [np.array(regs[op.attrs["name"]], dtype=np.int32)]


@impl(ops.ScalarOp)
def _scalar(op, args):
    a = int(args[0])
    b = (int(args[1]) if len(args) == 2 else 0) + int(op.attrs["imm"])
    return [np.array(nx.scalar_alu(op.attrs["func"], a, b), dtype=np.int32)]


def _global_rows(op, buf: np.ndarray, offset: int, rows: int) -> slice:
    if not 0 <= offset <= buf.shape[0] - rows:  # the verifier proves this cannot happen
        raise InputError(f"{op.describe()}: offset {offset} + {rows} row(s) outside {buf.shape[0]} rows")
    return slice(offset, offset + rows)


@impl(ops.GlobalLoadOp)
def _global_load(op, args):
    state, _ = _run_state(op)
    buf = state.globals[op.attrs["global"]]
    return [buf[_global_rows(op, buf, int(args[0]), op.result.type.shape[0])].copy()]


@impl(ops.GlobalStoreOp)
def _global_store(op, args):
    state, _ = _run_state(op)
    buf = state.globals[op.attrs["global"]]
    buf[_global_rows(op, buf, int(args[1]), args[0].shape[0])] = args[0]
    return []


# -- paged KV cache (ir/ops_kv.py) -----------------------------------------------------------------
def _checked_indices(op, idx: np.ndarray, limit: int, what: str) -> np.ndarray:
    idx = np.asarray(idx, dtype=np.int64).reshape(-1)
    bad = np.flatnonzero((idx < 0) | (idx >= limit))
    if bad.size:
        i = int(bad[0])
        raise InputError(f"{op.describe()}: {what} {int(idx[i])} at index {i} is outside [0, {limit})")
    return idx


@impl(ops.KVStoreOp)
def _kv_store(op, args):
    state, _ = _run_state(op)
    buf = state.globals[op.attrs["global"]]
    new, slot = args
    b, h, s, d = new.shape
    per_head = buf.shape[0] // h
    slots = _checked_indices(op, slot, per_head, "slot")
    rows = (np.arange(h)[None, :, None] * per_head + slots.reshape(b, 1, s)).reshape(-1)
    buf[rows] = new.reshape(-1, d)
    return []


@impl(ops.PagedAttentionOp)
def _paged_attention(op, args):
    state, _ = _run_state(op)
    q, gather, start, length, nblocks = args
    k_buf, v_buf = state.globals[op.attrs["k_global"]], state.globals[op.attrs["v_global"]]
    kv, bs = int(op.attrs["kv_heads"]), int(op.attrs["block_size"])
    b, hq, s, d = q.shape
    per_head = k_buf.shape[0] // kv
    n = int(nblocks)
    if not 0 <= n <= gather.shape[0]:
        raise InputError(f"{op.describe()}: block count {n} is outside [0, {gather.shape[0]}]")
    ids = _checked_indices(op, gather[:n], per_head // bs, "block id")
    start, length = np.asarray(start, np.int64), np.asarray(length, np.int64)
    bad = np.flatnonzero((length < 0) | (start < 0) | ((length > 0) & (start + length > n * bs)))
    if bad.size:
        r = int(bad[0])
        raise InputError(
            f"{op.describe()}: row {r} attends [{int(start[r])}, {int(start[r] + length[r])}), outside the "
            f"{n * bs} gathered rows"
        )
    offsets = (ids[:, None] * bs + np.arange(bs)[None, :]).reshape(-1)
    out = np.empty_like(q)
    group = hq // kv
    heat = np.zeros((hq, n * bs), np.float32) if op.attrs.get("heat_global") else None
    for kh in range(kv):
        gk, gv = k_buf[kh * per_head + offsets], v_buf[kh * per_head + offsets]
        for hd in range(kh * group, (kh + 1) * group):
            rows = q[:, hd].reshape(b * s, d)
            res = nx.attention_rows(rows, gk, gv, start, length, op.attrs["scale"], op.result.type.dtype.name,
                                    heat=None if heat is None else heat[hd])  # fmt: skip
            out[:, hd] = res.reshape(b, s, d)
    if heat is not None:
        row = int(op.attrs["heat_row"])
        state.globals[op.attrs["heat_global"]][row : row + n * bs] = heat.T
    return [out]
