"""``mcpc check --per-node``: the error at every ONNX node output that survives compilation.

A node output *survives* when the program stores it to DRAM: the backend plans one DRAM buffer per
IR value it materializes, named after the op's location (the ONNX node) and result index
(``main:<node>#0`` in the ``.mcpb`` memory map, with the op positions it is live over).  Values
kept in SRAM by a fused kernel, reshapes (views of their operand) and constants have no buffer of
their own and are listed as not compared, with the reason.

Reading them: the simulator runs the program once with an observer after each store instruction
(``run_program(observe=...)``; cycles are unchanged).  A store belongs to the buffers it writes
whose first live position is the position of the kernel issuing it (the kernel's ONNX node, from
the debug map); the value is copied out right after the last such store, before any later value
can reuse its bytes.  Its bytes are read in the dtype the size implies for the ONNX tensor's
element count (2 bytes: fp16, or bf16 in a bf16 build; 4: fp32 / int32; 1: int8); a size that
fits none is listed as not compared.

The reference is ONNX Runtime fp32 on the model with every node output added as a graph output
(graph optimizations off).  Each surviving value is scored like an output of ``mcpc check``
(normalized max error, cosine; the build's tolerances) in graph order, and the first node whose
value exceeds the budget is where accuracy is lost (with the kernel that stored it: a matmul whose
epilogue was fused stores its consumer's value).  Several IR ops of one ONNX node: the last one's
value is the node's output.  A reference value beyond the stored dtype's range is clipped to it
first (an fp16 build saturates the attention mask's float32 minimum to −65504 by design).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from mcpc.errors import InputError

_FLOAT = {4: np.float32, 2: np.float16}
_INT = {8: np.int64, 4: np.int32, 2: np.int16, 1: np.int8}


def onnx_node_outputs(model_path: str | Path, inputs: dict[str, np.ndarray]) -> tuple[list, dict]:
    """``(nodes, values)``: the model's nodes in graph order as ``(name, op_type, outputs)`` and
    ONNX Runtime's value of every node output (fp32 CPU, graph optimizations off)."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(model_path))
    have = {o.name for o in model.graph.output}
    nodes = []
    for node in model.graph.node:
        nodes.append((node.name, node.op_type, list(node.output)))
        for out in node.output:
            if out and out not in have:
                vi = onnx.ValueInfoProto()
                vi.name = out
                model.graph.output.append(vi)
                have.add(out)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    try:
        sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        names = [i.name for i in sess.get_inputs()]
        missing = [n for n in names if n not in inputs]
        if missing:
            raise InputError(f"inputs are missing {', '.join(missing)} (the model needs {', '.join(names)})")
        outs = sess.run(None, {n: inputs[n] for n in names})
    except InputError:
        raise
    except Exception as e:  # ORT's own exception types
        raise InputError(f"{model_path}: ONNX Runtime cannot run it with every node output: {e}") from None
    return nodes, {o.name: v for o, v in zip(sess.get_outputs(), outs, strict=True)}


def _buffer_key(name: str, fn: str) -> tuple[str, int] | None:
    """``("<loc>", index)`` of a scratch buffer named ``fn:<loc>#<index>`` (None for another fn)."""
    prefix = f"{fn}:"
    if not name.startswith(prefix) or "#" not in name:
        return None
    loc, _, idx = name[len(prefix) :].rpartition("#")
    return (loc, int(idx)) if idx.isdigit() else None


def _dram_writes(instr) -> list[tuple[int, int]]:
    from mcpc.backend.hazards import DRAM_ANY, footprint

    return [(lo, hi) for mem, lo, hi, w in footprint(instr) if mem == "dram" and w and (lo, hi) != DRAM_ANY]


def _decode(raw: np.ndarray, ref: np.ndarray, precision: str | None) -> np.ndarray | None:
    count = int(ref.size)
    if count == 0 or raw.size % count:
        return None
    size = raw.size // count
    if np.issubdtype(ref.dtype, np.floating):
        if size == 2 and precision == "bf16":
            import ml_dtypes

            dt = np.dtype(ml_dtypes.bfloat16)
        elif size in _FLOAT:
            dt = np.dtype(_FLOAT[size])
        else:
            return None
    elif np.issubdtype(ref.dtype, np.integer) and size in _INT:
        dt = np.dtype(_INT[size])
    else:
        return None
    return np.frombuffer(raw.tobytes(), dtype=dt).reshape(ref.shape)


def per_node(
    model_path: str | Path,
    program_path: str | Path,
    inputs: dict[str, np.ndarray],
    entry: str = "main",
    *,
    max_norm_err: float | None = None,
    min_cosine: float | None = None,
    mask: str | None = None,
) -> dict[str, Any]:
    """The per-node report: ``nodes`` (one row per compared node output, graph order: ``node``,
    ``op_type``, ``tensor``, ``dtype``, ``kernel`` (the ONNX node of the kernel that stored it: a
    fused matmul's for its epilogue) and the ``mcpc.check.compare`` fields), ``first_bad`` (index
    into ``nodes`` of the first that fails the tolerances, or None), ``not_compared`` (node outputs
    without a stored value, with the reason), ``tolerances``."""
    from mcpc.check import Tolerances, _mask_array
    from mcpc.sim.api import load_program, run_program

    program = load_program(program_path)
    tol = Tolerances.of_program(program.meta).override(max_norm_err=max_norm_err, min_cosine=min_cosine)
    tol = Tolerances(max_norm_err=tol.max_norm_err, min_cosine=tol.min_cosine)  # no top-1 inside
    mask_arr = _mask_array(inputs, mask) if mask is not None else None
    nodes, ref = onnx_node_outputs(model_path, inputs)
    entries = {e["name"]: e for e in program.program.entries}
    if entry not in entries:
        raise InputError(f"{program_path}: no entry point {entry!r} (entries: {', '.join(entries)})")
    start, count = entries[entry]["start"], entries[entry]["count"]
    buffers = [b for b in program.memory_map.get("buffers", []) if b.get("kind") == "scratch" and "live" in b]
    by_key: dict[tuple[str, int], dict] = {}
    firsts: dict[str, set[int]] = {}
    for b in buffers:
        key = _buffer_key(b["name"], entry)
        if key is None:
            continue
        firsts.setdefault(key[0], set()).add(int(b["live"][0]))
        if key not in by_key or b["live"][0] >= by_key[key]["live"][0]:
            by_key[key] = b  # several IR ops of one node: the last one holds the node's output
    wanted = {}  # (loc, idx) -> buffer, for node outputs ONNX Runtime computed
    for name, _, outs in nodes:
        for i, out in enumerate(outs):
            if (name, i) in by_key and out in ref:
                wanted[(name, i)] = by_key[(name, i)]
    last_store: dict[tuple[str, int], int] = {}
    instrs = program.program.instructions()
    for idx in range(start, start + count):
        writes = _dram_writes(instrs[idx])
        if not writes:
            continue
        loc = (program.program.debug[idx] or {}).get("onnx_node")
        positions = firsts.get(loc, set())
        for key, b in wanted.items():
            lo, hi = b["dram"], b["dram"] + b["bytes"]
            if b["live"][0] in positions and any(w_lo < hi and lo < w_hi for w_lo, w_hi in writes):
                last_store[key] = idx
    captured: dict[tuple[str, int], np.ndarray] = {}

    def grab(keys):
        def read(machine):
            for key in keys:
                b = wanted[key]
                captured[key] = machine.dram[b["dram"] : b["dram"] + b["bytes"]].copy()

        return read

    at: dict[int, list] = {}
    for key, idx in last_store.items():
        at.setdefault(idx, []).append(key)
    run_program(program, inputs, entry=entry, observe={i: grab(keys) for i, keys in at.items()})
    precision = program.meta.get("precision")
    rows, skipped = [], []
    graph_outputs = {b["name"] for b in (program.program.io or {}).get(entry, {}).get("outputs", [])}
    for name, op_type, outs in nodes:
        for i, out in enumerate(outs):
            if not out:
                continue
            key = (name, i)
            if key not in wanted:
                why = "a program output" if out in graph_outputs else "not stored (fused, folded or a view)"
                skipped.append({"node": name, "op_type": op_type, "tensor": out, "reason": why})
                continue
            if key not in captured:
                why = "no store writes it (a fused kernel keeps it in SRAM)"
                skipped.append({"node": name, "op_type": op_type, "tensor": out, "reason": why})
                continue
            r = np.asarray(ref[out])
            y = _decode(captured[key], r, precision)
            if y is None:
                reason = f"{captured[key].size} bytes do not hold {r.size} values of a known dtype"
                skipped.append({"node": name, "op_type": op_type, "tensor": out, "reason": reason})
                continue
            if np.issubdtype(y.dtype, np.floating) and np.issubdtype(r.dtype, np.floating):
                big = float(np.finfo(y.dtype).max)  # a narrower build saturates (the mask's float32 min)
                r = np.clip(r, -big, big) if big < float(np.finfo(r.dtype).max) else r
            cmp = tol.compare(out, y, r, mask=mask_arr)
            kernel = (program.program.debug[last_store[key]] or {}).get("onnx_node")
            rows.append({"node": name, "op_type": op_type, "tensor": out, "dtype": str(y.dtype),
                         "kernel": kernel, **asdict(cmp)})  # fmt: skip
    first_bad = next((k for k, row in enumerate(rows) if not row["passed"]), None)
    return {
        "model": str(model_path),
        "program": str(program_path),
        "precision": precision,
        "tolerances": {k: v for k, v in asdict(tol).items() if v is not None},
        "mask": mask,
        "nodes": rows,
        "first_bad": first_bad,
        "not_compared": skipped,
    }


def print_report(console, report: dict) -> None:
    """The per-node table (graph order, the first node outside the budget in bold red) and a line
    counting the node outputs that were not compared."""
    from rich.table import Table

    from mcpc.check import Tolerances

    tol = Tolerances.from_mapping(report["tolerances"])
    table = Table(title=f"per node: {tol.describe()}", title_justify="left")
    for column in ("#", "node", "op", "shape", "dtype", "norm max err", "cosine", "result"):
        table.add_column(column, justify="right" if column in ("#", "norm max err", "cosine") else "left",
                         no_wrap=True)  # fmt: skip
    first = report["first_bad"]
    for k, r in enumerate(report["nodes"]):
        result = "ok" if r["passed"] else "FAIL: " + "; ".join(r["reasons"])
        if k == first:
            result = "FIRST " + result
        table.add_row(str(k), r["node"], r["op_type"], "x".join(map(str, r["shape"])), r["dtype"],
                      f"{r['norm_max_err']:.3g}", f"{r['cosine']:.6f}", result,
                      style="bold red" if k == first else None)  # fmt: skip
    from rich.measure import Measurement

    width = Measurement.get(console, console.options.update(max_width=100_000), table).maximum
    console.width = max(console.width, width)  # node names and reasons in full, never truncated
    console.print(table)
    skipped = report["not_compared"]
    reasons: dict[str, int] = {}
    for s in skipped:
        reasons[s["reason"]] = reasons.get(s["reason"], 0) + 1
    detail = ", ".join(f"{n} {why}" for why, n in sorted(reasons.items(), key=lambda x: -x[1]))
    counts = f"{len(report['nodes'])} node outputs compared; {len(skipped)} not"
    console.print(counts + (f" ({detail})" if skipped else ""))
    if first is None:
        console.print("every compared node output is within the budget")
    else:
        r = report["nodes"][first]
        fused = r.get("kernel") not in (None, r["node"])
        kernel = f", stored by the kernel of {r['kernel']}" if fused else ""
        console.print(f"[bold red]first node outside the budget: {r['node']} ({r['op_type']}){kernel}[/]")
