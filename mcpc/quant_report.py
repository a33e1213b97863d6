"""What quantization did, in words and tables: the compile summary's weight lines and
``mcpc quant report`` (per layer: sensitivity, chosen precision, algorithm, bytes).

Reads the compile report (``mcpc.driver.compile``): ``weights`` (MatMul/Gemm weight bytes before and
after the passes, ``mcpc.passes.weight_stats``) and ``quantization`` (the ``quantize-weights``
pass's per-layer record).
"""

from __future__ import annotations

from collections import Counter
from typing import Any


def _mb(n: float) -> str:
    return f"{n / 1e6:.3f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def summary_lines(report: dict[str, Any]) -> list[str]:
    """The lines every compile prints about its weights (and quantization, when it ran)."""
    lines = []
    w = report.get("weights")
    if w and w["before"]["weights"]:
        b, a = w["before"], w["after"]
        lines.append(
            f"weights: {a['weights']} MatMul/Gemm weights, {a['params']:,} params: {_mb(b['bytes'])} -> "
            f"{_mb(a['bytes'])} ({b['bits_per_weight']:.3g} -> {a['bits_per_weight']:.4g} bits/weight, "
            "scales and zero points included)"
        )
    q = report.get("quantization")
    if q:
        rows = [r for f in q["functions"].values() for r in f["layers"]]
        groups = Counter((r["precision"], r["algorithm"], r.get("group_size")) for r in rows)
        said = ", ".join(
            f"{n} x {prec}" + (f" g{g}" if g else "") + (f" by {alg}" if alg != "none" else "")
            for (prec, alg, g), n in sorted(groups.items(), key=lambda kv: -kv[1])
        )
        cal = q["calibration"]
        cal_text = "none" if cal is None else f"{cal['samples']} samples from {cal['source']}"
        if cal is not None and "tokens" in cal:  # a decoder build's token windows
            cal_text = f"{cal['samples']} windows ({cal['tokens']:,} tokens) from {cal['source']}"
        lines.append(f"quantization: {said}; calibration: {cal_text}")
        kept = list({r["weight"]: r for r in rows if r["algorithm"] == "none"}.values())  # once a weight
        if kept:
            names = ", ".join(
                r["layer"] + (" (LM head" + (", tied to the embedding" if r["tied_gathers"] else "") + ")"
                              if r.get("lm_head") else "")
                for r in kept
            )  # fmt: skip
            kept_bytes = sum(r["bytes"] for r in kept)
            lines.append(f"kept in float: {names}: {_mb(kept_bytes)} of weights")
        acts = [r for f in q["functions"].values() for r in f["activations"]]
        if acts:
            lines.append(
                "activations: "
                + ", ".join(
                    f"{r['dtype']} into {r['layer']} (scale {r['scale']:.4g}, zp {r['zero_point']})"
                    for r in acts
                )
            )
        else:
            lines.append("activations: not quantized")
    return lines


def layer_table(report: dict[str, Any]):
    """A rich Table of the quantized layers: layer, shape, sensitivity, precision, algorithm, bytes."""
    from rich.table import Table

    table = Table(title="quantization by layer", title_justify="left")
    for column, justify in [("layer", "left"), ("K x N", "right"), ("sensitivity", "right"),
                            ("precision", "left"), ("algorithm", "left"), ("bytes", "right"),
                            ("bits/weight", "right")]:  # fmt: skip
        table.add_column(column, justify=justify, overflow="fold", no_wrap=column != "layer")
    q = report.get("quantization") or {"functions": {}}
    for fname, f in q["functions"].items():
        prefix = f"@{fname} " if len(q["functions"]) > 1 else ""
        for r in f["layers"]:
            sens = r.get("sensitivity")
            table.add_row(
                prefix
                + r["layer"]
                + (" (LM head)" if r.get("lm_head") else "")
                + (" (+ tied gather)" if r["tied_gathers"] else ""),
                "x".join(map(str, r["shape"])),
                "-" if sens is None else f"{sens:.3g}",
                r["precision"] + (f" g{r['group_size']}" if r.get("group_size") else ""),
                r["algorithm"],
                f"{r['bytes']:,}",
                f"{r['bits_per_weight']:.3g}",
            )
    return table
