"""The per-node breakdown of the profile: engine cycles, idle time (span minus the union of the
node's busy intervals) and the DRAM memory breakdown."""

from __future__ import annotations

import numpy as np

from mcpc.sim.profile import _covered, memory_breakdown


def _brute_covered(node, issue, busy, k):
    out = np.zeros(k, dtype=np.int64)
    for j in range(k):
        cycles = set()
        for n, s, b in zip(node, issue, busy, strict=True):
            if n == j:
                cycles.update(range(s, s + b))
        out[j] = len(cycles)
    return out


def test_covered_is_the_union_of_busy_intervals():
    rng = np.random.default_rng(0)
    for _ in range(50):
        n, k = int(rng.integers(1, 40)), int(rng.integers(1, 6))
        node = rng.integers(0, k, n)
        issue = rng.integers(0, 200, n)
        busy = rng.integers(0, 30, n)  # zero-cycle instructions cover nothing
        assert _covered(node, issue, busy, k).tolist() == _brute_covered(node, issue, busy, k).tolist()


def test_covered_overlaps_and_gaps():
    # node 0: [0,10) and [5,12) overlap -> 12; node 1: [0,3) and [10,13) with a gap -> 6
    node, issue, busy = np.array([0, 1, 0, 1]), np.array([0, 0, 5, 10]), np.array([10, 3, 7, 3])
    assert _covered(node, issue, busy, 2).tolist() == [12, 6]


def test_memory_breakdown_sums_regions_by_kind():
    mm = {"dram_size": 1000, "regions": [
        {"kind": "const", "bytes": 600, "dram": 0}, {"kind": "input", "bytes": 100, "dram": 600},
        {"kind": "scratch", "bytes": 200, "dram": 700}, {"kind": "persistent", "bytes": 50, "dram": 900},
        {"kind": "scratch", "bytes": 40, "dram": 950}]}  # fmt: skip
    assert memory_breakdown(mm) == {
        "peak_bytes": 1000,
        "bytes_per_kind": {"const": 600, "input": 100, "persistent": 50, "scratch": 240},
    }
