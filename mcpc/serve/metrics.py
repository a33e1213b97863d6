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


def summarize(sim: Simulator, slo=None) -> dict:
    """The result JSON of a run (the keys documented in docs/serving.md)."""
    done = sim.finished
    first_arrival = min(s.req.arrival_s for s in done)
    last_finish = max(s.finish_s for s in done)
    span = max(last_finish - first_arrival, 1e-12)
    tokens = sum(s.generated for s in done)
    useful = sum(s.req.output_len for s in done)
    its = sim.iterations
    busy = sum(i["end"] - i["start"] for i in its)
    kv_time = sum((i["end"] - i["start"]) * i["kv_blocks_used"] for i in its)
    kv = sim.kv
    peak_blocks = max((i["kv_blocks_used"] for i in its), default=0)
    decode_its = [i for i in its if i["decode"]]
    out = {
        "requests": len(done),
        "policy": sim.policy.name,
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
            "iterations": len(its),
            "busy_fraction": busy / span,
            "decode_cycles": float(sum(i["decode_cycles"] for i in its)),
            "prefill_cycles": float(sum(i["prefill_cycles"] for i in its)),
            "mean_decode_batch": float(np.mean([i["decode"] for i in decode_its])) if decode_its else 0.0,
            "prefill_tokens": int(sum(i["prefill_tokens"] for i in its)),
            # prefill tokens beyond the prompts' (tokens recomputed after preemptions)
            "recomputed_tokens": int(
                sum(i["prefill_tokens"] for i in its) - sum(s.req.prompt_len for s in done) + kv.hit_tokens
            ),
        },
        "kv": {
            "blocks": kv.num_blocks,
            "block_tokens": kv.block,
            "peak_blocks": int(peak_blocks),
            "peak_utilisation": peak_blocks / kv.num_blocks,
            "mean_utilisation": kv_time / span / kv.num_blocks,
            "peak_bytes": int(kv.kv.peak_kv_bytes),
            "prefix_hit_rate": kv.hit_tokens / max(kv.lookup_tokens, 1),
            "evictions": kv.kv.evictions,
            "preemptions": sim.preemptions,
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
    return out


def chrome_trace(sim: Simulator, name: str = "serve") -> dict:
    """The iterations as Chrome/Perfetto trace events (µs): one slice per iteration, counters of the
    decode batch, waiting requests and KV blocks in use."""
    events = [
        {"ph": "M", "pid": 0, "name": "process_name", "args": {"name": f"NPU ({name})"}},
        {"ph": "M", "pid": 0, "tid": 0, "name": "thread_name", "args": {"name": "iterations"}},
    ]
    for i in sim.iterations:
        ts, dur = i["start"] * 1e6, (i["end"] - i["start"]) * 1e6
        label = " + ".join(
            part
            for part in (
                f"decode x{i['decode']}" if i["decode"] else "",
                f"prefill {i['prefill_tokens']} tok" if i["prefill"] else "",
            )
            if part
        )
        events.append({"ph": "X", "pid": 0, "tid": 0, "name": label, "ts": ts, "dur": dur, "args": i})
        events.append(
            {
                "ph": "C",
                "pid": 0,
                "name": "load",
                "ts": ts,
                "args": {"decode": i["decode"], "waiting": i["waiting"], "kv_blocks": i["kv_blocks_used"]},
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


def timeline(sim: Simulator) -> dict:
    """The run over time, one entry per iteration (columns): its end ``t_s``, the ``tokens`` it
    emitted, the KV blocks in use, the decode batch and the waiting requests."""
    ends = np.array([i["end"] for i in sim.iterations], dtype=float)
    tokens = np.zeros(ends.size, dtype=np.int64)
    for s in sim.finished:  # a token is emitted at the end of the iteration that computed it
        times = s.first_token_s + np.concatenate([[0.0], np.cumsum(s.itl)])
        np.add.at(tokens, np.searchsorted(ends, times - 1e-12), 1)
    return {
        "t_s": ends.tolist(),
        "tokens": tokens.tolist(),
        "kv_blocks_used": [int(i["kv_blocks_used"]) for i in sim.iterations],
        "decode_batch": [int(i["decode"]) for i in sim.iterations],
        "waiting": [int(i["waiting"]) for i in sim.iterations],
    }
