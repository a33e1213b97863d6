"""The rich summary of one simulation: cycles, latency, DRAM traffic, engines, roofline, top nodes."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .numeric import message as numeric_message


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n}"  # pragma: no cover


def render_summary(profile: dict, console: Console, source: str = "", top: int = 10) -> None:
    """Print the profile as a few compact tables (assumes the dict from ``build_profile``)."""
    p = profile
    roof = p["roofline"]
    head = Table(
        title=f"{source} on {p['target']} (entry {p['entry']})", title_justify="left", show_header=False
    )
    head.add_column(justify="left")
    head.add_column(justify="right")
    rows = [
        ("cycles", f"{p['cycles']:,}"),
        ("latency", f"{p['latency_us']:.3f} us at {p['clock_mhz']:g} MHz"),
        ("instructions", f"{p['instructions']:,}"),
        ("MACs", f"{p['macs']:,}"),
        ("DRAM read / write (moved)", f"{_bytes(p['dram_read_bytes'])} / {_bytes(p['dram_write_bytes'])}"),
        ("peak SRAM", f"{_bytes(p['peak_sram_bytes'])} of {_bytes(p['sram_size_bytes'])}"),
        (
            "MAC rate",
            f"{roof['achieved_macs_per_cycle']:,.1f}/cycle, {100 * roof['mac_utilization']:.1f} % of peak "
            f"({roof['peak_macs_per_cycle']:,} {roof['peak_dtype']})",
        ),
        (
            "DRAM bandwidth",
            f"{roof['achieved_dram_bytes_per_cycle']:,.1f} B/cycle, {100 * roof['dram_utilization']:.1f} % "
            f"of peak ({roof['peak_dram_bytes_per_cycle']:,.1f} B/cycle)",
        ),
        (
            "MAC array",
            f"busy {roof['mac_array_busy_cycles']:,} cycles, "
            f"{100 * roof['mac_array_fill']:.1f} % of that doing useful MACs",
        ),
        (
            "compulsory DRAM",
            f"{_bytes(roof['compulsory_dram_bytes'])} (weights once + inputs + outputs + KV in use; "
            f"moved {roof['dram_traffic_ratio']:.2f}× that)",
        ),
        (
            "roofline",
            f"{roof['roofline_cycles']:,.0f} cycles (MACs ÷ peak {roof['compute_bound_cycles']:,.0f}, "
            f"compulsory bytes ÷ bandwidth {roof['memory_roof_cycles']:,.0f}); the run is "
            f"{roof['roofline_ratio']:.2f}× it",
        ),
        ("bound", roof.get("bound_detail", roof["bound"])),
    ]
    for k, v in rows:
        head.add_row(k, v)
    console.print(head)
    eng = Table(title="engines", title_justify="left")
    for col in ("engine", "busy cycles", "stall cycles", "utilisation"):
        eng.add_column(col, justify="left" if col == "engine" else "right")
    for name, e in p["engines"].items():
        eng.add_row(name, f"{e['busy']:,}", f"{e['stall']:,}", f"{100 * e['utilization']:.1f} %")
    console.print(eng)
    nodes = Table(title=f"top {top} ONNX nodes by cycles", title_justify="left")
    for col in ("node", "op", "cycles", "%", "span", "instrs"):
        nodes.add_column(col, justify="left" if col in ("node", "op") else "right", overflow="fold")
    total = sum(n["cycles"] for n in p["nodes"]) or 1
    for n in p["nodes"][:top]:
        nodes.add_row(
            n["name"],
            n["op_type"],
            f"{n['cycles']:,}",
            f"{100 * n['cycles'] / total:.1f}",
            f"{n['span']:,}",
            f"{n['instructions']:,}",
        )
    console.print(nodes)
    problem = numeric_message(p.get("numeric") or {})
    if problem:
        console.print(f"[yellow]warning:[/] numeric fault: {escape(problem)}")
    if p.get("tokens_left"):
        left = ", ".join(f"{k}: {v}" for k, v in p["tokens_left"].items())
        console.print(f"[yellow]warning:[/] dependency tokens left unconsumed at the end ({left})")
