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
* a ``mcp.gather`` of a tied embedding (the table the LM head reads transposed) reads the same
  ``mcp.dequantize`` of the table: the table is stored once, quantized (the backend's
  ``fuse-dequantize-matmul`` rewrites ``gather(dequantize(table))`` of a row-blocked table into the
  dequantize of the gathered rows, so a run dequantizes only the rows it reads);
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

from mcpc.errors import InputError, PassError, UnsupportedError
from mcpc.ir.core import Function, Module, Operation, Value
from mcpc.ir.ops import (
    AddOp,
    CastOp,
    ConstantOp,
    DequantizeOp,
    DivOp,
    GatherOp,
    MatMulOp,
    MulOp,
    QuantizeOp,
    ReshapeOp,
    SliceOp,
    SubOp,
    TransposeOp,
)
from mcpc.passes.calibration import CalibrationData, run_collecting
from mcpc.passes.manager import Pass, PassContext, register_pass
from mcpc.passes.weight_quantizer import QuantResult, _algos, quantize_weight, resolve_algorithm

F32 = np.float32


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
    lm_head: bool = False

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
    found = list(layers.values())
    for layer in lm_head_layers(func, found):
        layer.lm_head = True
    return found


# ops a logits tensor may pass through between the LM head and a model output: layout changes,
# dtype casts, slices/gathers picking positions, and elementwise ops with a constant (a bias, a
# logit scale)
_LAYOUT_OPS = (ReshapeOp, TransposeOp, CastOp, SliceOp, GatherOp)
_CONST_ELEMENTWISE = (AddOp, SubOp, MulOp, DivOp)


def _reaches_output(func: Function, value: Value) -> bool:
    """Whether ``value`` is a result of ``func`` or reaches one through layout ops only."""
    outputs = {id(v) for v in func.outputs}
    users: dict[int, list[Operation]] = {}
    for op in func.ops:
        for v in op.operands:
            users.setdefault(id(v), []).append(op)
    todo, seen = [value], set()
    while todo:
        v = todo.pop()
        if id(v) in outputs:
            return True
        if id(v) in seen:
            continue
        seen.add(id(v))
        for op in users.get(id(v), []):
            if isinstance(op, GatherOp) and op.operands[0] is not v:
                continue
            if isinstance(op, _CONST_ELEMENTWISE):
                if not all(o is v or isinstance(o.owner, ConstantOp) for o in op.operands):
                    continue
            elif not isinstance(op, _LAYOUT_OPS):
                continue
            todo.extend(op.results)
    return False


def lm_head_layers(func: Function, layers: list[Layer]) -> list[Layer]:
    """The layers that are an LM head, by graph structure: a weight tied to an embedding (a
    constant table that a Gather also reads), or a matmul producing logits over the vocabulary —
    its output width is the row count of the largest constant table a Gather reads (the token
    embedding) and its result is a model output, directly or through layout ops (reshapes,
    transposes, casts, slices and gathers of positions, elementwise ops with a constant).  An
    encoder (MiniLM, BERT) has none: no matmul there projects onto the vocabulary."""
    rows = [
        op.operands[0].type.shape[0]
        for op in func.ops
        if isinstance(op, GatherOp)
        and isinstance(op.operands[0].owner, ConstantOp)
        and op.operands[0].type.rank == 2
        and op.operands[0].type.dtype.is_float
    ]
    vocab = max(rows, default=None)
    heads = []
    for layer in layers:
        if layer.gathers or (
            vocab is not None
            and layer.kn[1] == vocab
            and any(_reaches_output(func, m.result) for m in layer.matmuls)
        ):
            heads.append(layer)
    return heads


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
    ``bits`` from sensitivity when given (0 = keep), then ``lm_head`` for an LM head (kept by
    default), then every matching override in order."""
    settings = quant.weights
    keep = bits == 0
    if bits:
        settings = settings.model_copy(update={"bits": bits})
    head = getattr(quant, "lm_head", None)
    if layer.lm_head and head is not None:
        keep = keep or head.keep
        settings = head.apply(settings)
    for o in quant.overrides:
        if any(fnmatch.fnmatchcase(n, o.pattern) for n in layer.names()):
            keep = keep or o.keep
            settings = o.apply(settings)
            if o.bits is not None or o.keep:
                keep = o.keep
    return None if keep else settings


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
        from mcpc.passes.sensitivity import measure_sensitivity

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
        run_collecting(func, batch, watch={k: watcher(k) for k in readers}, fast_matmul=True)
    return stats


def _stats_of(layers: list[Layer], stats: dict, source: str) -> list:
    """Per layer the ``InputStats`` collected outside the interpreter (a decoder build's
    calibration, keyed by matmul loc); a layer none of whose matmuls has them is an InputError."""
    out = []
    for layer in layers:
        found = next((stats[m.loc] for m in layer.matmuls if m.loc in stats), None)
        if found is None:
            raise InputError(
                f"quantize-weights: layer {layer.name!r} (weight {layer.weight_name!r}) has no "
                f"calibration statistics from {source}: no node of the original graph computes its input"
            )
        out.append(found)
    return out


def quantize_function(
    func: Function,
    quant,
    calib: CalibrationData | None,
    measure: bool = False,
    float_dtype=None,
    stats=None,
):
    """Quantize ``func`` in place per ``quant`` (a ``Quantization``); return its report (JSON-ready)
    and the arrays behind it (per quantized layer its ``Layer``, ``QuantResult`` and float weight;
    per matmul name the activation (scale, zero point)) for ``mcpc export-onnx``.  ``stats`` (a
    ``DecoderCalibration``) gives the layers' input statistics instead of ``calib``."""
    plan = plan_function(func, quant, calib, measure)
    have_data = calib is not None or stats is not None
    algos_needed = {resolve_algorithm(s, have_data) for s in plan.settings if s is not None}
    observers: dict[int, Any] = {}
    for m in plan.act_matmuls:
        observers.setdefault(id(m.operands[0]), _observer(quant.calibration))
    xs = None
    if stats is not None:
        if observers:
            raise UnsupportedError(
                "quantize-weights: activation quantization (quantization.activations.where) in a "
                "decoder build (--max-seq) is not implemented: its calibration collects the weights' "
                "input statistics only"
            )
        quantized = [layer for layer, s in zip(plan.layers, plan.settings, strict=True) if s is not None]
        found = dict(zip(map(id, quantized), _stats_of(quantized, stats.stats, stats.source), strict=True))
        xs = [found.get(id(layer)) for layer in plan.layers]
    elif calib is not None and (algos_needed & {"awq", "gptq"} or observers):
        xs = collect_inputs(func, plan.layers, calib, observers)
    rows, new_for_const, deq_of, details = [], {}, {}, []
    for i, (layer, settings) in enumerate(zip(plan.layers, plan.settings, strict=True)):
        row = {
            "layer": layer.name,
            "weight": layer.weight_name,
            "shape": list(layer.kn),
            "params": int(np.prod(layer.kn)),
            "tied_gathers": len(layer.gathers),
            "lm_head": layer.lm_head,
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
        if resolve_algorithm(settings, have_data) in ("awq", "gptq"):
            x = xs[i]
            if x.rows == 0:
                source = calib.source if calib is not None else stats.source
                raise InputError(
                    f"quantize-weights: layer {layer.name!r} (weight {layer.weight_name!r}) saw no "
                    f"calibration rows: its input is empty for every batch of {source}; "
                    "give calibration data that reaches it, or select a data-free algorithm (rtn or "
                    "mse) for it under quantization.overrides"
                )
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
    """``gather(table, ids)`` of a quantized tied table reads the table's dequantize: the codes are
    stored once.  (The backend's ``fuse-dequantize-matmul`` turns ``gather(dequantize(rows))`` of a
    row-blocked table into the dequantize of the gathered rows, so only they are dequantized.)"""
    deq, _q, _layer = entry
    new = GatherOp([deq, op.operands[1]], dict(op.attrs), loc=op.loc)
    rename[id(op.result)] = new.result
    return [new]


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
        stats = ctx.notes.get("calibration_stats")  # a decoder build's (passes/decoder_calib.py)
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
        if stats is not None:
            if quant.sensitivity is not None or measure:
                raise UnsupportedError(
                    "quantize-weights: sensitivity (quantization.sensitivity) in a decoder build "
                    "(--max-seq) is not implemented: its calibration collects input statistics only"
                )
            report["calibration"] = {"source": stats.source, "samples": stats.samples, "tokens": stats.tokens}
        if calib is not None and len(module.functions) > 1:
            raise UnsupportedError(
                f"quantize-weights: calibration of a module with several functions "
                f"({', '.join('@' + f for f in module.functions)}) is not implemented yet; quantize "
                "without calibration data (algorithm rtn or mse) or calibrate a single-function build"
            )
        for func in module.functions.values():
            data = calib
            report["functions"][func.name], detail = quantize_function(
                func, quant, data, measure, kept, stats
            )
            ctx.notes.setdefault("quantized_arrays", {})[func.name] = detail
        ctx.notes["quantization"] = report
        return module
