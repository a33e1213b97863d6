"""QAT config schema v1: shipped configs, name vs path resolution, errors naming file and key path."""

from __future__ import annotations

import pytest

from mcpc.errors import ConfigError
from mcpc.passes import PRESETS, parse_pipeline
from mcpc.qat_configs import DTYPE_NAMES, load_config, parse_config, schema, shipped_configs

VALID = """\
schema: 1
name: custom
description: test config
precision: {weights: f32, activations: f32, accumulate: f32}
pipeline: "fold-constants, dce"
check: {rtol: 1.0e-3, atol: 1.0e-4, min_cosine: 0.99}
"""


def test_shipped_configs_load_with_documented_values():
    assert {"fp16.yaml", "fp32.yaml"} <= set(shipped_configs())
    fp16 = load_config("fp16.yaml")
    p = fp16.precision
    assert (p.weights, p.activations, p.accumulate) == ("f16", "f16", "f32")
    assert fp16.check.tolerances() == {"max_norm_err": 5e-2, "min_cosine": 0.999, "min_top1": 0.99}
    assert fp16.preset == "fp16" and fp16.pipeline_text() == PRESETS["fp16"]
    fp32 = load_config("fp32")
    assert fp32.precision.weights == "f32"
    assert fp32.check.tolerances() == {"max_norm_err": 1e-4, "min_cosine": 0.99999, "min_top1": 0.99}
    assert fp32.source == "fp32.yaml"


def test_backend_default_tolerances_are_the_shipped_configs():
    """A program built without a config records the same criteria as one built with the shipped one."""
    from mcpc.backend.compile import TOLERANCES

    for name in ("fp16", "fp32"):
        assert load_config(name).check.tolerances() == TOLERANCES[name], name


def test_explicit_pipeline_text_is_kept():
    cfg = parse_config(VALID, "custom.yaml")
    assert cfg.preset is None
    assert parse_pipeline(cfg.pipeline_text()) == [("fold-constants", {}), ("dce", {})]
    assert cfg.check.min_cosine == 0.99


def test_existing_path_wins_over_shipped_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fp16.yaml").write_text(VALID)
    assert load_config("fp16.yaml").name == "custom"
    assert load_config("fp16").name == "fp16"  # no file called "fp16": the shipped config
    assert load_config(tmp_path / "fp16.yaml").source == str(tmp_path / "fp16.yaml")


def test_unknown_name_lists_shipped_configs():
    with pytest.raises(ConfigError, match=r"fp17\.yaml: no such config.*shipped: fp16\.yaml, fp32\.yaml"):
        load_config("fp17.yaml")


def _error(text: str, source: str = "fp16.yaml") -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(text, source)
    assert info.value.exit_code == 3
    return info.value.message


def test_unknown_dtype_names_file_and_key_path():
    msg = _error(VALID.replace("weights: f32", "weights: f17"))
    assert msg.startswith("fp16.yaml: precision.weights: unknown dtype 'f17' (expected one of f32, f16,")
    assert all(name in msg for name in DTYPE_NAMES)


def test_unknown_keys_are_errors_listing_valid_keys():
    msg = _error(VALID + "quantisation: {bits: 4}\n")
    assert "fp16.yaml: quantisation: unknown key (expected one of schema, name, description" in msg
    msg = _error(VALID.replace("atol: 1.0e-4", "atol: 1.0e-4, rtool: 1"))
    assert "check.rtool: unknown key (expected one of max_norm_err, min_cosine, min_top1, rtol, atol)" in msg


def test_missing_keys_and_bad_values():
    msg = _error("schema: 1\nname: x\n")
    for key in ("precision", "pipeline", "check"):
        assert f"{key}: missing required key" in msg
    assert "check.rtol" in _error(VALID.replace("rtol: 1.0e-3", "rtol: -1"))
    assert "check.min_cosine" in _error(VALID.replace("min_cosine: 0.99", "min_cosine: 2"))
    assert "check.min_top1" in _error(VALID.replace("min_cosine: 0.99", "min_top1: 1.5"))
    none = _error(VALID.replace("{rtol: 1.0e-3, atol: 1.0e-4, min_cosine: 0.99}", "{min_top1: 0.9}"))
    assert "check: give at least one of max_norm_err, min_cosine, rtol, atol" in none
    assert "schema: unsupported schema version 2" in _error(VALID.replace("schema: 1", "schema: 2"))


def test_pipeline_syntax_error_names_key_and_column():
    msg = _error(VALID.replace('"fold-constants, dce"', '"fold-constants{x=1"'))
    assert "fp16.yaml: pipeline: invalid pipeline at column 19" in msg
    assert "\n" not in msg


def test_yaml_syntax_error_has_line_and_column():
    assert _error("schema: 1\nname: [x\n", "bad.yaml").startswith("bad.yaml:3:1: YAML syntax error")


@pytest.mark.parametrize("text, found", [("", "an empty file"), ("- 1\n- 2\n", "a list"), ("3\n", "a int")])
def test_top_level_must_be_a_mapping(text, found):
    assert f"found {found}" in _error(text)


def test_dtype_vocabulary_matches_the_ir():
    from mcpc.ir import dtypes

    assert set(DTYPE_NAMES) == set(dtypes.DTYPES)


@pytest.mark.parametrize(
    "precision, pipeline, key",
    [
        ("{weights: i4, activations: f16, accumulate: f32}", "fp16", "precision.weights: i4"),
        ("{weights: f16, activations: f16, accumulate: f32}", "fp32", "precision.weights: f16"),
        ("{weights: f16, activations: f16, accumulate: f16}", "fp16", "precision.accumulate: f16"),
        ("{weights: f32, activations: i8, accumulate: f32}", '"dce"', "precision.activations: i8"),
    ],
)
def test_a_precision_the_pipeline_does_not_build_is_refused(precision, pipeline, key):
    text = f"schema: 1\nname: x\nprecision: {precision}\npipeline: {pipeline}\ncheck: {{min_cosine: 0.9}}\n"
    msg = _error(text, "x.yaml")
    assert msg.startswith(f"x.yaml: {key}") and "pipeline builds" in msg


def test_the_shipped_configs_describe_their_builds():
    for name in ("fp16", "fp32"):
        cfg = load_config(name)
        assert cfg.precision.weights == cfg.precision.activations == schema.built_precision(cfg)


# -- quantization: section ------------------------------------------------------------------------


def test_shipped_quantization_configs():
    w4 = load_config("qat_w4a16.yaml")
    q = w4.quantization
    assert (q.weights.bits, q.weights.group_size, q.weights.symmetric, q.weights.scale_dtype) == (
        4,
        32,
        True,
        "f16",
    )
    assert q.weights.algorithm == "auto" and not q.activations.quantized and q.needs_calibration() is None
    assert (w4.precision.weights, w4.precision.activations) == ("i4", "f16")
    gptq = load_config("qat_gptq_g128.yaml").quantization.weights
    assert (gptq.bits, gptq.group_size, gptq.desc_act, gptq.symmetric, gptq.code_dtype) == (
        4,
        128,
        True,
        False,
        "u4",
    )
    fp8 = load_config("qat_int4_fp8.yaml")
    assert fp8.quantization.weights.code_dtype == "f8e4m3fn" and fp8.precision.activations == "i4"
    assert fp8.quantization.needs_calibration() == "quantization.activations.where: all"
    mixed = load_config("qat_mixed.yaml").quantization
    assert mixed.sensitivity.thresholds.int6 < mixed.sensitivity.thresholds.int8
    assert mixed.needs_calibration() == "quantization.sensitivity"
    for name in shipped_configs():
        cfg = load_config(name)
        assert cfg.precision.weights == schema.built_weights(cfg), name
        assert cfg.precision.activations == schema.built_activations(cfg), name


QUANT = VALID.replace("weights: f32,", "weights: i4,").replace('"fold-constants, dce"', "quant-fp32") + (
    "quantization:\n  weights: {bits: 4, group_size: 32}\n"
)


def test_quantization_section_validates_with_key_paths():
    assert parse_config(QUANT, "q.yaml").quantization.weights.code_dtype == "i4"
    assert "quantization.weights: bits: expected one of 4, 6, 8, got 3" in _error(
        QUANT.replace("bits: 4", "bits: 3")
    )
    msg = _error(QUANT.replace("group_size: 32", "group_size: 32, algorithm: gptx"))
    assert "quantization.weights.algorithm" in msg and "'gptq'" in msg
    msg = _error(QUANT.replace("group_size: 32}", "group_size: 32, desc_act: true, algorithm: mse}"))
    assert "desc_act is a GPTQ option" in msg
    msg = _error(QUANT + "  activations: {dtype: i8}\n")
    assert "quantization.activations: dtype i8 quantizes activations: say where" in msg
    msg = _error(QUANT + "  calibration: {method: ema, decay: 1.5}\n")
    assert "quantization.calibration.decay" in msg
    msg = _error(QUANT + "  sensitivity: {thresholds: {int6: 0.1, int8: 0.01}}\n")
    assert "int6 (0.1) must not exceed int8 (0.01)" in msg
    msg = _error(QUANT + "  overrides:\n    - {pattern: 'x', bits: 5}\n")
    assert "overrides[0] ('x')" in msg
    msg = _error(QUANT + "  lm_head: {bits: 8}\n")
    assert "quantization.lm_head: bits set how to quantize the LM head, but keep: true" in msg
    assert "lm_head: bits: expected one of 4, 6, 8, got 5" in _error(
        QUANT + "  lm_head: {keep: false, bits: 5}\n"
    )
    assert "quantization.lm_head.kep: unknown key" in _error(QUANT + "  lm_head: {kep: false}\n")
    assert "quantization.weigths: unknown key" in _error(QUANT.replace("  weights:", "  weigths:"))


def test_precision_must_agree_with_quantization():
    msg = _error(QUANT.replace("weights: i4,", "weights: f32,"))
    assert "precision.weights: f32 (the build makes i4)" in msg
    msg = _error(QUANT.replace("group_size: 32}", "group_size: 32, symmetric: false}"))
    assert "precision.weights: i4 (the build makes u4)" in msg
    msg = _error(QUANT.replace("quant-fp32", "fp32"))
    assert "quantization: the pipeline 'fp32' has no quantize-weights pass" in msg
    no_section = VALID.replace('"fold-constants, dce"', "quant-fp32")
    assert "pipeline: quantize-weights needs a quantization: section" in _error(no_section)
