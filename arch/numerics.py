"""The arithmetic of the MCP 2026 NPU — one definition shared by the IR interpreter and the simulator.

The IR interpreter defines every op's semantics by calling these kernels; the simulator executes
instructions with the very same kernels on the same tile shapes, so the two agree bit for bit.
Rules that make that possible:

* Floating-point work is done in f32 and rounded once to the destination dtype (round half to
  even, via numpy/ml_dtypes casts).  f16/bf16/f8 storage never computes in its own precision.
* A matmul accumulates in f32, tile by tile along K, in ascending K order:
  ``acc = 0; for k0 in range(0, K, tk): acc += A[:, k0:k0+tk] @ B[k0:k0+tk, :]``, each tile
  product computed by ``matmul_tile`` on exactly the tile's shape.  ``tk`` is part of the op
  (the tiling pass sets it), so the compiled op and the binary share one accumulation order.
* Reductions run along the last axis of a contiguous 2-D (rows, cols) array, whole rows at once.
* Special functions (exp, tanh, erf, sqrt, rsqrt, recip, sigmoid, gelu, sin, cos, log) are
  evaluated in f64 and rounded to f32 (deterministic, element by element).

This module must not import the compiler (mcpc.ir, mcpc.passes, mcpc.backend) or onnx.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
from scipy import special as _special

from . import kernels
from .dtypes import FLOAT_DTYPES, NUMPY_DTYPES

F32 = np.float32

_F16 = np.dtype(np.float16)
_FLOAT_NP = frozenset(NUMPY_DTYPES[n] for n in FLOAT_DTYPES) | {np.dtype(np.float64)}
_F8_MAX = np.float32(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max)  # 448


def np_dtype(name: str) -> np.dtype:
    return NUMPY_DTYPES[name]


def is_float(name: str) -> bool:
    return name in FLOAT_DTYPES


def compute_dtype(name: str) -> np.dtype:
    """The dtype arithmetic happens in for operands stored as ``name``: f32 for floats, i64 for ints."""
    if name in FLOAT_DTYPES:
        return np.dtype(np.float32)
    if name == "i1":
        return np.dtype(np.bool_)
    return np.dtype(np.int64)


def widen(x: np.ndarray) -> np.ndarray:
    """Operand in its compute dtype (a contiguous copy when a cast is needed); keeps rank 0."""
    # np.asarray(order="C"), not np.ascontiguousarray: the latter turns a 0-d array into shape (1,)
    x = np.asarray(x)
    src = x.dtype
    if src == np.float32 or src == np.int64 or src == np.bool_:
        return np.asarray(x, order="C")
    if src in _FLOAT_NP:
        if src == _F16:
            w = kernels.widen(x)  # the same values, eight at a time with F16C when built
            if w is not None:
                return w
        return np.asarray(x.astype(np.float32), order="C")
    return np.asarray(x.astype(np.int64), order="C")


def cast(x: np.ndarray, out: str) -> np.ndarray:
    """Convert to the storage dtype ``out``.

    float -> float rounds half to even; float -> int truncates toward zero then wraps like a C
    cast of the f32 value (ONNX Cast leaves out-of-range undefined); int/bool -> any is exact
    where representable; anything -> i1 is ``x != 0``.  f8e4m3fn has no infinity: values beyond
    ±448 (infinities included) saturate to ±448, NaN stays NaN — ONNX Cast's default
    ``saturate=1`` and QuantizeLinear's rule.
    """
    target = NUMPY_DTYPES[out]
    if x.dtype == target:
        return x
    if out == "i1":
        return np.asarray(x != 0)
    src_is_float = x.dtype in _FLOAT_NP
    if out not in FLOAT_DTYPES and src_is_float:
        x = np.trunc(x.astype(np.float64)).astype(np.int64)
    elif out in ("f16", "bf16", "f8e4m3fn") and x.dtype != np.float32:
        x = x.astype(np.float32)  # one rounding step from f32, as the hardware converts
    if out == "f16" and x.dtype == np.float32:
        n = kernels.narrow(x)  # numpy's rounding, eight at a time with F16C when built
        if n is not None:
            return n
    if out == "f8e4m3fn":
        x = np.clip(x, -_F8_MAX, _F8_MAX)  # a plain cast would turn overflow into NaN
    with np.errstate(over="ignore", invalid="ignore"):  # overflow to inf / wrap is the defined result
        return x.astype(target)


# -- 8- and 16-bit float operands: one table per function ----------------------------------------
# An elementwise function of one 8- or 16-bit operand (a ``unary`` function, or a ``binary`` one
# whose other operand is a single value) takes at most 65 536 distinct inputs.  Above
# ``_TABLE_MIN`` elements it is applied by looking each element's bits up in a table of the same
# function evaluated once on every bit pattern of the dtype: the very values the direct
# computation gives (it is elementwise, each element computed on its own, so its value does not
# depend on the array around it), without widening the operand (f16 -> f32 conversions cost
# ~2-3 ns per element in numpy, a lookup ~1) or evaluating an f64 special function per element.
# Binary: the IEEE operations only, whose result is one correctly rounded value whatever code
# path computes it (not max/min, whose choice between +0 and -0 may differ between numpy's
# vectorised and scalar loops, nor pow).
_TABLE_MIN = 4096
_TABLE_BINARY = frozenset({"add", "sub", "mul", "div"})
_TABLES: dict[tuple, np.ndarray] = {}
_TABLES_MAX = 512  # at most 512 tables of 65 536 entries (up to 256 KiB each) are kept


def _tabled(x: np.ndarray) -> bool:
    """Whether ``x`` is applied a function through a table: a large array of an 8/16-bit float."""
    return x.size >= _TABLE_MIN and x.dtype.itemsize <= 2 and x.dtype in _FLOAT_NP


def _by_table(key: tuple, x: np.ndarray, fn) -> np.ndarray:
    """``fn(x)`` for an elementwise ``fn``: ``fn`` of every bit pattern of ``x.dtype``, indexed by
    the bits of ``x`` (the table is computed on first use and kept under ``key``)."""
    bits = np.dtype(f"u{x.dtype.itemsize}")
    table = _TABLES.get(key)
    if table is None:
        every = np.arange(1 << (8 * x.dtype.itemsize), dtype=bits).view(x.dtype)
        table = np.ascontiguousarray(fn(every))
        if len(_TABLES) >= _TABLES_MAX:
            _TABLES.pop(next(iter(_TABLES)))
        _TABLES[key] = table
    return table.take(x.view(bits))


# -- elementwise ---------------------------------------------------------------------------------
_BINARY = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": None,  # integer division truncates toward zero (ONNX Div on ints); floats divide
    "pow": np.power,
    "max": np.maximum,
    "min": np.minimum,
    "eq": np.equal,
    "lt": np.less,
    "gt": np.greater,
    "mod": None,  # remainder with the sign of the divisor (Python %, ONNX Mod fmod=0)
    "fmod": None,  # remainder with the sign of the dividend (C fmod, ONNX Mod fmod=1)
}
COMPARISONS = frozenset({"eq", "lt", "gt"})


def binary(func: str, a: np.ndarray, b: np.ndarray, out: str) -> np.ndarray:
    """``a FUNC b`` with numpy broadcasting, computed in the compute dtype, stored as ``out``."""
    if func in _TABLE_BINARY:
        a, b = np.asarray(a), np.asarray(b)
        if b.size == 1 and b.ndim <= a.ndim and _tabled(a):
            key = ("binary", func, False, b.dtype.str, b.tobytes(), a.dtype.str, out)
            return _by_table(key, a, lambda every: _binary(func, every, b, out))
        if a.size == 1 and a.ndim <= b.ndim and _tabled(b):
            key = ("binary", func, True, a.dtype.str, a.tobytes(), b.dtype.str, out)
            return _by_table(key, b, lambda every: _binary(func, a, every, out))
    return _binary(func, a, b, out)


def _binary(func: str, a: np.ndarray, b: np.ndarray, out: str) -> np.ndarray:
    wa, wb = widen(a), widen(b)
    with np.errstate(all="ignore"):
        if func == "div":
            if np.issubdtype(wa.dtype, np.integer):
                # exact integer quotient truncated toward zero (an f64 detour is wrong past 2**53);
                # division by zero gives 0 (undefined in ONNX)
                q = np.floor_divide(wa, wb)
                r = q + ((np.remainder(wa, wb) != 0) & ((wa < 0) != (wb < 0)))
            else:
                r = np.divide(wa, wb)
        elif func in ("mod", "fmod"):
            r = _remainder(func, wa, wb)
        elif func == "pow" and np.issubdtype(wa.dtype, np.floating):
            r = np.power(wa, wb.astype(np.float32)).astype(np.float32)
        else:
            r = _BINARY[func](wa, wb)
    return cast(np.asarray(r), out)


def _remainder(func: str, wa: np.ndarray, wb: np.ndarray) -> np.ndarray:
    """``mod``/``fmod`` in the compute dtype (numpy's definitions).  Exact for ints, where a zero
    divisor gives 0 (undefined in ONNX).  For floats ``fmod`` is exact; ``mod`` is ``fmod`` plus the
    divisor when the signs differ, that one addition rounded in f32 (as Python's ``%``); x mod 0 is
    NaN."""
    if func == "fmod":
        r = np.fmod(wa, wb)
    else:
        r = np.mod(wa, wb)
    if np.issubdtype(r.dtype, np.integer):
        r = np.where(wb == 0, r.dtype.type(0), r)
    return r


# Special functions on an f64 array ``t``, in place (each is the formula in its comment, with
# the same operations in the same order; in place only to spare large temporaries).
def _rsqrt(t):  # 1 / sqrt(x)
    np.sqrt(t, out=t)
    np.divide(1.0, t, out=t)


def _recip(t):  # 1 / x
    np.divide(1.0, t, out=t)


def _gelu(t):  # 0.5 * x * (1 + erf(x / sqrt(2)))
    e = np.divide(t, np.sqrt(2.0), out=np.empty_like(t))
    _special.erf(e, out=e)
    np.add(1.0, e, out=e)
    np.multiply(0.5, t, out=t)
    np.multiply(t, e, out=t)


def _exp(t):  # exp(x)
    # numpy's vectorised f64 exp takes a slow path below about -745 (5x slower on a softmax with
    # masked scores); every x <= -200 gives exp(x) < 2^-288, which the f32 result (``_unary``
    # rounds every special function to f32) holds as +0 just as it holds exp(-200): the clamp
    # changes no bit.  np.maximum keeps NaN, and -inf becomes -200 (also +0).
    np.maximum(t, -200.0, out=t)
    np.exp(t, out=t)


def _silu(t):  # x * sigmoid(x)
    np.multiply(t, _special.expit(t), out=t)


def _inplace(ufunc):
    return lambda t: ufunc(t, out=t)


_UNARY_F64 = {
    "exp": _exp,
    "tanh": _inplace(np.tanh),
    "erf": _inplace(_special.erf),
    "sqrt": _inplace(np.sqrt),
    "rsqrt": _rsqrt,
    "recip": _recip,
    "sigmoid": _inplace(_special.expit),
    "gelu": _gelu,
    "sin": _inplace(np.sin),
    "cos": _inplace(np.cos),
    "log": _inplace(np.log),
    "silu": _silu,
}
SPECIAL_FUNCTIONS = frozenset(_UNARY_F64)


def unary(func: str, x: np.ndarray, out: str) -> np.ndarray:
    """Elementwise function of ``x`` stored as ``out``.  ``copy`` with a new dtype is a cast."""
    x = np.asarray(x)
    # a plain widening copy is no faster through a table (numpy's astype is as quick as a lookup)
    if _tabled(x) and (func != "copy" or NUMPY_DTYPES[out].itemsize < 4 and x.dtype != NUMPY_DTYPES[out]):
        return _by_table(("unary", func, x.dtype.str, out), x, lambda every: _unary(func, every, out))
    return _unary(func, x, out)


def _unary(func: str, x: np.ndarray, out: str) -> np.ndarray:
    if func == "copy":
        return cast(np.asarray(x, order="C"), out)
    x = np.asarray(x)
    if func in _UNARY_F64:  # in f64 from the operand's compute value (a float's own, exactly)
        t = (x if x.dtype in _FLOAT_NP and x.dtype != np.float64 else widen(x)).astype(np.float64)
        with np.errstate(all="ignore"):
            _UNARY_F64[func](t)
            r = t.astype(np.float32)
        return cast(r, out)
    w = widen(x)
    with np.errstate(all="ignore"):
        if func == "neg":
            r = np.negative(w)
        elif func == "abs":
            r = np.abs(w)
        elif func == "floor":
            r = np.floor(w)  # exact in f32 (and the identity on ints)
        elif func == "round":
            r = np.rint(w) if w.dtype.kind == "f" else w  # half to even, exact in f32
        elif func == "relu":
            r = np.maximum(w, w.dtype.type(0))
        else:
            raise ValueError(f"unknown unary function {func!r}")
    return cast(np.asarray(r), out)


def select(cond: np.ndarray, a: np.ndarray, b: np.ndarray, out: str) -> np.ndarray:
    """``cond ? a : b`` elementwise with broadcasting (values copied exactly)."""
    return cast(np.where(cond.astype(np.bool_), widen(a), widen(b)), out)


# -- reductions ----------------------------------------------------------------------------------
def row_reduce(func: str, x2d: np.ndarray, out: str) -> np.ndarray:
    """Reduce each row of a 2-D array (rows, cols) to one value -> shape (rows,).

    Whole rows at once on a contiguous compute-dtype copy, so the result for a row does not
    depend on how many rows are processed together.
    """
    w = np.ascontiguousarray(widen(x2d))
    if func == "sum":
        r = np.add.reduce(w, axis=-1)
    elif func == "max":
        r = np.maximum.reduce(w, axis=-1)
    elif func == "min":
        r = np.minimum.reduce(w, axis=-1)
    elif func == "argmax":
        r = np.argmax(w, axis=-1)  # first maximum; a NaN counts as the maximum (numpy's rule)
    else:
        raise ValueError(f"unknown reduction {func!r}")
    return cast(np.asarray(r), out)


def topk(x2d: np.ndarray, k: int, largest: bool, out: str) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` largest (descending) or smallest (ascending) elements of each row of ``x2d`` and
    their column indices (int64), as ONNX TopK with sorted=1: equal values keep ascending index
    order, a NaN counts as larger than +inf.  Values are stored as ``out`` (copied exactly)."""
    w = np.ascontiguousarray(widen(x2d))
    if w.dtype.kind == "f":
        nan = np.isnan(w)
        filled = np.where(nan, w.dtype.type(0), w)
        # lexsort is stable; its last key is the primary one.
        keys = (-filled, ~nan) if largest else (filled, nan)
        order = np.lexsort(keys, axis=-1)
    elif largest:
        order = np.argsort(~w, axis=-1, kind="stable")  # ~ reverses the order of ints without overflow
    else:
        order = np.argsort(w, axis=-1, kind="stable")
    idx = order[:, :k]
    return cast(np.take_along_axis(w, idx, axis=-1), out), idx.astype(np.int64)


# -- scalar registers ------------------------------------------------------------------------------
_S32 = 1 << 32


def _wrap32(v: int) -> int:
    v &= _S32 - 1
    return v - _S32 if v >> 31 else v


_SCALAR = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "min": min,
    "max": max,
    "eq": lambda a, b: int(a == b),
    "ne": lambda a, b: int(a != b),
    "lt": lambda a, b: int(a < b),
    "le": lambda a, b: int(a <= b),
    "gt": lambda a, b: int(a > b),
    "ge": lambda a, b: int(a >= b),
}


def scalar_alu(func: str, a: int, b: int) -> int:
    """``func(a, b)`` on signed 32-bit register values, wrapped to s32 (the ``salu`` instruction)."""
    return _wrap32(_SCALAR[func](_wrap32(a), _wrap32(b)))


# -- matmul --------------------------------------------------------------------------------------
# Largest |value| of each integer storage dtype (bounds the products of an integer matmul).
_INT_MAGNITUDE = {
    NUMPY_DTYPES["i4"]: 8,
    NUMPY_DTYPES["u4"]: 15,
    np.dtype(np.int8): 128,
    np.dtype(np.uint8): 255,
    np.dtype(np.int32): 2**31,
    np.dtype(np.int64): 2**63,
}


def matmul_in_f64(a_dtype: np.dtype, b_dtype: np.dtype, k: int) -> bool:
    """Whether an integer (m, k) x (k, n) tile product is computed exactly on float64 BLAS.

    Every product and partial sum is an integer of magnitude at most k·max|a|·max|b|; when that
    bound is below 2**53 each such integer is a float64, so no step rounds, in whatever order
    BLAS sums.  Otherwise (and for bool or float operands) the product is computed as before.
    """
    ma, mb = _INT_MAGNITUDE.get(a_dtype), _INT_MAGNITUDE.get(b_dtype)
    return ma is not None and mb is not None and k * ma * mb < 2**53


def tile_operand(x: np.ndarray, in_f64: bool) -> np.ndarray:
    """A matmul operand as ``matmul_tile`` multiplies it: C-contiguous, in f64 when ``in_f64``
    (``matmul_in_f64``), else in its compute dtype."""
    if in_f64:
        return np.ascontiguousarray(x, dtype=np.float64)
    return np.ascontiguousarray(widen(x))


def matmul_prepared(wa: np.ndarray, wb: np.ndarray, in_f64: bool) -> np.ndarray:
    """``matmul_tile`` on operands already passed through ``tile_operand``."""
    if in_f64:
        return np.matmul(wa, wb).astype(np.int64)  # exact integers below 2**53
    return np.matmul(wa, wb)


def matmul_tile(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """f32 product of one (m, k) tile and one (k, n) tile, computed on exactly these shapes
    (i64 for integer tiles)."""
    in_f64 = matmul_in_f64(a.dtype, b.dtype, a.shape[-1])
    return matmul_prepared(tile_operand(a, in_f64), tile_operand(b, in_f64), in_f64)


def matmul_2d(a: np.ndarray, b: np.ndarray, tile: tuple[int, int, int] | None = None) -> np.ndarray:
    """f32 accumulation of ``a (M, K) @ b (K, N)`` in the tile order defined above.

    ``tile = (tm, tn, tk)``; 0 or None for a dim means the whole dim.  Output tiles are
    independent; inside one output tile the K tiles accumulate in ascending order.
    """
    m, k = a.shape
    n = b.shape[1]
    tm, tn, tk = tile or (0, 0, 0)
    tm, tn, tk = tm or m or 1, tn or n or 1, tk or k or 1
    acc = np.zeros((m, n), dtype=np.float32)
    for i0 in range(0, m, tm):
        for j0 in range(0, n, tn):
            c = acc[i0 : i0 + tm, j0 : j0 + tn]
            for k0 in range(0, k, tk):
                part = matmul_tile(a[i0 : i0 + tm, k0 : k0 + tk], b[k0 : k0 + tk, j0 : j0 + tn])
                if k0 == 0:
                    c[...] = part  # the first K tile overwrites (no 0 + x: keeps the sign of zero)
                else:
                    c += part
    return acc


# -- quantization (ONNX QuantizeLinear / DequantizeLinear) ---------------------------------------
def expand_qparam(p: np.ndarray, shape: tuple[int, ...], axis: int, block_size: int) -> np.ndarray:
    """A scale or zero point broadcastable to a tensor of ``shape``.

    One element: per-tensor.  ``block_size == 0``: rank 1 along ``axis`` (per-axis).  Otherwise
    blocked: entry ``i // block_size`` along ``axis`` for element ``i`` (the last block may be short).
    """
    p = np.asarray(p)
    if p.size == 1:
        return p.reshape(())
    axis = axis % len(shape)
    if block_size == 0:
        dims = [1] * len(shape)
        dims[axis] = p.size
        return p.reshape(dims)
    return np.repeat(p, block_size, axis=axis).take(range(shape[axis]), axis=axis)


def quantize(x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, out: str, saturate: bool = True):
    """``x / scale + zero_point`` stored as the quantized type ``out`` (qparams already expanded).

    The quotient is f32.  Integers: rounded half to even, the zero point added exactly, clipped to
    the type's range (NaN gives the zero point).  f8e4m3fn: ``x / scale + zero_point`` in f32, rounded
    half to even once; beyond ±448 (±inf included) it saturates, or with ``saturate=False`` becomes
    NaN (ONNX's saturate=0); NaN stays NaN.
    """
    with np.errstate(all="ignore"):
        q = np.divide(widen(x).astype(F32), widen(scale).astype(F32), dtype=F32)
        if out in FLOAT_DTYPES:
            q = q + widen(zero_point).astype(F32)
            if saturate:
                return cast(q, out)
            return q.astype(NUMPY_DTYPES[out])  # ml_dtypes: overflow and ±inf become NaN
        lo, hi = (int(v) for v in _int_range(out))
        r = np.rint(q.astype(np.float64)) + widen(zero_point).astype(np.float64)
        r = np.where(np.isnan(r), widen(zero_point).astype(np.float64), r)
        return np.clip(r, lo, hi).astype(np.int64).astype(NUMPY_DTYPES[out])


def _int_range(name: str) -> tuple[int, int]:
    ii = ml_dtypes.iinfo(NUMPY_DTYPES[name])
    return int(ii.min), int(ii.max)


def dequantize(x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, out: str) -> np.ndarray:
    """``(x - zero_point) * scale`` rounded once to ``out`` (qparams already expanded).

    Integer inputs subtract exactly (i64) and convert to f32; f8 inputs subtract in f32 (exact
    for the values f8 holds); the product is f32.
    """
    d = widen(x) - widen(zero_point)
    with np.errstate(all="ignore"):
        return cast(np.multiply(d.astype(F32), widen(scale).astype(F32), dtype=F32), out)


# -- weight-quantized matmul (matmul_w4a16) -------------------------------------------------------
def dequantize_weight(codes: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None, group: int,
                      trans_b: bool, out: str) -> np.ndarray:  # fmt: skip
    """The weight ``(codes - zero_point) · scale`` rounded once to ``out`` (``dequantize``).

    ``codes`` is (k, n), or (n, k) when ``trans_b``; ``scale`` and ``zero_point`` hold one entry
    per group of ``group`` consecutive elements along K (``group`` 0: one group spanning K), i.e.
    shape (ceil(k/group), n), or (n, ceil(k/group)) when ``trans_b``; ``zero_point`` None means 0.
    """
    axis = 1 if trans_b else 0
    k = codes.shape[axis]
    g = group or max(k, 1)
    s = expand_qparam(scale, codes.shape, axis, g)
    z = np.zeros((), codes.dtype) if zero_point is None else expand_qparam(zero_point, codes.shape, axis, g)
    return dequantize(codes, s, z, out)


def matmul_wq_tile(a: np.ndarray, codes: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None,
                   group: int, trans_b: bool, a_dtype: str) -> np.ndarray:  # fmt: skip
    """f32 product of an activation tile ``a`` (m, k) of dtype ``a_dtype`` and a quantized weight
    tile (``dequantize_weight``): the weights are dequantized to ``a_dtype`` (the MAC array's input
    type), then multiplied as ``matmul_tile``.  Dequantizing is elementwise, so a tile of the
    dequantized weight is the dequantized tile: the tiled product equals ``matmul_2d`` of ``a`` and
    the whole dequantized weight, bit for bit."""
    w = dequantize_weight(codes, scale, zero_point, group, trans_b, a_dtype)
    return matmul_tile(a, w.T if trans_b else w)


# -- quantized-activation matmul (vmmul.q4f8, matmul_i8) ------------------------------------------
def fused_scale(scale_a, scale_w, scale_o=1.0) -> np.ndarray:
    """The one f32 scale a quantized-activation product is multiplied by: f32(f32(scale_a · scale_w)
    / scale_o) — what the scale-fusion pass folds into a single constant."""
    with np.errstate(all="ignore"):
        sw = np.asarray(scale_w, np.float32)
        return np.divide(np.multiply(np.float32(scale_a), sw, dtype=F32), np.float32(scale_o), dtype=F32)


def matmul_qa_tile(
    a: np.ndarray, codes: np.ndarray, scale_a, zp_a, q_dtype: str, scale: np.ndarray
) -> np.ndarray:
    """f32 tile of a quantized-activation matmul: ``a`` (m, k, float) quantized on the fly to
    ``q_dtype`` (``quantize`` with ``scale_a`` and ``zp_a``), times the weight codes (k, n: int4,
    int8 or fp8 e4m3fn values), the products summed exactly (every product of a 4/8-bit integer
    and an 8-bit code is exact in f64, and so is a sum of fewer than 2^20 of them), rounded once to
    f32 and multiplied in f32 by ``scale`` (``fused_scale``; one per column, shape (n,), or one)."""
    qa = quantize(a, np.float32(scale_a), np.asarray(zp_a), q_dtype)
    da = qa.astype(np.float64) - float(np.asarray(zp_a).astype(np.float64))
    p = np.matmul(np.ascontiguousarray(da), np.ascontiguousarray(codes.astype(np.float64)))
    with np.errstate(all="ignore"):
        return np.multiply(p.astype(np.float32), np.asarray(scale, np.float32), dtype=F32)


def matmul_qa_2d(a: np.ndarray, codes: np.ndarray, scale_a, zp_a, q_dtype: str, scale: np.ndarray,
                 tile: tuple[int, int, int] | None = None) -> np.ndarray:  # fmt: skip
    """``matmul_2d``'s tile order with ``matmul_qa_tile`` products: f32 accumulation of the K
    tiles, ascending; ``scale`` has one entry per column (or one)."""
    m, k = a.shape
    n = codes.shape[1]
    tm, tn, tk = tile or (0, 0, 0)
    tm, tn, tk = tm or m or 1, tn or n or 1, tk or k or 1
    s = np.broadcast_to(np.asarray(scale, np.float32).reshape(-1), (n,))
    acc = np.zeros((m, n), dtype=np.float32)
    for i0 in range(0, m, tm):
        for j0 in range(0, n, tn):
            c = acc[i0 : i0 + tm, j0 : j0 + tn]
            for k0 in range(0, k, tk):
                part = matmul_qa_tile(a[i0 : i0 + tm, k0 : k0 + tk], codes[k0 : k0 + tk, j0 : j0 + tn],
                                      scale_a, zp_a, q_dtype, s[j0 : j0 + tn])  # fmt: skip
                if k0 == 0:
                    c[...] = part
                else:
                    c += part
    return acc


# -- attention over a KV cache (mcp.paged_attention, the `vattn` instruction) --------------------
def attention_rows(q: np.ndarray, k: np.ndarray, v: np.ndarray, start: np.ndarray, length: np.ndarray,
                   scale: float, out: str, heat: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """Attention of each query row over its own window of K/V rows, stored as ``out``.

    ``q`` (R, D); ``k`` and ``v`` (N, D), any float dtype; ``start`` and ``length`` one integer per
    row.  Row r attends rows ``[start[r], start[r] + length[r])`` of K and V; a row of length 0 gives
    zeros.  Per row, on exactly these shapes: ``s = q[r] @ K.T`` (``matmul_tile``, f32), ``s *= scale``
    (f32), ``e = exp(s - max(s))`` (exp as ``unary``: f64 rounded to f32), ``p = e / sum(e)`` (f32),
    ``o = p @ V`` (``matmul_tile``, f32), rounded once to ``out``.  The caller guarantees every window
    lies inside K and V (the interpreter and the simulator check it first).

    ``heat`` (optional, f32 with one element per K/V row, updated in place): the attention heat of
    the rows' query head.  After row r's ``p`` is computed, ``heat[start:start + len] += p`` (f32),
    rows in order: so ``heat[j]`` ends as the sum over the rows of the probability they gave K/V row
    j (rows no window reaches are left as they were; the caller zeroes them first).
    """
    rows, d = q.shape
    res = np.zeros((rows, d), dtype=F32)
    sc = F32(scale)
    with np.errstate(all="ignore"):
        for r in range(rows):
            n = int(length[r])
            if n <= 0:
                continue
            s0 = int(start[r])
            s = matmul_tile(q[r : r + 1], k[s0 : s0 + n].T)
            s *= sc
            s -= np.maximum.reduce(s, axis=-1, keepdims=True)
            e = unary("exp", s, "f32")
            e /= np.add.reduce(e, axis=-1, keepdims=True)
            if heat is not None:
                heat[s0 : s0 + n] += e[0]
            res[r] = matmul_tile(e, v[s0 : s0 + n])[0]
    return cast(res, out)
