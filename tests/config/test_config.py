"""QAT config schema v1: shipped configs, name vs path resolution, errors naming file and key path."""

from __future__ import annotations

import pytest

from mcpc.errors import ConfigError
from mcpc.passes import PRESETS, parse_pipeline
from mcpc.qat_configs import DTYPE_NAMES, load_config, parse_config, shipped_configs

VALID = """\
schema: 1
name: custom
description: test config
precision: {weights: f16, activations: f16, accumulate: f32}
pipeline: "fold-constants, dce"
check: {rtol: 1.0e-3, atol: 1.0e-4, min_cosine: 0.99}
"""


def test_shipped_configs_load_with_documented_values():
    assert {"fp16.yaml", "fp32.yaml"} <= set(shipped_configs())
    fp16 = load_config("fp16.yaml")
    p = fp16.precision
    assert (p.weights, p.activations, p.accumulate) == ("f16", "f16", "f32")
    assert (fp16.check.rtol, fp16.check.atol) == (2e-2, 1e-2)
    assert fp16.preset == "fp16" and fp16.pipeline_text() == PRESETS["fp16"]
    fp32 = load_config("fp32")
    assert fp32.precision.weights == "f32" and (fp32.check.rtol, fp32.check.atol) == (1e-4, 1e-5)
    assert fp32.source == "fp32.yaml"


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
    msg = _error(VALID.replace("weights: f16", "weights: f17"))
    assert msg.startswith("fp16.yaml: precision.weights: unknown dtype 'f17' (expected one of f32, f16,")
    assert all(name in msg for name in DTYPE_NAMES)


def test_unknown_keys_are_errors_listing_valid_keys():
    msg = _error(VALID + "quantisation: {bits: 4}\n")
    assert "fp16.yaml: quantisation: unknown key (expected one of schema, name, description" in msg
    msg = _error(VALID.replace("atol: 1.0e-4", "atol: 1.0e-4, rtool: 1"))
    assert "check.rtool: unknown key (expected one of rtol, atol, min_cosine)" in msg


def test_missing_keys_and_bad_values():
    msg = _error("schema: 1\nname: x\n")
    for key in ("precision", "pipeline", "check"):
        assert f"{key}: missing required key" in msg
    assert "check.rtol" in _error(VALID.replace("rtol: 1.0e-3", "rtol: -1"))
    assert "check.min_cosine" in _error(VALID.replace("min_cosine: 0.99", "min_cosine: 2"))
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
