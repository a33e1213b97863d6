"""Measure one case on one target and build: toolchain wall times, ONNX Runtime wall time, the
simulated profile (roofline) and the accuracy against ONNX Runtime.

Assumes ``case.build(seed)`` gives a model ONNX Runtime and mcpc both accept.  Guarantees: the
first pass through the toolchain is a warm-up whose times are discarded (its outputs and profile
are kept: compilation and simulation are deterministic, which the project's tests check), and the
``repeats`` timed passes that follow are reported as their median and their samples.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np
import onnx

import mcpc
from mcpc.check import Tolerances, compare, is_logits, run_onnxruntime
from mcpc.driver import load_qat_config
from mcpc.sim.api import load_program, run_program

STAGES = ("import_s", "passes_s", "backend_s", "sim_load_s", "sim_run_s")
ORT_MIN_SECONDS = 0.2  # small models run in microseconds: repeat ORT until this much time is sampled
ORT_MAX_RUNS = 2000


def _toolchain_once(onnx_path: Path, mcpb_path: Path, case, target: str, qat_config: str, inputs):
    """One pass import → passes → backend (+ .mcpb write) → sim load → sim run; (times, sim result)."""
    t0 = time.perf_counter()
    module = mcpc.load_model(onnx_path, dims=case.dims)
    t1 = time.perf_counter()
    result = mcpc.compile(module, target=target, qat_config=qat_config, output=mcpb_path)
    t2 = time.perf_counter()
    program = load_program(mcpb_path)
    t3 = time.perf_counter()
    sim = run_program(program, inputs)
    t4 = time.perf_counter()
    # The driver times each pass (and the verifier after it); the rest of compile() is the backend.
    passes = sum(p["seconds"] + p["verify_seconds"] for p in result.report["pass_times"])
    times = {
        "import_s": t1 - t0,
        "passes_s": passes,
        "backend_s": max(0.0, (t2 - t1) - passes),
        "sim_load_s": t3 - t2,
        "sim_run_s": t4 - t3,
    }
    return times, sim, result


def time_onnxruntime(onnx_path: Path, inputs: dict[str, np.ndarray], repeats: int) -> dict:
    """ONNX Runtime CPU inference wall time (default graph optimizations and thread pool).

    Session creation and one warm-up run are excluded; at least ``repeats`` runs are timed, more
    for fast models (up to ``ORT_MIN_SECONDS`` of sampling), and the median is reported.
    """
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
    feed = {i.name: inputs[i.name] for i in sess.get_inputs()}
    sess.run(None, feed)
    samples: list[float] = []
    start = time.perf_counter()
    while len(samples) < ORT_MAX_RUNS and (
        len(samples) < repeats or time.perf_counter() - start < ORT_MIN_SECONDS
    ):
        t = time.perf_counter()
        sess.run(None, feed)
        samples.append(time.perf_counter() - t)
    return {"median_s": statistics.median(samples), "min_s": min(samples), "runs": len(samples)}


def _profile_summary(profile: dict) -> dict:
    roof = profile["roofline"]
    nodes = profile.get("nodes", [])
    busy = sum(n["cycles"] for n in nodes) or 1
    return {
        "cycles": profile["cycles"],
        "latency_us": profile["latency_us"],
        "instructions": profile["instructions"],
        "macs": profile["macs"],
        "dram_read_bytes": profile["dram_read_bytes"],
        "dram_write_bytes": profile["dram_write_bytes"],
        "dram_bytes": profile["dram_read_bytes"] + profile["dram_write_bytes"],
        "peak_sram_bytes": profile["peak_sram_bytes"],
        "sram_size_bytes": profile["sram_size_bytes"],
        "mac_dtype": roof["peak_dtype"],
        "achieved_macs_per_cycle": roof["achieved_macs_per_cycle"],
        "peak_macs_per_cycle": roof["peak_macs_per_cycle"],
        "mac_pct_of_peak": 100.0 * roof["mac_utilization"],
        "achieved_dram_bytes_per_cycle": roof["achieved_dram_bytes_per_cycle"],
        "peak_dram_bytes_per_cycle": roof["peak_dram_bytes_per_cycle"],
        "dram_pct_of_peak": 100.0 * roof["dram_utilization"],
        "roof_pct": 100.0 * max(roof["mac_utilization"], roof["dram_utilization"]),
        "bound": roof["bound"],
        "engine_utilization": {e: v["utilization"] for e, v in profile["engines"].items()},
        "top_nodes": [
            {"name": n["name"], "op_type": n["op_type"], "cycles": n["cycles"], "share": n["cycles"] / busy}
            for n in nodes[:3]
        ],
    }


def _accuracy(sim_outputs: dict, ref: dict, config) -> dict:
    tol = config.check
    criteria = Tolerances.from_mapping(tol.tolerances())
    comps = [
        criteria.compare(n, y, ref[n], top1=is_logits(n, y.shape, set())) for n, y in sim_outputs.items()
    ]
    return {
        "norm_max_err": max(c.norm_max_err for c in comps),
        "cosine": min(c.cosine for c in comps),
        "tolerances": tol.tolerances(),
        "within_tolerance": all(c.passed for c in comps),
    }


def measure_case(case, target: str, qat_config: str, workdir: Path, repeats: int, seed: int = 0) -> dict:
    """Everything the benchmark records for ``case`` on ``target`` with ``qat_config`` (JSON-ready)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    config = load_qat_config(qat_config)
    model, inputs = case.build(seed)
    stem = f"{case.name}-{case.size.replace(' ', '_')}-{target}-{config.name}"
    onnx_path, mcpb_path = workdir / f"{stem}.onnx", workdir / f"{stem}.mcpb"
    onnx.save(model, onnx_path)

    _, sim, result = _toolchain_once(onnx_path, mcpb_path, case, target, qat_config, inputs)  # warm-up
    samples = {s: [] for s in STAGES}
    for _ in range(repeats):
        times, _, _ = _toolchain_once(onnx_path, mcpb_path, case, target, qat_config, inputs)
        for s in STAGES:
            samples[s].append(times[s])
    toolchain = {s: statistics.median(v) for s, v in samples.items()}
    # the minimum is the least disturbed sample: on a shared machine it is the better speed estimate
    toolchain_min = {s: min(v) for s, v in samples.items()}
    toolchain["compile_s"] = toolchain["import_s"] + toolchain["passes_s"] + toolchain["backend_s"]
    toolchain["sim_s"] = toolchain["sim_load_s"] + toolchain["sim_run_s"]
    instructions = sim.profile["instructions"]
    toolchain["sim_instructions_per_s"] = instructions / toolchain["sim_run_s"]

    ort = time_onnxruntime(onnx_path, inputs, repeats)
    ref = run_onnxruntime(onnx_path, inputs)  # the fidelity reference: graph optimizations off
    mcpb_bytes = mcpb_path.stat().st_size
    onnx_path.unlink()
    mcpb_path.unlink()
    return {
        "case": case.name,
        "kind": case.kind,
        "size": case.size,
        "target": target,
        "build": config.name,
        "repeats": repeats,
        "toolchain": toolchain,
        "toolchain_min": toolchain_min,
        "toolchain_samples": samples,
        "mcpb_bytes": mcpb_bytes,
        "ort": ort,
        # How much slower simulating the model is than running it natively on this CPU.
        "sim_over_ort": toolchain["sim_run_s"] / ort["median_s"],
        "sim": _profile_summary(sim.profile),
        "accuracy": _accuracy(sim.outputs, ref, config),
        "ir_ops": result.report.get("ir_ops", {}),
    }


def _interleaved(fns: dict, repeats: int, settle_s: float = 0.25) -> dict[str, float]:
    """Best wall time of each of ``fns`` over ``repeats`` rounds.  A round runs each in turn,
    twice (the first run a warm-up, excluded) after a ``settle_s`` pause, so that every peer is
    sampled under the same machine conditions (a shared machine's speed drifts by tens of percent
    over seconds) and none runs while another's worker threads still spin (OpenBLAS's and ONNX
    Runtime's keep spinning for a while after each call)."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            time.sleep(settle_s)
            fn()
            t = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t)
    return best


def measure_sim_speed(case, target: str, qat_config: str, workdir: Path, repeats: int, seed: int = 0) -> dict:
    """Simulator wall time against ONNX Runtime's on ``case`` (JSON-ready): best of ``repeats``
    interleaved rounds (``_interleaved``; program load, session creation and each round's warm-up
    excluded) of the functional simulator, the timing-only simulator, and ONNX Runtime with 2
    intra-op threads on the same model and inputs; plus the accuracy of the functional outputs
    against ONNX Runtime."""
    import onnxruntime as ort

    config = load_qat_config(qat_config)
    model, inputs = case.build(seed)
    stem = f"speed-{case.name}-{case.size.split(',')[0].replace(' ', '_')}-{config.name}"
    onnx_path, mcpb_path = workdir / f"{stem}.onnx", workdir / f"{stem}.mcpb"
    onnx.save(model, onnx_path)
    del model
    t = time.perf_counter()
    mcpc.compile(onnx_path, target=target, qat_config=qat_config, dims=case.dims, output=mcpb_path)
    compile_s = time.perf_counter() - t
    t = time.perf_counter()
    program = load_program(mcpb_path)
    load_s = time.perf_counter() - t
    t = time.perf_counter()
    first = run_program(program, inputs)  # the first run prepares the program's machine
    first_s = time.perf_counter() - t
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
    feed = {i.name: inputs[i.name] for i in sess.get_inputs()}
    names = [o.name for o in sess.get_outputs()]
    ref = dict(zip(names, sess.run(None, feed), strict=True))
    best = _interleaved(
        {
            "sim": lambda: run_program(program, inputs),
            "timing": lambda: run_program(program, inputs, timing_only=True),
            "ort": lambda: sess.run(None, feed),
        },
        repeats,
    )
    sim_s, timing_s, ort_s = best["sim"], best["timing"], best["ort"]

    err = max(compare(n, first.outputs[n], ref[n], 0, 0).norm_max_err for n in names)
    onnx_path.unlink()
    mcpb_path.unlink()
    return {
        "case": case.name,
        "size": case.size,
        "target": target,
        "build": config.name,
        "repeats": repeats,
        "instructions": first.profile["instructions"],
        "cycles": first.profile["cycles"],
        "compile_s": compile_s,
        "sim_load_s": load_s,
        "sim_first_run_s": first_s,
        "sim_s": sim_s,
        "timing_only_s": timing_s,
        "ort_s": ort_s,
        "sim_over_ort": sim_s / ort_s,
        "timing_only_over_ort": timing_s / ort_s,
        "norm_max_err": err,
    }
