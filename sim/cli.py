"""``mcpc sim run``: simulate a .mcpb, print a rich summary, write outputs, profile and trace.

Exported as ``sim_group`` (the lead registers it under ``mcpc``).  Errors are McpcError
subclasses turned into ``error: <message>`` and the documented exit code (3 bad input, 5 trap,
7 a numeric fault under ``--strict``) by this module's own guard, so the group behaves the same
standalone and under ``mcpc``.  Every
output file is written to a temporary file first and moved into place (never half-written).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import click

from mcpc.errors import McpcError, UsageError
from mcpc.fileio import read_npz, write_atomic


def _json_bytes(obj) -> bytes:
    return (json.dumps(obj, indent=1, sort_keys=False) + "\n").encode("utf-8")


_WIDEN = {"bfloat16": "float32", "float8_e4m3fn": "float32", "int4": "int8", "uint4": "uint8"}


def _npz_bytes(arrays: dict) -> bytes:
    """The .npz bytes of ``arrays``; ml_dtypes arrays are widened exactly (bf16/fp8 -> float32,
    int4/uint4 -> int8/uint8) because .npz has no descriptor for them (they would load as void)."""
    import numpy as np

    buf = io.BytesIO()
    plain = {}
    for name, arr in arrays.items():
        wide = _WIDEN.get(arr.dtype.name)
        plain[name] = arr.astype(wide) if wide is not None else arr
    np.savez(buf, **plain)
    return buf.getvalue()


class _Guarded(click.Command):
    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except McpcError as err:
            from rich.console import Console
            from rich.text import Text

            Console(stderr=True, soft_wrap=True, highlight=False).print(
                Text.assemble(("error: ", "bold red"), err.message)
            )
            raise click.exceptions.Exit(err.exit_code) from None


def _require_no_inputs(loaded, entry: str, program: Path) -> None:
    """UsageError when ``entry`` takes inputs but neither --inputs nor --random-inputs was given."""
    io = loaded.io.get(entry, {}) if isinstance(loaded.io, dict) else {}
    needed = [b for b in io.get("inputs", []) if isinstance(b, dict)]
    if needed:
        listed = ", ".join(
            f"{b.get('name')} ({b.get('dtype')} {'x'.join(map(str, b.get('shape', []))) or 'scalar'})"
            for b in needed
        )
        raise UsageError(
            f"{program}: entry {entry!r} takes inputs {listed}: give them with --inputs IN.npz (one array "
            "per input name), or simulate on generated values with --random-inputs [--seed N]"
        )


def _pick_entry(loaded, entry: str | None, program: Path) -> str:
    """``entry``, or the program's only entry point; UsageError when several and none named."""
    names = list(loaded.entries)
    if entry is not None:
        return entry  # an unknown name is refused by run_program (exit 3, naming the entries)
    if len(names) == 1:
        return names[0]
    raise UsageError(
        f"{program}: the program has {len(names)} entry points ({', '.join(names) or 'none'}): "
        "choose one with --entry NAME"
    )


def _registers(loaded, entry: str, set_regs: tuple[str, ...]) -> dict[int, int]:
    """--set-reg NAME=VALUE options as register numbers; UsageError (exit 2) for a malformed
    option, an unknown name, a value outside the declared range or a register left unset."""
    from mcpc.errors import InputError
    from mcpc.sim.session import named_registers

    named: dict[str, int] = {}
    for item in set_regs:
        name, eq, value = item.partition("=")
        try:
            number = int(value.strip(), 0)
        except ValueError:
            number = None
        if not eq or not name.strip() or number is None:
            raise UsageError(f"--set-reg {item!r}: expected NAME=VALUE with an integer VALUE")
        named[name.strip()] = number
    if entry not in loaded.entries:
        return {}  # run_program names the entries
    try:
        return named_registers(loaded, entry, named)
    except InputError as exc:
        raise UsageError(exc.message) from None


@click.group("sim")
def sim_group():
    """Run compiled .mcpb programs on the MCP 2026 simulator."""


@sim_group.command("run", cls=_Guarded)
@click.argument("program", type=click.Path(path_type=Path, dir_okay=False))
@click.option(
    "--inputs",
    "inputs_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Inputs as an .npz with one array per model input.",
)
@click.option("--random-inputs", is_flag=True, help="Generate random inputs instead of --inputs.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for --random-inputs.")
@click.option(
    "--outputs",
    "outputs_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write the outputs (named as the model's outputs) to this .npz.",
)
@click.option(
    "--profile-json", type=click.Path(path_type=Path, dir_okay=False), help="Write the profile JSON."
)
@click.option(
    "--trace",
    "trace_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write a Chrome/Perfetto trace-event JSON (one track per engine).",
)
@click.option("--entry", default=None, help="Entry point to run (needed when the program has several).")
@click.option(
    "--set-reg",
    "set_regs",
    multiple=True,
    metavar="NAME=VALUE",
    help="Set a host register the program declares (repeatable; mcpc inspect lists them).",
)
@click.option(
    "--timing-only",
    is_flag=True,
    help="Cycles, profile and trace without computing values (no --outputs; data-dependent traps "
    "such as a gather index out of range are not detected).",
)
@click.option(
    "--max-cycles",
    type=click.IntRange(min=0),
    default=None,
    help="Stop a runaway program: trap (exit 5) when an instruction would issue after this cycle.",
)
@click.option(
    "--report",
    "report_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write an HTML report of the run (cycles per node by engine, roofline, memory).",
)
@click.option(
    "--strict",
    is_flag=True,
    help="Exit 7 when the run produced a NaN or overflowed to infinity, or an output is not finite.",
)
def run_command(
    program,
    inputs_path,
    random_inputs,
    seed,
    outputs_path,
    profile_json,
    trace_path,
    entry,
    set_regs,
    timing_only,
    max_cycles,
    strict,
    report_path=None,
):
    """Simulate PROGRAM (.mcpb) and print cycles, latency, traffic, utilisation and top nodes."""
    from rich.console import Console

    from mcpc.errors import NumericFault
    from mcpc.sim.api import load_program, run_program
    from mcpc.sim.api import random_inputs as make_random
    from mcpc.sim.numeric import message as numeric_message
    from mcpc.sim.summary import render_summary

    if inputs_path and random_inputs:
        raise UsageError("give either --inputs or --random-inputs, not both")
    if timing_only and outputs_path:
        raise UsageError("--outputs needs the values: a --timing-only run computes none")
    loaded = load_program(program)
    entry = _pick_entry(loaded, entry, program)
    registers = _registers(loaded, entry, set_regs)
    if inputs_path:
        inputs = read_npz(inputs_path)
    elif random_inputs:
        inputs = make_random(loaded, entry, seed)
    else:
        inputs = {}
        _require_no_inputs(loaded, entry, program)
    result = run_program(
        loaded,
        inputs,
        entry=entry,
        trace=trace_path is not None,
        timing_only=timing_only,
        max_cycles=max_cycles,
        registers=registers,
    )
    if outputs_path:
        write_atomic(outputs_path, _npz_bytes(result.outputs))
    decoder = (loaded.program.meta or {}).get("decoder")
    if isinstance(decoder, dict):  # a decoder build: the report shows its KV cache apart
        result.profile["decoder"] = decoder
    if profile_json:
        write_atomic(profile_json, _json_bytes(result.profile))
    if trace_path:
        doc = {
            "traceEvents": result.trace_events,
            "displayTimeUnit": "ns",
            "otherData": {"program": program.name, "target": loaded.target.name, "entry": entry},
        }
        write_atomic(trace_path, json.dumps(doc, separators=(",", ":")).encode("utf-8"))
    if report_path:
        from mcpc.report import write_profile_report

        write_profile_report(result.profile, program.name, report_path)
    render_summary(result.profile, Console(soft_wrap=True, highlight=False), source=program.name)
    problem = numeric_message(result.profile["numeric"] or {})
    if strict and problem:
        raise NumericFault(f"{program}: {problem}")


def _register_decoding() -> None:
    from .cli_decode import eval_ppl_command, generate_command  # needs _Guarded above

    sim_group.add_command(generate_command)
    sim_group.add_command(eval_ppl_command)


_register_decoding()
