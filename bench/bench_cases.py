"""What the benchmark measures: the bundled example models at two sizes and synthetic roofline probes.

A ``Case`` is one ONNX model with fixed inputs.  Model cases are the same for every target and
build (f32 models: the fp16 build converts them inside the compiler, as a user's export would be).
Probe cases are sized for the target (square matmuls at multiples of its systolic array) and
written in the build's activation dtype, so that they measure the kernel itself and not the
boundary casts an f32 model would add to an fp16 build.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from mcpc import examples
from mcpc.errors import InputError

_ELEM = {"f32": (TensorProto.FLOAT, np.float32), "f16": (TensorProto.FLOAT16, np.float16)}


@dataclass(frozen=True)
class Case:
    """One benchmark case.  ``build(seed)`` returns ``(model, inputs)``; ``dims`` binds symbolic dims.

    ``kind`` is ``model`` or ``probe``; ``size`` is a short human label (``h256 s64``).
    """

    name: str
    kind: str
    size: str
    build: Callable[[int], tuple[onnx.ModelProto, dict[str, np.ndarray]]] = field(repr=False)
    dims: dict[str, int] | None = None


def _normal(rng: np.random.Generator, shape, dtype=np.float32) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


def _mlp(batch: int, d_in: int, d_hidden: int, d_out: int) -> Callable:
    def build(seed: int):
        rng = np.random.default_rng(seed + 1)
        model = examples.mlp(batch=batch, d_in=d_in, d_hidden=d_hidden, d_out=d_out, seed=seed)
        return model, {"x": _normal(rng, (batch, d_in))}

    return build


def _encoder(hidden: int, heads: int, seq: int) -> Callable:
    def build(seed: int):
        rng = np.random.default_rng(seed + 1)
        model = examples.encoder_block(hidden=hidden, heads=heads, seq=seq, seed=seed)
        return model, {"x": _normal(rng, (1, seq, hidden)), "mask": examples.causal_mask(seq)}

    return build


def _decoder(hidden: int, heads: int, seq: int) -> Callable:
    def build(seed: int):
        rng = np.random.default_rng(seed + 1)
        model = examples.decoder_block(hidden=hidden, heads=heads, seed=seed)
        return model, {"x": _normal(rng, (1, seq, hidden))}

    return build


def model_cases(quick: bool = False) -> list[Case]:
    """The bundled examples (``mcpc.examples``): the default sizes, and a larger size unless ``quick``."""
    cases = [
        Case("mlp", "model", "4x256-1024-256", _mlp(4, 256, 1024, 256)),
        Case("encoder_block", "model", "h256 heads4 s64", _encoder(256, 4, 64)),
        Case("decoder_block", "model", "h256 heads4 s32", _decoder(256, 4, 32), {"seq": 32}),
    ]
    if not quick:
        cases += [
            Case("mlp", "model", "64x1024-4096-1024", _mlp(64, 1024, 4096, 1024)),
            Case("encoder_block", "model", "h512 heads8 s128", _encoder(512, 8, 128)),
            Case("decoder_block", "model", "h512 heads8 s128", _decoder(512, 8, 128), {"seq": 128}),
        ]
    return cases


def _graph_model(nodes, name: str, inputs, outputs, inits=()) -> onnx.ModelProto:
    model = helper.make_model(
        helper.make_graph(nodes, name, inputs, outputs, list(inits)),
        opset_imports=[helper.make_opsetid("", 17)],
        producer_name="mcpc.bench",
    )
    model.ir_version = 8  # loadable by ONNX Runtime releases that lag onnx
    return model


def matmul_probe(m: int, k: int, n: int, dtype: str) -> Callable:
    """``y = a @ w`` with ``w`` a [k, n] constant (the weight stream) and ``a`` an [m, k] input."""
    elem, np_dt = _ELEM[dtype]

    def build(seed: int):
        rng = np.random.default_rng(seed)
        w = numpy_helper.from_array((rng.standard_normal((k, n)) / math.sqrt(k)).astype(np_dt), "w")
        node = helper.make_node("MatMul", ["a", "w"], ["y"], name="matmul")
        a_info = helper.make_tensor_value_info("a", elem, [m, k])
        y_info = helper.make_tensor_value_info("y", elem, [m, n])
        model = _graph_model([node], "matmul_probe", [a_info], [y_info], [w])
        return model, {"a": _normal(rng, (m, k), np_dt)}

    return build


def add_probe(rows: int, cols: int, dtype: str) -> Callable:
    """``y = a + b`` on two [rows, cols] inputs: pure DRAM streaming."""
    elem, np_dt = _ELEM[dtype]

    def build(seed: int):
        rng = np.random.default_rng(seed)
        info = lambda n: helper.make_tensor_value_info(n, elem, [rows, cols])  # noqa: E731
        node = helper.make_node("Add", ["a", "b"], ["y"], name="add")
        model = _graph_model([node], "add_probe", [info("a"), info("b")], [info("y")])
        return model, {n: _normal(rng, (rows, cols), np_dt) for n in "ab"}

    return build


def square_size(target, at_least: int) -> int:
    """The smallest multiple of lcm(array_rows, array_cols) that is ≥ ``at_least``: every tile full."""
    step = math.lcm(target.mac.array_rows, target.mac.array_cols)
    return step * max(1, math.ceil(at_least / step))


def probe_cases(target, dtype: str, quick: bool = False) -> list[Case]:
    """Roofline probes for ``target`` in ``dtype`` (``f32`` or ``f16``).

    * a square matmul (compute roof) at an array multiple ≥ 2048 (≥ 512 with ``quick``);
    * a one-row matmul (M = 1) streaming a K × N weight (DRAM roof in f16; compute-bound in f32 on
      targets whose f32 MAC rate is below the bytes it would need);
    * a large elementwise add (DRAM roof).
    """
    n = square_size(target, 512 if quick else 2048)
    k, nn = (1024, 2048) if quick else (4096, 8192)
    rows, cols = (512, 1024) if quick else (2048, 4096)
    return [
        Case("square_matmul", "probe", f"{n}x{n}x{n} {dtype}", matmul_probe(n, n, n, dtype)),
        Case("matvec", "probe", f"1x{k}x{nn} {dtype}", matmul_probe(1, k, nn, dtype)),
        Case("elementwise_add", "probe", f"{rows}x{cols} {dtype}", add_probe(rows, cols, dtype)),
    ]


# -- simulator speed against ONNX Runtime -------------------------------------------------------
SIM_SPEED_TARGET = "mcp2026-a100"
_REAL_MODELS = Path(__file__).resolve().parent.parent / "tests" / "real_models"


def load_minilm(needed_by: str) -> tuple[onnx.ModelProto, Callable]:
    """The real MiniLM-L3 export (the ``models`` extra) and ``realistic_inputs(model, batch, seq,
    seed)`` of tests/real_models; InputError naming ``needed_by`` when the export is missing."""
    sys.path.insert(0, str(_REAL_MODELS))
    try:
        from real_model import MINILM, realistic_inputs
    finally:
        sys.path.remove(str(_REAL_MODELS))
    try:
        path = MINILM.path()
    except LookupError as e:
        raise InputError(f"{needed_by} needs the real MiniLM export: {e}") from None
    return onnx.load(str(path)), realistic_inputs


def _minilm(batch: int, seq: int) -> Callable:
    def build(seed: int):
        model, realistic_inputs = load_minilm("the minilm_l3 case")
        return model, realistic_inputs(model, batch, seq, seed)

    return build


def _minilm_dims(batch: int, seq: int) -> dict[str, int]:
    # the shipped export's symbolic dims (tests/real_models/real_model.dim_bindings reads the same)
    return {"batch_size": batch, "sequence_length": seq}


def _decoder_step(layers: int, context: int) -> Callable:
    def build(seed: int):
        from decoder_step import decoder_step

        return decoder_step(layers=layers, context=context, seed=seed)

    return build


def sim_speed_cases(quick: bool = False) -> list[Case]:
    """Models the simulator's speed is compared on (functional and timing-only runs against ONNX
    Runtime): MiniLM-L3 (the real export) at batch 1 and 8, sequence 128, and a decoder step of
    SmolLM2-135M's shape at context 256 (``decoder_step.py``).  ``quick``: MiniLM batch 1 and a
    4-layer decoder step."""
    cases = [Case("minilm_l3", "sim_speed", "b1 s128", _minilm(1, 128), _minilm_dims(1, 128))]
    if not quick:
        cases.append(Case("minilm_l3", "sim_speed", "b8 s128", _minilm(8, 128), _minilm_dims(8, 128)))
    layers = 4 if quick else 30
    cases.append(
        Case(
            "decoder_step",
            "sim_speed",
            f"SmolLM2-135M shape, {layers} layers, b1 ctx256",
            _decoder_step(layers, 256),
        )
    )
    return cases
