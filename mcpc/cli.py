"""The command line: ``mcp-compile`` and ``mcpc`` (click + rich).  The work is in ``mcpc.driver``.

Error handling lives in one place, ``_guard`` (in ``mcpc.cli_guard``, re-exported here): an
``McpcError`` becomes ``error: <message>`` on stderr and its exit code; click usage errors exit 2;
anything else is an internal error (exit 70, traceback only with ``MCPC_DEBUG=1``).  Every command
is a ``GuardedCommand`` (groups a ``GuardedGroup``), so the same codes come out of the console
scripts and of ``CliRunner``.  This module holds ``compile``, ``targets`` and ``examples``; the
tools over a compiled program (``check``, ``disasm``, ``inspect``) and ``conformance`` are in
``mcpc.cli_tools``.

Adding a subcommand: write a ``@click.command(cls=GuardedCommand)`` function that calls into the
layer doing the work (imported inside the function, so ``mcpc --help`` stays fast) and register it
with ``cli.add_command(...)`` (or on a subgroup such as ``sim``) at the bottom of this file.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import click

from mcpc import __version__
from mcpc.cli_guard import (  # noqa: F401  (re-exported: where commands were always looked up)
    EXIT_CODES_EPILOG,
    GuardedCommand,
    GuardedGroup,
    _guard,
    _print_error,
    _stderr_console,
    _stdout_console,
)
from mcpc.cli_tools import (
    check_command,
    conformance_command,
    disasm_command,
    inspect_command,
    inspect_model_command,
)

# -- option parsing (click.BadParameter -> exit 2) ---------------------------------------------


def _split_assignment(param: click.Parameter, item: str) -> tuple[str, str]:
    name, sep, value = item.partition("=")
    if not sep or not name.strip() or not value.strip():
        raise click.BadParameter(f"expected NAME=VALUE, got {item!r}", param=param)
    return name.strip(), value.strip()


def _parse_shapes(ctx, param, items) -> dict[str, tuple[int, ...]] | None:
    shapes = {}
    for item in items:
        name, value = _split_assignment(param, item)
        try:
            dims = tuple(int(d) for d in value.lower().split("x"))
        except ValueError:
            raise click.BadParameter(
                f"{item!r}: shape must be sizes joined by 'x', e.g. 1x128", param=param
            ) from None
        shapes[name] = dims
    return shapes or None


def _parse_dims(ctx, param, items) -> dict[str, int] | None:
    # sizes are checked against the model (negative, unknown name, empty input) when it is bound
    dims = {}
    for item in items:
        name, value = _split_assignment(param, item)
        try:
            dims[name] = int(value)
        except ValueError:
            raise click.BadParameter(f"{item!r}: size must be an integer", param=param) from None
    return dims or None


def _parse_sets(ctx, param, items) -> list[str]:
    for item in items:
        _split_assignment(param, item)
    return list(items)


# -- compile ---------------------------------------------------------------------------------


@click.command(
    "compile",
    cls=GuardedCommand,
    epilog=EXIT_CODES_EPILOG,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.argument(
    "model", type=click.Path(path_type=Path, dir_okay=False), required=False, metavar="MODEL.onnx"
)
@click.option(
    "--target", "-t", default="mcp2026-a100", show_default=True, help="Shipped target name or YAML path."
)
@click.option(
    "--qat-config", "-c", default="fp16.yaml", show_default=True, help="Shipped config name or path."
)
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path, dir_okay=False, allow_dash=True),
    help="Output file (default: MODEL with .mcpb/.s/.mcpir next to it; '-' = stdout for text).",
)
@click.option(
    "--shape",
    "shapes",
    multiple=True,
    callback=_parse_shapes,
    metavar="NAME=1x128",
    help="Bind every dim of one input (repeatable).",
)
@click.option(
    "--dim",
    "dims",
    multiple=True,
    callback=_parse_dims,
    metavar="NAME=128",
    help="Bind a symbolic dim everywhere it appears (repeatable).",
)
@click.option(
    "--passes", default=None, metavar="PIPELINE", help="Pipeline text replacing the config's pipeline."
)
@click.option("--print-pipeline", is_flag=True, help="Print the effective pipeline and exit.")
@click.option("--print-ir-after-all", is_flag=True, help="Print the IR after every pass (stderr).")
@click.option("--time-passes", is_flag=True, help="Print per-pass wall time (stderr).")
@click.option("--emit", type=click.Choice(["mcpb", "asm", "ir"]), default="mcpb", show_default=True)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    callback=_parse_sets,
    metavar="KEY=VALUE",
    help="Override one target field, e.g. sram.size_bytes=8388608 (repeatable).",
)
@click.option(
    "--report-json", type=click.Path(path_type=Path, dir_okay=False), help="Write a JSON compile report."
)
@click.option(
    "--calib",
    type=click.Path(path_type=Path),
    default=None,
    metavar="FILE.npz|DIR",
    help="Calibration data for a quantizing config (arrays named like the inputs, batch axis leading).",
)
@click.option(
    "--kv-quant",
    type=click.Choice(["fp16", "int8"]),
    default=None,
    help="KV cache of a --max-seq build: fp16 (unquantized) or int8 (INT8_Asymmetric).",
)
@click.option(
    "--kv-sparsity",
    type=click.FloatRange(0, 1, max_open=True),
    default=None,
    metavar="RATIO",
    help="KV cache of a --max-seq build: fraction of K/V dropped by the --kv-policy.",
)
@click.option(
    "--kv-policy",
    type=click.Choice(["none", "topk_magnitude", "topk_entropy", "heavy_hitter"]),
    default=None,
    help="KV cache of a --max-seq build: the sparsity policy.",
)
@click.option(
    "--max-seq",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Decoder build: the graph with past becomes entries prefill + decode over a paged KV cache "
    "(N: the longest sequence a request may reach).",
)
@click.option(
    "--max-batch",
    type=click.IntRange(min=1),
    default=None,
    metavar="B",
    help="Decoder build: sequences per call (default 1; --dim batch=B is a synonym).",
)
@click.option(
    "--kv-blocks",
    type=click.IntRange(min=1),
    default=None,
    metavar="NB",
    help="Decoder build: 64-token KV cache blocks (default B * ceil(N / 64)).",
)
@click.option(
    "--prefill-chunk",
    type=click.IntRange(min=1),
    default=None,
    metavar="C",
    help="Decoder build: tokens per sequence a prefill call takes (default min(64, N)).",
)
@click.option(
    "--estimate/--no-estimate",
    default=True,
    help="Run the build timing-only on the simulator and warn when an entry takes more than 2x its "
    "roofline, naming the nodes responsible (default on; builds of at most 100 000 instructions).",
)
@click.version_option(__version__)
def compile_command(model, target, qat_config, output, shapes, dims, passes, print_pipeline,
                    print_ir_after_all, time_passes, emit, overrides, report_json, calib, max_seq,
                    max_batch, kv_blocks, prefill_chunk, kv_quant, kv_sparsity, kv_policy,
                    estimate):  # fmt: skip
    """Compile an ONNX model for the MCP 2026 NPU."""
    from mcpc import driver
    from mcpc.passes import format_pipeline

    if (kv_quant, kv_sparsity, kv_policy) != (None, None, None):  # merged into the config's kv_cache:
        from mcpc.qat_configs.kv_cache import with_kv_flags

        qat_config = with_kv_flags(driver.load_qat_config(qat_config), kv_quant, kv_sparsity, kv_policy,
                                   max_seq)  # fmt: skip

    if print_pipeline:
        click.echo(format_pipeline(driver.resolve_passes(qat_config, passes)))
        return
    if model is None:
        raise click.UsageError("Missing argument 'MODEL.onnx'.")
    to_stdout = output is not None and str(output) == "-"
    if to_stdout and emit == "mcpb":
        raise click.BadParameter("'-' (stdout) is only for --emit ir or --emit asm", param_hint="'-o'")
    if output is None:
        output = driver.default_output(model, emit)
    decoder, dims = _decoder_build(max_seq, max_batch, kv_blocks, prefill_chunk, dims, model)
    result = driver.compile(
        model,
        target=target,
        qat_config=qat_config,
        passes=passes,
        emit=emit,
        output=None if to_stdout else output,
        shapes=shapes,
        dims=dims,
        overrides=overrides,
        print_ir_after_all=sys.stderr if print_ir_after_all else None,
        time_passes=time_passes,
        calib=calib,
        decoder=decoder,
    )
    if time_passes:
        result.pass_manager.print_timings(sys.stderr)
    if estimate and emit == "mcpb" and result.program is not None and _has_module("mcpc.sim.estimate"):
        from mcpc.sim.estimate import estimate_program  # the cycles beside the roofline, per entry

        result.report["estimate"] = estimate_program(result.program, str(output))
    if report_json is not None:
        driver.write_report(report_json, result.report)
    if to_stdout:
        click.echo(result.text, nl=False)
        from mcpc.quant_report import summary_lines

        for text in summary_lines(result.report):
            click.echo(text, err=True)
    else:
        _print_summary(result)


def _decoder_build(max_seq, max_batch, kv_blocks, prefill_chunk, dims, model=None):
    """The ``DecoderBuild`` of the --max-seq options (None without --max-seq) and the dims left.
    ``--dim batch=B`` and ``--dim NAME=B`` for a name the model gives its batch dim (``batch_size``,
    a dynamo ``s<N>``: ``decoder_import.batch_dim_names``) are synonyms of ``--max-batch B``."""
    if max_seq is None:
        given = [f"--{k}" for k, v in (("max-batch", max_batch), ("kv-blocks", kv_blocks),
                                         ("prefill-chunk", prefill_chunk)) if v is not None]  # fmt: skip
        if given:
            raise click.UsageError(f"{given[0]} is an option of a decoder build: give --max-seq N too")
        return None, dims
    from mcpc.ir.decoder_import import DecoderBuild, batch_dim_names

    dims = dict(dims or {})
    names = ["batch", *(n for n in (batch_dim_names(model) if model is not None else []) if n != "batch")]
    given = [(f"--max-batch {max_batch}", max_batch)] if max_batch is not None else []
    given += [(f"--dim {n}={dims[n]}", dims.pop(n)) for n in names if n in dims]
    if len({v for _, v in given}) > 1:
        raise click.UsageError(
            f"{' and '.join(t for t, _ in given)} disagree: each sets the batch of the decoder build"
        )
    batch = given[0][1] if given else None
    build = DecoderBuild(max_seq, batch or 1, kv_blocks, prefill_chunk)
    return build, dims or None


def _decoder_line(report) -> str:
    d = report["decoder"]
    line = (
        f"decoder: prefill {d['max_batch']}x{d['prefill_chunk']} + decode {d['max_batch']}x1 rows, "
        f"{d['layers']} layers, KV cache {d['kv_blocks']} blocks of {d['block']} tokens in {d['kv_dtype']}"
    )
    kv = d.get("kv_quant")
    if kv:  # stored as mcpc.kv blocks (docs/kv-cache.md, "In a decoder build")
        policy = "" if kv["policy"] == "none" else f" + {kv['policy']} dropping {kv['sparsity_ratio']:g}"
        line += f", stored as {kv['quant']}{policy}"
        pool = d.get("kv_pool")
        if pool:  # where the full blocks live in NPU DRAM, read by kvdecomp (docs/kv-cache.md)
            line += f" in a {pool['pool_bytes']:,}-byte pool"
    heat = d.get("heat")
    if heat:  # the program writes its attention heat for the host (docs/decoding.md, "Attention heat")
        window = "" if heat.get("min_window") is None else f", dynamic window (min {heat['min_window']})"
        line += f", attention heat out{window}"
    checks = report.get("decoder_check") or []
    for check, what in zip(checks, ("imported", "built"), strict=False):
        err = check["errors"].get("logits", 0.0)
        line += f"; self-check {what}: logits error {err:.2g} (bound {check['max_norm_err']:g})"
        if not check.get("within_tolerance", True):
            line += " EXCEEDED: the quantization's accuracy cost"
    return line


def _print_summary(result) -> None:
    report = result.report
    ops = report["ir_ops"]
    top = ", ".join(f"{name} x{count}" for name, count in sorted(ops.items(), key=lambda kv: -kv[1])[:6])
    line = f"wrote {result.output}  [{report['target']}, {report['qat_config']}]  {sum(ops.values())} IR ops"
    if top:
        line += f" ({top})"
    if "program" in report:
        stats = report["program"]
        line += f"; {stats['instructions']} instructions, {stats['weight_bytes']} weight bytes"
    from rich.text import Text

    _stdout_console().print(Text(line))
    if report.get("decoder"):
        _stdout_console().print(Text(_decoder_line(report)))
    for r in report.get("refused") or []:  # an optimisation refused must not cost silently
        _stdout_console().print(
            Text(f"refused: {r['optimisation']} of the {r['entry']} entry: {r['reason']}; cost: {r['cost']}")
        )
    for text in report.get("import_notes") or []:
        _stdout_console().print(Text(f"note: {text}"))
    from mcpc.quant_report import summary_lines

    for text in summary_lines(report):
        _stdout_console().print(Text(text))
    if report.get("estimate") is not None:
        from mcpc.sim.estimate import warning_lines

        for text in warning_lines(report["estimate"]):
            _stdout_console().print(Text(text))


# -- mcpc group --------------------------------------------------------------------------------


@click.group(
    cls=GuardedGroup, epilog=EXIT_CODES_EPILOG, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.version_option(__version__)
def cli():
    """mcpc: compile ONNX models for the MCP 2026 NPU, simulate and profile them."""


@click.command("targets", cls=GuardedCommand)
def targets_command():
    """List the shipped target descriptions."""
    from rich.table import Table

    from mcpc.arch.target import list_targets

    table = Table(title="shipped targets", title_justify="left")
    for column, justify in [("name", "left"), ("clock MHz", "right"), ("f16 MACs/cycle", "right"),
                            ("SRAM", "right"), ("DRAM GB/s", "right"), ("modelled on", "left")]:  # fmt: skip
        table.add_column(column, justify=justify, overflow="fold")
    for t in list_targets():
        table.add_row(
            t.name,
            f"{t.clock_mhz:g}",
            str(t.mac.macs_per_cycle.get("f16", "-")),
            _bytes(t.sram.size_bytes),
            f"{t.dram.bandwidth_gbps:g}",
            t.modelled_on.split(":")[0],
        )
    _stdout_console().print(table)


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:g} {unit}" if unit == "B" else f"{n:.4g} {unit}"
        n /= 1024
    return str(n)  # pragma: no cover


@click.group("examples", cls=GuardedGroup)
def examples_group():
    """Bundled example models."""


@examples_group.command("build")
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False))
def examples_build(directory: Path):
    """Write the bundled example ONNX models into DIRECTORY (created if missing)."""
    from mcpc.examples import build_examples

    directory.mkdir(parents=True, exist_ok=True)
    for path in build_examples(directory):
        click.echo(str(path))


def _has_module(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


# Registration.  A command backed by a module another layer delivers is registered only once that
# module exists, so `mcpc --help` never lists a command that cannot work.
cli.add_command(compile_command)
cli.add_command(targets_command)
cli.add_command(disasm_command)
cli.add_command(inspect_command)
cli.add_command(inspect_model_command)
if _has_module("mcpc.check") and _has_module("mcpc.sim.api"):
    cli.add_command(check_command)
if _has_module("mcpc.cli_quant"):
    from mcpc.cli_quant import export_onnx_command, quant_group

    cli.add_command(quant_group)
    cli.add_command(export_onnx_command)
if _has_module("mcpc.examples"):
    cli.add_command(examples_group)
if _has_module("mcpc.conformance"):
    cli.add_command(conformance_command)  # light: onnx loads inside the command
if _has_module("mcpc.cli_ci"):
    from mcpc.cli_ci import ci_command, report_command, sweep_command  # light: click only

    for command in (ci_command, sweep_command, report_command):
        cli.add_command(command)
if _has_module("mcpc.serve"):
    from mcpc.serve.cli import tune_batching_command  # light: click only

    cli.add_command(tune_batching_command)
if _has_module("mcpc.sim.cli"):
    from mcpc.sim.cli import sim_group  # light: click only; the simulator loads inside `run`

    cli.add_command(sim_group)
    if _has_module("mcpc.serve"):
        from mcpc.serve.cli import serve_command  # light: click only; the simulator loads inside

        sim_group.add_command(serve_command)
if _has_module("mcpc.serve.compare") and _has_module("mcpc.sim.cli"):
    from mcpc.serve.compare import compare_command  # light: click only; the simulator loads inside

    cli.add_command(compare_command)


def main() -> None:
    """Console script ``mcpc``."""
    cli.main(prog_name="mcpc")


def compile_main() -> None:
    """Console script ``mcp-compile`` (the same command object as ``mcpc compile``)."""
    compile_command.main(prog_name="mcp-compile")
