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
    "kv": "KV cache",
    "persistent": "other persistent",
    "scratch": "activations",
    "input": "inputs",
    "output": "outputs",
}
MEMORY_COLORS = {
    "weights": "#4c78a8",
    "KV cache": "#e45756",
    "other persistent": "#b279a2",
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


_KV_DTYPE_BYTES = {"f16": 2, "fp16": 2, "float16": 2, "bf16": 2, "f32": 4, "fp32": 4, "float32": 4}


def kv_pool_bytes(decoder: dict) -> int | None:
    """The KV cache's bytes in NPU DRAM from a build's META decoder entry: ``kv_blocks`` blocks of
    K and V for every layer and kv head, ``block`` tokens of ``head_dim`` values (an INT8 cache adds
    an fp16 scale and a u8 zero point per vector; a ``kv_quant`` stating ``bytes_per_block`` is
    taken as it is); None when the entry lacks a field or names an unknown dtype."""
    try:
        quant = decoder.get("kv_quant") or {}
        if "bytes_per_block" in quant:
            per_block = int(quant["bytes_per_block"])
        else:
            dtype = str(decoder["kv_dtype"])
            per_vector = (
                decoder["head_dim"] + 3
                if dtype in ("i8", "u8", "int8")
                else decoder["head_dim"] * _KV_DTYPE_BYTES[dtype]
            )
            per_block = decoder["layers"] * 2 * decoder["kv_heads"] * decoder["block"] * per_vector
        return int(decoder["kv_blocks"]) * per_block
    except (KeyError, TypeError, ValueError):
        return None


def with_kv(per_kind: dict, decoder: dict | None) -> dict:
    """``per_kind`` (DRAM bytes per region kind) with a decoder build's KV cache (``kv_pool_bytes``)
    taken out of its persistent regions as ``kv``; unchanged for other programs."""
    kv = kv_pool_bytes(decoder) if isinstance(decoder, dict) else None
    persistent = int(per_kind.get("persistent", 0))
    if kv is None or kv > persistent:
        return dict(per_kind)
    out = {k: v for k, v in per_kind.items() if k != "persistent"}
    out["kv"] = kv
    if persistent > kv:
        out["persistent"] = persistent - kv
    return out


def latency_cdfs(per_request: Sequence[dict]) -> str:
    """The empirical CDF of each request's TTFT, TPOT and end-to-end latency (ms, log axis), one
    panel each, with the median and P99 marked."""
    import numpy as np

    fig = _figure(11, 3.6)
    axes = fig.subplots(1, 3)
    for ax, (key, title) in zip(
        axes, (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2e_ms", "end-to-end")), strict=True
    ):
        values = np.sort([q[key] for q in per_request if q.get(key) is not None])
        if values.size == 0:
            ax.text(0.5, 0.5, f"no {title}", ha="center", va="center", transform=ax.transAxes)
            ax.set_axis_off()
            continue
        ax.step(values, np.arange(1, values.size + 1) / values.size, where="post", color="#4c78a8")
        for q, style in ((50, "--"), (99, ":")):
            v = float(np.percentile(values, q))
            ax.axvline(v, color="#e45756", ls=style, lw=1, label=f"P{q} {v:.4g} ms")
        if values[0] > 0 and values[-1] / values[0] > 100:
            from matplotlib.ticker import NullFormatter

            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(f"{title} (ms)")
        ax.set_title(f"{title}, {values.size} requests")
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=7, loc="lower right")
    axes[0].set_ylabel("fraction of requests")
    return _svg(fig)


def serving_timeline(timeline: dict, kv_blocks: int | None, bins: int = 60) -> str:
    """Throughput (generated tokens per second, in ``bins`` equal spans of the run) and the KV
    blocks in use after each iteration, against the run's virtual time."""
    import numpy as np

    t = np.asarray(timeline["t_s"], dtype=float)
    tokens = np.asarray(timeline["tokens"], dtype=float)
    fig = _figure(11, 4.2)
    top, bottom = fig.subplots(2, 1, sharex=True)
    edges = np.linspace(0.0, float(t[-1]) if t.size else 1.0, bins + 1)
    counts, _ = np.histogram(t, bins=edges, weights=tokens)
    width = edges[1] - edges[0]
    top.bar(edges[:-1], counts / width, width=width, align="edge", color="#4c78a8")
    top.set_ylabel("tokens / s")
    top.set_title("throughput and KV cache use over the run")
    bottom.step(t, timeline["kv_blocks_used"], where="pre", color="#e45756", label="KV blocks in use")
    if kv_blocks:
        bottom.axhline(kv_blocks, color="black", lw=1, ls="--", label=f"pool: {kv_blocks} blocks")
    bottom.set_ylabel("KV blocks")
    bottom.set_xlabel("virtual time (s)")
    bottom.legend(fontsize=7, loc="upper right")
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
