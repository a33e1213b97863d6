"""The report's figures, drawn by matplotlib (its object API, no pyplot state) as inline SVG.

Each function takes the data of one result kind and returns an SVG string (fonts as paths: the
file needs no font and no network to display).  ``pareto_front`` is the one computation here
that is not drawing: the builds no other build beats on both latency and error.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence

ENGINE_LABELS = {"LD": "load", "EX": "execute", "ST": "store"}
ENGINE_COLORS = {"LD": "#4c78a8", "EX": "#f58518", "ST": "#54a24b", "idle": "#d3d3d3"}
# memory-map region kinds grouped the way a user reads memory; kinds not listed keep their own name
MEMORY_GROUPS = {
    "const": "weights",
    "persistent": "KV / persistent",
    "kv": "KV / persistent",
    "scratch": "activations",
    "input": "inputs",
    "output": "outputs",
}
MEMORY_COLORS = {
    "weights": "#4c78a8",
    "KV / persistent": "#e45756",
    "activations": "#f58518",
    "inputs": "#72b7b2",
    "outputs": "#54a24b",
}
TARGET_MARKERS = "osD^v<>ph*"
_count = 0


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    return fig


def _svg(fig) -> str:
    import matplotlib

    global _count
    _count += 1
    buf = io.StringIO()
    # a salt per figure keeps the clip-path ids of several SVGs in one page distinct
    with matplotlib.rc_context({"svg.hashsalt": f"mcpc-fig-{_count}", "svg.fonttype": "path"}):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": "mcpc"})
    text = buf.getvalue()
    text = text[text.index("<svg") :]
    # the RDF metadata block is of no use inline (and names vocabularies by URL)
    return re.sub(r"\s*<metadata>.*?</metadata>", "", text, count=1, flags=re.S)


def node_breakdown(profile: dict, top: int = 30) -> str:
    """Stacked horizontal bars: each ONNX node's load / execute / store busy cycles and its idle
    cycles (its span covered by none of its instructions), the ``top`` nodes by span."""
    nodes = sorted(profile["nodes"], key=lambda n: -n["span"])[:top][::-1]
    fig = _figure(9, 0.28 * len(nodes) + 1.4)
    ax = fig.add_subplot()
    names = [n["name"] for n in nodes]
    left = [0] * len(nodes)
    for key in ("LD", "EX", "ST", "idle"):
        values = [n["idle"] if key == "idle" else n["engine_cycles"].get(key, 0) for n in nodes]
        ax.barh(names, values, left=left, color=ENGINE_COLORS[key], label=ENGINE_LABELS.get(key, key))
        left = [a + b for a, b in zip(left, values, strict=True)]
    ax.set_xlabel("cycles (engine busy, then idle within the node's span)")
    ax.set_title(
        f"cycles per ONNX node, {profile['target']} (top {len(nodes)} of {len(profile['nodes'])} by span)"
    )
    ax.tick_params(axis="y", labelsize=7)
    ax.legend(loc="lower right", fontsize=8)
    return _svg(fig)


def roofline(profile: dict) -> tuple[str, int]:
    """Every node with MACs at (MACs per DRAM byte, MACs per cycle over its span) under the target's
    compute roof (peak MACs/cycle of the run's main dtype) and DRAM roof (bytes/cycle × intensity);
    the whole run as a star.  Returns the SVG and how many nodes had no MACs (vector and data
    movement nodes, which have no place on a MAC roofline)."""
    roof = profile["roofline"]
    peak, bw = roof["peak_macs_per_cycle"], roof["peak_dram_bytes_per_cycle"]
    points = [
        (n["macs"] / n["dram_bytes"], n["macs"] / max(n["span"], 1), n)
        for n in profile["nodes"]
        if n["macs"] > 0 and n["dram_bytes"] > 0
    ]
    without = sum(1 for n in profile["nodes"] if n["macs"] == 0 or n["dram_bytes"] == 0)
    fig = _figure(8, 5)
    ax = fig.add_subplot()
    xs = [p[0] for p in points] or [1.0]
    run_bytes = profile["dram_read_bytes"] + profile["dram_write_bytes"]
    run_x = profile["macs"] / run_bytes if run_bytes and profile["macs"] else None
    lo = min(xs + ([run_x] if run_x else [])) / 4
    hi = max(xs + [peak / bw if bw else 1.0] + ([run_x] if run_x else [])) * 4
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.plot(
        grid,
        [min(peak, bw * x) for x in grid],
        color="black",
        lw=1.5,
        label=f"roof: {peak:,} MACs/cycle ({roof['peak_dtype']}), {bw:.4g} DRAM B/cycle",
    )
    if points:
        ax.scatter(
            [p[0] for p in points],
            [p[1] for p in points],
            s=18,
            color="#4c78a8",
            alpha=0.8,
            label=f"ONNX nodes with MACs ({len(points)})",
        )
        for x, y, n in sorted(points, key=lambda p: -p[2]["macs"])[:6]:
            ax.annotate(n["name"], (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    if run_x:
        ax.scatter(
            [run_x],
            [roof["achieved_macs_per_cycle"]],
            marker="*",
            s=160,
            color="#e45756",
            label="whole run",
            zorder=3,
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (MACs per DRAM byte)")
    ax.set_ylabel("achieved MACs per cycle (over the node's span)")
    ax.set_title(f"roofline, {profile['target']} ({roof['bound']}-bound run)")
    ax.legend(fontsize=8, loc="lower right")
    return _svg(fig), without


def memory_breakdown(entries: Sequence[tuple[str, dict]]) -> str:
    """One stacked horizontal bar per (label, bytes_per_kind): weights / KV / activations / I/O."""
    groups: list[str] = []
    data = []
    for label, per_kind in entries:
        grouped: dict[str, int] = {}
        for kind, nbytes in per_kind.items():
            g = MEMORY_GROUPS.get(kind, kind)
            grouped[g] = grouped.get(g, 0) + int(nbytes)
            if g not in groups:
                groups.append(g)
        data.append((label, grouped))
    order = [g for g in MEMORY_COLORS if g in groups] + [g for g in groups if g not in MEMORY_COLORS]
    fig = _figure(9, 0.32 * len(data) + 1.5)
    ax = fig.add_subplot()
    labels = [label for label, _ in data][::-1]
    left = [0.0] * len(data)
    for g in order:
        values = [grouped.get(g, 0) / 2**20 for _, grouped in data][::-1]
        ax.barh(labels, values, left=left, label=g, color=MEMORY_COLORS.get(g))
        left = [a + b for a, b in zip(left, values, strict=True)]
    ax.set_xlabel("NPU DRAM (MiB)")
    ax.set_title("memory breakdown")
    ax.tick_params(axis="y", labelsize=7)
    fig.legend(fontsize=8, loc="outside right upper")
    return _svg(fig)


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats: lower or equal on both axes and lower on one."""
    front = []
    for i, (x, y) in enumerate(points):
        dominated = any((a <= x and b <= y) and (a < x or b < y) for j, (a, b) in enumerate(points) if j != i)
        if not dominated:
            front.append(i)
    return front


ERROR_FLOOR = 1e-9  # an exact build (error 0) is drawn here on the log axis


def pareto(rows: Sequence[dict]) -> str:
    """Accuracy against latency: each successful build at (latency µs, normalized max error against
    ONNX Runtime), one marker per target, each config labelled; each target's Pareto front drawn
    as a step line through its front builds (ringed)."""
    fig = _figure(8, 5.5)
    ax = fig.add_subplot()
    targets = list(dict.fromkeys(r["target"] for r in rows))
    cmap = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2"]
    for k, target in enumerate(targets):
        mine = [r for r in rows if r["target"] == target]
        pts = [(r["metrics"]["latency_us"], max(r["metrics"]["max_norm_err"], ERROR_FLOOR)) for r in mine]
        color = cmap[k % len(cmap)]
        ax.scatter(
            [p[0] for p in pts],
            [p[1] for p in pts],
            marker=TARGET_MARKERS[k % len(TARGET_MARKERS)],
            s=40,
            color=color,
            label=target,
            zorder=3,
        )
        for r, (x, y) in zip(mine, pts, strict=True):
            ax.annotate(
                r.get("config") or r["qat_config"],
                (x, y),
                fontsize=7,
                xytext=(4, 4),
                textcoords="offset points",
            )
        front = sorted((pts[i] for i in pareto_front(pts)), key=lambda p: p[0])
        ax.step([p[0] for p in front], [p[1] for p in front], where="post", color=color, lw=1, alpha=0.7)
        ax.scatter(
            [p[0] for p in front],
            [p[1] for p in front],
            s=140,
            facecolors="none",
            edgecolors=color,
            linewidths=1.5,
            zorder=2,
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("simulated latency (µs)")
    ax.set_ylabel("normalized max error vs ONNX Runtime fp32")
    ax.set_title("accuracy vs latency (ringed: Pareto front of each target)")
    ax.legend(fontsize=8)
    return _svg(fig)


def budgets(doc: dict) -> str:
    """Each budget's measured value as a percentage of its limit (for min budgets, the limit as a
    percentage of the measured value): past 100 % the budget failed."""
    from mcpc.ci import BUDGETS

    bars = []
    for build in doc["builds"]:
        for v in build["budgets"]:
            if v["case"] not in BUDGETS or v["measured"] is None or not v["limit"]:
                continue
            kind = BUDGETS[v["case"]][1]
            ratio = v["measured"] / v["limit"] if kind == "max" else v["limit"] / max(v["measured"], 1e-300)
            bars.append((f"{build['name']}: {v['case']}", 100 * ratio, v["passed"]))
    fig = _figure(9, 0.26 * len(bars) + 1.4)
    ax = fig.add_subplot()
    bars = bars[::-1]
    ax.barh(
        [b[0] for b in bars], [b[1] for b in bars], color=["#54a24b" if b[2] else "#e45756" for b in bars]
    )
    ax.axvline(100, color="black", lw=1)
    ax.set_xlabel("% of budget used (past 100 %: failed)")
    ax.set_title("budgets")
    ax.tick_params(axis="y", labelsize=7)
    return _svg(fig)
