"""Shared check of timing-only runs: the same cycles, profile and trace as the functional run."""

from __future__ import annotations

from mcpc.sim.api import LoadedProgram, run_program


def assert_timing_only_matches(program: LoadedProgram, inputs: dict, entry: str = "main") -> None:
    """A functional run then a timing-only run (and two functional runs again): the timing-only run
    reports exactly the functional profile and trace, and no outputs; later runs give the same bits."""
    full = run_program(program, inputs, entry=entry, trace=True)
    fast = run_program(program, inputs, entry=entry, trace=True, timing_only=True)
    assert full.outputs, "the functional run produced no outputs"
    assert fast.outputs == {}
    # the numeric guards need values: a timing-only run reports none (null), not "clean"
    assert fast.profile["numeric"] is None and full.profile["numeric"] is not None
    assert {**fast.profile, "numeric": None} == {**full.profile, "numeric": None}
    assert fast.trace_events == full.trace_events
    for _ in range(2):  # the program's own machine (sim/fastpath.py): prepared, then lean
        again = run_program(program, inputs, entry=entry)
        for name, y in full.outputs.items():
            assert y.tobytes() == again.outputs[name].tobytes(), f"{name} changed in a later run"
