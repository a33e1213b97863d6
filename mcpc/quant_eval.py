"""What quantization cost: one accuracy table for our builds and ONNX Runtime's 4-bit quantizer.

For a model, a set of evaluation inputs (``.npz``, batch axis leading: one row per sentence) and
some QAT configs, ``evaluate`` measures in one run:

* ONNX Runtime fp32 on the original model: the reference;
* each config compiled by mcpc (``mcp-compile --qat-config C [--calib F]`` in-process, every row
  of the evaluation set in one batch) and run on the **simulator** (the ``.mcpb`` itself) — or,
  while the backend cannot lower an op of the build yet, the compiled IR on the reference
  interpreter, which defines the simulator's results bit for bit (the row says which ran);
* ONNX Runtime's ``MatMulNBitsQuantizer`` (RTN, 4 bits, block 32, symmetric and asymmetric,
  ``accuracy_level`` 0) run by ONNX Runtime with ``session.qdq_matmulnbits_accuracy_level`` = 0:
  the peer;

and for each row: the per-sentence cosine of the watched output (default: the first float output
whose shape is [batch, features], e.g. MiniLM's pooled ``461``) against the reference, averaged
(and its minimum); the error 1 − cosine and its ratio to each peer's error; and bits per weight
over all MatMul/Gemm weights, scales and zero points included (``weight_bits``).

Our bits per weight come from the compiled IR: every matmul-like op (``mcp.*matmul*``/``gemm``)
that reads a value computed from constants alone has a weight of K × N elements (K the other
operand's last dim, N the result's), stored in the bytes of the distinct constants that value is
computed from (packed int4 counts half a byte, a scale its own dtype), so a dequantize op feeding
the matmul or a fused ``matmul_w4a16`` are counted alike.  ONNX Runtime's come from the ONNX
graph: a MatMul/Gemm initializer weight (directly or through Transpose) in its own dtype, a
``MatMulNBits`` as its packed weight, scales and zero points over K × N.
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mcpc.errors import InputError, UsageError

ORT_BLOCK = 32
PEERS = {"ort-rtn-sym": True, "ort-rtn-asym": False}  # name -> symmetric
MATMUL_ONNX = ("MatMul", "Gemm")


@dataclass
class EvalRow:
    """One build's accuracy and size against the fp32 reference."""

    name: str
    kind: str  # "mcpc" (compiled, simulated) or "onnxruntime" (the peer)
    cosine: float  # per-sentence cosine, averaged
    min_cosine: float
    error: float  # 1 - cosine
    weights: int  # MatMul/Gemm weight elements
    weight_bytes: int  # their storage, scales and zero points included
    bits_per_weight: float
    seconds: float  # quantize (+ compile) wall time
    symmetric: bool | None = None  # the weights' symmetry when the config or peer says
    ratio: dict[str, float] = field(default_factory=dict)  # error / each peer's error
    detail: dict[str, Any] = field(default_factory=dict)


def sentence_cosines(y: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Cosine of each batch row of ``y`` against ``r`` (rows flattened, float64); a row that is zero
    on both sides scores 1, on one side 0."""
    if y.shape != r.shape or y.ndim < 1:
        raise InputError(f"outputs differ in shape: {y.shape} against the reference {r.shape}")
    a = np.asarray(y, np.float64).reshape(y.shape[0], -1)
    b = np.asarray(r, np.float64).reshape(r.shape[0], -1)
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    dot = (a * b).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = dot / (na * nb)
    cos = np.where((na == 0) & (nb == 0), 1.0, np.where((na == 0) | (nb == 0), 0.0, cos))
    return np.where(np.isfinite(cos), cos, 0.0)  # a NaN row is a wrong row


def _initializers(model) -> dict:
    return {t.name: t for t in model.graph.initializer}


def _tensor_bytes(t) -> int:
    from onnx import helper, numpy_helper

    if t.data_type in (22, 21):  # INT4 / UINT4: two per byte
        return -(-int(np.prod(t.dims, dtype=np.int64)) // 2)
    arr = numpy_helper.to_array(t)
    itemsize = helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    return int(arr.size) * itemsize


def onnx_weight_bits(model) -> tuple[int, int]:
    """``(weights, bytes)`` over the MatMul/Gemm weights of an ONNX model: an initializer B (or A)
    read directly or through a Transpose counts numel elements in its dtype; ``MatMulNBits`` counts
    K × N elements stored in its packed weight, scales and zero points (and group index)."""
    inits = _initializers(model)
    transposed = {n.output[0]: n.input[0] for n in model.graph.node if n.op_type == "Transpose"}
    seen: set[str] = set()
    weights = nbytes = 0
    for node in model.graph.node:
        if node.op_type in MATMUL_ONNX:
            for x in node.input[:2]:
                src = transposed.get(x, x)
                if src in inits and src not in seen and len(inits[src].dims) >= 2:
                    seen.add(src)
                    weights += int(np.prod(inits[src].dims, dtype=np.int64))
                    nbytes += _tensor_bytes(inits[src])
        elif node.op_type == "MatMulNBits":
            attrs = {a.name: a.i for a in node.attribute}
            weights += attrs["K"] * attrs["N"]
            for name in node.input[1:5]:  # B, scales, zero_points, g_idx (not the bias)
                if name and name in inits and name not in seen:
                    seen.add(name)
                    nbytes += _tensor_bytes(inits[name])
    return weights, nbytes


def _constant_sources(value, producers: dict, memo: dict) -> frozenset | None:
    """The constant ops a value is computed from, or None when it depends on a non-constant."""
    if value in memo:
        return memo[value]
    memo[value] = None  # cycles cannot occur in valid IR; this just guards recursion
    op = producers.get(value)
    if op is None:  # a function argument
        return None
    if op.name == "mcp.constant":
        memo[value] = frozenset([op])
        return memo[value]
    found: set = set()
    for x in op.operands:
        src = _constant_sources(x, producers, memo)
        if src is None:
            return None
        found |= src
    memo[value] = frozenset(found)
    return memo[value]


def ir_weight_bits(module) -> tuple[int, int]:
    """``(weights, bytes)`` over the weights of the matmul-like ops of a compiled IR module (see the
    module doc); each constant's bytes are counted once however many matmuls read it."""
    weights = nbytes = 0
    counted: set = set()
    for fn in module.functions.values():
        producers = {r: op for op in fn.ops for r in op.results}
        memo: dict = {}
        for op in fn.ops:
            if "matmul" not in op.name and "gemm" not in op.name:
                continue
            sources = [(_constant_sources(x, producers, memo), x) for x in op.operands]
            const = [s for s, _ in sources if s]
            acts = [x for s, x in sources if s is None]
            if not const or not acts:
                continue  # activation x activation (attention), or folded constants
            k = int(acts[0].type.shape[-1])
            n = int(op.results[0].type.shape[-1])
            weights += k * n
            for src in const:
                for c in src:
                    if c not in counted:
                        counted.add(c)
                        nbytes += int(c.results[0].type.nbytes)
    return weights, nbytes


def _ort_session(model, accuracy_level_zero: bool = False):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    if accuracy_level_zero:  # a DequantizeLinear(int4) -> MatMul pair must not run on int8 activations
        opts.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    data = model if isinstance(model, (str, Path)) else model.SerializeToString()
    return ort.InferenceSession(str(data) if isinstance(data, Path) else data, opts,
                                providers=["CPUExecutionProvider"])  # fmt: skip


def run_ort(model, inputs: dict[str, np.ndarray], output: str, accuracy_level_zero: bool = False):
    """``output`` of ONNX Runtime (CPU, graph optimizations off) on ``model`` (path or ModelProto)."""
    sess = _ort_session(model, accuracy_level_zero)
    names = [i.name for i in sess.get_inputs()]
    missing = [n for n in names if n not in inputs]
    if missing:
        raise InputError(f"evaluation inputs are missing {', '.join(missing)} (the model needs {names})")
    return sess.run([output], {n: inputs[n] for n in names})[0]


def ort_rtn(model, symmetric: bool, block_size: int = ORT_BLOCK):
    """The model quantized by ONNX Runtime's ``MatMulNBitsQuantizer`` (RTN, 4 bits, ``block_size``,
    ``accuracy_level`` 0, MatMulNBits nodes): ``(ModelProto, seconds)``."""
    import onnx

    try:
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    except ImportError as exc:  # it imports onnx_ir, of the quant extra
        raise UsageError(
            f"ONNX Runtime's MatMulNBitsQuantizer cannot be imported ({exc}): install the quant extra "
            "(`.venv/bin/pip install -e '.[quant]'`)"
        ) from None
    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    if isinstance(model, (str, Path)):
        proto = onnx.load(str(model))
    else:  # the quantizer rewrites the graph it is given: keep the caller's model intact
        proto = onnx.ModelProto()
        proto.CopyFrom(model)
    start = time.perf_counter()
    q = MatMulNBitsQuantizer(proto, bits=4, block_size=block_size, is_symmetric=symmetric, accuracy_level=0)
    q.process()
    seconds = time.perf_counter() - start
    out = q.model.model if hasattr(q.model, "model") else q.model
    return out, seconds


def default_output(model) -> str:
    """The first float graph output of rank 2 ([batch, features]: a pooled embedding, logits of a
    classifier), else the first float output."""
    from onnx import TensorProto

    floats = [o for o in model.graph.output if o.type.tensor_type.elem_type == TensorProto.FLOAT]
    if not floats:
        raise InputError("the model has no float output to score")
    ranked = [o for o in floats if len(o.type.tensor_type.shape.dim) == 2]
    return (ranked or floats)[0].name


def config_symmetric(config) -> bool | None:
    """``quantization.weights.symmetric`` of a QAT config (None when it has no such key)."""
    weights = getattr(getattr(config, "quantization", None), "weights", None)
    if weights is not None and getattr(weights, "symmetric", None) is not None:
        return bool(weights.symmetric)
    import yaml

    source = getattr(config, "source", None)
    if not source or not Path(source).is_file():
        return None
    data = yaml.safe_load(Path(source).read_text(encoding="utf-8")) or {}
    weights = ((data.get("quantization") or {}).get("weights")) or {}
    sym = weights.get("symmetric")
    return bool(sym) if sym is not None else None


def compile_and_run(model_path, config, inputs, calib=None, target="mcp2026-a100", dims=None, engine="auto"):
    """Compile ``model_path`` with ``config`` (and calibration data ``calib`` when given) for the
    batch of ``inputs`` and run it: ``(outputs, CompileResult | None, compile seconds, engine used,
    report)``.

    ``engine``: ``sim`` runs the ``.mcpb`` on the simulator; ``ir`` runs the compiled IR (after the
    config's passes) on the reference interpreter, which defines what the simulator must compute
    bit for bit; ``auto`` is ``sim``, falling back to ``ir`` when the backend cannot lower an op
    of the build yet (the reason is returned in the report's ``fallback``)."""
    from mcpc import driver
    from mcpc.errors import UnsupportedError
    from mcpc.ir.interpreter import interpret
    from mcpc.sim.api import run_program
    from mcpc.sim.loader import from_program

    if engine not in ("auto", "sim", "ir"):
        raise UsageError(f"engine {engine!r}: expected auto, sim or ir")
    kwargs: dict[str, Any] = {}
    if calib is not None:
        if "calib" not in inspect.signature(driver.compile).parameters:
            raise UsageError("this build of mcpc takes no calibration data (driver.compile has no calib)")
        kwargs["calib"] = calib
    start = time.perf_counter()
    tgt = driver.load_target(target)
    module = driver.load_model(model_path, dims=dims, dram_bytes=tgt.dram.size_bytes)
    info: dict[str, Any] = {}
    result = None
    if engine == "ir":
        result = driver.compile(module, tgt, config, emit="ir", **kwargs)
    else:
        try:
            result = driver.compile(module, tgt, config, **kwargs)  # the passes rewrite ``module`` in place
        except UnsupportedError as exc:
            if engine == "sim" or not exc.message.startswith("backend:"):
                raise
            info["fallback"] = exc.message
    seconds = time.perf_counter() - start
    if result is not None and result.program is not None:
        source = f"{Path(model_path).name} [{result.report['qat_config']}]"
        outs = run_program(from_program(result.program, source), inputs).outputs
        return outs, result, seconds, "simulator", info
    info["module"] = module  # after the config's passes
    return interpret(module, inputs), result, seconds, "interpreter", info


def _dims(model, inputs: dict[str, np.ndarray]) -> dict[str, int]:
    """Symbolic dims of the model's inputs bound to the evaluation arrays' sizes."""
    dims: dict[str, int] = {}
    for vi in model.graph.input:
        if vi.name not in inputs:
            continue
        for axis, d in enumerate(vi.type.tensor_type.shape.dim):
            if d.dim_param:
                dims[d.dim_param] = int(inputs[vi.name].shape[axis])
    return dims


@dataclass(frozen=True)
class Build:
    """One mcpc build to evaluate: a QAT config (name, path or QatConfig) and its calibration data."""

    config: Any
    calib: str | Path | None = None

    def label(self, name: str) -> str:
        return f"{name} +calib" if self.calib is not None else name


def evaluate(
    model_path: str | Path,
    inputs: dict[str, np.ndarray],
    builds: list = (),
    target: str = "mcp2026-a100",
    output: str | None = None,
    peers: tuple[str, ...] = tuple(PEERS),
    engine: str = "auto",
) -> dict[str, Any]:
    """The accuracy table (see the module doc) as a JSON-ready dict: ``rows`` (EvalRow dicts),
    ``output``, ``sentences``, ``target``.  ``builds`` holds ``Build``s (a bare config means no
    calibration data); ``engine`` runs them (``compile_and_run``; each row's ``detail.engine``
    says which ran)."""
    import onnx

    from mcpc import driver

    model = onnx.load(str(model_path))
    output = output or default_output(model)
    inputs = {k: np.asarray(v) for k, v in inputs.items()}
    ref = run_ort(model_path, inputs, output)
    rows: list[EvalRow] = []
    w, b = onnx_weight_bits(model)
    rows.append(EvalRow("onnx fp32", "onnxruntime", 1.0, 1.0, 0.0, w, b, 8 * b / max(w, 1), 0.0))
    for name in peers:
        sym = PEERS[name]
        qmodel, seconds = ort_rtn(model, sym)
        cos = sentence_cosines(run_ort(qmodel, inputs, output, accuracy_level_zero=True), ref)
        w, b = onnx_weight_bits(qmodel)
        rows.append(EvalRow(name, "onnxruntime", float(cos.mean()), float(cos.min()), float(1 - cos.mean()),
                            w, b, 8 * b / max(w, 1), seconds, sym))  # fmt: skip
    dims = _dims(model, inputs)
    for build in builds:
        build = build if isinstance(build, Build) else Build(build)
        cfg = driver.load_qat_config(build.config)
        outs, result, seconds, used, info = compile_and_run(
            model_path, cfg, inputs, build.calib, target, dims, engine
        )
        if output not in outs:
            raise InputError(f"{cfg.name}: the program has no output {output!r} (it has {', '.join(outs)})")
        cos = sentence_cosines(outs[output], ref)
        w, b = ir_weight_bits(info.get("module") or (result.module if result is not None else None))
        report = result.report if result is not None else {}
        passes = {t["pass"]: round(t["seconds"], 4) for t in report.get("pass_times", [])}
        detail = {"pass_seconds": passes, "calib": str(build.calib) if build.calib else None, "engine": used,
                  **{k: v for k, v in info.items() if k != "module"},
                  **{k: report[k] for k in ("weights", "quantization") if k in report}}  # fmt: skip
        name = Path(str(build.config)).stem if isinstance(build.config, (str, Path)) else cfg.name
        rows.append(EvalRow(build.label(name), "mcpc", float(cos.mean()), float(cos.min()),
                            float(1 - cos.mean()), w, b, 8 * b / max(w, 1), seconds, config_symmetric(cfg),
                            detail=detail))  # fmt: skip
    peer_err = {r.name: r.error for r in rows if r.name in PEERS}
    for r in rows:
        if r.kind == "mcpc":
            r.ratio = {p: (r.error / e if e > 0 else float("inf")) for p, e in peer_err.items()}
    return {
        "model": Path(model_path).name,
        "output": output,
        "sentences": int(next(iter(inputs.values())).shape[0]),
        "target": target,
        "rows": [asdict(r) for r in rows],
    }


def peer_of(row: dict, report: dict) -> dict | None:
    """The ONNX Runtime RTN row of the same symmetry as ``row`` (None when unknown or not run)."""
    if row.get("symmetric") is None:
        return None
    name = "ort-rtn-sym" if row["symmetric"] else "ort-rtn-asym"
    return next((r for r in report["rows"] if r["name"] == name), None)


def render(report: dict) -> str:
    """The report as a Markdown table."""
    lines = [
        f"{report['model']}: per-sentence cosine of `{report['output']}` against ONNX Runtime fp32, "
        f"{report['sentences']} sentences, target {report['target']}"
        + " (`+calib`: built with calibration data)",
        "",
        "| build | run by | cosine (mean) | min | error 1−cos | error / ORT RTN sym | error / ORT RTN asym "
        "| bits/weight | weight MB | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        ratios = [f"{r['ratio'][p]:.2f}" if p in r["ratio"] else "-" for p in PEERS]
        by = r["detail"].get("engine", "onnxruntime")
        lines.append(
            f"| {r['name']} | {by} | {r['cosine']:.5f} | {r['min_cosine']:.5f} | {r['error']:.2e} | "
            + " | ".join(ratios)
            + f" | {r['bits_per_weight']:.3f} | {r['weight_bytes'] / 1e6:.2f} | {r['seconds']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mcpc.quant_eval", description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--eval", dest="eval_npz", type=Path, required=True, help="evaluation inputs (.npz)")
    ap.add_argument("--config", action="append", default=[], help="QAT config to build (repeatable)")
    ap.add_argument("--calib", type=Path, help="calibration data for the builds (.npz or directory)")
    ap.add_argument("--also-uncalibrated", action="store_true", help="with --calib, also build each without")
    ap.add_argument("--target", default="mcp2026-a100")
    ap.add_argument("--output", help="output to score (default: the first [batch, features] float output)")
    ap.add_argument("--engine", choices=("auto", "sim", "ir"), default="auto",
                    help="sim: the .mcpb on the simulator; ir: the compiled IR on the interpreter; "
                    "auto: sim, else ir when the backend cannot lower the build yet")  # fmt: skip
    ap.add_argument("--json", dest="json_path", type=Path, help="write the report as JSON")
    args = ap.parse_args(argv)
    from mcpc.fileio import read_npz

    builds = [Build(c, args.calib) for c in args.config]
    if args.calib is not None and args.also_uncalibrated:
        builds += [Build(c) for c in args.config]
    inputs = read_npz(args.eval_npz)
    report = evaluate(args.model, inputs, builds, args.target, args.output, engine=args.engine)
    print(render(report))
    if args.json_path:
        from mcpc.fileio import write_atomic

        write_atomic(args.json_path, json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
