"""``mcpc report FILES... -o report.html``: one self-contained HTML page from result files.

Each file's kind is recognised by its content (``KINDS``, tried in order), and each kind gives the
figures it can:

* ``ci`` (``mcpc ci --json``): the budgets used per build, the verdict table, memory per build;
* ``profile`` (``mcpc sim run --profile-json``): cycles per ONNX node stacked by engine (load /
  execute / store / idle), the roofline of every node with the target's roofs, the memory
  breakdown;
* ``sweep`` (``mcpc sweep`` JSONL): accuracy against latency with each target's Pareto front, the
  memory breakdown per build, the table of rows (a failed build with its reason).

A new kind (the serving simulator's results, say) is one detector and one renderer added to
``KINDS``.  The page has no script and loads nothing: the figures are inline SVG (matplotlib,
text as paths), the style sheet is inline.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcpc.errors import InputError


@dataclass(frozen=True)
class Kind:
    name: str
    detect: Callable[[Any], bool]
    render: Callable[[str, Any], list[str]]


def _is_ci(data: Any) -> bool:
    return (
        isinstance(data, dict)
        and isinstance(data.get("builds"), list)
        and (data.get("kind") == "mcpc-ci" or all("budgets" in b for b in data["builds"]))
    )


def _is_profile(data: Any) -> bool:
    return isinstance(data, dict) and all(k in data for k in ("cycles", "nodes", "engines", "roofline"))


def _is_sweep(data: Any) -> bool:
    return (
        isinstance(data, list)
        and bool(data)
        and all(isinstance(r, dict) and "key" in r and "status" in r for r in data)
    )


def load(path: str | Path) -> tuple[str, Any]:
    """(kind name, data) of a result file: JSON or JSON lines; InputError naming the file when it
    is unreadable or of no known kind."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read ({exc})") from None
    try:
        data: Any = json.loads(text)
    except ValueError:
        try:
            data = [json.loads(line) for line in text.splitlines() if line.strip()]
        except ValueError as exc:
            raise InputError(f"{path}: neither JSON nor JSON lines ({exc})") from None
    for kind in KINDS:
        if kind.detect(data):
            return kind.name, data
    raise InputError(
        f"{path}: not a result mcpc report knows (expected one of: {', '.join(k.name for k in KINDS)}: the "
        "JSON of mcpc ci --json, mcpc sim run --profile-json, or the JSONL of mcpc sweep)"
    )


# -- HTML pieces -----------------------------------------------------------------------------------


def _figure(svg: str, caption: str, kind: str) -> str:
    caption = f"<figcaption>{html.escape(caption)}</figcaption>"
    return f'<figure class="plot" data-kind="{kind}">{svg}{caption}</figure>'


def _table(columns: list[str], rows: list[list[Any]], classes: list[str] | None = None) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        body.append(f"<tr{cls}>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _num(v: Any, fmt: str = ",.0f") -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    return format(v, fmt)


def _render_profile(source: str, p: dict) -> list[str]:
    from mcpc import report_plots as plots

    if p["nodes"] and not all("engine_cycles" in n and "idle" in n for n in p["nodes"]):
        raise InputError(
            f"{source}: this profile has no per-node engine cycles (written by an older mcpc): "
            "run mcpc sim run --profile-json again"
        )

    roof_svg, without = plots.roofline(p)
    eng = ", ".join(
        f"{plots.ENGINE_LABELS.get(k, k)} {v['utilization']:.0%}" for k, v in p["engines"].items()
    )
    out = [
        f"<p>{html.escape(p['target'])}, entry {html.escape(str(p.get('entry')))}: {p['cycles']:,} cycles "
        f"({p['latency_us']:.4g} µs), {p['instructions']:,} instructions, {p['macs']:,} MACs; engine "
        f"utilisation {html.escape(eng)}; {p['roofline']['bound']}-bound.</p>",
        _figure(
            plots.node_breakdown(p),
            "Busy cycles of each node's instructions per engine, and the cycles "
            "of its span in which none of them was busy (waiting on DRAM latency or a producer).",
            "node-breakdown",
        ),
        _figure(
            roof_svg,
            f"Each node with MACs; {without} node(s) without MACs or DRAM traffic (vector, "
            "data movement) are not on a MAC roofline.",
            "roofline",
        ),
    ]
    if p.get("memory"):
        out.append(
            _figure(
                plots.memory_breakdown([(p["target"], p["memory"]["bytes_per_kind"])]),
                f"Planned NPU DRAM: {p['memory']['peak_bytes']:,} bytes.",
                "memory",
            )
        )
    return out


def _row_table(rows: list[dict], first: str) -> str:
    cols = [
        first,
        "target",
        "config",
        "status",
        "latency µs",
        "cycles",
        "peak DRAM B",
        ".mcpb B",
        "min cosine",
        "max norm err",
        "reason",
    ]
    body, classes = [], []
    for r in rows:
        m = r.get("metrics") or {}
        body.append(
            [
                r["name"],
                r["target"],
                r.get("config") or r["qat_config"],
                r["status"],
                _num(m.get("latency_us"), ".4g"),
                _num(m.get("cycles")),
                _num(m.get("peak_memory_bytes")),
                _num(m.get("mcpb_bytes")),
                _num(m.get("min_cosine"), ".7f"),
                _num(m.get("max_norm_err"), ".3g"),
                r.get("reason") or "",
            ]
        )
        classes.append("" if r["status"] == "ok" else "fail")
    return _table(cols, body, classes)


def _render_sweep(source: str, rows: list[dict]) -> list[str]:
    from mcpc import report_plots as plots

    rows = sorted(rows, key=lambda r: (r["target"], r["name"]))
    ok = [r for r in rows if r["status"] == "ok"]
    models = sorted({Path(r["model"]).name for r in rows})
    out = [
        f"<p>{len(rows)} builds of {html.escape(', '.join(models))}: {len(ok)} ran, "
        f"{len(rows) - len(ok)} could not (reasons in the table).</p>"
    ]
    if ok:
        out.append(
            _figure(
                plots.pareto(ok),
                "Lower left is better. A build is on its target's front when no "
                "other build on that target is both faster and more accurate.",
                "pareto",
            )
        )
        out.append(
            _figure(
                plots.memory_breakdown([(r["name"], r["memory"]) for r in ok]),
                "NPU DRAM per build, by memory-map region kind.",
                "memory",
            )
        )
    out.append(_row_table(rows, "build"))
    return out


def _render_ci(source: str, doc: dict) -> list[str]:
    from mcpc import report_plots as plots
    from mcpc.ci_output import cases

    builds = doc["builds"]
    n_fail = sum(not c["passed"] for b in builds for c in cases(b))
    verdict = "passed" if doc.get("passed") else f"failed ({n_fail} case(s))"
    out = [f"<p>{html.escape(str(doc.get('checks_file', source)))}: {len(builds)} builds, {verdict}.</p>"]
    if any(v["measured"] is not None for b in builds for v in b["budgets"]):
        out.append(_figure(plots.budgets(doc), "Measured value against each budget's limit.", "budgets"))
    ok = [b for b in builds if b.get("status") == "ok"]
    if ok:
        out.append(
            _figure(
                plots.memory_breakdown([(b["name"], b["memory"]) for b in ok]),
                "NPU DRAM per build, by memory-map region kind.",
                "memory",
            )
        )
    rows, classes = [], []
    for b in builds:
        for c in cases(b):
            rows.append([b["name"], c["case"], "ok" if c["passed"] else "FAIL", c["message"]])
            classes.append("" if c["passed"] else "fail")
    out.append(_table(["build", "case", "result", "detail"], rows, classes))
    out.append(_row_table(builds, "build"))
    return out


KINDS = [
    Kind("ci", _is_ci, _render_ci),
    Kind("profile", _is_profile, _render_profile),
    Kind("sweep", _is_sweep, _render_sweep),
]
_TITLES = {"ci": "CI checks", "profile": "simulated run", "sweep": "sweep"}

_STYLE = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:2em auto;max-width:1100px;color:#222;
padding:0 1em}
h1{font-size:1.6em}h2{font-size:1.25em;border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
figure.plot{margin:1em 0}figure.plot svg{max-width:100%;height:auto}
figcaption{font-size:.85em;color:#555}
table{border-collapse:collapse;font-size:.8em;margin:1em 0}
th,td{border:1px solid #ddd;padding:.2em .5em;text-align:left}th{background:#f4f4f4}
tr.fail td{background:#fde8e8}
"""


def render(sources: list[tuple[str, str, Any]], title: str = "mcpc report") -> str:
    """The page for ``(source name, kind, data)`` triples, one section each."""
    from mcpc import __version__

    sections = []
    for source, kind_name, data in sources:
        kind = next(k for k in KINDS if k.name == kind_name)
        body = "\n".join(kind.render(source, data))
        sections.append(
            f'<section class="source" data-kind="{kind.name}"><h2>{_TITLES[kind.name]}: '
            f"{html.escape(source)}</h2>\n{body}</section>"
        )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>"
        f"<h1>{html.escape(title)}</h1><p>mcpc {__version__}</p>\n"
        + "\n".join(sections)
        + "\n</body></html>\n"
    )


def write_report(paths: list[str | Path], output: str | Path) -> int:
    """Render ``paths`` into ``output`` (atomically); returns the file's size in bytes."""
    from mcpc.fileio import write_atomic

    sources = [(Path(p).name, *load(p)) for p in paths]
    text = render(sources)
    write_atomic(output, text)
    return len(text.encode("utf-8"))


def write_profile_report(profile: dict, source: str, output: str | Path) -> int:
    """The report of one simulated run (``mcpc sim run --report``)."""
    from mcpc.fileio import write_atomic

    text = render([(source, "profile", profile)], title=f"mcpc report: {source}")
    write_atomic(output, text)
    return len(text.encode("utf-8"))
