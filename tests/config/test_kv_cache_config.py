"""The kv_cache: section, the shipped KV configs, the --kv-* flags and their refusal without --max-seq."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from mcpc.errors import ConfigError, UsageError
from mcpc.kv import KvSettings
from mcpc.qat_configs import load_config, parse_config
from mcpc.qat_configs.kv_cache import check_kv_cache_applies, kv_settings, with_kv_flags

BASE = """\
schema: 1
name: custom
precision: {weights: f16, activations: f16, accumulate: f32}
pipeline: fp16
check: {min_cosine: 0.99}
"""


def _error(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "kv.yaml")
    assert info.value.exit_code == 3
    return info.value.message


def test_kv_cache_section_and_its_defaults():
    cfg = parse_config(BASE + "kv_cache: {quant: int8}\n", "kv.yaml")
    assert cfg.kv_cache.quant == "int8" and cfg.quantization is None  # no weight quantization needed
    assert kv_settings(cfg) == KvSettings(quant="int8")
    s = kv_settings(parse_config(BASE + "kv_cache: {policy: topk_entropy}\n", "kv.yaml"))
    assert (s.policy, s.sparsity_ratio, s.quant) == ("topk_entropy", 0.7, "fp16")  # 0.7 with a policy
    full = parse_config(
        BASE + "kv_cache:\n  quant: int8\n  quant_tol: 0.01\n  policy: heavy_hitter\n  sparsity_ratio: 0.5\n"
        "  per_layer: {0: 0.0, 3: 0.9}\n  recent_window: 8\n"
        "  dynamic_window: {enabled: true, min_window: 32}\n",
        "kv.yaml",
    )
    s = kv_settings(full, layers=4)
    assert (s.quant_tol, s.ratio(0), s.ratio(1), s.ratio(3), s.recent_window) == (0.01, 0.0, 0.5, 0.9, 8)
    assert s.dynamic_window and s.min_window == 32
    assert parse_config(BASE, "kv.yaml").kv_cache is None and kv_settings(parse_config(BASE, "x")) is None


@pytest.mark.parametrize(
    "section, message",
    [
        ("{quant: int4}", "kv_cache.quant: Input should be 'fp16' or 'int8'"),
        ("{quant_tol: 0}", "kv_cache.quant_tol"),
        ("{sparsity_ratio: 0.7}", "kv_cache: sparsity_ratio needs a policy"),
        ("{policy: topk_magnitude, sparsity_ratio: 1.0}", "kv_cache.sparsity_ratio"),
        ("{policy: h2o}", "kv_cache.policy"),
        ("{per_layer: [0.5]}", "per_layer ratios need a policy"),
        ("{policy: topk_magnitude, per_layer: {1: 1.5}}", "per_layer ratios lie in [0, 1)"),
        ("{policy: topk_magnitude, recent_window: 8}", "recent_window is a heavy_hitter setting"),
        ("{dynamic_window: {enabled: true, min_window: 0}}", "kv_cache.dynamic_window.min_window"),
        ("{dynamic_window: true}", "kv_cache.dynamic_window"),
        (
            "{quant: int8, polcy: none}",
            "kv_cache.polcy: unknown key (expected one of quant, quant_tol, policy",
        ),
    ],
)
def test_bad_kv_cache_keys_name_their_path(section, message):
    msg = _error(BASE + f"kv_cache: {section}\n")
    assert msg.startswith("kv.yaml: ") and message in msg


def test_per_layer_is_checked_against_the_model():
    cfg = parse_config(BASE + "kv_cache: {policy: topk_magnitude, per_layer: [0.1, 0.2]}\n", "kv.yaml")
    assert kv_settings(cfg, layers=2).per_layer == {0: 0.1, 1: 0.2}
    with pytest.raises(ConfigError, match="kv.yaml: kv_cache.per_layer: 2 ratios for a model with 3 layers"):
        kv_settings(cfg, layers=3)
    cfg = parse_config(BASE + "kv_cache: {policy: topk_magnitude, per_layer: {5: 0.1}}\n", "kv.yaml")
    with pytest.raises(ConfigError, match="layer 5 does not exist"):
        kv_settings(cfg, layers=4)


def test_early_quantization_kv_cache_moves_to_the_top_level():
    text = BASE.replace("weights: f16", "weights: i4").replace("pipeline: fp16", "pipeline: quant-fp16")
    text += "quantization:\n  weights: {bits: 4}\n"
    text += "  kv_cache: {quant: fp16, max_error: 0.02, sparsity_ratio: 0.0}\n"
    cfg = parse_config(text, "old.yaml")
    assert cfg.kv_cache.quant == "fp16" and cfg.kv_cache.quant_tol == 0.02 and cfg.kv_cache.ratio == 0.0
    old = text.replace("max_error: 0.02, sparsity_ratio: 0.0", "dynamic_window: true, min_window: 8")
    assert parse_config(old, "old.yaml").kv_cache.dynamic_window.min_window == 8
    both = text + "kv_cache: {quant: int8}\n"
    assert "kv_cache is given twice" in _error(both)


def test_shipped_kv_configs():
    kv8 = load_config("qat_w4a16_kv8.yaml")
    w4 = load_config("qat_w4a16.yaml")
    assert kv8.quantization == w4.quantization and kv8.precision == w4.precision
    assert kv_settings(kv8) == KvSettings(quant="int8", quant_tol=0.02)
    sparse = load_config("qat_w4a16_kv8_sparse")
    assert sparse.quantization == w4.quantization
    s = kv_settings(sparse)
    assert (s.quant, s.policy, s.sparsity_ratio, s.recent_window) == ("int8", "heavy_hitter", 0.7, 16)


def test_a_kv_cache_section_is_refused_without_max_seq():
    cfg = load_config("qat_w4a16_kv8")
    with pytest.raises(UsageError) as info:
        check_kv_cache_applies(cfg, max_seq=None)
    assert info.value.exit_code == 2
    assert (
        info.value.message.startswith("qat_w4a16_kv8.yaml: kv_cache: ") and "--max-seq" in info.value.message
    )
    check_kv_cache_applies(cfg, max_seq=256)
    check_kv_cache_applies(load_config("qat_w4a16"), max_seq=None)


GPT_KV = Path(__file__).resolve().parents[1] / "torch_models" / "fixtures" / "gpt_kv-torchscript-op17.onnx"


@pytest.mark.parametrize("config", ["qat_w4a16_kv8", "qat_w4a16_kv8_sparse"])
def test_compile_refuses_a_kv_config_without_max_seq(tmp_path, config):
    """A decoder with past K/V compiled as a single graph has no KV cache to compress: refused, not
    silently built uncompressed."""
    from mcpc import driver
    from mcpc.cli import compile_command

    out = tmp_path / "m.mcpb"
    with pytest.raises(
        UsageError, match=f"{config}.yaml: kv_cache: the KV-cache settings apply to a decoder"
    ):
        driver.compile(GPT_KV, qat_config=config, output=out, dims={"batch": 1, "seq": 1, "past_seq": 3})
    result = CliRunner().invoke(compile_command, [str(GPT_KV), "-c", config, "-o", str(out)])
    assert result.exit_code == 2 and "kv_cache:" in result.output and "--max-seq" in result.output
    assert not out.exists()


def test_kv_flags_merge_into_the_config():
    w4 = load_config("qat_w4a16")
    merged = with_kv_flags(w4, "int8", None, None, max_seq=128)
    assert (
        merged.kv_cache.quant == "int8"
        and merged.source == w4.source
        and merged.quantization == w4.quantization
    )
    merged = with_kv_flags(load_config("qat_w4a16_kv8"), None, 0.5, "topk_magnitude", max_seq=128)
    assert (kv_settings(merged).quant, kv_settings(merged).ratio(0)) == ("int8", 0.5)
    off = with_kv_flags(load_config("qat_w4a16_kv8_sparse"), "fp16", None, "none", max_seq=128)
    assert kv_settings(off) == KvSettings()  # recent_window and the ratio go with the policy
    other = with_kv_flags(load_config("qat_w4a16_kv8_sparse"), None, None, "topk_entropy", max_seq=128)
    assert kv_settings(other).policy == "topk_entropy" and kv_settings(other).sparsity_ratio == 0.7
    assert with_kv_flags(w4, None, None, None, max_seq=None) is w4
    with pytest.raises(
        UsageError, match=r"--kv-quant int8: the KV-cache flags apply to a decoder build \(--max-seq"
    ):
        with_kv_flags(w4, "int8", None, None, max_seq=None)
    with pytest.raises(UsageError, match="--kv-sparsity 0.7: a sparsity ratio needs a policy"):
        with_kv_flags(w4, None, 0.7, None, max_seq=128)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--kv-quant", "int8"], "--kv-quant int8: the KV-cache flags apply to a decoder build"),
        (
            ["--kv-sparsity", "0.7", "--kv-policy", "heavy_hitter"],
            "--kv-sparsity 0.7, --kv-policy heavy_hitter",
        ),
        (["--kv-sparsity", "1.0"], "--kv-sparsity"),
        (["--kv-policy", "h2o"], "--kv-policy"),
    ],
)
def test_cli_kv_flags_need_max_seq(tmp_path, flags, message):
    from mcpc.cli import compile_command

    model = tmp_path / "m.onnx"
    model.write_bytes(b"")
    result = CliRunner().invoke(compile_command, [str(model), "-c", "qat_w4a16", *flags])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
