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
