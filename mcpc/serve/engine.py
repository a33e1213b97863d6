"""The serving simulator: one NPU over virtual time, driven by a batching policy.

The only clock is the event loop: requests arrive at their workload times; whenever the NPU is free
the policy is asked for the next *iteration* (prefill chunks and/or one decode step of some
sequences), which lasts its step cost (``StepCost``: the decode call, then each prefill chunk, back
to back) and takes effect when it ends: a sequence whose prompt is fully prefilled emits its first
token, every decoding sequence emits one token, a sequence with all its output tokens leaves and
frees its KV blocks.  A policy may instead answer "wait until t" (a queue delay expiring) or "wait
for the next arrival".  Nothing here depends on wall time, so a seed gives the same run every time.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from mcpc.errors import InputError, InternalError

from .cost import ServedShape, StepCost
from .kv import ServingKV
from .workload import Request


@dataclass(eq=False)
class Seq:
    """A request being served: its KV context and the times of its tokens."""

    req: Request
    tokens: np.ndarray  # what prefill computes: the prompt (plus generated ids after a preemption)
    prefilled: int = 0
    ctx: int = 0  # tokens whose K/V are in the cache
    generated: int = 0
    admitted_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    finish_s: float | None = None
    preemptions: int = 0
    itl: array = field(default_factory=lambda: array("d"))  # its inter-token gaps (s)
    ids: array = field(default_factory=lambda: array("q"))  # its generated token ids

    @property
    def id(self) -> int:
        return self.req.id

    @property
    def prefill_done(self) -> bool:
        return self.prefilled >= len(self.tokens)


@dataclass
class Iteration:
    """One step of the NPU: ``prefill`` chunks (sequence, tokens) and one decode token for ``decode``."""

    decode: list[Seq] = field(default_factory=list)
    prefill: list[tuple[Seq, int]] = field(default_factory=list)


class IterationLog:
    """The iterations of a run, one row each, stored as columns of float64 (a long run has millions):
    ``log[i]`` is a dict of ``FIELDS`` (counts as ints), ``log.column(name)`` a numpy array."""

    FIELDS = ("start", "end", "decode", "prefill", "prefill_tokens", "kv_tokens", "decode_cycles",
              "prefill_cycles", "kv_blocks_used", "waiting", "dram_bytes")  # fmt: skip
    _FLOAT = frozenset({"start", "end", "decode_cycles", "prefill_cycles", "dram_bytes"})

    def __init__(self):
        self._data = array("d")  # the rows back to back
        self.append = self._data.extend  # one row: a tuple of len(FIELDS) numbers

    def __len__(self) -> int:
        return len(self._data) // len(self.FIELDS)

    def column(self, name: str) -> np.ndarray:
        rows = np.frombuffer(self._data, dtype=np.float64) if len(self._data) else np.zeros(0)
        return rows.reshape(-1, len(self.FIELDS))[:, self.FIELDS.index(name)]

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self.FIELDS)
        i = range(len(self))[i]  # negative indices, IndexError beyond the end
        row = self._data[i * n : (i + 1) * n]
        return {f: (v if f in self._FLOAT else int(v)) for f, v in zip(self.FIELDS, row, strict=True)}

    def __iter__(self):
        return (self[i] for i in range(len(self)))


class Simulator:
    """Serves ``requests`` with ``policy`` on a model of ``shape`` whose steps cost ``cost``."""

    def __init__(
        self, requests: list[Request], cost: StepCost, shape: ServedShape, policy, check: bool = False
    ):
        self.requests, self.cost, self.shape, self.policy = requests, cost, shape, policy
        self.check = check
        # DRAM bytes of each step when the cost knows them (0 otherwise: no bandwidth figures)
        self.bandwidth = getattr(cost, "dram_bytes_per_s", None)
        self.kv = ServingKV(shape.kv_blocks, shape.block, shape.kv_bytes_per_token, shape.max_seq)
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.finished: list[Seq] = []
        self.now = 0.0
        self.arrivals_done = False
        self.iterations = IterationLog()
        self.preemptions = 0
        self.outstanding = 0  # tokens still to compute: prompts (recompute included) and outputs
        self.progress: Callable[[int], None] | None = None
        self._made = 1 << 40  # generated ids: unique, outside any vocabulary (timing never reads them)
        self._validate()

    def _validate(self) -> None:
        s = self.shape
        longest = max(self.requests, key=lambda r: r.prompt_len + r.output_len, default=None)
        if longest is None:
            raise InputError("the workload holds no requests")
        need = longest.prompt_len + longest.output_len
        if need > s.max_seq:
            n = sum(1 for r in self.requests if r.prompt_len + r.output_len > s.max_seq)
            raise InputError(
                f"{n} request(s) need more than the build's max_seq {s.max_seq} tokens (request "
                f"{longest.id}: prompt {longest.prompt_len} + output {longest.output_len} = {need}): shorten "
                "prompt_len/output_len in the workload or build with a larger --max-seq"
            )
        if -(-need // s.block) > s.kv_blocks:
            raise InputError(
                f"request {longest.id} needs {-(-need // s.block)} KV blocks of {s.block} tokens, the "
                f"build's pool holds {s.kv_blocks} (--kv-blocks)"
            )

    # -- what policies call ------------------------------------------------------------------
    def admit(self, seq: Seq, reserve: int, keep: int = 0) -> bool:
        """Reserve KV for ``seq`` (``reserve`` tokens, leaving ``keep`` spare blocks) and make it
        running; False when it does not fit."""
        hit = self.kv.admit(seq.id, seq.tokens, reserve, keep)
        if hit is None:
            return False
        seq.prefilled = seq.ctx = hit
        self.outstanding -= hit
        if seq.admitted_s is None:
            seq.admitted_s = self.now
        self.running.append(seq)
        return True

    def preempt(self, seq: Seq) -> None:
        """Evict ``seq`` by recompute: free its KV (its full blocks stay cached until evicted),
        requeue it first with its generated tokens appended to what its next prefill computes."""
        self.kv.free(seq.id)
        self.running.remove(seq)
        before = len(seq.tokens) - seq.prefilled
        seq.tokens = np.concatenate([seq.req.prompt, np.asarray(seq.ids, dtype=np.int64)])
        self.outstanding += len(seq.tokens) - before  # its prefill starts again, generated ids too
        seq.prefilled = seq.ctx = 0
        seq.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(seq)

    # -- the loop ----------------------------------------------------------------------------
    def _emit(self, seq: Seq, t: float) -> None:
        seq.generated += 1
        self.outstanding -= 1
        self._made += 1
        seq.ids.append(self._made)
        if seq.first_token_s is None:
            seq.first_token_s = t
        else:
            seq.itl.append(t - seq.last_token_s)
        seq.last_token_s = t
        if seq.generated >= seq.req.output_len:
            seq.finish_s = t
            self.kv.free(seq.id)
            self.running.remove(seq)
            self.finished.append(seq)

    def _run(self, it: Iteration) -> None:
        if not it.decode and not it.prefill:
            raise InternalError(f"policy {self.policy.name} planned an empty iteration")
        s = self.shape
        if len(it.decode) > s.max_batch:
            raise InternalError(
                f"policy {self.policy.name} decodes {len(it.decode)} > max_batch {s.max_batch}"
            )
        # the K/V rows this iteration writes: each prefill chunk, each decode step's input token
        append, cost, c = self.kv.append, self.cost, self.bandwidth
        decode_c = prefill_c = nbytes = 0.0
        prefill_tokens = kv_tokens = 0
        for q, n in it.prefill:
            prefill_c += cost.prefill_cost(n, q.prefilled)
            if c:
                nbytes += cost.prefill_bytes(n, q.prefilled)
            prefill_tokens += n
            if not append(q.id, q.tokens[q.prefilled : q.prefilled + n]):
                raise InternalError(f"policy {self.policy.name} runs sequence {q.id} without KV room")
        for q in it.decode:
            kv_tokens += q.ctx + 1
            if not append(q.id, q.ids[-1:]):
                raise InternalError(f"policy {self.policy.name} runs sequence {q.id} without KV room")
        if it.decode:
            decode_c = cost.decode_cost(len(it.decode), kv_tokens)
            if c:
                nbytes += cost.decode_bytes(len(it.decode), kv_tokens)
        start, end = self.now, self.now + (decode_c + prefill_c) / cost.clock_hz
        self.iterations.append(
            (start, end, len(it.decode), len(it.prefill), prefill_tokens, kv_tokens, decode_c, prefill_c,
             self.kv.used_blocks, len(self.waiting), nbytes)
        )  # fmt: skip
        self.now = end
        self.outstanding -= prefill_tokens
        for seq, n in it.prefill:
            seq.prefilled += n
            seq.ctx += n
            if seq.prefilled >= len(seq.tokens):
                self._emit(seq, end)
        for seq in it.decode:
            seq.ctx += 1
            self._emit(seq, end)
        if self.check:
            self.kv.check([q.id for q in self.running])
            assert all(self.kv.num_tokens(q.id) == q.ctx for q in self.running)
            assert self.outstanding == sum(
                len(q.tokens) - q.prefilled + q.req.output_len - q.generated
                for q in (*self.waiting, *self.running)
            ), "outstanding tokens out of step"

    # -- the event loop: arrivals in time order, each replica advanced to an arrival before it ---
    def arrive(self, req: Request) -> None:
        """Queue ``req`` (its arrival time is at most ``now``: ``advance`` to it first)."""
        self.waiting.append(Seq(req, req.prompt))
        self.outstanding += req.prompt_len + req.output_len
        self.policy.on_arrival(req.arrival_s)

    def advance(self, until: float) -> None:
        """Run iterations and waits while the NPU's clock is before ``until`` (an iteration started
        before it runs to its end, past it); the clock ends at ``until`` or later.  ``until`` = inf
        (after the last arrival, ``arrivals_done`` set) serves everything queued."""
        while self.now < until:
            plan = self.policy.plan(self)
            if isinstance(plan, Iteration):
                before = len(self.finished)
                self._run(plan)
                if self.progress and len(self.finished) != before:
                    self.progress(len(self.finished))
                continue
            wake = float("inf") if plan is None else float(plan)
            if wake <= self.now:
                raise InternalError(f"policy {self.policy.name} asked to wait until {wake} at {self.now}")
            nxt = min(until, wake)
            if nxt == float("inf"):
                if not self.waiting and not self.running:
                    return  # idle and nothing more will come
                raise InternalError(
                    f"policy {self.policy.name} waits with nothing to wait for ({len(self.waiting)} waiting, "
                    f"{len(self.running)} running)"
                )
            self.now = nxt

    def run(self, progress: Callable[[int, int], None] | None = None) -> list[Seq]:
        """Serve every request; returns the finished sequences (each request exactly once)."""
        reqs = sorted(self.requests, key=lambda r: (r.arrival_s, r.id))
        n = len(reqs)
        self.progress = (lambda done: progress(done, n)) if progress else None
        for r in reqs:
            self.advance(r.arrival_s)
            self.arrive(r)
        self.arrivals_done = True
        self.advance(float("inf"))
        distinct = len({s.id for s in self.finished})
        if len(self.finished) != n or distinct != n:
            raise InternalError(f"{len(self.finished)} of {n} requests finished ({distinct} distinct)")
        return self.finished
