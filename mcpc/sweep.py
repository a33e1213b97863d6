"""``mcpc sweep``: one model over a grid of QAT configs × targets, one JSONL row per build.

Rows are ``mcpc.measure.measure_build`` rows (accuracy, latency, memory, bytes, or the reason a
build could not run) plus ``config`` and ``kind: "mcpc-sweep"``.  The file is the sweep's state:
each row is appended and flushed as soon as its build finishes, and a build whose ``key`` (a
digest of the spec and the contents of the files it names) is already in the file is not run
again, so an interrupted sweep resumes where it stopped.  A last line cut short by the
interruption is dropped when resuming.
"""

from __future__ import annotations

import fnmatch
import glob
import json
import os
from collections.abc import Sequence
from pathlib import Path

from mcpc.errors import ConfigError, InputError, McpcError, UsageError
from mcpc.measure import BuildSpec

ROW_KIND = "mcpc-sweep"


def resolve_configs(patterns: str | None) -> list[str]:
    """Config references from a comma-separated list of shipped names, paths and globs (a glob is
    tried on files first, then on the shipped config names); None = every shipped config."""
    from mcpc.qat_configs.schema import shipped_configs

    shipped = shipped_configs()
    if patterns is None:
        return [Path(n).stem for n in shipped]
    out: list[str] = []
    for item in (p.strip() for p in patterns.split(",")):
        if not item:
            continue
        if glob.has_magic(item):
            found = sorted(glob.glob(item)) or [
                Path(n).stem
                for n in shipped
                if fnmatch.fnmatch(n, item) or fnmatch.fnmatch(Path(n).stem, item)
            ]
            if not found:
                raise UsageError(
                    f"--configs {item!r} matches no file and no shipped config ({', '.join(shipped)})"
                )
            out.extend(found)
        elif Path(item).is_file() or f"{item.removesuffix('.yaml')}.yaml" in shipped:
            out.append(item)
        else:
            raise UsageError(
                f"--configs {item!r}: no such file and not a shipped config ({', '.join(shipped)})"
            )
    if not out:
        raise UsageError("--configs names no config")
    return list(dict.fromkeys(out))


def grid(
    model: str,
    configs: Sequence[str],
    targets: Sequence[str],
    dims: dict | None = None,
    inputs: str = "random",
    seed: int = 0,
    calib: str | None = None,
    overrides: Sequence[str] = (),
) -> list[BuildSpec]:
    """One BuildSpec per (config, target), named ``config@target``.  ``calib`` goes to the configs
    that quantize (a ``quantization:`` section); a float config compiles without it (the compiler
    refuses calibration data a config would ignore)."""
    if not targets:
        raise UsageError("--targets names no target")
    return [
        BuildSpec(
            name=f"{Path(c).stem}@{Path(t).stem}",
            model=model,
            target=t,
            qat_config=c,
            dims=dict(dims or {}),
            inputs=inputs,
            seed=seed,
            calib=calib if calib is not None and _quantizes(c) else None,
            overrides=tuple(overrides),
        )
        for c in configs
        for t in targets
    ]


def _quantizes(config: str) -> bool:
    """Whether ``config`` has a ``quantization:`` section; True for a config that does not load (its
    build then fails with the config's own error, calibration data or not)."""
    from mcpc.qat_configs.schema import load_config

    try:
        return load_config(config).quantization is not None
    except McpcError:
        return True


def read_rows(path: Path) -> list[dict]:
    """The complete rows of a sweep file; a cut-short last line is dropped (and the file truncated
    to the rows kept), any other unreadable line is an InputError naming the line."""
    if not path.exists():
        return []
    rows, good_bytes = [], 0
    with open(path, "rb") as f:
        lines = f.readlines()
    for i, raw in enumerate(lines):
        try:
            row = json.loads(raw)
            if not isinstance(row, dict) or "key" not in row:
                raise ValueError("not a sweep row")
        except ValueError as exc:
            if i == len(lines) - 1 and not raw.endswith(b"\n"):  # interrupted while writing it
                with open(path, "r+b") as f:
                    f.truncate(good_bytes)
                break
            raise InputError(
                f"{path}:{i + 1}: not a sweep result line ({exc}); use another -o file"
            ) from None
        rows.append(row)
        good_bytes += len(raw)
    return rows


def run_sweep(
    specs: Sequence[BuildSpec], out: Path, jobs: int = 1, ray_address: str | None = None, progress=None
) -> tuple[list[dict], int, list]:
    """Run the specs not yet in ``out``; returns (all rows of the grid, how many were resumed, lost
    builds).  ``progress(n_done, n_total, row)`` is called after each build."""
    from mcpc.executor import run_builds

    if out.parent and not out.parent.is_dir():
        raise InputError(f"{out}: output directory {str(out.parent)!r} does not exist")
    previous = {r["key"]: r for r in read_rows(out)}
    keys = {s.name: s.key() for s in specs}
    todo = [s for s in specs if keys[s.name] not in previous]
    rows = [previous[keys[s.name]] for s in specs if keys[s.name] in previous]
    total, count = len(specs), len(rows)
    if progress is not None:
        progress(count, total, None)
    by_name = {s.name: s for s in specs}

    with open(out, "a", encoding="utf-8") as f:

        def on_row(row: dict) -> None:
            nonlocal count
            row["kind"] = ROW_KIND
            row["config"] = Path(by_name[row["name"]].qat_config).stem
            f.write(json.dumps(row, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
            rows.append(row)
            count += 1
            if progress is not None:
                progress(count, total, row)

        outcome = run_builds(todo, jobs=jobs, ray_address=ray_address, on_row=on_row)
    return rows, total - len(todo), outcome.lost


def check_targets(targets: Sequence[str]) -> None:
    """Every target must load (a typo fails before hours of builds); ConfigError otherwise."""
    from mcpc.driver import load_target

    for t in targets:
        try:
            load_target(t)
        except ConfigError as err:
            raise UsageError(f"--targets {t}: {err.message}") from None
