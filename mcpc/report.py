"""``mcpc report FILES... -o report.html``: one self-contained HTML page from result files.

Each file's kind is recognised by its content (``KINDS``, tried in order), and each kind gives the
figures it can:

* ``ci`` (``mcpc ci --json``): the budgets used per build, the verdict table, memory per build;
* ``profile`` (``mcpc sim run --profile-json``): cycles per ONNX node stacked by engine (load /
  execute / store / idle), the roofline of every node with the target's roofs, the memory
  breakdown;
* ``sweep`` (``mcpc sweep`` JSONL): accuracy against latency with each target's Pareto front, the
  memory breakdown per build, the table of rows (a failed build with its reason);
* ``serve`` (``mcpc sim serve --json``): the latency CDFs of TTFT, TPOT and E2E (from its
  ``per_request`` records), throughput and KV blocks in use over time (from its ``timeline``), the
  summary table.

A decoder build's memory breakdown (a ci row with ``decoder``, a profile of a decoder program)
shows its KV cache (from META decoder) apart from the other persistent regions.  A new kind is
one detector and one renderer added to ``KINDS``.  The page has no script and loads nothing: the
figures are inline SVG (matplotlib, text as paths), the style sheet is inline.
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


def _is_serve(data: Any) -> bool:
    return isinstance(data, dict) and all(
        k in data for k in ("requests", "policy", "ttft_ms", "tpot_ms", "e2e_ms", "kv", "npu")
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
        "JSON of mcpc ci --json, mcpc sim run --profile-json, mcpc sim serve --json, or the JSONL of "
        "mcpc sweep)"
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
        f"utilisation {html.escape(eng)}; {p['roofline']['bound']}-bound{_roofline_note(p['roofline'])}.</p>",
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
        kv = plots.kv_pool_bytes(p["decoder"]) if isinstance(p.get("decoder"), dict) else None
        said = "" if kv is None else f", of which the KV cache {kv:,} (META decoder)"
        out.append(
            _figure(
                plots.memory_breakdown(
                    [(p["target"], plots.with_kv(p["memory"]["bytes_per_kind"], p.get("decoder")))]
                ),
                f"Planned NPU DRAM: {p['memory']['peak_bytes']:,} bytes{said}.",
                "memory",
            )
        )
    return out


def _render_serve(source: str, r: dict) -> list[str]:
    from mcpc import report_plots as plots

    kv = r["kv"]
    out = [
        f"<p>{r['requests']:,} requests, policy {html.escape(str(r['policy']))}: "
        f"{r['throughput_tokens_per_s']:,.1f} tokens/s over {r['duration_s']:.4g} s of virtual time, "
        f"KV peak {kv['peak_blocks']:,} of {kv['blocks']:,} blocks, {kv['preemptions']:,} preemption(s).</p>"
    ]
    if r.get("per_request"):
        out.append(
            _figure(
                plots.latency_cdfs(r["per_request"]),
                "Fraction of requests served within a latency: time to first token, time per output "
                "token (requests of two or more tokens), arrival to last token.",
                "latency-cdf",
            )
        )
    else:
        out.append(
            "<p>No per-request records in this file (written by an older mcpc): run mcpc sim serve "
            "--json again for the latency CDFs.</p>"
        )
    timeline = r.get("timeline")
    if timeline and timeline.get("t_s"):
        out.append(
            _figure(
                plots.serving_timeline(timeline, kv.get("blocks")),
                "Generated tokens per second in equal spans of the run, and the KV blocks referenced "
                "by live sequences after each iteration.",
                "serving-timeline",
            )
        )
    rows = [
        [name, *(_num(r[key].get(q), ".4g") for q in ("mean", "p50", "p90", "p99", "max"))]
        for key, name in (
            ("ttft_ms", "TTFT ms"),
            ("tpot_ms", "TPOT ms"),
            ("itl_ms", "ITL ms"),
            ("e2e_ms", "E2E ms"),
            ("queue_ms", "queue ms"),
        )  # fmt: skip
        if isinstance(r.get(key), dict)
    ]
    out.append(_table(["latency", "mean", "p50", "p90", "p99", "max"], rows))
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
    ppl = any("perplexity" in (r.get("metrics") or {}) for r in rows)
    if ppl:  # decoder builds: eval-ppl's perplexity and ONNX Runtime's on the same windows
        cols[-1:-1] = ["perplexity", "ORT fp32", "change %"]
    body, classes = [], []
    for r in rows:
        m = r.get("metrics") or {}
        row = [
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
        ]
        if ppl:
            row += [_num(m.get("perplexity"), ".6g"), _num(m.get("ref_perplexity"), ".6g"),
                    _num(m.get("ppl_change_pct"), "+.4f")]  # fmt: skip
        body.append([*row, r.get("reason") or ""])
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
                plots.memory_breakdown(
                    [(b["name"], plots.with_kv(b["memory"], b.get("decoder"))) for b in ok]
                ),
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
    Kind("serve", _is_serve, _render_serve),
]
_TITLES = {"ci": "CI checks", "profile": "simulated run", "sweep": "sweep", "serve": "serving"}

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


def _roofline_note(roof: dict) -> str:
    """The roofline beside the bound (a profile from before the compulsory bytes has none)."""
    if "roofline_cycles" not in roof:
        return ""
    text = (
        f" ({roof['roofline_ratio']:.2f}× the roofline of {roof['roofline_cycles']:,.0f} cycles: "
        f"MACs ÷ peak, compulsory DRAM bytes {roof['compulsory_dram_bytes']:,} ÷ bandwidth"
    )
    if roof.get("bound") == "latency":
        text += f"; {roof['bound_reason']}"
    return html.escape(text + ")")
