"""Replicas: ``N`` NPUs, each with its own program, KV pool and batching policy, behind a router.

Requests reach the router in arrival order; before routing one, the replicas the router looks at
are advanced to its arrival time (every iteration that starts before it has been planned), so the
router sees each replica's state at that instant.  Routers:

- ``round_robin``: request ``i`` goes to replica ``i mod N``;
- ``least_tokens``: to the replica with the fewest outstanding tokens (prompt tokens still to
  prefill, recomputation after a preemption included, plus output tokens still to generate, over
  its waiting and running requests); ties dealt in turn (the first tied replica after the one the
  previous request went to), so idle replicas share a light load;
- ``prefix_affinity``: to the replica whose KV cache holds the longest cached prefix of the
  request's prompt (full blocks, by the KV manager's chained hashes: a shared-prefix group's system
  prompt lands where it is already cached), ties and no hit anywhere falling back to
  ``least_tokens``.

A replica is a ``Simulator``; one replica behind any router serves exactly as ``Simulator.run``.
"""

from __future__ import annotations

from collections.abc import Callable

from mcpc.errors import InternalError, UsageError
from mcpc.sim.kv_manager import ROOT_HASH, block_hash

from .cost import ServedShape, StepCost
from .engine import Seq, Simulator
from .workload import Request

ROUTERS = ("round_robin", "least_tokens", "prefix_affinity")


def prefix_hashes(prompt, block: int) -> list[bytes]:
    """The chained hashes of the full blocks of ``prompt`` a prefix hit may reuse (never the block
    holding the last prompt token: ``KVManager.add_sequence``'s rule)."""
    toks = prompt.tolist() if hasattr(prompt, "tolist") else list(prompt)
    out, parent = [], ROOT_HASH
    for j in range((len(toks) - 1) // block if toks else 0):
        parent = block_hash(parent, toks[j * block : (j + 1) * block])
        out.append(parent)
    return out


class Fleet:
    """``replicas`` simulators of ``shape`` / ``cost``, each with a policy from ``make_policy()``."""

    def __init__(
        self,
        requests: list[Request],
        cost: StepCost,
        shape: ServedShape,
        make_policy: Callable[[], object],
        replicas: int,
        router: str = "least_tokens",
        check: bool = False,
    ):
        if replicas < 1:
            raise UsageError(f"--replicas must be at least 1, got {replicas}")
        if router not in ROUTERS:
            raise UsageError(f"--router: expected one of {', '.join(ROUTERS)}, got {router!r}")
        self.requests, self.router = requests, router
        self.replicas = [
            Simulator(requests, cost, shape, make_policy(), check=check) for _ in range(replicas)
        ]
        self.assigned = [0] * replicas
        self.prefix_routed = 0  # requests prefix_affinity placed by a cache hit
        self.last = -1  # the replica the previous request went to (ties are dealt in turn after it)

    @property
    def finished(self) -> list[Seq]:
        return [s for r in self.replicas for s in r.finished]

    def _least(self, candidates) -> int:
        n, last = len(self.replicas), self.last
        return min(candidates, key=lambda k: (self.replicas[k].outstanding, (k - last - 1) % n))

    def route(self, req: Request, index: int) -> int:
        n = len(self.replicas)
        if self.router == "round_robin":
            return index % n
        if self.router == "prefix_affinity":
            hashes = prefix_hashes(req.prompt, self.replicas[0].kv.block)
            if hashes:
                hits = []
                for r in self.replicas:
                    kv, depth = r.kv.kv, 0
                    while depth < len(hashes) and kv.is_cached(hashes[depth]):
                        depth += 1
                    hits.append(depth)
                best = max(hits)
                if best:
                    self.prefix_routed += 1
                    return self._least([k for k in range(n) if hits[k] == best])
        return self._least(range(n))

    def run(self, progress: Callable[[int, int], None] | None = None) -> list[Seq]:
        """Serve every request; returns the finished sequences of all replicas."""
        reqs = sorted(self.requests, key=lambda r: (r.arrival_s, r.id))
        n = len(reqs)
        if progress:
            tick = lambda _done: progress(sum(len(r.finished) for r in self.replicas), n)  # noqa: E731
            for r in self.replicas:
                r.progress = tick
        look_all = self.router != "round_robin"  # round robin reads no replica state
        for i, req in enumerate(reqs):
            t = req.arrival_s
            if look_all:
                for r in self.replicas:
                    r.advance(t)
            k = self.route(req, i)
            self.replicas[k].advance(t)
            self.replicas[k].arrive(req)
            self.assigned[k] += 1
            self.last = k
        for r in self.replicas:
            r.arrivals_done = True
            r.advance(float("inf"))
        done = self.finished
        if len(done) != n or len({s.id for s in done}) != n:
            raise InternalError(f"{len(done)} of {n} requests finished across the replicas")
        return done
