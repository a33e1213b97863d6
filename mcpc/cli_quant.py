"""The quantization subcommands: ``mcpc quant report`` (per-layer sensitivity, chosen precision and
bytes) and ``mcpc export-onnx`` (the quantized model as ONNX QDQ for ONNX Runtime).  The work is in
``mcpc.driver`` and ``mcpc.quant_report``; ``mcpc.cli`` registers them.
"""

from __future__ import annotations

from pathlib import Path

import click

from mcpc.cli_guard import GuardedCommand, GuardedGroup, _stdout_console


def _model_options(fn):
    from mcpc.cli import _parse_dims, _parse_shapes

    fn = click.option("--dim", "dims", multiple=True, callback=_parse_dims, metavar="NAME=128",
                      help="Bind a symbolic dim everywhere it appears (repeatable).")(fn)  # fmt: skip
    fn = click.option("--shape", "shapes", multiple=True, callback=_parse_shapes, metavar="NAME=1x128",
                      help="Bind every dim of one input (repeatable).")(fn)  # fmt: skip
    fn = click.option("--calib", type=click.Path(path_type=Path), metavar="FILE.npz|DIR",
                      help="Calibration data (arrays named like the inputs, batch first).")(fn)  # fmt: skip
    fn = click.option("--qat-config", "-c", required=True, help="Shipped config name or path.")(fn)
    return click.argument("model", type=click.Path(path_type=Path, dir_okay=False), metavar="MODEL.onnx")(fn)


@click.group("quant", cls=GuardedGroup)
def quant_group():
    """Quantization: what it chose per layer and what it cost."""


@quant_group.command("report", cls=GuardedCommand)
@_model_options
@click.option("--target", "-t", default="mcp2026-a100", show_default=True, help="Target name or YAML path.")
@click.option(
    "--json", "json_path", type=click.Path(path_type=Path, dir_okay=False), help="Write the report."
)
def quant_report_command(model, qat_config, calib, shapes, dims, target, json_path):
    """Per layer: sensitivity (model output error with that layer alone quantized, measured on the
    calibration data), chosen precision, algorithm and bytes as stored; then the weight totals.

    With a config's sensitivity section the sensitivity is the INT6 probe that chose the
    precision; otherwise the layer alone at its configured precision.  Without --calib (or the
    config's calibration.data) no sensitivity is measured.
    """
    import json

    from rich.text import Text

    from mcpc import driver
    from mcpc.fileio import write_atomic
    from mcpc.quant_report import layer_table, summary_lines

    config = driver.load_qat_config(qat_config)
    if config.quantization is None:
        raise click.UsageError(f"config {config.source} does not quantize (no quantization: section)")
    result = driver.compile(
        model, target=target, qat_config=config, emit="ir", shapes=shapes, dims=dims, calib=calib,
        notes={"measure_sensitivity": True},
    )  # fmt: skip
    console = _stdout_console()
    console.print(layer_table(result.report))
    for line in summary_lines(result.report):
        console.print(Text(line))
    if result.report["quantization"]["calibration"] is None:
        console.print(Text("sensitivity: not measured (give --calib to measure it)"))
    if json_path is not None:
        keep = ("model", "target", "qat_config", "weights", "quantization", "pass_times")
        write_atomic(
            json_path, json.dumps({k: result.report[k] for k in keep}, indent=2, sort_keys=True) + "\n"
        )


@click.command("export-onnx", cls=GuardedCommand)
@_model_options
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False), required=True,
              help="The quantized ONNX model to write.")  # fmt: skip
def export_onnx_command(model, qat_config, calib, shapes, dims, output):
    """Write MODEL quantized as the config says, as ONNX opset 21 (INT4/INT8 blocked and FP8
    DequantizeLinear on the weights, QuantizeLinear/DequantizeLinear on quantized activations), for
    ONNX Runtime to run as an independent check of the quantization (f32 activations)."""
    from rich.text import Text

    from mcpc import driver
    from mcpc.quant_report import summary_lines

    result = driver.export_onnx(model, qat_config, output, calib=calib, shapes=shapes, dims=dims)
    console = _stdout_console()
    console.print(Text(f"wrote {output}  [{result.report['qat_config']}, ONNX opset 21 QDQ]"))
    for line in summary_lines(result.report):
        console.print(Text(line))
