"""Step costs of a compiled decoder program (a ``mcp-compile --max-seq`` build).

``served_shape`` reads what the build serves from its META ``decoder`` section.  ``measurer``
returns the callable ``CostGrid.measure`` and ``ExactCost`` call: one timing-only step of the
program, through the decoder host driver (``mcpc.sim.decoder.DecoderSession``), as
``step_cycles("decode", active, context)`` (``active`` sequences, each at ``context`` tokens) and
``step_cycles("prefill", chunk, past)``.  A build whose host driver lacks it is refused with a
message pointing at the cost-file route (``--cost-grid FILE``, or a cost file instead of the program).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from mcpc.errors import InputError, UnsupportedError

from .cost import Measurer, ServedShape

_DTYPE_BYTES = {
    "f32": 4,
    "fp32": 4,
    "float32": 4,
    "f16": 2,
    "fp16": 2,
    "float16": 2,
    "bf16": 2,
    "int8": 1,
    "i8": 1,
}


def served_shape(loaded, source: str) -> ServedShape:
    meta = loaded.meta.get("decoder") if isinstance(loaded.meta, dict) else None
    if not isinstance(meta, dict):
        raise InputError(
            f"{source}: not a decoder build (its META has no 'decoder' section): serving needs a program "
            "compiled with mcp-compile --max-seq N [--max-batch B]"
        )
    try:
        values = int(meta["layers"]) * int(meta["kv_heads"]) * int(meta["head_dim"]) * 2  # K and V
        if meta.get("kv_quant"):  # INT8 codes, an fp16 scale and a u8 zero point per head_dim values
            per_token = values + 3 * values // int(meta["head_dim"])
        else:
            per_token = values * _DTYPE_BYTES.get(str(meta.get("kv_dtype", "f16")), 2)
        return ServedShape(
            int(meta["max_batch"]),
            int(meta["max_seq"]),
            int(meta["prefill_chunk"]),
            int(meta["kv_blocks"]),
            int(meta.get("block", 64)),
            per_token,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{source}: META decoder section is malformed ({exc!r})") from None


def measurer(loaded, source: str) -> Measurer:
    """Timing-only steps of the program through the decoder host driver."""
    if importlib.util.find_spec("mcpc.sim.decoder") is None:
        raise UnsupportedError(
            f"{source}: measuring step costs needs the decoder host driver (mcpc.sim.decoder), which "
            "this installation lacks: give a cached grid with --cost-grid FILE, or a cost file "
            "(kind: analytic or cost_grid) in place of the program"
        )
    from mcpc.sim.decoder import DecoderSession

    session = DecoderSession(loaded)
    step = getattr(session, "step_cycles", None)
    if step is None:
        raise UnsupportedError(
            f"{source}: this decoder host driver has no timing-only step_cycles(kind, n, m): give a "
            "cached grid with --cost-grid FILE, or a cost file in place of the program"
        )
    return lambda kind, x, y: float(step(kind, int(x), int(y)))


def default_grid_path(program: Path) -> Path:
    """Where the cost grid of ``program`` is cached: beside it, ``NAME.costgrid.json``."""
    return program.with_name(program.stem + ".costgrid.json")
