"""One build, measured: compile a model for a target with a QAT config, simulate it, compare it with
ONNX Runtime, and return every figure as one JSON-ready row.  ``mcpc ci`` and ``mcpc sweep`` are
built on ``measure_build``; neither computes a figure of its own.

A row never raises for a build that cannot be made or run: a user-facing error (``McpcError``: a
config needing calibration data it did not get, a model that does not fit, an unsupported op) and
an internal error alike become ``status: "error"`` with the ``reason`` and the ``exit_code`` the CLI
would have given, so a grid of builds always completes.  What a row holds:

* ``metrics``: ``cycles``, ``latency_us``, ``peak_memory_bytes`` (NPU DRAM the program occupies:
  weights, I/O and activations as planned), ``mcpb_bytes`` (the encoded file), ``weight_bytes``,
  ``instructions``, ``macs``, ``dram_bytes``, accuracy against ONNX Runtime over every output
  (``min_cosine``, ``max_norm_err``, ``min_top1`` when an output is logits-like), the build's own
  check verdict ``check_passed``, and the wall times ``compile_s`` and ``sim_s`` (the only figures
  that differ from run to run: ``WALL_TIME_METRICS``);
* ``memory``: DRAM bytes per memory-map region kind; ``outputs``: the per-output comparison;
  ``numeric``: the simulator's NaN/overflow section; ``build``: the compile report (whatever the
  build reports: a quantizing pipeline's own sections travel in it unchanged).

A decoder build (``max_seq`` set: ``mcp-compile --max-seq``, with ``max_batch``, ``kv_blocks``,
``prefill_chunk``) is measured through ``mcpc sim eval-ppl``'s path instead: the ``tokens`` (.npy:
1-D cut into windows of ``window``, or 2-D one window a row) run through ``DecoderSession.eval_ppl``
(a prefill of each window's first ``prefill`` tokens, then one decode step per token), and ONNX
Runtime runs the original graph in its own KV loop on the same windows (``mcpc.ort_decoder``).
Its ``metrics`` are then ``perplexity``, ``ref_perplexity`` (ONNX Runtime fp32),
``ppl_change_pct`` (signed: 100 · (perplexity − ref) / ref), ``cycles`` / ``latency_us`` of the
mean decode step, ``ttft_ms`` (mean prefill of a window), ``tpot_ms``, ``kv_bytes`` (peak KV in
use), ``peak_memory_bytes`` (the program's NPU DRAM with its KV pool), ``mcpb_bytes``,
``weight_bytes``, ``compile_s`` and ``sim_s``; its ``memory`` splits the DRAM into weights / KV /
activations / inputs / outputs as for any program, and ``decoder`` is META["decoder"].
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

WALL_TIME_METRICS = ("compile_s", "sim_s")
DECODER_FIELDS = ("max_seq", "max_batch", "kv_blocks", "prefill_chunk", "tokens", "window", "prefill")


@dataclass(frozen=True)
class BuildSpec:
    """What to build and how to feed it.

    ``model`` is an ONNX path; ``inputs`` ``"random"`` (values drawn from the program's I/O
    bindings with ``seed``) or an ``.npz`` path; ``dims`` binds symbolic dims as ``--dim`` does;
    ``calib`` is calibration data handed to the compiler (for configs that quantize with it);
    ``overrides`` are ``--set key=value`` target overrides.
    """

    name: str
    model: str
    target: str = "mcp2026-a100"
    qat_config: str = "fp16"
    dims: dict[str, int] = field(default_factory=dict)
    inputs: str = "random"
    seed: int = 0
    calib: str | None = None
    overrides: tuple[str, ...] = ()
    # a decoder build (module doc): its sizes and the token windows its perplexity is measured on
    max_seq: int | None = None
    max_batch: int | None = None
    kv_blocks: int | None = None
    prefill_chunk: int | None = None
    tokens: str | None = None
    window: int | None = None
    prefill: int | None = None

    def key(self) -> str:
        """A digest of everything that determines the build's result: the spec itself plus the
        contents of the files it names (model, inputs, calibration data, tokens, a config or target
        given as a path), so a resumed sweep redoes a build whose files changed.  Decoder fields
        left unset are not part of it (the keys of other builds stay as they were)."""
        spec = {k: v for k, v in asdict(self).items() if not (k in DECODER_FIELDS and v is None)}
        h = hashlib.sha256(json.dumps(spec, sort_keys=True).encode())
        for ref in (self.model, self.inputs, self.calib, self.tokens, self.qat_config, self.target):
            if ref and Path(ref).is_file():
                stat = Path(ref).stat()
                h.update(_file_digest(str(Path(ref).resolve()), stat.st_size, stat.st_mtime_ns).encode())
        return h.hexdigest()[:16]


@functools.lru_cache(maxsize=64)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    """SHA-256 of a whole file (a model edited in place may keep its size), computed once per
    (path, size, modification time): a sweep asks for the key of each build several times."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


BUILD_BLAS_THREADS = 1


def measure_build(spec: BuildSpec) -> dict[str, Any]:
    """The row of ``spec`` (see the module doc); never raises for a build that fails.

    The build runs with ``BUILD_BLAS_THREADS`` BLAS threads wherever it runs (this process, a pool
    worker, a Ray task): a calibrated quantizer's linear algebra rounds differently with another
    thread count, and a row must not depend on where it was measured.
    """
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=BUILD_BLAS_THREADS, user_api="blas"):
        return _measure_build(spec)


def _measure_build(spec: BuildSpec) -> dict[str, Any]:
    from mcpc.errors import EXIT_INTERNAL, McpcError

    row: dict[str, Any] = {
        "name": spec.name,
        "key": spec.key(),
        "model": spec.model,
        "target": spec.target,
        "qat_config": spec.qat_config,
        "dims": dict(spec.dims),
        "inputs": spec.inputs,
        "calib": spec.calib,
    }
    if spec.max_seq is not None:
        row["decoder_build"] = {k: getattr(spec, k) for k in DECODER_FIELDS}
    try:
        row.update(_measure_decoder(spec) if spec.max_seq is not None else _measure(spec))
        row["status"] = "ok"
    except McpcError as err:
        row.update(status="error", reason=err.message, exit_code=err.exit_code)
        if err.exit_code == EXIT_INTERNAL:
            row["reason"] = f"internal error: {err.message}"
    except Exception as err:  # a bug of ours must not end a sweep of many builds: it is a row too
        row.update(
            status="error", reason=f"internal error: {type(err).__name__}: {err}", exit_code=EXIT_INTERNAL
        )
    return row


def _compile(spec: BuildSpec):
    from mcpc import driver

    kwargs: dict[str, Any] = {}
    if spec.calib is not None:
        kwargs["calib"] = spec.calib
    if spec.max_seq is not None:
        from mcpc.ir.decoder_import import DecoderBuild

        batch = spec.max_batch or 1
        kwargs["decoder"] = DecoderBuild(spec.max_seq, batch, spec.kv_blocks, spec.prefill_chunk)
    return driver.compile(
        spec.model,
        target=spec.target,
        qat_config=spec.qat_config,
        dims=spec.dims or None,
        overrides=spec.overrides,
        **kwargs,
    )


def _compiled(spec: BuildSpec):
    """The build, the program loaded for the simulator, and the build's metrics (compile seconds,
    .mcpb and weight bytes)."""
    from mcpc.arch.mcpb import program_bytes
    from mcpc.sim.api import from_program

    t0 = time.perf_counter()
    result = _compile(spec)
    compile_s = time.perf_counter() - t0
    loaded = from_program(result.program, source=f"{spec.name}.mcpb")
    sizes = {"mcpb_bytes": len(program_bytes(result.program)), "weight_bytes": len(result.program.constants)}
    return result, loaded, sizes, compile_s


def _row(metrics: dict, prof: dict, result, **extra) -> dict[str, Any]:
    """One measured row: the metrics, the memory per kind of the last run, ``extra`` and the build report."""
    build = {k: v for k, v in result.report.items() if k not in ("pass_times", "output", "mcpc_version")}
    return {"metrics": metrics, "memory": prof["memory"]["bytes_per_kind"], **extra, "build": build}


def _measure(spec: BuildSpec) -> dict[str, Any]:
    from mcpc.check import Tolerances, is_logits, run_onnxruntime, vocabulary_sizes
    from mcpc.errors import InputError
    from mcpc.sim.api import random_inputs, run_program
    from mcpc.sim.numeric import message as numeric_message

    result, loaded, sizes, compile_s = _compiled(spec)
    inputs = _inputs(spec, loaded, random_inputs)
    t1 = time.perf_counter()
    sim = run_program(loaded, inputs)
    sim_s = time.perf_counter() - t1
    ref = run_onnxruntime(spec.model, _as_model_dtypes(spec.model, inputs))
    tol = Tolerances.of_program(loaded.meta)
    vocab = vocabulary_sizes(spec.model)
    outputs = []
    for name, y in sim.outputs.items():
        if name not in ref:
            raise InputError(f"program output '{name}' is not an output of {spec.model}")
        outputs.append(tol.compare(name, y, ref[name], top1=is_logits(name, y.shape, vocab)))
    prof = sim.profile
    top1 = [o.top1 for o in outputs if o.top1 is not None]
    problem = numeric_message(prof.get("numeric") or {})
    metrics = {
        "cycles": prof["cycles"],
        "latency_us": prof["latency_us"],
        "peak_memory_bytes": prof["memory"]["peak_bytes"],
        **sizes,
        "instructions": prof["instructions"],
        "macs": prof["macs"],
        "dram_bytes": prof["dram_read_bytes"] + prof["dram_write_bytes"],
        "min_cosine": min((o.cosine for o in outputs), default=None),
        "max_norm_err": max((o.norm_max_err for o in outputs), default=None),
        "min_top1": min(top1) if top1 else None,
        "check_passed": bool(outputs) and all(o.passed for o in outputs) and not problem,
        "compile_s": compile_s,
        "sim_s": sim_s,
    }
    return _row(
        metrics,
        prof,
        result,
        tolerances={k: v for k, v in asdict(tol).items() if v is not None},
        outputs=[
            {
                "name": o.name,
                "cosine": o.cosine,
                "norm_max_err": o.norm_max_err,
                "top1": o.top1,
                "passed": o.passed,
                "reasons": o.reasons,
            }
            for o in outputs
        ],
        numeric=problem or None,
    )


def _measure_decoder(spec: BuildSpec) -> dict[str, Any]:
    """A decoder build's row: eval-ppl's perplexity in the simulator against ONNX Runtime's (module doc)."""
    import numpy as np

    from mcpc.errors import InputError, UsageError
    from mcpc.ort_decoder import ort_nll, perplexity
    from mcpc.sim.decoder import DecoderSession

    if spec.tokens is None:
        raise UsageError(f"{spec.name}: a decoder build (max_seq) needs tokens to measure perplexity on")
    try:
        tokens = np.load(spec.tokens, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise InputError(f"{spec.tokens}: cannot read the tokens as a .npy file ({exc})") from None
    if tokens.dtype.kind not in "iu":
        raise UsageError(f"{spec.tokens}: the tokens must be integer token ids, not {tokens.dtype}")
    prefill = 16 if spec.prefill is None else spec.prefill
    result, loaded, sizes, compile_s = _compiled(spec)
    dec = DecoderSession(loaded)
    t1 = time.perf_counter()
    ppl = dec.eval_ppl(tokens, spec.window, prefill)
    sim_s = time.perf_counter() - t1
    try:
        ref = perplexity(ort_nll(spec.model, tokens, spec.window, prefill))
    except ValueError as exc:
        raise InputError(f"{spec.model}: ONNX Runtime's reference loop cannot run it ({exc})") from None
    prof = dec.session.last_profile
    metrics = {
        "perplexity": ppl["perplexity"],
        "ref_perplexity": ref,
        "ppl_change_pct": (ppl["perplexity"] - ref) / ref * 100,
        "cycles": ppl["cycles_per_token"],
        "latency_us": ppl["latency_us_per_token"],
        "ttft_ms": ppl["ttft_ms"],
        "tpot_ms": ppl["tpot_ms"],
        "kv_bytes": ppl["kv_bytes"],
        "peak_memory_bytes": prof["memory"]["peak_bytes"],
        **sizes,
        "windows": ppl["windows"],
        "predictions": ppl["predictions"],
        "compile_s": compile_s,
        "sim_s": sim_s,
    }
    return _row(
        metrics,
        prof,
        result,
        decoder=(result.program.meta or {}).get("decoder"),
        numeric=None if np.isfinite(ppl["perplexity"]) else f"simulated perplexity {ppl['perplexity']}",
    )


def _inputs(spec: BuildSpec, loaded, random_inputs) -> dict:
    if spec.inputs == "random":
        return random_inputs(loaded, "main", spec.seed)
    from mcpc.fileio import read_npz

    return read_npz(Path(spec.inputs))


def _as_model_dtypes(model_path: str, inputs: dict) -> dict:
    """The simulator's inputs in the dtypes the ONNX graph declares (an f16 binding drawn at random
    widens exactly to the model's float32; integer ids to its int64)."""
    import numpy as np
    import onnx
    from onnx import helper

    model = onnx.load(model_path, load_external_data=False)
    out = dict(inputs)
    for vi in model.graph.input:
        if vi.name in out:
            dtype = helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
            out[vi.name] = np.asarray(out[vi.name]).astype(dtype)
    return out
