"""The mcpc subcommands for many builds at once: ``ci`` (budgets and baselines over a checks file),
``sweep`` (a model over configs × targets, resumable, local pool or Ray) and ``report`` (HTML from
their results and from profiles).  The work is in ``mcpc.ci``, ``mcpc.sweep``, ``mcpc.report``;
``mcpc.cli`` registers these commands.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from mcpc.cli_guard import GuardedCommand, _stderr_console, _stdout_console
from mcpc.errors import EXIT_CHECK_FAILED, UsageError


def _targets(ctx, param, value: str) -> list[str]:
    items = [t.strip() for t in value.split(",") if t.strip()]
    if not items:
        raise click.BadParameter("give at least one target", param=param)
    return items


@click.command("ci", cls=GuardedCommand)
@click.argument("checks", type=click.Path(path_type=Path, dir_okay=False), metavar="CHECKS.yaml")
@click.option("--junit", type=click.Path(path_type=Path, dir_okay=False), help="Write JUnit XML here.")
@click.option(
    "--json", "json_path", type=click.Path(path_type=Path, dir_okay=False), help="Write the results."
)
@click.option("--github", is_flag=True, help="Print GitHub Actions ::error annotations for failed cases.")
@click.option(
    "--baseline",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Fail on a regression beyond the checks file's regression_pct against this result JSON.",
)
@click.option("--update-baseline", is_flag=True, help="Write this run's results to --baseline instead.")
@click.option(
    "-j", "--jobs", type=click.IntRange(min=1), default=1, show_default=True, help="Parallel builds."
)
@click.option(
    "--work-dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="Where bundled examples are written (default: a temporary directory).",
)
def ci_command(checks, junit, json_path, github, baseline, update_baseline, jobs, work_dir):
    """Compile, simulate and check every build of CHECKS.yaml against its budgets.

    Exit 0 when every budget holds (and, with --baseline, nothing regressed), 1 when one fails;
    3 for a checks file that is invalid (naming the file, line and key).
    """
    import tempfile

    from mcpc import ci, ci_output
    from mcpc.executor import run_builds
    from mcpc.fileio import write_atomic

    if update_baseline and baseline is None:
        raise UsageError("--update-baseline writes the file given with --baseline: give --baseline PATH")
    with tempfile.TemporaryDirectory(prefix="mcpc-ci-") as tmp:
        checks_doc = ci.load_checks(checks, Path(work_dir or tmp) / "examples")
        old = ci.read_baseline(baseline) if baseline is not None and not update_baseline else None
        err = _stderr_console()
        err.print(f"mcpc ci: {len(checks_doc.builds)} builds from {checks}", highlight=False)
        outcome = run_builds(
            [b.spec for b in checks_doc.builds],
            jobs=jobs,
            on_row=lambda r: err.print(f"  {r['name']}: {r['status']}", highlight=False),
        )
    _no_lost(outcome.lost, "mcpc ci")
    rows = {r["name"]: r for r in outcome.rows}
    regressions = ci.compare_baseline(list(rows.values()), old, checks_doc.regression_pct) if old else []
    doc = ci.result_document(checks_doc, checks_doc.builds, rows, regressions)
    ci_output.print_tables(doc, _wide_console())
    if old is not None:
        known = {b["name"] for b in old["builds"]}
        new = [b.spec.name for b in checks_doc.builds if b.spec.name not in known]
        if new:
            click.echo(f"not in the baseline (no deltas): {', '.join(new)}")
    text = json.dumps(doc, indent=1, sort_keys=True) + "\n"
    if json_path is not None:
        write_atomic(json_path, text)
    if update_baseline:
        write_atomic(baseline, text)
        click.echo(f"wrote baseline {baseline}")
    if junit is not None:
        write_atomic(junit, ci_output.junit_xml(doc))
    if github:
        for line in ci_output.github_annotations(doc):
            click.echo(line)
    if not doc["passed"]:
        sys.exit(EXIT_CHECK_FAILED)


def _no_lost(lost, what: str) -> None:
    from mcpc.errors import InternalError

    if lost:
        names = ", ".join(spec.name for spec, _ in lost)
        raise InternalError(f"{what}: {len(lost)} build(s) produced no result ({names}): {lost[0][1]}")


@click.command("sweep", cls=GuardedCommand)
@click.argument("model", type=click.Path(path_type=Path, dir_okay=False), metavar="MODEL.onnx")
@click.option(
    "--configs",
    default=None,
    metavar="A,B,GLOB",
    help="QAT configs: shipped names, paths or globs, comma-separated (default: every shipped config).",
)
@click.option(
    "--targets",
    default="mcp2026-a100,mcp2026-a10,mcp2026-edge",
    show_default=True,
    callback=_targets,
    metavar="A,B,C",
    help="Targets: shipped names or YAML paths.",
)
@click.option("--dim", "dims", multiple=True, metavar="NAME=128", help="Bind a symbolic dim (repeatable).")
@click.option(
    "--inputs",
    default="random",
    show_default=True,
    metavar="IN.npz|random",
    help="Inputs every build is checked on against ONNX Runtime.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of random inputs.")
@click.option(
    "--calib", type=click.Path(path_type=Path, exists=True), help="Calibration data for the configs."
)
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a target field.")
@click.option(
    "-j",
    "--jobs",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Parallel builds (local processes; with --ray-address, CPUs of a local Ray).",
)
@click.option(
    "--ray-address",
    metavar="ADDR",
    help="Run the builds on Ray: HOST:PORT of a cluster, 'auto', or 'local' (needs mcpc[ray]).",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Results JSONL, also the resume state (default: MODEL.sweep.jsonl here).",
)
def sweep_command(model, configs, targets, dims, inputs, seed, calib, overrides, jobs, ray_address, output):
    """Build MODEL for every QAT config x target; one JSONL row per build.

    Each row holds accuracy against ONNX Runtime, simulated latency, memory and .mcpb bytes, or
    the reason the build could not run. Builds already in the output file are not redone.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from mcpc import sweep
    from mcpc.cli import _parse_dims, _parse_sets
    from mcpc.errors import InputError

    if not model.is_file():
        raise InputError(f"{model}: no such model file")
    if inputs != "random" and not Path(inputs).is_file():
        raise InputError(f"--inputs {inputs}: no such file (give an .npz, or 'random')")
    dim_map = _parse_dims(None, None, dims) or {}
    _parse_sets(None, None, overrides)
    sweep.check_targets(targets)
    specs = sweep.grid(
        str(model),
        sweep.resolve_configs(configs),
        targets,
        dim_map,
        inputs,
        seed,
        str(calib) if calib else None,
        overrides,
    )
    output = output or Path(f"{model.stem}.sweep.jsonl")
    err = _stderr_console()
    with Progress(
        TextColumn("sweep"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
        console=err,
        transient=False,
    ) as bar:
        task = bar.add_task("", total=len(specs))

        def progress(done, total, row):
            text = "" if row is None else f"{row['name']}: {row['status']}"
            bar.update(task, completed=done, description=text)

        rows, resumed, lost = sweep.run_sweep(
            specs, output, jobs=jobs, ray_address=ray_address, progress=progress
        )
    _print_sweep(rows, resumed, output)
    _no_lost(lost, "mcpc sweep (run the same command again to resume)")


def _print_sweep(rows, resumed, output) -> None:
    from rich.table import Table
    from rich.text import Text

    table = Table(
        title=f"sweep: {output}" + (f" ({resumed} resumed)" if resumed else ""), title_justify="left"
    )
    for column in ("build", "latency µs", "peak DRAM B", ".mcpb B", "min cosine", "max norm err", "status"):
        table.add_column(
            column, justify="left" if column in ("build", "status") else "right", overflow="fold"
        )
    for r in sorted(rows, key=lambda r: r["name"]):
        m = r.get("metrics") or {}
        if r["status"] == "ok":
            table.add_row(
                r["name"],
                f"{m['latency_us']:.4g}",
                f"{m['peak_memory_bytes']:,}",
                f"{m['mcpb_bytes']:,}",
                f"{m['min_cosine']:.7f}",
                f"{m['max_norm_err']:.3g}",
                Text("ok", style="green"),
            )
        else:
            table.add_row(
                r["name"], "", "", "", "", "", Text(f"exit {r['exit_code']}: {r['reason']}", style="red")
            )
    _wide_console().print(table)


def _wide_console():
    """stdout; a CI log is no terminal, and rich's 80 columns would fold every name there."""
    console = _stdout_console()
    if not console.is_terminal:
        console.width = max(console.width, 160)
    return console


@click.command("report", cls=GuardedCommand)
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path, dir_okay=False))
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="The HTML file to write.",
)
def report_command(files, output):
    """One self-contained HTML report from FILES: mcpc ci --json results, sim run --profile-json
    profiles and sweep JSONL, each recognised by its content."""
    from mcpc.report import write_report

    size = write_report(list(files), output)
    click.echo(f"wrote {output} ({size:,} bytes)")
