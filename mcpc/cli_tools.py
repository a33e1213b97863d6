"""The mcpc subcommands that check, read and measure: ``check``, ``disasm`` and ``inspect`` over a
compiled .mcpb (and the model), and ``conformance`` over the ONNX backend node tests.

Each is a ``GuardedCommand`` that imports the layer doing the work inside the function (so
``mcpc --help`` stays fast); ``mcpc.cli`` registers them.
"""

from __future__ import annotations

from pathlib import Path

import click

from mcpc.cli_guard import GuardedCommand, _stdout_console
from mcpc.errors import InputError
from mcpc.fileio import read_npz


@click.command("check", cls=GuardedCommand)
@click.argument("model", type=click.Path(path_type=Path, dir_okay=False), metavar="MODEL.onnx")
@click.argument("program", type=click.Path(path_type=Path, dir_okay=False), metavar="PROG.mcpb")
@click.option("--inputs", "inputs_path", required=True, type=click.Path(path_type=Path, dir_okay=False),
              help="Inputs as an .npz with one array per model input.")  # fmt: skip
@click.option("--max-norm-err", type=float, help="Max |y - r| / max |r| per output (default: the build's).")
@click.option("--min-cosine", type=float, help="Min cosine similarity per output (default: the build's).")
@click.option(
    "--min-top1", type=float, help="Min argmax agreement of logits outputs, 0..1 (default: the build's)."
)
@click.option("--rtol", type=float, help="Also require every element within atol + rtol * |reference|.")
@click.option("--atol", type=float, help="Absolute part of that element-wise bound.")
@click.option(
    "--mask", "mask", metavar="INPUT", help="Score only positions where this [batch, seq] input is 1."
)
@click.option("--ignore-outputs", metavar="A,B", help="Comma-separated outputs not to compare.")
@click.option("--entry", default="main", show_default=True, help="Entry point to run.")
@click.option(
    "--json", "json_path", type=click.Path(path_type=Path, dir_okay=False), help="Write the report."
)
@click.option("--per-node", "per_node", is_flag=True,
              help="Also compare every ONNX node output the program stores, in graph order.")  # fmt: skip
def check_command(
    model, program, inputs_path, max_norm_err, min_cosine, min_top1, rtol, atol, mask, ignore_outputs, entry,
    json_path, per_node,
):  # fmt: skip
    """Compare PROG on the simulator with MODEL on ONNX Runtime.

    Per output: normalized max error (max |y - r| / max |r|), max abs error, cosine, and top-1
    agreement for logits (last axis = vocabulary); exits 1 when one is outside the build's
    tolerances (the QAT config's check section) or an option's.  --mask attention_mask scores
    only the [batch, seq] positions whose mask is 1 (outputs laid out [batch, seq, ...] or
    [batch, heads, seq, head_dim]; others whole). --per-node also scores every ONNX node output the
    program stores to DRAM, in graph order, marking the first outside the budget (where accuracy
    is lost); the exit status still follows the outputs. Exits 7 when the simulated run
    produced a NaN or overflowed to infinity (naming the first instruction and its ONNX node).
    """
    import json

    from rich.measure import Measurement
    from rich.table import Table

    from mcpc import check, driver
    from mcpc.errors import CheckFailed, NumericFault
    from mcpc.sim.numeric import message as numeric_message

    for path in (model, program, inputs_path):
        if not path.is_file():
            raise InputError(f"{path}: no such file")
    ignored = tuple(n.strip() for n in (ignore_outputs or "").split(",") if n.strip())
    inputs = read_npz(inputs_path)
    report = check.check(
        model, program, inputs, rtol, atol, min_cosine, entry,
        max_norm_err=max_norm_err, min_top1=min_top1, mask=mask, ignore_outputs=ignored,
    )  # fmt: skip
    if per_node:  # where accuracy is lost: every stored node output against ONNX Runtime's
        from mcpc import per_node as per_node_mod

        report["per_node"] = per_node_mod.per_node(
            model, program, inputs, entry, max_norm_err=max_norm_err, min_cosine=min_cosine, mask=mask
        )
    if json_path is not None:
        driver.write_atomic(json_path, json.dumps(report, indent=2, sort_keys=True) + "\n")
    tol = check.Tolerances.from_mapping(report["tolerances"])
    title = f"check: {tol.describe()}" + (f"; scored where {mask} is 1" if mask else "")
    table = Table(title=title, title_justify="left")
    columns = ("output", "shape", "scored", "norm max err", "max abs err", "cosine", "top-1", "result")
    for column in columns:
        left = column in ("output", "shape", "scored", "result")
        table.add_column(column, justify="left" if left else "right", no_wrap=True)
    for r in report["outputs"]:
        axes = r["masked_axes"]
        scored = f"{r['scored']} (mask on axes {','.join(map(str, axes))})" if axes else "all"
        top1 = "-" if r["top1"] is None else f"{100 * r['top1']:.2f}%"
        table.add_row(r["name"], "x".join(map(str, r["shape"])), scored, f"{r['norm_max_err']:.3g}",
                      f"{r['max_abs_err']:.3g}", f"{r['cosine']:.6f}", top1,
                      "ok" if r["passed"] else "FAIL: " + "; ".join(r["reasons"]))  # fmt: skip
    for name in report["ignored"]:
        table.add_row(name, "", "", "", "", "", "", "ignored")
    console = _stdout_console()
    width = Measurement.get(console, console.options.update(max_width=100_000), table).maximum
    console.width = max(console.width, width)  # full output names and reasons, never truncated
    console.print(table)
    if per_node:
        per_node_mod.print_report(console, report["per_node"])
    problem = numeric_message(report.get("numeric") or {})
    if problem:  # a NaN or an overflow is a fault even when the outputs happen to be within tolerance
        raise NumericFault(f"{program}: {problem}")
    if not report["passed"]:
        failed = [f"{r['name']} ({'; '.join(r['reasons'])})" for r in report["outputs"] if not r["passed"]]
        raise CheckFailed(f"{program}: outputs outside tolerance against {model}: {', '.join(failed)}")


@click.command("disasm", cls=GuardedCommand)
@click.argument("program", type=click.Path(path_type=Path, dir_okay=False), metavar="PROG.mcpb")
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False), help="Write to a file.")
def disasm_command(program, output):
    """Print the assembly of PROG.

    One line per instruction, annotated with the ONNX node and IR op it came from.
    """
    from mcpc import driver
    from mcpc.arch.asm import disassemble
    from mcpc.arch.mcpb import read_mcpb

    prog = read_mcpb(program)
    text = disassemble(prog.text, prog.debug)
    if output is not None:
        driver.write_atomic(output, text)
    else:
        click.echo(text, nl=False)


@click.command("inspect", cls=GuardedCommand)
@click.argument("program", type=click.Path(path_type=Path, dir_okay=False), metavar="PROG.mcpb")
def inspect_command(program):
    """Print PROG's target, sections, entries, I/O, persistent buffers and host registers."""
    from rich.table import Table

    from mcpc.arch.mcpb import read_mcpb, section_table

    prog = read_mcpb(program)
    console = _stdout_console()
    console.print(f"{program}: target {prog.target_name} (sha256 {prog.target_digest[:16]}...)")
    meta = prog.meta or {}
    console.print(", ".join(f"{k}: {meta[k]}" for k in sorted(meta) if not isinstance(meta[k], (dict, list))))
    if isinstance(meta.get("decoder"), dict):  # a --max-seq build (docs/decoding.md)
        console.print(
            "decoder: " + ", ".join(f"{k}: {v}" for k, v in meta["decoder"].items()), soft_wrap=True
        )
    sections = Table(title="sections", title_justify="left")
    for column in ("tag", "offset", "bytes", "crc32"):
        sections.add_column(column, justify="left" if column == "tag" else "right")
    for tag, offset, size, crc in section_table(program):
        sections.add_row(tag, str(offset), str(size), f"{crc:08x}")
    console.print(sections)
    io = Table(title="entry points and I/O", title_justify="left")
    for column in ("entry", "instructions", "kind", "name", "dtype", "shape", "bytes"):
        io.add_column(column)
    for entry in prog.entries:
        bindings = (prog.io or {}).get(entry["name"], {})
        for kind in ("inputs", "outputs"):
            for b in bindings.get(kind, []):
                shape = "x".join(map(str, b.get("shape", []))) or "scalar"
                row = (
                    entry["name"],
                    entry["count"],
                    kind[:-1],
                    b.get("name"),
                    b.get("dtype"),
                    shape,
                    b.get("bytes"),
                )
                io.add_row(*(str(x) for x in row))
    console.print(io)
    console.print(
        "entries: " + ", ".join(f"{e['name']} (instructions {e['start']}..{e['start'] + e['count'] - 1})"
                                for e in prog.entries)
    )  # fmt: skip
    mm = prog.memory_map or {}
    persistent = [r for r in mm.get("regions", []) if isinstance(r, dict) and r.get("kind") == "persistent"]
    if persistent:
        table = Table(title="persistent buffers (zero at load, kept from run to run)", title_justify="left")
        for column in ("name", "dtype", "shape", "bytes", "dram"):
            table.add_column(column)
        for r in persistent:
            shape = "x".join(map(str, r.get("shape", []))) or "?"
            table.add_row(
                str(r.get("name")), str(r.get("dtype", "?")), shape, str(r["bytes"]), hex(r["dram"])
            )
        console.print(table)
    if prog.host_registers:
        table = Table(title="host registers (--set-reg NAME=VALUE)", title_justify="left")
        for column in ("name", "register", "min", "max", "read by"):
            table.add_column(column)
        for h in prog.host_registers:
            table.add_row(h["name"], f"r{h['reg']}", str(h["min"]), str(h["max"]), ", ".join(h["entries"]))
        console.print(table)
    regions, peak = len(mm.get("regions", [])), mm.get("sram_peak_bytes", "?")
    consts = [b for b in mm.get("buffers", []) if b.get("kind") == "const"]
    shared = sum(len(b.get("users", [])) - 1 for b in consts if b.get("users"))
    console.print(
        f"DRAM {mm.get('dram_size', '?')} bytes in {regions} regions, constants {len(prog.constants)} bytes "
        f"({len(consts)} stored, {shared} shared references), planned SRAM peak {peak} bytes"
    )


@click.command("inspect-model", cls=GuardedCommand)
@click.argument("model", type=click.Path(path_type=Path, dir_okay=False), metavar="MODEL.onnx")
@click.option("--json", "as_json", is_flag=True, help="Print the description as JSON.")
def inspect_model_command(model, as_json):
    """Describe MODEL before compiling: inputs and outputs (dtypes, symbolic dims), opset, op
    histogram with what mcpc supports, initializer bytes and the --dim line to bind its dims."""
    import json

    from mcpc.inspect_model import describe_model, format_model

    info = describe_model(model)
    click.echo(json.dumps(info, indent=2) if as_json else format_model(info), nl=as_json)


@click.command("conformance", cls=GuardedCommand)
@click.option("--ops", help="Comma-separated op types: only tests using one of them.")
@click.option("--test", "tests", multiple=True, help="Run only this test (repeatable).")
@click.option("--compile", "do_compile", is_flag=True, help="Also level 2: fp32 build + simulator.")
@click.option("--target", default="mcp2026-a100", show_default=True, help="Target for --compile.")
@click.option("--json", "json_path", type=click.Path(path_type=Path, dir_okay=False), help="Write results.")
@click.option("-v", "--verbose", is_flag=True, help="Per-op table and every unsupported test's reason.")
def conformance_command(ops, tests, do_compile, target, json_path, verbose):
    """Run the ONNX backend node tests through mcpc (level 1: importer + IR interpreter; level 2
    with --compile: compiled fp32 program on the simulator) and classify each test as pass,
    fail, unsupported or error.  Exits 1 when any test fails or errors."""
    import json

    from rich.console import Console

    from mcpc.conformance import print_summary, report, run_conformance
    from mcpc.driver import write_atomic
    from mcpc.errors import CheckFailed

    target_name = target if do_compile else None
    if target_name is not None:
        from mcpc.driver import load_target

        load_target(target_name)  # a bad target is a usage error before minutes of work
    op_list = [o.strip() for o in ops.split(",") if o.strip()] if ops else None
    results = run_conformance(op_list, target_name, set(tests) or None)
    if json_path is not None:
        write_atomic(json_path, json.dumps(report(results, target_name), indent=1, sort_keys=True) + "\n")
    print_summary(results, Console(), verbose)
    bad = [r.name for r in results if "fail" in (r.level1, r.level2) or "error" in (r.level1, r.level2)]
    if bad:
        raise CheckFailed(f"{len(bad)} node test(s) fail or error: {', '.join(bad[:10])}")
