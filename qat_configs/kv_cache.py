"""The ``kv_cache:`` section of a QAT config (schema v1, optional): how a decoder build
(``mcp-compile --max-seq N``) stores its KV cache.

::

    kv_cache:
      quant: int8              # fp16 (FP16_Retain, the default) | int8 (INT8_Asymmetric)
      quant_tol: 0.02          # per block max|dequant(quant(x)) - x| / max|x|; above: kept unquantized
      policy: heavy_hitter     # none | topk_magnitude | topk_entropy | heavy_hitter
      sparsity_ratio: 0.7      # dropped fraction; 0.7 when a policy is set without it
      per_layer: {0: 0.0}      # layer -> ratio; or a list, one ratio per layer
      recent_window: 16        # heavy_hitter only: the last N positions are always kept
      dynamic_window: {enabled: false, min_window: 64}

The section only means something to a decoder build: ``check_kv_cache_applies`` refuses it
(exit 2) in a build without ``--max-seq``.  ``kv_settings`` turns it into the
``mcpc.kv.KvSettings`` the codec takes; ``with_kv_flags`` merges the ``--kv-*`` flags of
``mcp-compile``.  The formats are in docs/kv-cache.md.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from mcpc.errors import ConfigError, UsageError
from mcpc.kv.store import DEFAULT_MIN_WINDOW, DEFAULT_RATIO, DEFAULT_RECENT, KvSettings

Ratio = Field(ge=0, lt=1)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DynamicWindow(_Section):
    """The seed's heat window: a query attends from the furthest position whose heat (attention
    received relative to a uniform head's) >= 0.6 x the mean of the last ``min_window`` positions
    (docs/kv-cache.md)."""

    enabled: bool = False
    min_window: int = Field(default=DEFAULT_MIN_WINDOW, ge=1)


class KvCache(_Section):
    """The KV-cache settings (see the module docstring); every key is validated here, and one that
    would have no effect (a ratio without a policy, ``recent_window`` without ``heavy_hitter``)
    is an error."""

    quant: Literal["fp16", "int8"] = "fp16"
    quant_tol: float = Field(default=0.02, gt=0)
    policy: Literal["none", "topk_magnitude", "topk_entropy", "heavy_hitter"] = "none"
    sparsity_ratio: float | None = Field(default=None, ge=0, lt=1)
    per_layer: dict[int, float] | list[float] | None = None
    recent_window: int | None = Field(default=None, ge=0)
    dynamic_window: DynamicWindow = DynamicWindow()

    @model_validator(mode="after")
    def _consistent(self) -> KvCache:
        if self.policy == "none":
            if self.sparsity_ratio:
                raise ValueError("sparsity_ratio needs a policy (topk_magnitude, topk_entropy, heavy_hitter)")
            if self.per_layer:
                raise ValueError(
                    "per_layer ratios need a policy (topk_magnitude, topk_entropy, heavy_hitter)"
                )
        if self.recent_window is not None and self.policy != "heavy_hitter":
            raise ValueError(f"recent_window is a heavy_hitter setting (policy is {self.policy})")
        ratios = self.per_layer.values() if isinstance(self.per_layer, dict) else self.per_layer or []
        if any(not 0 <= r < 1 for r in ratios):
            raise ValueError(f"per_layer ratios lie in [0, 1), got {self.per_layer}")
        if isinstance(self.per_layer, dict) and any(k < 0 for k in self.per_layer):
            raise ValueError(f"per_layer layer indices are >= 0, got {sorted(self.per_layer)}")
        return self

    @property
    def ratio(self) -> float:
        """The drop ratio of layers without their own: 0 without a policy, 0.7 by default with one."""
        if self.policy == "none":
            return 0.0
        return DEFAULT_RATIO if self.sparsity_ratio is None else self.sparsity_ratio


def migrate_v1_quantization_kv_cache(data: Any) -> Any:
    """Early v1 files held these settings as ``quantization.kv_cache`` (keys ``max_error``,
    ``layer_ratios``, ``dynamic_window: bool``, ``min_window``); they move to ``kv_cache:`` with
    today's names.  A file with both is refused."""
    if not isinstance(data, dict) or not isinstance(data.get("quantization"), dict):
        return data
    if "kv_cache" not in data["quantization"]:
        return data
    data = dict(data)
    quantization = dict(data["quantization"])
    old = quantization.pop("kv_cache")
    data["quantization"] = quantization
    if "kv_cache" in data:
        raise ValueError(
            "kv_cache is given twice (top level and quantization.kv_cache): keep the top-level one"
        )
    if isinstance(old, dict):
        old = dict(old)
        renamed = {"max_error": "quant_tol", "layer_ratios": "per_layer"}
        new = {renamed.get(k, k): v for k, v in old.items() if k not in ("dynamic_window", "min_window")}
        window = {}
        if "dynamic_window" in old:
            window["enabled"] = old["dynamic_window"]
        if "min_window" in old:
            window["min_window"] = old["min_window"]
        if window:
            new["dynamic_window"] = window
        if new.get("policy", "none") == "none" and new.get("sparsity_ratio") == 0:
            new.pop("sparsity_ratio")  # the old default spelled out
        old = new
    data["kv_cache"] = old
    return data


def kv_settings(config, layers: int | None = None) -> KvSettings | None:
    """The ``KvSettings`` of ``config``'s ``kv_cache:`` section (None without one).  With
    ``layers`` (the model's layer count) a ``per_layer`` list must have that many ratios and a
    mapping name only existing layers (ConfigError naming the file otherwise)."""
    kv = config.kv_cache
    if kv is None:
        return None
    per_layer = kv.per_layer or {}
    if isinstance(per_layer, list):
        if layers is not None and len(per_layer) != layers:
            raise ConfigError(
                f"{config.source}: kv_cache.per_layer: {len(per_layer)} ratios for a model with {layers} "
                "layers (give one per layer, or a mapping {layer: ratio})"
            )
        per_layer = dict(enumerate(per_layer))
    elif layers is not None and any(k >= layers for k in per_layer):
        raise ConfigError(
            f"{config.source}: kv_cache.per_layer: layer {max(per_layer)} does not exist (the model has "
            f"{layers} layers, 0..{layers - 1})"
        )
    return KvSettings(
        quant=kv.quant,
        quant_tol=kv.quant_tol,
        policy=kv.policy,
        sparsity_ratio=kv.ratio,
        per_layer=per_layer,
        recent_window=DEFAULT_RECENT if kv.recent_window is None else kv.recent_window,
        dynamic_window=kv.dynamic_window.enabled,
        min_window=kv.dynamic_window.min_window,
    )


KV_FLAGS = {"quant": "--kv-quant", "sparsity_ratio": "--kv-sparsity", "policy": "--kv-policy"}


def check_kv_cache_applies(config, max_seq: int | None) -> None:
    """A ``kv_cache:`` section compiled without ``--max-seq`` is refused (UsageError, exit 2): only
    a decoder build has a KV cache, so the settings would be silently ignored."""
    if config.kv_cache is not None and max_seq is None:
        raise UsageError(
            f"{config.source}: kv_cache: the KV-cache settings apply to a decoder build (--max-seq N), "
            "whose K/V stay in NPU memory; this is a single-graph build without a KV cache, so they would "
            "be ignored: add --max-seq, or use a config without a kv_cache: section"
        )


def with_kv_flags(config, quant: str | None, sparsity_ratio: float | None, policy: str | None, max_seq):
    """``config`` with the ``--kv-quant`` / ``--kv-sparsity`` / ``--kv-policy`` flags merged into its
    ``kv_cache:`` section (a flag wins over the file; ``--kv-policy none`` turns sparsity off).
    The flags need ``--max-seq`` and a ratio needs a policy: UsageError (exit 2) naming them."""
    given = {k: v for k, v in (("quant", quant), ("sparsity_ratio", sparsity_ratio), ("policy", policy))
             if v is not None}  # fmt: skip
    if not given:
        return config
    flags = ", ".join(f"{KV_FLAGS[k]} {v}" for k, v in given.items())
    if max_seq is None:
        raise UsageError(
            f"{flags}: the KV-cache flags apply to a decoder build (--max-seq N); this is a single-graph "
            "build without a KV cache, so they would be ignored"
        )
    section = config.kv_cache.model_dump(exclude_unset=True) if config.kv_cache is not None else {}
    if given.get("policy") == "none":
        section.pop("per_layer", None)
        section.pop("recent_window", None)
        section.pop("sparsity_ratio", None)
    if given.get("sparsity_ratio") and given.get("policy", section.get("policy", "none")) == "none":
        raise UsageError(
            f"{flags}: a sparsity ratio needs a policy: add --kv-policy topk_magnitude|topk_entropy|"
            f"heavy_hitter (config {config.source} sets none)"
        )
    if given.get("policy", "heavy_hitter") != "heavy_hitter":
        section.pop("recent_window", None)
    section.update(given)
    try:
        kv = KvCache.model_validate(section)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise UsageError(f"{flags}: {first['msg']} (merged into the kv_cache: of {config.source})") from None
    merged = config.model_copy(update={"kv_cache": kv})
    merged._source = config.source
    return merged
