"""Running many builds: in this process (``jobs=1``), on a local process pool (``jobs=N``) or on a
Ray cluster (``ray_address``; the optional extra ``mcpc[ray]``).  Each build is one call of
``mcpc.measure.measure_build`` wherever it runs, so all three give the same rows (wall times
aside).

A build's own failure is already a row (``measure_build`` never raises for it).  A worker that dies
(killed, out of memory) or a Ray task that is lost produces no row: those builds are returned as
``lost`` so the caller can say so, and a resumable caller (``mcpc sweep``) simply runs them again
next time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from mcpc.errors import UsageError
from mcpc.measure import BuildSpec, measure_build


@dataclass
class RunOutcome:
    """Rows in completion order, and the builds that produced none (with why)."""

    rows: list[dict] = field(default_factory=list)
    lost: list[tuple[BuildSpec, str]] = field(default_factory=list)


def run_builds(
    specs: Sequence[BuildSpec],
    jobs: int = 1,
    ray_address: str | None = None,
    on_row: Callable[[dict], None] | None = None,
) -> RunOutcome:
    """Measure every spec; ``on_row`` is called in this process as each row arrives."""
    if jobs < 1:
        raise UsageError(f"-j {jobs}: the number of parallel builds must be at least 1")
    outcome = RunOutcome()

    def deliver(row: dict) -> None:
        outcome.rows.append(row)
        if on_row is not None:
            on_row(row)

    if ray_address is not None:
        _run_ray(specs, jobs, ray_address, deliver, outcome)
    elif jobs == 1 or len(specs) <= 1:
        for spec in specs:
            deliver(measure_build(spec))
    else:
        _run_pool(specs, jobs, deliver, outcome)
    return outcome


def _run_pool(specs, jobs, deliver, outcome) -> None:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    # spawn: a forked child would inherit ONNX Runtime's and BLAS's threads in an unknown state
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        futures = {pool.submit(measure_build, spec): spec for spec in specs}
        for future in as_completed(futures):
            try:
                row = future.result()
            except Exception as err:  # BrokenProcessPool: the worker died, the build has no row
                outcome.lost.append((futures[future], f"{type(err).__name__}: {err}"))
                continue
            deliver(row)


def _run_ray(specs, jobs, address, deliver, outcome) -> None:
    try:
        import ray
    except ImportError:
        raise UsageError(
            f"--ray-address {address}: Ray is not installed; install the optional extra with "
            "pip install 'mcpc[ray]' (or pip install -e '.[ray]' in a clone)"
        ) from None
    started = not ray.is_initialized()
    if started:
        options = {"address": address, "log_to_driver": False, "include_dashboard": False}
        if address == "local":
            options["num_cpus"] = jobs
        try:
            ray.init(**options)
        except Exception as err:  # Ray raises ConnectionError or its own types for an absent cluster
            raise UsageError(
                f"--ray-address {address}: cannot connect to a Ray cluster ({type(err).__name__}: {err})"
            ) from None
    try:
        task = ray.remote(num_cpus=1, max_retries=0)(measure_build)
        pending = {task.remote(spec): spec for spec in specs}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            spec = pending.pop(done[0])
            try:
                row = ray.get(done[0])
            except Exception as err:  # a lost worker or node: no row for this build
                outcome.lost.append((spec, f"{type(err).__name__}: {err}"))
                continue
            deliver(row)
    finally:
        if started:
            ray.shutdown()
