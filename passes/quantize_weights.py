"""``quantize-weights``: apply the QAT config's ``quantization:`` section to the IR.

Assumes a valid module whose MatMul/Gemm weights are float constants read directly as a matmul's
``b`` (``fold-constants`` runs first: it lets a matmul read a transposed weight with ``trans_b``).
Guarantees a valid module computing, for every quantized layer, ``x @ dequant(W)`` where

* a quantized weight is three constants — ``codes`` (i4/u4, i8/u8 for INT8 and for INT6 held in
  an 8-bit container clipped to the 6-bit range, or f8e4m3fn) in the weight's own layout,
  ``scale`` (f16/f32, one per group of ``group_size`` along the contracted axis K and output
  column) and ``zero_point`` (the codes' dtype, the scale's shape, zeros when symmetric) —
  feeding ``mcp.dequantize {axis = K axis, block_size = group size}`` whose result is the
  matmul's ``b`` (so a ``trans_b`` matmul keeps reading an (N, K) weight);
* a ``mcp.gather`` of a tied embedding (the table the LM head reads transposed) gathers the
  codes, scales and zero points of the rows it reads and dequantizes those rows only: the table
  is stored once, quantized;
* AWQ's per-channel input scale ``s`` becomes ``x / s`` before the matmul (the weight quantized is
  ``diag(s) W``);
* activation quantization (``activations.where``) is a ``mcp.quantize`` → ``mcp.dequantize`` pair
  on the matmul's input with one calibrated scale and zero point (per tensor).

Layers kept in float (an override's ``keep``, or sensitivity above the INT8 threshold) are left
untouched.  What ran for each layer (algorithm, bits, bytes as stored) is recorded in
``ctx.notes["quantization"]`` for the compile summary (the arrays in
``ctx.notes["quantized_arrays"]``, for the ONNX export); calibration data comes from
``ctx.notes["calibration"]`` (a ``CalibrationData``), absent when none was given.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any, ClassVar

import ml_dtypes
import numpy as np

from mcpc.arch import numerics as nx
from mcpc.errors import PassError, UnsupportedError
from mcpc.ir.core import Function, Module, Operation, Value
from mcpc.ir.ops import ConstantOp, DequantizeOp, DivOp, GatherOp, MatMulOp, QuantizeOp
from mcpc.passes.calibration import CalibrationData, run_collecting
from mcpc.passes.manager import Pass, PassContext, register_pass

F32 = np.float32
INT_CODE_TYPES = {
    ("i", 4): ml_dtypes.int4,
    ("u", 4): ml_dtypes.uint4,
    ("i", 8): np.int8,
    ("u", 8): np.uint8,
}


# -- finding the layers ------------------------------------------------------------------------------
@dataclass
class Layer:
    """One quantizable weight as read by matmuls with one layout: the constant, its matmuls,
    the gathers reading it as a table (a tied embedding), and whether other ops read it too."""

    name: str
    weight_name: str
    const: ConstantOp
    trans_b: bool
    matmuls: list[MatMulOp] = field(default_factory=list)
    gathers: list[GatherOp] = field(default_factory=list)
    other_users: bool = False

    @property
    def k_axis(self) -> int:
        return 1 if self.trans_b else 0

    @property
    def kn(self) -> tuple[int, int]:
        """(K, N) of the weight."""
        rows, cols = self.const.value.shape
        return (cols, rows) if self.trans_b else (rows, cols)

    def names(self) -> list[str]:
        """The names an override pattern is matched against."""
        return [self.name, self.weight_name, *(m.loc for m in self.matmuls if m.loc)]


def find_layers(func: Function) -> list[Layer]:
    """Every MatMul/Gemm whose ``b`` is a rank-2 float constant, grouped by (constant, layout),
    in program order of their first matmul."""
    layers: dict[tuple[int, bool], Layer] = {}
    for i, op in enumerate(func.ops):
        if not isinstance(op, MatMulOp):
            continue
        b = op.operands[1]
        if not isinstance(b.owner, ConstantOp) or b.type.rank != 2 or not b.type.dtype.is_float:
            continue
        key = (id(b.owner), bool(op.attrs["trans_b"]))
        if key not in layers:
            name = op.loc or f"matmul#{i}"
            layers[key] = Layer(name, b.owner.loc or name, b.owner, key[1])
        layers[key].matmuls.append(op)
    by_const: dict[int, list[Layer]] = {}
    for layer in layers.values():
        by_const.setdefault(id(layer.const), []).append(layer)
    for op in func.ops:
        for j, v in enumerate(op.operands):
            owned = by_const.get(id(v.owner)) if isinstance(v.owner, ConstantOp) else None
            if not owned:
                continue
            if isinstance(op, MatMulOp) and j == 1:
                continue
            if isinstance(op, GatherOp) and j == 0 and int(op.attrs["axis"]) % 2 == 0:
                owned[0].gathers.append(op)
            else:
                for layer in owned:
                    layer.other_users = True
    return list(layers.values())


def output_layer(func: Function) -> MatMulOp | None:
    """The last MatMul/Gemm with a constant weight in program order: a decoder's LM head, an
    encoder's last projection (what ``activations.where: output_layer`` quantizes the input of)."""
    last = None
    for op in func.ops:
        if isinstance(op, MatMulOp) and isinstance(op.operands[1].owner, ConstantOp):
            last = op
    return last


# -- settings per layer ------------------------------------------------------------------------------
def layer_settings(quant, layer: Layer, bits: int | None = None):
    """The ``WeightQuant`` for ``layer`` (None: kept in float): the section's ``weights``, with
    ``bits`` from sensitivity when given (0 = keep), then every matching override in order."""
    settings = quant.weights
    keep = bits == 0
    if bits:
        settings = settings.model_copy(update={"bits": bits})
    for o in quant.overrides:
        if any(fnmatch.fnmatchcase(n, o.pattern) for n in layer.names()):
            keep = keep or o.keep
            settings = o.apply(settings)
            if o.bits is not None or o.keep:
                keep = o.keep
    return None if keep else settings


# -- quantizing one weight ---------------------------------------------------------------------------
@dataclass
class QuantResult:
    """A quantized (K, N) weight as the IR stores it, before the layout change."""

    codes: np.ndarray  # (K, N) in the IR code dtype
    scales: np.ndarray  # (G, N) f16/f32
    zero_points: np.ndarray  # (G, N), the codes' dtype
    block: int
    algorithm: str
    in_scale: np.ndarray | None = None  # AWQ: the matmul reads x / in_scale

    def dequantize(self) -> np.ndarray:
        """f32 (K, N): exactly what the IR dequantize op computes."""
        k, n = self.codes.shape
        s = nx.expand_qparam(self.scales, (k, n), 0, self.block)
        z = nx.expand_qparam(self.zero_points, (k, n), 0, self.block)
        return nx.dequantize(self.codes, s, z, "f32")

    @property
    def nbytes(self) -> int:
        return sum(_stored_bytes(a) for a in (self.codes, self.scales, self.zero_points))


def _stored_bytes(a: np.ndarray) -> int:
    from mcpc.ir.dtypes import dtype_from_numpy

    return dtype_from_numpy(a.dtype).storage_bytes(a.size)


def _algos():
    from mcpc.passes import quant

    return quant


def _algorithm(name: str):
    fn = getattr(_algos(), f"quantize_{name}", None)
    if fn is None:
        raise UnsupportedError(f"quantize-weights: algorithm {name} is not available in this build of mcpc")
    return fn


def resolve_algorithm(settings, have_data: bool) -> str:
    """``auto`` is GPTQ with calibration data, else the data-free clipping search ``mse``."""
    if settings.format == "f8e4m3fn":
        return "fp8"
    if settings.algorithm == "auto":
        return "gptq" if have_data else "mse"
    return settings.algorithm


def quantize_weight(w: np.ndarray, settings, x: np.ndarray | None, where: str) -> QuantResult:
    """Quantize the (K, N) f32 weight ``w`` with ``settings`` (a ``WeightQuant``); ``x`` the
    calibration inputs of its matmul(s) (an ``InputStats`` or a (rows, K) array), or None."""
    k = w.shape[0]
    block = settings.group_size or k
    algorithm = resolve_algorithm(settings, x is not None)
    if algorithm == "fp8":
        return _quantize_fp8(w, settings, block)
    if algorithm in ("awq", "gptq") and x is None:
        raise PassError(f"quantize-weights: {where}: algorithm {algorithm} needs calibration data")
    spec = _algos().QuantSpec(
        bits=settings.bits,
        group_size=settings.group_size,
        symmetric=settings.symmetric,
        scale_dtype=settings.scale_dtype,
        rounding=settings.rounding,
    )
    in_scale = None
    if algorithm == "gptq":
        qw = _algorithm("gptq")(w, x, spec, desc_act=settings.desc_act)
    elif algorithm == "awq":
        qw, in_scale = _algorithm("awq")(w, x, spec)
        in_scale = np.asarray(in_scale, F32)
    else:
        qw = _algorithm(algorithm)(w, spec)
    sign = "i" if settings.symmetric else "u"
    code_type = INT_CODE_TYPES[(sign, 4 if settings.bits == 4 else 8)]
    codes = np.asarray(qw.codes).astype(np.int64)
    lo, hi = (
        (-(1 << (settings.bits - 1)), (1 << (settings.bits - 1)) - 1)
        if settings.symmetric
        else (0, (1 << settings.bits) - 1)
    )
    if codes.min(initial=0) < lo or codes.max(initial=0) > hi:
        raise PassError(f"quantize-weights: {where}: {algorithm} produced codes outside [{lo}, {hi}]")
    zp = (
        np.zeros(qw.scales.shape, np.int64)
        if qw.zero_points is None
        else np.asarray(qw.zero_points, np.int64)
    )
    result = QuantResult(
        codes.astype(code_type), np.asarray(qw.scales), zp.astype(code_type), block, qw.algorithm, in_scale
    )
    if not np.array_equal(result.dequantize(), np.asarray(qw.dequantize(), F32), equal_nan=True):
        raise PassError(f"quantize-weights: {where}: the stored codes do not reproduce {algorithm}'s weight")
    return result


def _quantize_fp8(w: np.ndarray, settings, block: int) -> QuantResult:
    """fp8 e4m3 codes: one scale per group mapping its largest magnitude to 448 (saturating cast)."""
    k, n = w.shape
    groups = -(-k // block)
    pad = np.zeros((groups * block - k, n), F32)
    amax = np.abs(np.concatenate([w, pad])).reshape(groups, block, n).max(axis=1)
    sdt = np.float16 if settings.scale_dtype == "f16" else np.float32
    scales = (amax / F32(448.0)).astype(sdt)
    tiny = np.finfo(sdt).smallest_normal
    scales = np.where(scales == 0, sdt(tiny), scales).astype(sdt)
    zeros = np.zeros((groups, n), ml_dtypes.float8_e4m3fn)
    codes = nx.quantize(w, nx.expand_qparam(scales, (k, n), 0, block), np.zeros((), np.float32), "f8e4m3fn")
    return QuantResult(codes, scales, zeros, block, "fp8")


# -- the pass ----------------------------------------------------------------------------------------
def _const(value: np.ndarray, loc: str | None) -> ConstantOp:
    return ConstantOp([], {"value": np.asarray(value, order="C")}, loc=loc)


def _observer(calibration):
    algos = _algos()
    names = {"ema": "EmaObserver", "minmax": "MinMaxObserver", "percentile": "PercentileObserver"}
    cls = getattr(algos, names[calibration.method], None)
    if cls is None:
        raise UnsupportedError(
            f"quantize-weights: observer {calibration.method} is not available in this build"
        )
    if calibration.method == "ema":
        return cls(decay=calibration.decay)
    if calibration.method == "percentile":
        return cls(percentile=calibration.percentile)
    return cls()


def _activation_qparams(observer, dtype: str, symmetric: bool) -> tuple[np.ndarray, np.ndarray]:
    bits = 8 if dtype in ("i8", "u8") else 4
    scale, zp = observer.qparams(bits, symmetric)
    zp = int(np.asarray(zp).reshape(()))
    if dtype.startswith("i") and not symmetric:
        zp -= 1 << (bits - 1)  # the observer's unsigned zero point, moved into the signed range
    elif dtype.startswith("u") and symmetric:
        zp += 1 << (bits - 1)
    npd = {"i8": np.int8, "u8": np.uint8, "i4": ml_dtypes.int4, "u4": ml_dtypes.uint4}[dtype]
    return np.asarray(scale, F32).reshape(()), np.asarray(zp).astype(npd).reshape(())


@dataclass
class _Plan:
    """What the pass does to one function: per layer its settings (None = kept), per matmul
    whether its input is quantized."""

    layers: list[Layer]
    settings: list[Any]
    act_matmuls: list[MatMulOp]
    sensitivity: dict[str, float]


def plan_function(func: Function, quant, calib: CalibrationData | None, measure: bool = False) -> _Plan:
    """Settings for every layer of ``func`` (sensitivity measured when the section asks for it, or
    when ``measure`` — ``mcpc quant report`` — and calibration data is given)."""
    layers = find_layers(func)
    sensitivity: dict[str, float] = {}
    bits: dict[int, int] = {}
    sens_cfg = quant.sensitivity
    if sens_cfg is not None or (measure and calib is not None):
        if calib is None:
            raise PassError("quantize-weights: quantization.sensitivity needs calibration data")
        samples = sens_cfg.samples if sens_cfg is not None else 8
        metric = sens_cfg.metric if sens_cfg is not None else "rel_l2"
        probe = 6 if sens_cfg is not None else None
        sensitivity = measure_sensitivity(func, layers, quant, calib.limited(samples), metric, probe)
        if sens_cfg is not None:
            t = sens_cfg.thresholds
            for i, layer in enumerate(layers):
                s = sensitivity.get(layer.name)
                if s is not None:
                    bits[i] = 6 if s <= t.int6 else 8 if s <= t.int8 else 0
    settings = [layer_settings(quant, layer, bits.get(i)) for i, layer in enumerate(layers)]
    act: list[MatMulOp] = []
    if quant.activations.where == "output_layer":
        last = output_layer(func)
        act = [last] if last is not None else []
    elif quant.activations.where == "all":
        act = [m for layer, s in zip(layers, settings, strict=True) if s is not None for m in layer.matmuls]
    return _Plan(layers, settings, act, sensitivity)


def measure_sensitivity(func, layers, quant, calib, metric: str, probe_bits: int | None) -> dict[str, float]:
    """Per layer: the model output error with that layer alone quantized (at ``probe_bits``, else
    at its configured settings), over ``calib``.  Layers an override keeps are not measured."""
    refs = [run_collecting(func, b) for b in calib.batches]
    chosen = [layer_settings(quant, layer, probe_bits) for layer in layers]
    needs_x = any(s is not None and resolve_algorithm(s, True) in ("awq", "gptq") for s in chosen)
    xs = collect_inputs(func, layers, calib) if needs_x else None
    out: dict[str, float] = {}
    for i, (layer, settings) in enumerate(zip(layers, chosen, strict=True)):
        if settings is None:
            continue
        w = _kn(layer)
        x = xs[i] if xs is not None else None
        q = quantize_weight(w, settings, x, layer.name)
        wq = q.dequantize()
        replaced = (wq.T if layer.trans_b else wq).astype(layer.const.value.dtype)
        errs = []
        for batch, ref in zip(calib.batches, refs, strict=True):
            got = run_collecting(func, batch, replace={id(layer.const.result): replaced})
            errs.append((ref, got))
        out[layer.name] = _error(errs, metric)
    return out


def _error(pairs, metric: str) -> float:
    num = den = dot = nr = ng = 0.0
    for ref, got in pairs:
        for r, g in zip(ref, got, strict=True):
            if not np.issubdtype(r.dtype, np.floating) and r.dtype.kind != "V":
                continue
            r64, g64 = np.asarray(r, np.float64).ravel(), np.asarray(g, np.float64).ravel()
            num += float(np.sum((g64 - r64) ** 2))
            den += float(np.sum(r64**2))
            dot += float(r64 @ g64)
            nr += float(r64 @ r64)
            ng += float(g64 @ g64)
    if metric == "cosine":
        return 1.0 - dot / max(np.sqrt(nr * ng), 1e-300)
    return float(np.sqrt(num / max(den, 1e-300)))


def _kn(layer: Layer) -> np.ndarray:
    w = np.asarray(layer.const.value, F32)
    return np.ascontiguousarray(w.T if layer.trans_b else w)


def collect_inputs(func: Function, layers: list[Layer], calib: CalibrationData, observers=None) -> list:
    """Per layer, the ``InputStats`` (E[x^T x], E|x|) of its matmuls' inputs over the calibration
    batches; ``observers`` (id of an input value -> activation observer) see every batch too."""
    stats = [_algos().InputStats(layer.kn[0]) for layer in layers]
    readers: dict[int, list[int]] = {}
    for i, layer in enumerate(layers):
        for m in layer.matmuls:
            readers.setdefault(id(m.operands[0]), [])
            if i not in readers[id(m.operands[0])]:
                readers[id(m.operands[0])].append(i)
    observers = observers or {}
    for key in observers:
        readers.setdefault(key, [])

    def watcher(key: int):
        def see(arr: np.ndarray) -> None:
            a = np.asarray(arr, F32)
            for i in readers[key]:
                stats[i].update(a)
            if key in observers:
                observers[key].update(a)

        return see

    for batch in calib.batches:
        run_collecting(func, batch, watch={k: watcher(k) for k in readers})
    return stats


def quantize_function(
    func: Function, quant, calib: CalibrationData | None, measure: bool = False, float_dtype=None
):
    """Quantize ``func`` in place per ``quant`` (a ``Quantization``); return its report (JSON-ready)
    and the arrays behind it (per quantized layer its ``Layer``, ``QuantResult`` and float weight;
    per matmul name the activation (scale, zero point)) for ``mcpc export-onnx``."""
    plan = plan_function(func, quant, calib, measure)
    algos_needed = {resolve_algorithm(s, calib is not None) for s in plan.settings if s is not None}
    observers: dict[int, Any] = {}
    for m in plan.act_matmuls:
        observers.setdefault(id(m.operands[0]), _observer(quant.calibration))
    xs = None
    if calib is not None and (algos_needed & {"awq", "gptq"} or observers):
        xs = collect_inputs(func, plan.layers, calib, observers)
    rows, new_for_const, deq_of, details = [], {}, {}, []
    for i, (layer, settings) in enumerate(zip(plan.layers, plan.settings, strict=True)):
        row = {
            "layer": layer.name,
            "weight": layer.weight_name,
            "shape": list(layer.kn),
            "params": int(np.prod(layer.kn)),
            "tied_gathers": len(layer.gathers),
            "float_bytes": int(layer.const.result.type.nbytes),
        }
        if layer.name in plan.sensitivity:
            row["sensitivity"] = plan.sensitivity[layer.name]
        if settings is None:
            kept = float_dtype or layer.const.result.type.dtype
            row.update(
                precision=f"{kept.name} (kept)",
                algorithm="none",
                bytes=kept.storage_bytes(row["params"]),
                bits_per_weight=kept.bits,
            )
            rows.append(row)
            continue
        x = None
        if resolve_algorithm(settings, calib is not None) in ("awq", "gptq"):
            x = xs[i]
        q = quantize_weight(_kn(layer), settings, x, layer.name)
        ops = _emit_layer(layer, q)
        new_for_const.setdefault(id(layer.const), []).extend(ops)
        deq_of[id(layer.const), layer.trans_b] = (ops[-1].result, q, layer)
        details.append({"layer": layer, "result": q, "float": layer.const.value})
        bits = settings.bits if settings.format == "int" else 8
        row.update(
            precision=(
                "f8e4m3fn" if settings.format != "int" else f"{'i' if settings.symmetric else 'u'}{bits}"
            ),
            algorithm=q.algorithm,
            group_size=settings.group_size,
            bytes=q.nbytes,
            bits_per_weight=8.0 * q.nbytes / max(row["params"], 1),
        )
        rows.append(row)
    by_matmul = {id(m): observers[id(m.operands[0])] for m in plan.act_matmuls}
    act_rows = _rewrite(func, plan, new_for_const, deq_of, by_matmul, quant)
    activations = {r["layer"]: r.pop("_qparams") for r in act_rows}
    return {"layers": rows, "activations": act_rows}, {"weights": details, "activations": activations}


def _emit_layer(layer: Layer, q: QuantResult) -> list[Operation]:
    """codes, scale, zero point constants in the weight's layout and the dequantize reading them."""
    t = (lambda a: np.ascontiguousarray(a.T)) if layer.trans_b else (lambda a: a)
    loc = layer.const.loc
    codes, scale, zp = _const(t(q.codes), loc), _const(t(q.scales), loc), _const(t(q.zero_points), loc)
    deq = DequantizeOp(
        [codes.result, scale.result, zp.result],
        {"axis": layer.k_axis, "block_size": q.block, "out": layer.const.result.type.dtype},
        loc=loc,
    )
    return [codes, scale, zp, deq]


def _rewrite(func: Function, plan: _Plan, new_for_const, deq_of, observers, quant) -> list[dict]:
    keep_const = {id(layer.const) for layer in plan.layers if layer.other_users}
    quantized_consts = {key[0] for key in deq_of}
    for layer in plan.layers:  # a const one of whose layouts stays float keeps the constant too
        if (id(layer.const), layer.trans_b) not in deq_of:
            keep_const.add(id(layer.const))
    act_of = {id(m) for m in plan.act_matmuls}
    tied = {id(g): layer for layer in plan.layers for g in layer.gathers}
    rename: dict[int, Value] = {}
    act_rows: list[dict] = []
    act_done: dict[int, Value] = {}
    new_ops: list[Operation] = []
    for op in func.ops:
        op.operands = [rename.get(id(v), v) for v in op.operands]
        if isinstance(op, ConstantOp) and id(op) in quantized_consts:
            if id(op) in keep_const:
                new_ops.append(op)
            new_ops.extend(new_for_const[id(op)])
            continue
        if isinstance(op, GatherOp) and id(op) in tied:
            layer = tied[id(op)]
            entry = deq_of.get((id(layer.const), layer.trans_b))
            if entry is not None:
                new_ops.extend(_tied_gather(op, entry, rename))
                continue
        if isinstance(op, MatMulOp):
            b = op.operands[1]
            entry = (
                deq_of.get((id(b.owner), bool(op.attrs["trans_b"])))
                if isinstance(b.owner, ConstantOp)
                else None
            )
            x = op.operands[0]
            if id(op) in act_of:
                x = _quantize_activation(op, x, observers[id(op)], quant, new_ops, act_done, act_rows)
            if entry is not None:
                deq, q, _layer = entry
                if q.in_scale is not None:
                    s = _const(q.in_scale.astype(x.type.dtype.np_dtype), op.loc)
                    div = DivOp([x, s.result], loc=op.loc)
                    new_ops.extend([s, div])
                    x = div.result
                op.operands = [x, deq]
            elif x is not op.operands[0]:
                op.operands = [x, op.operands[1]]
        new_ops.append(op)
    func.ops = new_ops
    return act_rows


def _tied_gather(op: GatherOp, entry, rename) -> list[Operation]:
    """``gather(table, ids)`` of a quantized tied table: gather its codes, scales and zero points
    (row-blocked layout) and dequantize the gathered rows; or gather the dequantized table."""
    deq, q, layer = entry
    if not layer.trans_b:  # blocks run along the rows gathered: dequantize the table, then gather
        new = GatherOp([deq, op.operands[1]], dict(op.attrs), loc=op.loc)
        rename[id(op.result)] = new.result
        return [new]
    codes, scale, zp = deq.owner.operands
    ids = op.operands[1]
    gathered = [GatherOp([v, ids], {"axis": 0}, loc=op.loc) for v in (codes, scale, zp)]
    rank = gathered[0].result.type.rank
    out = DequantizeOp(
        [g.result for g in gathered],
        {"axis": rank - 1, "block_size": q.block, "out": op.result.type.dtype},
        loc=op.loc,
    )
    rename[id(op.result)] = out.result
    return [*gathered, out]


def _quantize_activation(op, x, observer, quant, new_ops, done, rows) -> Value:
    """``x`` through a quantize -> dequantize pair with the observer's per-tensor qparams (one pair
    per value: matmuls sharing an input share it)."""
    if id(x) not in done:
        a = quant.activations
        scale, zp = _activation_qparams(observer, a.dtype, a.symmetric)
        s = _const(scale.astype(x.type.dtype.np_dtype) if x.type.dtype.is_float else scale, op.loc)
        z = _const(zp, op.loc)
        qop = QuantizeOp([x, s.result, z.result], {"axis": 0, "block_size": 0}, loc=op.loc)
        dq = DequantizeOp(
            [qop.result, s.result, z.result], {"axis": 0, "block_size": 0, "out": x.type.dtype}, loc=op.loc
        )
        new_ops.extend([s, z, qop, dq])
        done[id(x)] = (dq.result, scale, zp)
    result, scale, zp = done[id(x)]
    rows.append(
        {
            "layer": op.loc or "matmul",
            "dtype": quant.activations.dtype,
            "scale": float(scale),
            "zero_point": int(zp.astype(np.int64)),
            "_qparams": (scale, zp),
        }
    )
    return result


@register_pass
@dataclass(frozen=True)
class QuantizeWeightsPass(Pass):
    """Quantize MatMul/Gemm weights (and activations where asked) as the QAT config's
    ``quantization:`` section says.

    Assumes: a valid module, ``fold-constants`` already run (weights are constants read as a
    matmul's ``b``), ``ctx.config.quantization`` set.  Guarantees: a valid module; see the module
    docstring for the IR it produces; ``ctx.notes["quantization"]`` holds the per-layer report.
    """

    name: ClassVar[str] = "quantize-weights"

    def apply(self, module: Module, ctx: PassContext) -> Module:
        quant = getattr(ctx.config, "quantization", None)
        if quant is None:
            raise PassError(
                "quantize-weights: the QAT config has no quantization: section saying how to quantize"
            )
        calib = ctx.notes.get("calibration")
        kept = None  # the dtype a layer left in float is stored in: the build's
        if ctx.config is not None:
            from mcpc.ir.dtypes import dtype_from_name
            from mcpc.qat_configs.schema import built_precision

            kept = dtype_from_name(built_precision(ctx.config))
        measure = bool(ctx.notes.get("measure_sensitivity"))
        report: dict[str, Any] = {
            "calibration": None if calib is None else {"source": calib.source, "samples": calib.samples},
            "functions": {},
        }
        for func in module.functions.values():
            data = calib if calib is not None and len(module.functions) == 1 else None
            report["functions"][func.name], detail = quantize_function(func, quant, data, measure, kept)
            ctx.notes.setdefault("quantized_arrays", {})[func.name] = detail
        ctx.notes["quantization"] = report
        return module
