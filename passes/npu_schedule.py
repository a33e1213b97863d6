"""``npu-schedule{double-buffer,prefetch,fuse-epilogue,keep-in-sram}``: how the backend schedules
the program.

These are choices of the backend, not rewrites of the IR: the pass records them as module
attributes (``double_buffer``, ``prefetch``, ``fuse_epilogue``, ``keep_in_sram``) that ``compile_to_program``
follows unless its own ``BackendOptions`` sets them.  None of them changes a result bit — the
matmul tiles (and so the accumulation order) come from ``tile-matmul`` alone — only cycles and
DRAM traffic, which is what makes their effect measurable.  A pipeline without this pass gets
every option on.

* ``double-buffer``: two SRAM slots per operand so the next tile's loads overlap this tile's
  compute (off: one slot, loads and compute alternate).
* ``prefetch``: a kernel's loads that read nothing a pending kernel writes start before the
  previous kernel's stores land (docs/backend.md, "Across kernels").
* ``fuse-epilogue``: elementwise ops consuming a matmul's result alone run on its output tiles in
  SRAM (``backend/fusion.py``).
* ``keep-in-sram``: intermediates that fit a resident area of the scratchpad stay there; later
  kernels read them on chip instead of reloading them from DRAM, a store to DRAM is kept only
  for function outputs and values some DMA still reads, and kernels follow each other around
  the rest of the scratchpad so weight loads run far ahead (``backend/residency.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mcpc.ir.core import Module
from mcpc.passes.manager import Pass, PassContext, register_pass


@register_pass
@dataclass(frozen=True)
class NpuSchedulePass(Pass):
    """Record the backend's scheduling choices on the module.

    Assumes: a valid module.  Guarantees: the module is unchanged but for the four attributes.
    """

    name: ClassVar[str] = "npu-schedule"
    double_buffer: bool = True
    prefetch: bool = True
    fuse_epilogue: bool = True
    keep_in_sram: bool = True

    def apply(self, module: Module, ctx: PassContext) -> Module:
        module.attrs["double_buffer"] = self.double_buffer
        module.attrs["prefetch"] = self.prefetch
        module.attrs["fuse_epilogue"] = self.fuse_epilogue
        module.attrs["keep_in_sram"] = self.keep_in_sram
        return module
