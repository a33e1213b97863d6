"""What a serving run measured: latency distributions, throughput, goodput, KV use, and a Chrome
trace of its iterations.

Definitions (times in virtual seconds of the simulated NPU):
TTFT = arrival -> first token; TPOT = (E2E - TTFT) / (output tokens - 1) (requests of one output
token have none); ITL = every gap between two consecutive tokens of a request (pooled);
E2E = arrival -> last token; queue = arrival -> first admission.
``throughput_tokens_per_s`` = generated tokens / (last completion - first arrival);
goodput = requests meeting every SLO of the workload, per second of the same span.
KV utilisation = blocks referenced by live sequences / the pool, averaged over time (each
iteration weighted by its duration; idle time counts with what it holds, which is nothing).
"""

from __future__ import annotations

import numpy as np

from .engine import Seq, Simulator


def stats(values) -> dict:
    """mean, p50, p90, p99 (numpy's linear percentiles), min and max; None when there are none."""
    a = np.asarray(values, dtype=float)
    if a.size == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None, "min": None, "max": None, "count": 0}
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {
        "mean": float(a.mean()),
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "min": float(a.min()),
        "max": float(a.max()),
        "count": int(a.size),
    }


def _ms(values) -> dict:
    return stats(np.asarray(values, dtype=float) * 1e3)


def tpot_s(s: Seq) -> float | None:
    if s.req.output_len < 2:
        return None
    return (s.finish_s - s.first_token_s) / (s.req.output_len - 1)


def meets(s: Seq, slo) -> bool:
    ttft, e2e, tpot = s.first_token_s - s.req.arrival_s, s.finish_s - s.req.arrival_s, tpot_s(s)
    return (
        (slo.ttft_ms is None or ttft * 1e3 <= slo.ttft_ms)
        and (slo.e2e_ms is None or e2e * 1e3 <= slo.e2e_ms)
        and (slo.tpot_ms is None or tpot is None or tpot * 1e3 <= slo.tpot_ms)
    )


def _col(sims, name: str) -> np.ndarray:
    cols = [sim.iterations.column(name) for sim in sims]
    return np.concatenate(cols) if cols else np.zeros(0)


def _peak_concurrent(sims) -> int:
    """The most KV blocks in use at once over all ``sims`` (each holds an iteration's blocks from
    its start to its end, nothing while idle): a sweep over the iterations' starts and ends."""
    t = np.concatenate([_col(sims, "start"), _col(sims, "end")])
    if not t.size:
        return 0
    v = _col(sims, "kv_blocks_used")
    d = np.concatenate([v, -v])
    order = np.lexsort((d, t))  # at one instant an iteration ends before the next one starts
    return int(np.cumsum(d[order]).max())


def _bandwidth(sims, dur: np.ndarray) -> dict:
    """DRAM bandwidth utilisation of the steps: each step's bytes read / (its time x bandwidth),
    the mean over steps and the time-weighted mean (all bytes / busy time x bandwidth); None
    when the step costs know no bytes."""
    bw = sims[0].bandwidth
    if not bw or not dur.size:
        return {"dram_bytes_per_s": bw or None, "dram_bytes": None, "mean_utilisation": None,
                "time_weighted_utilisation": None, "peak_utilisation": None}  # fmt: skip
    nbytes = _col(sims, "dram_bytes")
    util = nbytes / np.maximum(dur, 1e-30) / bw
    return {
        "dram_bytes_per_s": bw,
        "dram_bytes": float(nbytes.sum()),
        "mean_utilisation": float(util.mean()),
        "time_weighted_utilisation": float(nbytes.sum() / max(dur.sum(), 1e-30) / bw),
        "peak_utilisation": float(util.max()),
    }


def summarize(sim, slo=None) -> dict:
    """The result JSON of a run (the keys documented in docs/serving.md): of one ``Simulator``, or
    of a ``Fleet`` (fleet-wide figures at top level, each replica's summary under ``replicas``)."""
    sims = getattr(sim, "replicas", None) or [sim]
    done = sim.finished
    first_arrival = min(s.req.arrival_s for s in done)
    last_finish = max(s.finish_s for s in done)
    span = max(last_finish - first_arrival, 1e-12)
    tokens = sum(s.generated for s in done)
    useful = sum(s.req.output_len for s in done)
    dur = _col(sims, "end") - _col(sims, "start")
    busy = float(dur.sum())
    kv_time = float((dur * _col(sims, "kv_blocks_used")).sum())
    blocks = sum(r.kv.num_blocks for r in sims)
    peak_blocks = _peak_concurrent(sims)
    batch = _col(sims, "decode")
    batch = batch[batch > 0]
    prefill_tokens = int(_col(sims, "prefill_tokens").sum())
    hit_tokens = sum(r.kv.hit_tokens for r in sims)
    out = {
        "requests": len(done),
        "policy": sims[0].policy.name,
        "duration_s": span,
        "throughput_tokens_per_s": useful / span,
        "throughput_requests_per_s": len(done) / span,
        "ttft_ms": _ms([s.first_token_s - s.req.arrival_s for s in done]),
        "tpot_ms": _ms([t for s in done if (t := tpot_s(s)) is not None]),
        "itl_ms": _ms([g for s in done for g in s.itl]),
        "e2e_ms": _ms([s.finish_s - s.req.arrival_s for s in done]),
        "queue_ms": _ms([s.admitted_s - s.req.arrival_s for s in done]),
        "prompt_tokens": int(sum(s.req.prompt_len for s in done)),
        "generated_tokens": int(useful),
        "npu": {
            "iterations": int(dur.size),
            "busy_fraction": busy / span / len(sims),
            "decode_cycles": float(_col(sims, "decode_cycles").sum()),
            "prefill_cycles": float(_col(sims, "prefill_cycles").sum()),
            "mean_decode_batch": float(batch.mean()) if batch.size else 0.0,
            "prefill_tokens": prefill_tokens,
            # prefill tokens beyond the prompts' (tokens recomputed after preemptions)
            "recomputed_tokens": int(prefill_tokens - sum(s.req.prompt_len for s in done) + hit_tokens),
        },
        "kv": {
            "blocks": blocks,
            "block_tokens": sims[0].kv.block,
            "peak_blocks": int(peak_blocks),
            "peak_utilisation": peak_blocks / blocks,
            "mean_utilisation": kv_time / span / blocks,
            "peak_bytes": int(sum(r.kv.kv.peak_kv_bytes for r in sims)),
            "prefix_hit_rate": hit_tokens / max(sum(r.kv.lookup_tokens for r in sims), 1),
            "evictions": sum(r.kv.kv.evictions for r in sims),
            "preemptions": sum(r.preemptions for r in sims),
        },
    }
    if tokens != useful:
        raise AssertionError(f"generated {tokens} tokens, the requests asked for {useful}")
    if slo is not None and any(v is not None for v in (slo.ttft_ms, slo.tpot_ms, slo.e2e_ms)):
        good = sum(1 for s in done if meets(s, slo))
        out["goodput"] = {
            "slo": {k: v for k, v in slo.model_dump().items() if v is not None},
            "requests_meeting_slo": good,
            "fraction": good / len(done),
            "requests_per_s": good / span,
        }
    out["bandwidth"] = _bandwidth(sims, dur)
    if len(sims) > 1 or hasattr(sim, "replicas"):
        out["fleet"] = {"replicas": len(sims), "router": sim.router, "prefix_routed": sim.prefix_routed}
        out["replicas"] = [
            {"replica": k, **(summarize(r, slo) if r.finished else {"requests": 0})}
            for k, r in enumerate(sims)
        ]
    return out


def chrome_trace(sim, name: str = "serve") -> dict:
    """The iterations as Chrome/Perfetto trace events (µs): one slice per iteration, counters of the
    decode batch, waiting requests and KV blocks in use; a ``Fleet``'s replicas one process each."""
    sims = getattr(sim, "replicas", None) or [sim]
    events = []
    for pid, rep in enumerate(sims):
        title = (
            f"NPU ({name})" if len(sims) == 1 and not hasattr(sim, "replicas") else f"replica {pid} ({name})"
        )
        events += [
            {"ph": "M", "pid": pid, "name": "process_name", "args": {"name": title}},
            {"ph": "M", "pid": pid, "tid": 0, "name": "thread_name", "args": {"name": "iterations"}},
        ]
        for i in rep.iterations:
            ts, dur = i["start"] * 1e6, (i["end"] - i["start"]) * 1e6
            label = " + ".join(
                part
                for part in (
                    f"decode x{i['decode']}" if i["decode"] else "",
                    f"prefill {i['prefill_tokens']} tok" if i["prefill"] else "",
                )
                if part
            )
            events.append({"ph": "X", "pid": pid, "tid": 0, "name": label, "ts": ts, "dur": dur, "args": i})
            events.append(
                {
                    "ph": "C",
                    "pid": pid,
                    "name": "load",
                    "ts": ts,
                    "args": {
                        "decode": i["decode"],
                        "waiting": i["waiting"],
                        "kv_blocks": i["kv_blocks_used"],
                    },
                }
            )
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def per_request(sim: Simulator) -> list[dict]:
    """One record per request, in request id order: its times (virtual s), latencies (ms), lengths
    and preemptions (``tpot_ms`` None for a request of one output token)."""
    out = []
    for s in sorted(sim.finished, key=lambda q: q.req.id):
        arrival, tpot = s.req.arrival_s, tpot_s(s)
        out.append(
            {
                "id": int(s.req.id),
                "arrival_s": arrival,
                "first_token_s": s.first_token_s,
                "finish_s": s.finish_s,
                "ttft_ms": (s.first_token_s - arrival) * 1e3,
                "tpot_ms": None if tpot is None else tpot * 1e3,
                "e2e_ms": (s.finish_s - arrival) * 1e3,
                "queue_ms": (s.admitted_s - arrival) * 1e3,
                "prompt_tokens": s.req.prompt_len,
                "output_tokens": int(s.req.output_len),
                "preemptions": int(s.preemptions),
            }
        )
    return out


def timeline(sim) -> dict:
    """The run over time, one entry per iteration (columns): its end ``t_s``, the ``tokens`` it
    emitted, the KV blocks in use, the decode batch and the waiting requests.  For a fleet
    (``mcpc.serve.fleet.Fleet``) the entries are every replica's iterations in time order, with
    KV blocks, decode batch and waiting summed over the replicas as they stand at that time."""
    sims = getattr(sim, "replicas", None) or [sim]
    ends = np.concatenate([r.iterations.column("end") for r in sims])
    which = np.concatenate([np.full(len(r.iterations), k) for k, r in enumerate(sims)])
    order = np.argsort(ends, kind="stable")
    ends, which = ends[order], which[order]
    tokens = np.zeros(ends.size, dtype=np.int64)
    for s in sim.finished:  # a token is emitted at the end of the iteration that computed it
        times = s.first_token_s + np.concatenate([[0.0], np.cumsum(s.itl)])
        np.add.at(tokens, np.minimum(np.searchsorted(ends, times - 1e-12), max(ends.size - 1, 0)), 1)
    out = {"t_s": ends.tolist(), "tokens": tokens.tolist()}
    for key, column in (
        ("kv_blocks_used", "kv_blocks_used"),
        ("decode_batch", "decode"),
        ("waiting", "waiting"),
    ):
        values = np.concatenate([r.iterations.column(column) for r in sims])[order]
        total = np.zeros(ends.size)
        for k in range(len(sims)):  # each replica's value holds from its iteration until its next one
            mine = np.flatnonzero(which == k)
            if mine.size:
                held = np.searchsorted(mine, np.arange(ends.size), side="right") - 1
                total += np.where(held >= 0, values[mine[np.maximum(held, 0)]], 0.0)
        out[key] = total.astype(np.int64).tolist()
    return out
