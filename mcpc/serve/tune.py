"""``tune-batching``: search batching parameters so that a latency P99 meets an SLO while the
throughput is highest, every candidate measured by a full serving simulation of the workload.

Two searches:

- ``table`` (the sequence-length table, ``seqlen_table``): the batch size of each bucket, over the
  powers of two up to the build's ``max_batch`` (and ``max_batch`` itself), by coordinate descent:
  starting from every bucket at ``max_batch``, each bucket in turn tries every size with the other
  buckets fixed and keeps the best, until a pass changes nothing (at most ``passes``);
- ``continuous``: ``max_seqs`` over the same sizes times ``token_budget`` over the prefill chunk
  times 1, 2, 4, 8, 16 (at least ``max_seqs``), exhaustively.

A setting is *feasible* when the P99 of the chosen metric (``e2e``, ``ttft`` or ``tpot``) is within
the SLO over every request and within each bucket's requests.  The best setting is the feasible one
of the highest generated-token throughput (ties: the lower worst P99); with none feasible, the
search reports the setting of the lowest worst P99 and fails.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .cost import ServedShape, StepCost
from .engine import Simulator
from .metrics import summarize, tpot_s
from .policies import Bucket, ContinuousSpec, SeqLenTableSpec, make_policy

METRICS = ("e2e", "ttft", "tpot")


def _value(seq, metric: str) -> float | None:
    if metric == "e2e":
        return seq.finish_s - seq.req.arrival_s
    if metric == "ttft":
        return seq.first_token_s - seq.req.arrival_s
    return tpot_s(seq)


def p99_ms(seqs, metric: str) -> float | None:
    vals = [v for s in seqs if (v := _value(s, metric)) is not None]
    return float(np.percentile(np.asarray(vals) * 1e3, 99)) if vals else None


@dataclass
class Trial:
    """One simulated setting: its policy spec, throughput and P99s (overall and per bucket)."""

    spec: object
    throughput: float
    p99: float | None
    bucket_p99: list[float | None]
    bucket_requests: list[int]
    slo_ms: float

    @property
    def worst(self) -> float:
        vals = [v for v in (self.p99, *self.bucket_p99) if v is not None]
        return max(vals) if vals else 0.0

    @property
    def feasible(self) -> bool:
        return self.worst <= self.slo_ms

    def rank(self):
        return (0, -self.throughput, self.worst) if self.feasible else (1, self.worst, -self.throughput)


def sizes_for(shape: ServedShape) -> list[int]:
    return sorted({1 << k for k in range(shape.max_batch.bit_length()) if 1 << k <= shape.max_batch}
                  | {shape.max_batch})  # fmt: skip


class Tuner:
    """Runs trials of ``requests`` on ``cost``/``shape``; ``bounds`` are the buckets' ``max_prompt``
    (the last None), the buckets every trial's P99 is reported for."""

    def __init__(self, requests, cost: StepCost, shape: ServedShape, slo_ms: float, metric: str = "e2e",
                 bounds: list[int | None] | None = None, max_queue_delay_ms: float = 100.0,
                 progress: Callable[[int, int], None] | None = None):  # fmt: skip
        self.requests, self.cost, self.shape = requests, cost, shape
        self.slo_ms, self.metric, self.delay = slo_ms, metric, max_queue_delay_ms
        base = SeqLenTableSpec(policy="seqlen_table")
        self.bounds = bounds or [b.max_prompt for b in base.buckets]
        self.progress, self.done, self.total = progress, 0, 0
        self.trials: dict[tuple, Trial] = {}

    def bucket_of(self, prompt_len: int) -> int:
        for i, b in enumerate(self.bounds):
            if b is None or prompt_len <= b:
                return i
        return len(self.bounds) - 1

    def trial(self, key: tuple, spec) -> Trial:
        if key in self.trials:
            return self.trials[key]
        sim = Simulator(self.requests, self.cost, self.shape, make_policy(spec, self.shape, "<tune>"))
        sim.run()
        groups: list[list] = [[] for _ in self.bounds]
        for s in sim.finished:
            groups[self.bucket_of(s.req.prompt_len)].append(s)
        t = Trial(
            spec, summarize(sim)["throughput_tokens_per_s"], p99_ms(sim.finished, self.metric),
            [p99_ms(g, self.metric) for g in groups], [len(g) for g in groups], self.slo_ms,
        )  # fmt: skip
        self.trials[key] = t
        self.done += 1
        if self.progress:
            self.progress(self.done, max(self.total, self.done))
        return t

    def table_spec(self, batches) -> SeqLenTableSpec:
        buckets = [Bucket(max_prompt=m, batch=b) for m, b in zip(self.bounds, batches, strict=True)]
        return SeqLenTableSpec(policy="seqlen_table", buckets=buckets, max_queue_delay_ms=self.delay)

    def search_table(self, passes: int = 3) -> Trial:
        sizes = sizes_for(self.shape)
        self.total = passes * len(self.bounds) * len(sizes)
        current = [sizes[-1]] * len(self.bounds)
        best = self.trial(tuple(current), self.table_spec(current))
        for _ in range(passes):
            changed = False
            for i in range(len(self.bounds)):
                for size in sizes:
                    cand = [*current[:i], size, *current[i + 1 :]]
                    t = self.trial(tuple(cand), self.table_spec(cand))
                    if t.rank() < best.rank():
                        best, current, changed = t, cand, True
            if not changed:
                break
        return best

    def search_continuous(self) -> Trial:
        sizes, chunk = sizes_for(self.shape), self.shape.prefill_chunk
        grid = [(m, b) for m in sizes for b in sorted({max(chunk * k, m) for k in (1, 2, 4, 8, 16)})]
        self.total = len(grid)
        trials = [
            self.trial(("continuous", m, b), ContinuousSpec(policy="continuous", max_seqs=m, token_budget=b))
            for m, b in grid
        ]
        return min(trials, key=Trial.rank)


def policy_yaml(best: Trial, tuner: Tuner, header: list[str]) -> str:
    """The policy file of ``best``: a ``seqlen_table`` with each bucket's measured P99 (``p99_ms``),
    or a ``continuous`` policy with the P99 per bucket in comments."""
    lines = [f"# {h}" for h in header]
    spec = best.spec

    def fmt(v):
        return "null" if v is None else f"{v:.4g}"

    if isinstance(spec, SeqLenTableSpec):
        lines += ["policy: seqlen_table", f"max_queue_delay_ms: {spec.max_queue_delay_ms:g}", "buckets:"]
        for b, p, n in zip(spec.buckets, best.bucket_p99, best.bucket_requests, strict=True):
            bound = "" if b.max_prompt is None else f"max_prompt: {b.max_prompt}, "
            lines.append(f"  - {{{bound}batch: {b.batch}, p99_ms: {fmt(p)}}}   # {n} requests")
    else:
        lines += ["policy: continuous", f"max_seqs: {spec.max_seqs}", f"token_budget: {spec.token_budget}"]
        lo = 0
        for bound, p, n in zip(tuner.bounds, best.bucket_p99, best.bucket_requests, strict=True):
            rng = f"prompts {lo + 1}-{bound}" if bound is not None else f"prompts > {lo}"
            lines.append(f"# {rng}: P99 {tuner.metric} {fmt(p)} ms over {n} requests")
            lo = bound or lo
    return "\n".join(lines) + "\n"
