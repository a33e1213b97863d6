"""The Python API and the wiring behind the CLI: config + target + import + passes + backend + output.

No logic of its own: each step is a call into the layer that owns it.  Guarantees for every entry
point here: errors are ``mcpc.errors`` classes (with their exit codes); an output file is either
written completely (temp file + ``os.replace``) or not touched.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from mcpc import __version__
from mcpc.errors import ConfigError, InputError, UnsupportedError, UsageError, VerifyError
from mcpc.fileio import write_atomic

DEFAULT_TARGET = "mcp2026-a100"
DEFAULT_QAT_CONFIG = "fp16.yaml"
EMIT_SUFFIX = {"mcpb": ".mcpb", "asm": ".s", "ir": ".mcpir"}


@dataclass
class CompileResult:
    """What ``compile`` produced.

    ``module`` is the IR after the pipeline; ``program`` the ``mcpc.arch.mcpb.Program`` (None for
    ``emit="ir"``); ``text`` the IR or assembly text for text emits (None for ``mcpb``);
    ``output`` the file written (None when nothing was written); ``report`` a JSON-ready dict.
    """

    module: Any
    program: Any
    text: str | None
    output: Path | None
    report: dict[str, Any]
    pass_manager: Any = field(repr=False, default=None)
    notes: dict[str, Any] = field(repr=False, default_factory=dict)


def default_output(model_path: str | Path, emit: str) -> Path:
    """``MODEL`` with the emit's suffix (``.mcpb``, ``.s``, ``.mcpir``), next to the model."""
    return Path(model_path).with_suffix(_emit_suffix(emit))


def _emit_suffix(emit: str) -> str:
    if emit not in EMIT_SUFFIX:
        raise UsageError(f"unknown emit kind {emit!r} (expected one of {', '.join(EMIT_SUFFIX)})")
    return EMIT_SUFFIX[emit]


def load_model(path: str | Path, shapes: dict | None = None, dims: dict | None = None, dram_bytes=None):
    """Import an ONNX file into an MCP IR ``Module``, binding symbolic dims (a ``.mcpir`` file is
    parsed as MCP IR text instead: ParseError/VerifyError, exit 3; ``shapes``/``dims`` unused).

    ``shapes`` maps an input name to its full shape (``{"input_ids": (1, 128)}``), ``dims`` a
    symbolic dim name to a size everywhere (``{"seq": 128}``).  Raises InputError for a missing
    or malformed file or unbound dims, UsageError for a bad binding, UnsupportedError listing every
    unsupported node at once (grouped by op type, opset and reason); with ``dram_bytes`` (a
    target's DRAM), DoesNotFit for inputs larger than it.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such model file")
    if path.suffix == ".mcpir":  # MCP IR text (e.g. a program with state, docs/ir.md)
        from mcpc.ir import parse_module

        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"{path}: cannot read: {exc}") from None
        try:
            return parse_module(text, str(path))
        except VerifyError as exc:  # the user's IR, not one of our passes: bad input, exit 3
            raise InputError(f"{path}: invalid IR: {exc.message}") from None
    from mcpc.ir.onnx_import import import_onnx

    return import_onnx(str(path), shapes, dims, dram_bytes=dram_bytes)


def load_qat_config(qat_config):
    """A ``QatConfig`` from a shipped name, a path, or an already loaded config (returned as is)."""
    from mcpc.qat_configs import QatConfig, load_config

    return qat_config if isinstance(qat_config, QatConfig) else load_config(qat_config)


def resolve_passes(qat_config=DEFAULT_QAT_CONFIG, passes: str | None = None) -> list:
    """The effective pipeline: ``passes`` text when given (it replaces the config's), else the config's.

    Unknown passes or options are a UsageError for ``passes`` and a ConfigError naming the config
    file (and its ``pipeline`` key) when they come from the config.
    """
    from mcpc.passes import build_pipeline, load_all_passes

    load_all_passes()
    if passes is not None:
        return build_pipeline(passes)
    config = load_qat_config(qat_config)
    try:
        return build_pipeline(config.pipeline_text())
    except UsageError as exc:
        raise ConfigError(f"{config.source}: pipeline: {exc.message}") from None


def calibration_path(config, calib: str | Path | None) -> Path | None:
    """The calibration data a compile uses: ``calib`` (``--calib``) when given, else the config's
    ``quantization.calibration.data`` (relative to the config file).  A config that needs data
    and has none is refused (UsageError, exit 2) naming the key that needs it; data given to a
    config that does not quantize is refused too (it would be silently ignored)."""
    q = config.quantization
    if calib is None and q is not None and q.calibration.data is not None:
        base = Path(config.source).parent if Path(config.source).is_file() else Path.cwd()
        calib = base / q.calibration.data
    if calib is not None and q is None:
        raise UsageError(
            f"--calib {calib}: config {config.source} does not quantize (no quantization: section), "
            "so calibration data would be ignored"
        )
    need = q.needs_calibration() if q is not None else None
    if need is not None and calib is None:
        raise UsageError(
            f"{config.source}: {need} needs calibration data: give --calib FILE.npz (or a directory of "
            ".npz files; arrays named like the model inputs, the batch axis leading) or set "
            "quantization.calibration.data"
        )
    return Path(calib) if calib is not None else None


def load_target(target=DEFAULT_TARGET, overrides=()):
    """A ``Target`` from a shipped name or path with ``key=value`` overrides, or a Target as is."""
    from mcpc.arch.target import Target
    from mcpc.arch.target import load_target as _load

    if isinstance(target, Target):
        if overrides:
            raise UsageError("overrides need a target name or path, not a Target object")
        return target
    return _load(target, list(overrides))


def _check_output_dir(output: Path) -> None:
    # Checked before any work so a typo in -o fails in milliseconds, not after a long compile.
    if not output.parent.is_dir():
        raise InputError(f"{output}: output directory {str(output.parent)!r} does not exist")


def compile(  # noqa: A001 - the public API name (mcpc.compile) is part of the spec
    model,
    target=DEFAULT_TARGET,
    qat_config=DEFAULT_QAT_CONFIG,
    passes: str | None = None,
    emit: str = "mcpb",
    output: str | Path | None = None,
    shapes: dict | None = None,
    dims: dict | None = None,
    overrides=(),
    *,
    print_ir_after_all: TextIO | None = None,
    time_passes: bool = False,
    calib: str | Path | None = None,
    notes: dict | None = None,
    decoder=None,
) -> CompileResult:
    """Compile ``model`` (an ONNX path or an already imported ``Module``, which is modified in
    place) for ``target`` with ``qat_config``; write ``output`` when given.

    ``passes`` (pipeline text) replaces the config's pipeline.  ``emit`` is ``mcpb``, ``asm`` or
    ``ir``.  ``calib`` (an .npz file or a directory of them) is the calibration data of a
    quantizing config (it replaces the config's ``calibration.data``).  The result's ``report``
    lists the target, config, pipeline, per-pass times, the MatMul/Gemm weight bytes before and
    after the passes (``weights``), what quantization did (``quantization``) and, for programs,
    instruction and constant sizes.

    ``decoder`` (an ``mcpc.ir.decoder_import.DecoderBuild``) makes it a decoder build: ``model``, an
    ONNX graph with past, becomes one module with entries ``prefill`` and ``decode`` over a paged KV
    cache (``docs/decoding.md``), self-checked against ONNX Runtime before and after the pipeline;
    ``shapes`` and ``dims`` are then refused (the build binds every dim).  The report gains
    ``decoder`` (META["decoder"]) and ``decoder_check``.
    """
    from mcpc.passes import PassContext, PassManager, format_pass

    _emit_suffix(emit)
    if isinstance(model, (str, Path)) and not Path(model).is_file():
        raise InputError(f"{model}: no such model file")  # the most basic mistake is reported first
    output = Path(output) if output is not None else None
    if output is not None:
        _check_output_dir(output)
    config = load_qat_config(qat_config)
    from mcpc.qat_configs.kv_cache import check_kv_cache_applies

    check_kv_cache_applies(config, max_seq=None if decoder is None else decoder.max_seq)
    pipeline = resolve_passes(config, passes)
    calib_path = calibration_path(config, calib)
    tgt = load_target(target, overrides)
    built = None
    if decoder is not None:
        built = _import_decoder(model, decoder, shapes, dims, tgt)
        module = built.module
    elif isinstance(model, (str, Path)):
        module = load_model(model, shapes, dims, dram_bytes=tgt.dram.size_bytes)
    else:
        module = model

    from mcpc.passes.weight_stats import weight_stats

    before = weight_stats(module)
    ctx = PassContext(target=tgt, config=config, notes=dict(notes or {}))
    if calib_path is not None and built is not None:  # token windows through the graph with past
        from mcpc.ir.ops import MatMulOp
        from mcpc.passes.decoder_calib import collect_decoder_stats

        locs = {op.loc for op in module.walk() if isinstance(op, MatMulOp) and op.loc}
        ctx.notes["calibration_stats"] = collect_decoder_stats(model, calib_path, locs)
    elif calib_path is not None:
        from mcpc.passes.calibration import load_calibration

        samples = config.quantization.calibration.samples if config.quantization is not None else None
        ctx.notes["calibration"] = load_calibration(calib_path, module.main, samples)
    pm = PassManager(pipeline, print_ir_after_all=print_ir_after_all, time_passes=time_passes)
    module = pm.run(module, ctx)

    decoder_info = None
    if built is not None:
        decoder_info = _check_decoder(built, module, config)
    program, text = None, None
    if emit == "ir":
        from mcpc.ir import print_module

        text = print_module(module)
    else:
        program = _compile_to_program(module, tgt, config, pipeline, model, decoder_info)
        if emit == "asm":
            from mcpc.arch.asm import disassemble

            text = disassemble(program.text, program.debug)
    if output is not None:
        if text is not None:
            write_atomic(output, text)
        else:
            from mcpc.arch.mcpb import write_mcpb

            write_mcpb(output, program)

    report = {
        "mcpc_version": __version__,
        "model": Path(model).name if isinstance(model, (str, Path)) else getattr(model, "name", None),
        "target": tgt.name,
        "target_digest": tgt.digest(),
        "qat_config": config.name,
        "qat_config_source": config.source,
        "pipeline": [format_pass(p) for p in pipeline],
        "pass_times": [
            {"pass": t.pass_text, "seconds": t.seconds, "verify_seconds": t.verify_seconds}
            for t in pm.timings
        ],
        "emit": emit,
        "output": str(output) if output is not None else None,
        "ir_ops": dict(sorted(Counter(op.name for op in module.walk()).items())),
        "weights": {"before": before, "after": weight_stats(module)},
        "quantization": ctx.notes.get("quantization"),
        "import_notes": list(module.attrs.get("import_notes", [])),
    }
    if built is not None:
        report["decoder"] = decoder_info
        report["decoder_check"] = built.checks
    if program is not None:
        from mcpc.backend import compile_report

        report["program"] = compile_report(program)
        if built is not None:  # optimisations refused for the pattern of an export, and their cost
            from mcpc.backend.row_extent import refused_optimisations

            report["refused"] = refused_optimisations(program.meta.get("decoder"))
    return CompileResult(module, program, text, output, report, pm, ctx.notes)


def _import_decoder(model, build, shapes, dims, target):
    """The decoder module of ``model`` (``import_decoder``), self-checked as imported (fp32)."""
    from mcpc.decoder_check import check_rewrite
    from mcpc.ir.decoder_import import import_decoder

    if shapes:
        raise UsageError("--shape is not taken by a --max-seq build: the build binds every input")
    from mcpc.ir.decoder_import import batch_dim_names

    names = ["batch", *(n for n in batch_dim_names(model) if n != "batch")]
    for key in sorted(set(dims or {}) & set(names)):
        if dims[key] != build.max_batch:
            raise UsageError(
                f"--dim {key}={dims[key]} disagrees with the build's --max-batch {build.max_batch}"
            )
    extra = sorted(set(dims or {}) - set(names))
    if extra:
        raise UsageError(
            f"--dim {extra[0]}: a --max-seq build binds the sequence, past and total dims itself; only "
            f"the batch dim is taken: --dim {'=B, --dim '.join(names)}=B (the same as --max-batch B)"
        )
    if not isinstance(model, (str, Path)):
        raise UsageError("a --max-seq build takes the path of an ONNX graph with past")
    built = import_decoder(model, build, dram_bytes=target.dram.size_bytes)
    bound = IMPORTED_CHECK_BOUND.get(built.decoder["kv_dtype"], 1e-4)
    built.checks = [check_rewrite(built, built.module, bound, what="the imported decoder")]
    return built


# The imported decoder's self-check bound (normwise) by the graph's activation dtype: an f32 graph
# is held to 1e-4; an f16 / bf16 graph (e.g. ONNX Runtime GenAI's -p fp16) rounds every op to 11 /
# 8 bits where ONNX Runtime's kernels keep f32 inside (RoPE, norms, attention), ~5e-4 to 3e-3 on the
# builder's fp16 fixture; a broken rewrite is off by O(1).
IMPORTED_CHECK_BOUND = {"f32": 1e-4, "f16": 1e-2, "bf16": 5e-2}


def _check_decoder(built, module, config) -> dict:
    """META["decoder"] of the module after the pipeline (its KV storage dtype), after holding the
    built IR's logits to ONNX Runtime within the build's ``max_norm_err``.  A quantizing config's
    miss is reported (``within_tolerance`` false in the check's record), not refused: its error is
    the quantization's accuracy cost (the single-graph build of the config has it too), while the
    rewrite itself was held to 1e-4 on the imported module."""
    from mcpc.backend.compile import TOLERANCES
    from mcpc.decoder_check import check_rewrite
    from mcpc.errors import CheckFailed

    tol = config.check.tolerances().get("max_norm_err")
    if tol is None:
        tol = TOLERANCES.get(config.name, TOLERANCES["fp32"])["max_norm_err"]
    try:
        record = check_rewrite(built, module, tol, what="the built decoder", per_layer=False)
    except CheckFailed as exc:
        if config.quantization is None:
            raise
        record = check_rewrite(built, module, float("inf"), what="the built decoder", per_layer=False)
        record.update(max_norm_err=tol, within_tolerance=False, note=exc.message)
    built.checks.append(record)
    info = dict(built.decoder)
    info["kv_dtype"] = module.globals["kv_k_0"].type.dtype.name
    from mcpc.qat_configs.kv_cache import kv_settings

    settings = kv_settings(config, info["layers"])  # how the host stores the cache (docs/kv-cache.md)
    info["kv_quant"] = settings.to_json() if settings is not None and settings.compresses else None
    if info["kv_quant"] is not None:
        info["kv_pool"] = _add_kv_pool(module, info)
    info["heat"] = None
    if settings is not None and settings.needs_attention:  # the program writes its attention heat
        from mcpc.ir.decoder_import import enable_attention_heat

        info["heat"] = enable_attention_heat(module)
        info["heat"]["min_window"] = settings.min_window if settings.dynamic_window else None
    return info


def _add_kv_pool(module, info: dict) -> dict:
    """A build storing its cache compressed gets the pool of stored blocks and their descriptor
    table as persistent buffers (``mcpc.kv.pool``; the lowering of ``mcp.paged_attention`` then
    reads the blocks with ``kvdecomp``); returns their sizes for META ``decoder.kv_pool``."""
    from mcpc.ir.core import GlobalDecl
    from mcpc.ir.dtypes import I32, U8
    from mcpc.ir.types import TensorType
    from mcpc.kv.pool import DESC, POOL, pool_layout

    act = module.globals["kv_k_0"].type.dtype
    layout = pool_layout(info["layers"], info["kv_heads"], info["kv_blocks"], info["head_dim"], act.bits // 8)
    module.globals[POOL] = GlobalDecl(POOL, TensorType((layout["pool_bytes"],), U8))
    module.globals[DESC] = GlobalDecl(DESC, TensorType((layout["desc_entries"], 4), I32))
    return layout


def _compile_to_program(module, target, config, pipeline, model, decoder=None):
    import mcpc.backend
    from mcpc.passes import format_pass

    compile_to_program = getattr(mcpc.backend, "compile_to_program", None)
    if compile_to_program is None:  # the backend lands separately from the front end
        raise UnsupportedError("this build of mcpc has no backend yet: only --emit ir is available")

    options = {
        "precision": config.name,
        "tolerances": config.check.tolerances(),
        "passes": [format_pass(p) for p in pipeline],
        "source_model": Path(model).name if isinstance(model, (str, Path)) else None,
        "qat_config": config,
        "decoder": decoder,
    }
    return compile_to_program(module, target, options)


def export_onnx(
    model,
    qat_config,
    output: str | Path,
    calib: str | Path | None = None,
    shapes: dict | None = None,
    dims: dict | None = None,
) -> CompileResult:
    """Quantize ``model`` (an ONNX path) as ``qat_config`` says and write the quantized model as
    ONNX opset 21 QDQ to ``output`` (``mcpc.ir.onnx_export``).  The IR run is ``fold-constants,
    quantize-weights`` (what every quantizing preset runs first); returns that compile's result."""
    import onnx

    from mcpc.ir.onnx_export import export_quantized

    output = Path(output)
    _check_output_dir(output)
    config = load_qat_config(qat_config)
    if config.quantization is None:
        raise UsageError(f"export-onnx: config {config.source} does not quantize (no quantization: section)")
    result = compile(
        model, qat_config=config, passes="fold-constants,quantize-weights", emit="ir", shapes=shapes,
        dims=dims, calib=calib,
    )  # fmt: skip
    arrays = result.notes["quantized_arrays"]
    if len(arrays) != 1:
        raise UnsupportedError("export-onnx: models with several functions are not exported")
    try:
        proto = onnx.load(str(model))
    except Exception as exc:  # noqa: BLE001 - any parse failure is a bad input file
        raise InputError(f"{model}: cannot read ONNX model: {exc}") from None
    exported = export_quantized(proto, next(iter(arrays.values())))
    write_atomic(output, exported.SerializeToString())
    result.output = output
    return result


def write_report(path: str | Path, report: dict[str, Any]) -> None:
    """Write a compile report as sorted, indented JSON (atomically)."""
    write_atomic(path, json.dumps(report, indent=2, sort_keys=True) + "\n")
