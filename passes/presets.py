"""Named pipelines.  A QAT config's ``pipeline:`` is either one of these names or pipeline text.

There are no opt-levels: every preset is an explicit, readable pipeline string, printed by
``mcp-compile --print-pipeline``.  Pass names must exist in the registry once
``mcpc.passes.load_all_passes()`` ran (a test checks every preset builds).
"""

PRESETS: dict[str, str] = {
    "fp32": "fold-constants,dce,tile-matmul,npu-schedule",
    "fp16": "fold-constants,convert-precision{dtype=f16},dce,tile-matmul,npu-schedule",
    # quantized builds: the config's quantization: section applied to the f32 weights (calibrated
    # on the f32 graph), then the fp16 build of the rest
    "quant-fp16": "fold-constants,quantize-weights,convert-precision{dtype=f16},dce,tile-matmul,npu-schedule",
    "quant-fp32": "fold-constants,quantize-weights,dce,tile-matmul,npu-schedule",
}


def resolve_pipeline(preset_or_text: str) -> str:
    """The pipeline text for a preset name, or ``preset_or_text`` itself when it is not a preset name."""
    return PRESETS.get(preset_or_text.strip(), preset_or_text)
