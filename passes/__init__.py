"""Passes over the MCP IR: registry, pipeline syntax, pass manager and named presets.

Importing this package is light: the pass modules themselves are imported by
``load_all_passes()``, which the driver calls before building a pipeline.
"""

import importlib
import importlib.util

from mcpc.passes.manager import (
    REGISTRY,
    Pass,
    PassContext,
    PassManager,
    PassRegistry,
    build_pass,
    build_pipeline,
    format_pass,
    format_pipeline,
    parse_pipeline,
    register_pass,
)
from mcpc.passes.presets import PRESETS, resolve_pipeline

__all__ = [
    "PASS_MODULES",
    "PRESETS",
    "REGISTRY",
    "Pass",
    "PassContext",
    "PassManager",
    "PassRegistry",
    "build_pass",
    "build_pipeline",
    "format_pass",
    "format_pipeline",
    "load_all_passes",
    "parse_pipeline",
    "register_pass",
    "resolve_pipeline",
]

# Every module that registers passes.  Add a module here when you add a pass file; a listed module
# that does not exist yet is skipped (so helpers can land independently), but one that exists and
# fails to import is a real error and propagates.
PASS_MODULES: tuple[str, ...] = (
    "mcpc.passes.fold_constants",
    "mcpc.passes.dce",
    "mcpc.passes.convert_precision",
    "mcpc.passes.quantize_weights",
    "mcpc.passes.fuse_scales",
    "mcpc.passes.fuse_dequantize",
    "mcpc.passes.expand_quantize",
    "mcpc.passes.fold_norm_gain",
    "mcpc.passes.tile_matmul",
    "mcpc.passes.npu_schedule",
)


def load_all_passes() -> list[str]:
    """Import every existing module of ``PASS_MODULES`` (registering its passes); return those imported."""
    loaded = []
    for name in PASS_MODULES:
        if importlib.util.find_spec(name) is None:
            continue
        importlib.import_module(name)
        loaded.append(name)
    return loaded
