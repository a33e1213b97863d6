"""Batching policies, one small class each behind a registry (``POLICIES``), built from a policy
file::

    policy: continuous          # static | seqlen_table | dynamic | adaptive | continuous
    token_budget: 512           # the policy's own keys (below)

Request-level policies (``static``, ``seqlen_table``, ``dynamic``, ``adaptive``) pick a batch of
waiting requests, reserve KV for each one's whole prompt + output, prefill them (one chunk of each
unfinished prompt per iteration) and decode the batch until its last member finishes; members that
finish leave (the decode entry runs any number of active sequences), but nobody joins before the
batch is done.  ``continuous`` is iteration-level (Orca/vLLM with Sarathi's chunked prefill): every
iteration decodes all running sequences and fills the rest of a token budget with prefill chunks,
admitting waiting requests FCFS while KV and ``max_seqs`` allow; when a decode step finds no free
block it preempts the latest admitted sequence by recompute.  Batch sizes are capped at the
program's ``max_batch`` (the decode entry's batch).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from mcpc.errors import ConfigError, InputError

from .config import Section, load_yaml, validate
from .cost import ServedShape
from .engine import Iteration, Seq, Simulator

# -- policy files ------------------------------------------------------------------------------


class StaticSpec(Section):
    """Wait for ``batch_size`` requests (or ``max_wait_ms``, or the last arrival), run them together."""

    policy: Literal["static"]
    batch_size: int = Field(default=16, ge=1)
    max_wait_ms: float | None = Field(default=None, ge=0)


class Bucket(Section):
    max_prompt: int | None = Field(default=None, ge=1, description="largest prompt length (inclusive)")
    batch: int = Field(ge=1)
    p99_ms: float | None = Field(
        default=None, ge=0, description="informational: the P99 tune-batching measured (not read)"
    )


SEED_TABLE = [Bucket(max_prompt=127, batch=32), Bucket(max_prompt=512, batch=16), Bucket(batch=4)]


class SeqLenTableSpec(Section):
    """The seed's table: prompts < 128 tokens in batches of 32, 128-512 of 16, longer of 4."""

    policy: Literal["seqlen_table"]
    buckets: list[Bucket] = Field(default_factory=lambda: list(SEED_TABLE))
    max_queue_delay_ms: float = Field(default=100.0, ge=0)

    @model_validator(mode="after")
    def _ordered(self):
        bounds = [b.max_prompt for b in self.buckets]
        if not bounds or bounds[-1] is not None or None in bounds[:-1]:
            raise ValueError("buckets: every bucket but the last needs max_prompt; the last has none")
        if bounds[:-1] != sorted(set(bounds[:-1])):
            raise ValueError("buckets: max_prompt must increase")
        return self


class DynamicSpec(Section):
    """Triton's dynamic batcher: preferred sizes, a max queue delay, a max batch size."""

    policy: Literal["dynamic"]
    max_batch_size: int = Field(default=16, ge=1)
    preferred_batch_sizes: list[int] = Field(default_factory=list)
    max_queue_delay_ms: float = Field(default=10.0, ge=0)

    @model_validator(mode="after")
    def _sizes(self):
        if any(p < 1 or p > self.max_batch_size for p in self.preferred_batch_sizes):
            raise ValueError("preferred_batch_sizes: every size must lie in [1, max_batch_size]")
        return self


class AdaptiveSpec(Section):
    """The seed's adaptive batcher: batch from {1, 2, 4, 8, 16} by an EWMA arrival-rate estimate."""

    policy: Literal["adaptive"]
    sizes: list[int] = Field(default_factory=lambda: [1, 2, 4, 8, 16])
    ewma: float = Field(default=0.9, ge=0, lt=1, description="weight of the previous estimate")
    window_ms: float = Field(default=250.0, gt=0, description="batch = requests expected in this window")
    max_queue_delay_ms: float = Field(default=50.0, ge=0)


class ContinuousSpec(Section):
    """Iteration-level batching with chunked prefill."""

    policy: Literal["continuous"]
    token_budget: int = Field(default=512, ge=1)
    max_seqs: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _budget(self):
        if self.max_seqs is not None and self.token_budget < self.max_seqs:
            raise ValueError(
                "token_budget must be at least max_seqs (every running sequence decodes each step)"
            )
        return self


PolicySpec = Annotated[
    StaticSpec | SeqLenTableSpec | DynamicSpec | AdaptiveSpec | ContinuousSpec, Field(discriminator="policy")
]


class _File(Section):
    spec: PolicySpec


def load_policy(path, shape: ServedShape):
    """A policy file (or None: continuous batching with its defaults) as a policy object."""
    if path is None:
        return make_policy(ContinuousSpec(policy="continuous"), shape)
    data = load_yaml(path, "policy")
    if "policy" not in data:
        raise ConfigError(f"{path}: policy: missing required key (one of {', '.join(POLICIES)})")
    return make_policy(validate(_File, {"spec": data}, str(path)).spec, shape, str(path))


def make_policy(spec, shape: ServedShape, source: str = "<policy>"):
    return POLICIES[spec.policy](spec, shape, source)


# -- request-level -----------------------------------------------------------------------------


class RequestLevel:
    """A batch at a time: ``select`` picks requests (or a wake-up time, or None to wait)."""

    name = "request-level"

    def __init__(self, spec, shape: ServedShape, source: str = "<policy>"):
        self.spec, self.shape, self.source = spec, shape, source
        self.batch: list[Seq] = []
        self.batches: list[int] = []

    def on_arrival(self, t: float) -> None:
        pass

    def cap(self, n: int) -> int:
        return max(1, min(n, self.shape.max_batch))

    def select(self, sim: Simulator):
        raise NotImplementedError

    def _take(self, sim: Simulator, chosen: list[Seq]) -> None:
        for seq in chosen:
            sim.waiting.remove(seq)
        admitted = []
        for i, seq in enumerate(chosen):
            if not sim.admit(seq, len(seq.tokens) + seq.req.output_len):
                for back in reversed(chosen[i:]):  # the rest wait, first in line
                    sim.waiting.appendleft(back)
                break
            admitted.append(seq)
        if not admitted:
            raise InputError(
                f"request {chosen[0].id} does not fit the KV pool even alone ({sim.kv.num_blocks} blocks)"
            )
        self.batch = admitted
        self.batches.append(len(admitted))

    def plan(self, sim: Simulator):
        live = [s for s in self.batch if s.finish_s is None]
        if not live:
            chosen = self.select(sim)
            if not isinstance(chosen, list):
                return chosen
            self._take(sim, chosen)
            live = self.batch
        pending = [s for s in live if not s.prefill_done]
        if pending:
            c = self.shape.prefill_chunk
            return Iteration(prefill=[(s, min(c, len(s.tokens) - s.prefilled)) for s in pending])
        return Iteration(decode=live)


class StaticBatch(RequestLevel):
    name = "static"

    def select(self, sim):
        b = self.cap(self.spec.batch_size)
        w = sim.waiting
        if len(w) >= b or (w and sim.arrivals_done):
            return list(w)[:b]
        if w and self.spec.max_wait_ms is not None:
            due = w[0].req.arrival_s + self.spec.max_wait_ms / 1e3
            return list(w)[:b] if sim.now >= due else due
        return None


class SeqLenTable(RequestLevel):
    name = "seqlen_table"

    def _bucket(self, seq: Seq) -> int:
        for i, b in enumerate(self.spec.buckets):
            if b.max_prompt is None or seq.req.prompt_len <= b.max_prompt:
                return i
        return len(self.spec.buckets) - 1

    def select(self, sim):
        groups: dict[int, list[Seq]] = {}
        for seq in sim.waiting:
            groups.setdefault(self._bucket(seq), []).append(seq)
        delay = self.spec.max_queue_delay_ms / 1e3
        ready, wake = [], None
        for i, seqs in groups.items():
            b = self.cap(self.spec.buckets[i].batch)
            due = seqs[0].req.arrival_s + delay
            if len(seqs) >= b or sim.arrivals_done or sim.now >= due:
                ready.append((seqs[0].req.arrival_s, i, seqs[:b]))
            else:
                wake = due if wake is None else min(wake, due)
        return min(ready, key=lambda r: r[:2])[2] if ready else wake


class DynamicBatcher(RequestLevel):
    name = "dynamic"

    def select(self, sim):
        w = sim.waiting
        if not w:
            return None
        top = self.cap(self.spec.max_batch_size)
        preferred = sorted({self.cap(p) for p in self.spec.preferred_batch_sizes})
        full = preferred[-1] if preferred else top
        if len(w) >= full:
            return list(w)[:full]
        due = w[0].req.arrival_s + self.spec.max_queue_delay_ms / 1e3
        if sim.now >= due or sim.arrivals_done:
            fits = [p for p in preferred if p <= len(w)]
            return list(w)[: fits[-1] if fits else min(len(w), top)]
        return due


class AdaptiveBatcher(RequestLevel):
    name = "adaptive"

    def __init__(self, spec, shape, source="<policy>"):
        super().__init__(spec, shape, source)
        self.rate: float | None = None
        self._last: float | None = None
        self.chosen: list[int] = []

    def on_arrival(self, t: float) -> None:
        if self._last is not None and t > self._last:
            inst = 1.0 / (t - self._last)
            w = self.spec.ewma
            self.rate = inst if self.rate is None else w * self.rate + (1 - w) * inst
        self._last = t

    def size(self) -> int:
        want = (self.rate or 0.0) * self.spec.window_ms / 1e3
        fits = [s for s in sorted(self.spec.sizes) if s <= max(want, 1.0)]
        return self.cap(fits[-1] if fits else min(self.spec.sizes))

    def select(self, sim):
        w = sim.waiting
        if not w:
            return None
        b = self.size()
        due = w[0].req.arrival_s + self.spec.max_queue_delay_ms / 1e3
        if len(w) >= b or sim.now >= due or sim.arrivals_done:
            self.chosen.append(b)
            return list(w)[:b]
        return due


# -- iteration-level ---------------------------------------------------------------------------


class ContinuousBatching:
    """Every iteration: decode all running sequences, then prefill chunks up to the token budget."""

    name = "continuous"

    def __init__(self, spec: ContinuousSpec, shape: ServedShape, source: str = "<policy>"):
        self.spec, self.shape, self.source = spec, shape, source
        self.max_seqs = min(spec.max_seqs or shape.max_batch, shape.max_batch)
        self.budget = max(spec.token_budget, self.max_seqs)

    def on_arrival(self, t: float) -> None:
        pass

    def plan(self, sim: Simulator):
        kv = sim.kv
        while True:  # room for each decode step's new K/V row, else preempt the latest admitted
            decode = [s for s in sim.running if s.prefilled >= len(s.tokens)]
            growth = sum(kv.extra_blocks(s.id, 1) for s in decode if not s.ctx % kv.block)
            if growth <= kv.spare:
                break
            sim.preempt(sim.running[-1])
        budget = self.budget - len(decode)
        prefill = []
        for seq in sim.running:  # chunks of prompts already admitted, in admission order
            if budget <= 0:
                break
            if not seq.prefill_done:
                n = min(self.shape.prefill_chunk, len(seq.tokens) - seq.prefilled, budget)
                prefill.append((seq, n))
                budget -= n
        while sim.waiting and len(sim.running) < self.max_seqs and budget > 0:
            seq = sim.waiting[0]
            if not sim.admit(seq, len(seq.tokens), keep=growth):
                break  # FCFS: the head waits for KV, nobody overtakes it
            sim.waiting.popleft()
            n = min(self.shape.prefill_chunk, len(seq.tokens) - seq.prefilled, budget)
            prefill.append((seq, n))
            budget -= n
        if not decode and not prefill:
            return None
        return Iteration(decode=decode, prefill=prefill)


POLICIES = {
    "static": StaticBatch,
    "seqlen_table": SeqLenTable,
    "dynamic": DynamicBatcher,
    "adaptive": AdaptiveBatcher,
    "continuous": ContinuousBatching,
}
