"""What ``mcpc ci`` prints and writes for people and CI systems, from its result document
(``mcpc.ci.result_document``): the console tables, JUnit XML, GitHub Actions annotations.

JUnit: one ``<testsuite>`` per build, one ``<testcase>`` per budget (plus the ``numerics`` case
and, with a baseline, one ``regression:<metric>`` case per tracked metric); a failed case carries
a ``<failure>`` whose message says measured against limit.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

from mcpc.ci import BUDGETS, _fmt


def cases(build: dict) -> list[dict[str, Any]]:
    """The build's verdicts, budgets first, then its baseline comparisons as cases."""
    out = [dict(v) for v in build["budgets"]]
    for r in build.get("regressions", []):
        out.append(
            dict(
                case=f"regression:{r['metric']}",
                passed=not r["regressed"],
                message=f"{r['metric']} {r['old']:.6g} -> {r['new']:.6g} ({r['delta_pct']:+.2f} %, "
                f"limit {r['limit_pct']:g} %)",
            )
        )
    return out


def junit_xml(doc: dict) -> bytes:
    """The document as JUnit XML (the schema Jenkins, GitLab and GitHub test reporters read)."""
    suites = ET.Element("testsuites", name="mcpc ci")
    total = failed = 0
    for build in doc["builds"]:
        build_cases = cases(build)
        fails = sum(not c["passed"] for c in build_cases)
        seconds = (build.get("metrics") or {}).get("compile_s", 0) + (build.get("metrics") or {}).get(
            "sim_s", 0
        )
        suite = ET.SubElement(
            suites,
            "testsuite",
            name=build["name"],
            tests=str(len(build_cases)),
            failures=str(fails),
            errors="0",
            skipped="0",
            time=f"{seconds:.3f}",
        )
        for c in build_cases:
            case = ET.SubElement(suite, "testcase", classname=f"mcpc.ci.{build['name']}", name=c["case"])
            if not c["passed"]:
                failure = ET.SubElement(case, "failure", message=c["message"], type="budget")
                failure.text = f"{build['name']}: {c['case']}: {c['message']}"
            else:
                ET.SubElement(case, "system-out").text = c["message"]
        total += len(build_cases)
        failed += fails
    suites.set("tests", str(total))
    suites.set("failures", str(failed))
    ET.indent(suites)
    return ET.tostring(suites, encoding="utf-8", xml_declaration=True) + b"\n"


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def github_annotations(doc: dict) -> list[str]:
    """``::error`` workflow commands, one per failed case, pointing at the build's line."""
    lines = []
    for build in doc["builds"]:
        for c in cases(build):
            if c["passed"]:
                continue
            title = _escape_property(f"mcpc ci: {build['name']}: {c['case']}")
            where = f"file={_escape_property(doc['checks_file'])},line={build.get('line') or 1}"
            lines.append(f"::error {where},title={title}::{_escape_data(c['message'])}")
    return lines


def print_tables(doc: dict, console) -> None:
    """The budgets table (a failing budget in red with its measured value and limit) and, with a
    baseline, the deltas."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"mcpc ci: {doc['checks_file']}", title_justify="left")
    for column, justify in [
        ("build", "left"),
        ("budget", "left"),
        ("measured", "right"),
        ("limit", "right"),
        ("result", "left"),
    ]:
        table.add_column(column, justify=justify, overflow="fold")
    for build in doc["builds"]:
        for i, v in enumerate(build["budgets"]):
            unit = BUDGETS[v["case"]][2] if v["case"] in BUDGETS else ""
            measured = "" if v["measured"] is None else _fmt(v["measured"], unit)
            limit = "" if v["limit"] is None else _fmt(v["limit"], unit)
            result = (
                Text("ok", style="green") if v["passed"] else Text(f"FAIL: {v['message']}", style="bold red")
            )
            last = i == len(build["budgets"]) - 1
            table.add_row(
                build["name"] if i == 0 else "", v["case"], measured, limit, result, end_section=last
            )
    console.print(table)
    deltas = [r for b in doc["builds"] for r in b.get("regressions", [])]
    if deltas:
        t = Table(title="against the baseline", title_justify="left")
        for column in ("build", "metric", "baseline", "now", "delta", "limit", "result"):
            t.add_column(column, justify="left" if column in ("build", "metric", "result") else "right")
        for r in deltas:
            result = Text("REGRESSED", style="bold red") if r["regressed"] else Text("ok", style="green")
            t.add_row(
                r["build"],
                r["metric"],
                f"{r['old']:.6g}",
                f"{r['new']:.6g}",
                f"{r['delta_pct']:+.2f} %",
                f"{r['limit_pct']:g} %",
                result,
            )
        console.print(t)
    n_fail = sum(not c["passed"] for b in doc["builds"] for c in cases(b))
    n_all = sum(len(cases(b)) for b in doc["builds"])
    verdict = Text(f"{n_all - n_fail} passed, {n_fail} failed", style="green" if not n_fail else "bold red")
    console.print(Text.assemble("mcpc ci: ", verdict, f" ({len(doc['builds'])} builds)"))
