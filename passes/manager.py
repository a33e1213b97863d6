"""The pass manager: runs a pipeline of passes, verifying the module between them, with optional
per-pass IR printing and timing.

The ``Pass`` base class and the registry are in ``mcpc.passes.registry``, the pipeline text syntax
in ``mcpc.passes.pipeline``; their public names are re-exported here (and from ``mcpc.passes``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO

from mcpc.errors import McpcError, VerifyError
from mcpc.passes.pipeline import (  # noqa: F401  (re-exported)
    build_pass,
    build_pipeline,
    format_pass,
    format_pipeline,
    parse_pipeline,
)
from mcpc.passes.registry import (  # noqa: F401  (re-exported)
    REGISTRY,
    Pass,
    PassContext,
    PassRegistry,
    register_pass,
)


@dataclass
class PassTiming:
    """Wall time of one pass and of the verification that followed it."""

    pass_text: str
    seconds: float
    verify_seconds: float


class PassManager:
    """Runs passes in order, verifying the module before the first and after every pass.

    Guarantees: the returned module verified after the last pass (when ``verify_each``); a
    VerifyError is re-raised naming the pass after which the module became invalid; other errors
    propagate unchanged (McpcErrors keep their exit code; anything else gets a note naming the pass).
    """

    def __init__(
        self,
        passes: Sequence[Pass],
        verify_each: bool = True,
        print_ir_after_all: TextIO | None = None,
        time_passes: bool = False,
    ) -> None:
        self.passes = list(passes)
        self.verify_each = verify_each
        self.print_ir_after_all = print_ir_after_all
        self.time_passes = time_passes
        self.timings: list[PassTiming] = []

    def run(self, module, ctx: PassContext | None = None):
        """Apply every pass to ``module`` and return the result (passes may return a new module)."""
        ctx = ctx if ctx is not None else PassContext()
        self.timings = []
        if self.verify_each:
            try:
                module.verify()
            except VerifyError as exc:
                raise VerifyError(f"input module is invalid before any pass ran: {exc.message}") from exc
        for p in self.passes:
            text = format_pass(p)
            start = time.perf_counter()
            try:
                result = p.apply(module, ctx)
            except McpcError:
                raise
            except Exception as exc:
                if hasattr(exc, "add_note"):  # Python >= 3.11; the CLI shows notes in its report
                    exc.add_note(f"while running pass {text}")
                raise
            if result is None:
                raise TypeError(f"pass {p.name!r} returned None instead of a module")
            module = result
            applied = time.perf_counter()
            if self.verify_each:
                try:
                    module.verify()
                except VerifyError as exc:
                    raise VerifyError(f"IR is invalid after pass {text}: {exc.message}") from exc
            self.timings.append(PassTiming(text, applied - start, time.perf_counter() - applied))
            if self.print_ir_after_all is not None:
                from mcpc.ir import print_module

                print(f"// ----- IR after {text} ----- //", file=self.print_ir_after_all)
                print(print_module(module), file=self.print_ir_after_all)
        return module

    def timing_table(self):
        """A rich Table of per-pass wall times (pass, verify, share of total)."""
        from rich.table import Table

        total = sum(t.seconds + t.verify_seconds for t in self.timings) or 1e-12
        table = Table(title="pass timing", title_justify="left")
        table.add_column("pass")
        table.add_column("apply ms", justify="right")
        table.add_column("verify ms", justify="right")
        table.add_column("share", justify="right")
        for t in self.timings:
            share = (t.seconds + t.verify_seconds) / total
            table.add_row(
                t.pass_text, f"{t.seconds * 1e3:.2f}", f"{t.verify_seconds * 1e3:.2f}", f"{share:.0%}"
            )
        table.add_row(
            "total",
            f"{sum(t.seconds for t in self.timings) * 1e3:.2f}",
            f"{sum(t.verify_seconds for t in self.timings) * 1e3:.2f}",
            "100%",
        )
        return table

    def print_timings(self, file: TextIO | None = None) -> None:
        """Print ``timing_table()`` to ``file`` (default stderr)."""
        from rich.console import Console

        Console(file=file or sys.stderr).print(self.timing_table())
