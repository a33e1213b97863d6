"""Named pipelines.  A QAT config's ``pipeline:`` is either one of these names or pipeline text.

There are no opt-levels: every preset is an explicit, readable pipeline string, printed by
``mcp-compile --print-pipeline``.  Pass names must exist in the registry once
``mcpc.passes.load_all_passes()`` ran (a test checks every preset builds).
"""

PRESETS: dict[str, str] = {
    "fp32": "fold-constants,fuse-scales,fuse-dequantize-matmul,expand-quantize,dce,tile-matmul,npu-schedule",
    "fp16": (
        "fold-constants,convert-precision{dtype=f16},fuse-scales,fuse-dequantize-matmul,expand-quantize,"
        "dce,tile-matmul,npu-schedule"
    ),
}


def _quantizing(pipeline: str) -> str:
    """``pipeline`` with ``quantize-weights`` right after its ``fold-constants``: the config's
    quantization: section applied to the f32 weights (calibrated on the f32 graph), then the rest
    of the build as the float preset makes it."""
    if "fold-constants," not in pipeline:
        raise AssertionError(f"a float preset without fold-constants: {pipeline}")
    return pipeline.replace("fold-constants,", "fold-constants,quantize-weights,", 1)


PRESETS["quant-fp32"] = _quantizing(PRESETS["fp32"])
PRESETS["quant-fp16"] = _quantizing(PRESETS["fp16"])


def resolve_pipeline(preset_or_text: str) -> str:
    """The pipeline text for a preset name, or ``preset_or_text`` itself when it is not a preset name."""
    return PRESETS.get(preset_or_text.strip(), preset_or_text)
