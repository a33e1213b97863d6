"""Workloads of the serving simulator: when requests arrive, how long their prompts and outputs
are, which share a prefix.  A workload file::

    seed: 1
    requests: 1000
    arrival: {process: poisson, rate_per_s: 20}
    prompt_len: {dist: uniform, min: 32, max: 512}
    output_len: {dist: fixed, value: 64}
    prefix_groups: [{tokens: 256, share: 0.5}]      # optional: shared system prompts
    slo: {ttft_ms: 500, tpot_ms: 50}                # optional: goodput counts requests meeting both

Arrival processes: ``poisson`` (``rate_per_s``), ``gamma`` (``rate_per_s``, ``burstiness`` = CV² of
the inter-arrival time, 1 = Poisson), ``ar_poisson`` (the rate λ_k of interval k of ``interval_s``
seconds is α·λ_{k−1} + (1 − α)·Poisson(μ_k·interval_s)/interval_s, α = ``alpha`` 0.75, μ from
``rate_per_s`` or a piecewise-constant ``rate_schedule``; Poisson arrivals at λ_k inside the
interval), ``trace`` (JSONL replay, one request a line: ``arrival_s`` and ``prompt_len`` or
``prompt_tokens`` (a list of token ids), ``output_len``).  Lengths: ``fixed``, ``uniform``
(inclusive), ``zipf`` (P(n) ∝ (n − min + 1)^−a on [min, max]) and ``trace`` (the arrival trace's
lengths).  ``prompt_len`` is the request's own part: a request of a prefix group starts with that
group's ``tokens`` shared token ids (the same ids for every member, so the KV manager can share
their blocks), then ``prompt_len`` ids of its own.  Everything is drawn from one
``numpy.random.default_rng(seed)``, so a workload is the same requests on every run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import Field, model_validator

from mcpc.errors import ConfigError

from .config import Section, load_yaml, validate

# -- schema ------------------------------------------------------------------------------------


class Poisson(Section):
    process: Literal["poisson"]
    rate_per_s: float = Field(gt=0)


class Gamma(Section):
    process: Literal["gamma"]
    rate_per_s: float = Field(gt=0)
    burstiness: float = Field(default=1.0, gt=0, description="CV² of the inter-arrival time")


class RatePoint(Section):
    at_s: float = Field(ge=0)
    rate_per_s: float = Field(ge=0)


class ArPoisson(Section):
    process: Literal["ar_poisson"]
    rate_per_s: float | None = Field(default=None, gt=0)
    rate_schedule: list[RatePoint] | None = None
    alpha: float = Field(default=0.75, ge=0, lt=1)
    interval_s: float = Field(default=1.0, gt=0)

    @model_validator(mode="after")
    def _one_rate(self):
        if (self.rate_per_s is None) == (self.rate_schedule is None):
            raise ValueError("give exactly one of rate_per_s and rate_schedule")
        sched = self.rate_schedule
        if sched is not None:
            if not sched or sched[0].at_s != 0:
                raise ValueError("rate_schedule must start with a point at_s: 0")
            if any(b.at_s <= a.at_s for a, b in zip(sched, sched[1:], strict=False)):
                raise ValueError("rate_schedule: at_s must increase")
            if sched[-1].rate_per_s <= 0:
                raise ValueError(
                    "rate_schedule: the last rate must be > 0 (else the requests never all arrive)"
                )
        return self

    def mu(self, t: float) -> float:
        if self.rate_schedule is None:
            return float(self.rate_per_s)
        rate = self.rate_schedule[0].rate_per_s
        for p in self.rate_schedule:
            if p.at_s <= t:
                rate = p.rate_per_s
        return rate


class Trace(Section):
    process: Literal["trace"]
    path: str


Arrival = Annotated[Poisson | Gamma | ArPoisson | Trace, Field(discriminator="process")]


class Fixed(Section):
    dist: Literal["fixed"]
    value: int = Field(ge=1)


class _Range(Section):
    """A length drawn between ``min`` and ``max`` (inclusive), which must be in order."""

    @model_validator(mode="after")
    def _order(self):
        if self.max < self.min:
            raise ValueError(f"max {self.max} is below min {self.min}")
        return self


class Uniform(_Range):
    dist: Literal["uniform"]
    min: int = Field(ge=1)
    max: int = Field(ge=1)


class Zipf(_Range):
    dist: Literal["zipf"]
    a: float = Field(gt=0)
    min: int = Field(default=1, ge=1)
    max: int = Field(ge=1)


class FromTrace(Section):
    dist: Literal["trace"]


Length = Annotated[Fixed | Uniform | Zipf | FromTrace, Field(discriminator="dist")]


class PrefixGroup(Section):
    tokens: int = Field(ge=1, description="length of the shared prefix in tokens")
    share: float = Field(gt=0, le=1, description="fraction of requests that start with it")


class Slo(Section):
    ttft_ms: float | None = Field(default=None, gt=0)
    tpot_ms: float | None = Field(default=None, gt=0)
    e2e_ms: float | None = Field(default=None, gt=0)


class WorkloadSpec(Section):
    """A workload file, validated."""

    seed: int = 0
    requests: int | None = Field(default=None, ge=1)
    arrival: Arrival
    prompt_len: Length | None = None
    output_len: Length | None = None
    prefix_groups: list[PrefixGroup] = Field(default_factory=list)
    vocab: int = Field(default=32000, ge=2)
    slo: Slo = Field(default_factory=Slo)

    @model_validator(mode="after")
    def _consistent(self):
        is_trace = self.arrival.process == "trace"
        if not is_trace and self.requests is None:
            raise ValueError("requests: missing required key (only a trace arrival knows its own count)")
        for key in ("prompt_len", "output_len"):
            dist = getattr(self, key)
            if dist is None and not is_trace:
                raise ValueError(f"{key}: missing required key")
            if dist is not None and dist.dist == "trace" and not is_trace:
                raise ValueError(f"{key}: dist trace needs arrival.process trace")
        if sum(g.share for g in self.prefix_groups) > 1 + 1e-9:
            raise ValueError("prefix_groups: the shares add up to more than 1")
        return self


# -- requests ----------------------------------------------------------------------------------


@dataclass
class Request:
    """One request: arrival time (s), prompt token ids (shared prefix first), output length."""

    id: int
    arrival_s: float
    prompt: np.ndarray  # int64 token ids
    output_len: int
    prefix_group: int | None = None

    @property
    def prompt_len(self) -> int:
        return int(self.prompt.size)


def load_workload(path: str | Path) -> tuple[WorkloadSpec, list[Request]]:
    """Read, validate and generate a workload file; ConfigError naming the file and key path."""
    path = Path(path)
    spec = validate(WorkloadSpec, load_yaml(path, "workload"), str(path))
    return spec, generate(spec, base=path.parent, source=str(path))


def _read_trace(path: Path, source: str) -> list[dict]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        why = exc.strerror or exc
        raise ConfigError(f"{source}: arrival.path: cannot read trace {path}: {why}") from None
    rows = []
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{no}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}: not JSON: {exc.msg}") from None
        if not isinstance(row, dict):
            raise ConfigError(
                f"{where}: expected an object with arrival_s, prompt_len or prompt_tokens, output_len"
            )
        arrival = row.get("arrival_s")
        if isinstance(arrival, bool) or not isinstance(arrival, (int, float)) or arrival < 0:
            raise ConfigError(f"{where}: arrival_s must be a number >= 0, got {arrival!r}")
        tokens = row.get("prompt_tokens")
        if tokens is not None:
            if (
                not isinstance(tokens, list)
                or not tokens
                or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in tokens)
            ):
                raise ConfigError(f"{where}: prompt_tokens must be a non-empty list of token ids >= 0")
        for key in ("prompt_len", "output_len"):
            value = row.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"{where}: {key} must be an integer >= 1, got {value!r}")
        rows.append({**row, "_where": where})
    if not rows:
        raise ConfigError(f"{source}: arrival.path: trace {path} holds no requests")
    if any(b["arrival_s"] < a["arrival_s"] for a, b in zip(rows, rows[1:], strict=False)):
        raise ConfigError(f"{path}: arrival_s must not decrease from one line to the next")
    return rows


def _arrivals(arrival, n: int, rng: np.random.Generator) -> np.ndarray:
    if arrival.process == "poisson":
        return np.cumsum(rng.exponential(1.0 / arrival.rate_per_s, n))
    if arrival.process == "gamma":
        shape = 1.0 / arrival.burstiness
        return np.cumsum(rng.gamma(shape, 1.0 / (arrival.rate_per_s * shape), n))
    # ar_poisson: one rate per interval, Poisson arrivals at that rate inside it
    out: list[float] = []
    dt, alpha = arrival.interval_s, arrival.alpha
    lam, k = arrival.mu(0.0), 0
    while len(out) < n:
        start = k * dt
        if k > 0:
            lam = alpha * lam + (1 - alpha) * rng.poisson(arrival.mu(start) * dt) / dt
        count = rng.poisson(lam * dt)
        out.extend(np.sort(start + rng.uniform(0.0, dt, count)).tolist())
        k += 1
    return np.asarray(out[:n])


def _lengths(
    dist, n: int, rng: np.random.Generator, trace_values: list[int | None] | None, key: str
) -> np.ndarray:
    if dist.dist == "fixed":
        return np.full(n, dist.value, dtype=np.int64)
    if dist.dist == "uniform":
        return rng.integers(dist.min, dist.max + 1, n)
    if dist.dist == "zipf":
        support = np.arange(dist.min, dist.max + 1)
        weights = (support - dist.min + 1.0) ** -dist.a
        return rng.choice(support, size=n, p=weights / weights.sum())
    assert trace_values is not None
    missing = [i for i, v in enumerate(trace_values) if v is None]
    if missing:
        raise ConfigError(f"{key}: dist trace, but trace line {missing[0] + 1} has no {key}")
    return np.asarray(trace_values, dtype=np.int64)


def generate(spec: WorkloadSpec, base: Path = Path("."), source: str = "<workload>") -> list[Request]:
    """The requests of ``spec``, in arrival order (a trace path is relative to ``base``)."""
    rng = np.random.default_rng(spec.seed)
    rows = None
    if spec.arrival.process == "trace":
        trace_path = Path(spec.arrival.path)
        rows = _read_trace(trace_path if trace_path.is_absolute() else base / trace_path, source)
        if spec.requests is not None:
            if spec.requests > len(rows):
                raise ConfigError(f"{source}: requests: {spec.requests} asked, the trace holds {len(rows)}")
            rows = rows[: spec.requests]
        n = len(rows)
        arrivals = np.asarray([float(r["arrival_s"]) for r in rows])
    else:
        n = int(spec.requests)
        arrivals = _arrivals(spec.arrival, n, rng)
    prompt_from_trace = output_from_trace = None
    if rows is not None:
        prompt_from_trace = [
            len(r["prompt_tokens"]) if r.get("prompt_tokens") is not None else r.get("prompt_len")
            for r in rows
        ]
        output_from_trace = [r.get("output_len") for r in rows]
    prompt_dist = spec.prompt_len or FromTrace(dist="trace")
    output_dist = spec.output_len or FromTrace(dist="trace")
    prompt_lens = _lengths(prompt_dist, n, rng, prompt_from_trace, f"{source}: prompt_len")
    output_lens = _lengths(output_dist, n, rng, output_from_trace, f"{source}: output_len")
    # prefix groups: ids drawn once per group; membership by share (the rest share nothing)
    prefixes = [rng.integers(0, spec.vocab, g.tokens) for g in spec.prefix_groups]
    edges = np.cumsum([g.share for g in spec.prefix_groups])
    membership = np.searchsorted(edges, rng.uniform(0.0, 1.0, n), side="right")
    requests = []
    for i in range(n):
        own = None
        if rows is not None and rows[i].get("prompt_tokens") is not None and spec.prompt_len is None:
            own = np.asarray(rows[i]["prompt_tokens"], dtype=np.int64)
        if own is None:
            own = rng.integers(0, spec.vocab, int(prompt_lens[i]))
        group = int(membership[i]) if membership[i] < len(prefixes) else None
        prompt = own if group is None else np.concatenate([prefixes[group], own])
        requests.append(Request(i, float(arrivals[i]), prompt.astype(np.int64), int(output_lens[i]), group))
    return requests
