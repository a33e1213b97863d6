"""Per-layer sensitivity: the model output error with one layer alone quantized, measured on
calibration data with the reference interpreter (``mcpc quant report``, and the INT6 / INT8 / float
choice of a config's ``sensitivity:`` section).
"""

from __future__ import annotations

import numpy as np

from mcpc.passes.calibration import run_collecting
from mcpc.passes.quantize_weights import _kn, collect_inputs, layer_settings
from mcpc.passes.weight_quantizer import quantize_weight, resolve_algorithm


def measure_sensitivity(func, layers, quant, calib, metric: str, probe_bits: int | None) -> dict[str, float]:
    """Per layer: the model output error with that layer alone quantized (at ``probe_bits``, else
    at its configured settings), over ``calib``.  Layers an override keeps are not measured."""
    envs: list[dict] = [{} for _ in calib.batches]  # every value of the float runs, to resume from
    refs = [
        run_collecting(func, b, fast_matmul=True, keep=e) for b, e in zip(calib.batches, envs, strict=True)
    ]
    first_use = {}
    for j, op in enumerate(func.ops):
        for v in op.operands:
            first_use.setdefault(id(v), j)
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
        key = id(layer.const.result)
        for batch, ref, env in zip(calib.batches, refs, envs, strict=True):
            # the ops before the weight's first use compute what the float run did: resume there
            got = run_collecting(
                func, batch, fast_matmul=True, start=first_use[key], env={**env, key: replaced}
            )
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
