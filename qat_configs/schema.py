"""QAT config schema v1: what precision a build uses, which pipeline compiles it, how it is checked.

A config file::

    schema: 1
    name: fp16
    description: fp16 weights and activations, fp32 accumulation
    precision: {weights: f16, activations: f16, accumulate: f32}   # f32_islands: [norm_stats, ...]
    pipeline: fp16                  # a preset name (mcpc.passes.presets) or pipeline text
    check: {max_norm_err: 5.0e-2, min_cosine: 0.999, min_top1: 0.99}

How it grows: each top-level section is one pydantic model, and ``QatConfig`` lists the sections.
A new section (``quantization:``, qat_configs/quantization.py; ``kv_cache:``, qat_configs/kv_cache.py)
is a new model plus one *optional* field on ``QatConfig`` (default None = "not used"), so every v1
file stays valid.  Only an
incompatible change bumps ``schema`` (add the number to ``SUPPORTED_SCHEMAS`` and migrate in
``_migrate``).  Every model forbids unknown keys, so a typo is an error naming the key, never a
silently ignored setting.
"""

from __future__ import annotations

import importlib.resources
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from mcpc.arch.dtypes import DTYPE_NAMES
from mcpc.errors import ConfigError, UsageError
from mcpc.passes.manager import parse_pipeline
from mcpc.passes.precision_policy import ISLAND_KINDS, check_island_kinds
from mcpc.passes.presets import PRESETS, resolve_pipeline
from mcpc.qat_configs.kv_cache import KvCache, migrate_v1_quantization_kv_cache
from mcpc.qat_configs.quantization import Quantization

SUPPORTED_SCHEMAS = (1,)


def _dtype(value: Any) -> str:
    if value not in DTYPE_NAMES:
        raise ValueError(f"unknown dtype {value!r} (expected one of {', '.join(DTYPE_NAMES)})")
    return value


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Precision(_Section):
    """Storage dtype of weights and activations, and the accumulator dtype of matmuls/reductions.

    ``f32_islands`` lists the computations a reduced-precision build keeps in f32
    (``mcpc.passes.precision_policy.ISLAND_KINDS``: ``norm_stats``, ``softmax_sum``); omitted means
    every kind, ``[]`` none (the plain conversion, which overflows on large activations).
    """

    weights: str
    activations: str
    accumulate: str
    f32_islands: list[str] | None = None

    @field_validator("weights", "activations", "accumulate", mode="before")
    @classmethod
    def _known_dtype(cls, v: Any) -> str:
        return _dtype(v)

    @field_validator("f32_islands", mode="before")
    @classmethod
    def _known_islands(cls, v: Any) -> Any:
        if v is None:
            return v
        if not isinstance(v, list) or not all(isinstance(k, str) for k in v):
            raise ValueError(f"expected a list of island kinds ({', '.join(ISLAND_KINDS)}), got {v!r}")
        check_island_kinds(v)
        return v


class Check(_Section):
    """Tolerances ``mcpc check`` applies to every output of the build (mcpc.check): normalized max
    error max|y - r| / max|r| <= ``max_norm_err``, cosine >= ``min_cosine``, argmax agreement of
    logits-like outputs >= ``min_top1`` and, when ``rtol`` or ``atol`` is set, every element within
    atol + rtol * |r|.  A criterion left out is not applied; at least one must be given."""

    max_norm_err: float | None = Field(default=None, ge=0)
    min_cosine: float | None = Field(default=None, ge=-1, le=1)
    min_top1: float | None = Field(default=None, ge=0, le=1)
    rtol: float | None = Field(default=None, ge=0)
    atol: float | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _some_criterion(self) -> Check:
        if self.max_norm_err is None and self.min_cosine is None and self.rtol is None and self.atol is None:
            raise ValueError("give at least one of max_norm_err, min_cosine, rtol, atol")
        return self

    def tolerances(self) -> dict[str, float]:
        """The criteria that are set, as recorded in the .mcpb META ``tolerances``."""
        return {k: v for k, v in self.model_dump().items() if v is not None}


class QatConfig(_Section):
    """A whole config file.  ``source`` (not a YAML key) is the file it came from, for messages."""

    schema_: int = Field(alias="schema")
    name: str = Field(min_length=1)
    description: str = ""
    precision: Precision
    pipeline: str
    check: Check
    # Optional sections (None = not used); new ones go here.
    quantization: Quantization | None = None
    kv_cache: KvCache | None = None

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    _source: str = PrivateAttr(default="<config>")

    @property
    def source(self) -> str:
        return self._source

    @field_validator("schema_")
    @classmethod
    def _known_schema(cls, v: int) -> int:
        if v not in SUPPORTED_SCHEMAS:
            raise ValueError(
                f"unsupported schema version {v} (this mcpc reads {', '.join(map(str, SUPPORTED_SCHEMAS))})"
            )
        return v

    @field_validator("pipeline")
    @classmethod
    def _pipeline_syntax(cls, v: str) -> str:
        # Pass names are resolved later (they depend on which pass modules are installed);
        # here only the syntax is checked, so a typo in braces is reported against this file.
        try:
            parse_pipeline(resolve_pipeline(v))
        except UsageError as exc:
            raise ValueError(exc.message.splitlines()[0]) from None  # keep the column, drop the caret
        return v

    @model_validator(mode="before")
    @classmethod
    def _migrate(cls, data: Any) -> Any:
        # Older schema versions would be rewritten to the current one here.
        return migrate_v1_quantization_kv_cache(data)

    def pipeline_text(self) -> str:
        """The pipeline as text: the preset's string when ``pipeline`` names a preset."""
        return resolve_pipeline(self.pipeline)

    @property
    def preset(self) -> str | None:
        """The preset name when ``pipeline`` is one, else None."""
        return self.pipeline.strip() if self.pipeline.strip() in PRESETS else None


def _describe(err: dict) -> str:
    """One pydantic error as ``key.path: message``, in the words a config author needs."""
    # a validator's own step (``function-after[...]``) is not a key the author wrote
    loc = ".".join(str(p) for p in err["loc"] if p != "__root__" and not str(p).startswith("function-"))
    loc = loc or "(top level)"
    kind, msg = err["type"], err["msg"]
    if kind == "extra_forbidden":
        msg = "unknown key"
    elif kind == "missing":
        msg = "missing required key"
    elif kind == "value_error":
        msg = str(err.get("ctx", {}).get("error", msg))
    return f"{loc}: {msg}"


def _unknown_key_hint(err: dict, model: type[BaseModel]) -> str:
    """For an unknown key, the keys valid at that level (walks the model along the error's path)."""
    current: Any = model
    for part in err["loc"][:-1]:
        field = current.model_fields.get(str(part)) if isinstance(current, type) else None
        if field is None:
            return ""
        current = field.annotation
        # an optional section (``Section | None``): the model inside
        models = [a for a in typing.get_args(current) if isinstance(a, type) and issubclass(a, BaseModel)]
        current = models[0] if len(models) == 1 else current
    if not (isinstance(current, type) and issubclass(current, BaseModel)):
        return ""
    keys = [f.alias or name for name, f in current.model_fields.items()]
    return f" (expected one of {', '.join(keys)})"


def parse_yaml_mapping(text: str, source: str, what: str = "config") -> dict:
    """YAML text that must hold a mapping at the top level (a QAT config, a workload, a checks
    file); ConfigError naming ``source`` (with line and column for a syntax error) otherwise."""
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
        raise ConfigError(f"{where}: YAML syntax error in the {what}: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: YAML error in the {what}: {exc}") from None
    if not isinstance(data, dict):
        found = "an empty file" if data is None else f"a {type(data).__name__}"
        raise ConfigError(f"{source}: expected a mapping of {what} keys at the top level, found {found}")
    return data


def parse_config(text: str, source: str) -> QatConfig:
    """Validate YAML text as a QAT config; ConfigError naming ``source`` and the key path(s)."""
    data = parse_yaml_mapping(text, source, "config")
    try:
        config = QatConfig.model_validate(data)
    except ValidationError as exc:
        parts = []
        for err in exc.errors():
            hint = _unknown_key_hint(err, QatConfig) if err["type"] == "extra_forbidden" else ""
            parts.append(_describe(err) + hint)
        raise ConfigError(f"{source}: " + "; ".join(parts)) from None
    _check_precision_is_built(config, source)
    config._source = source
    return config


def built_precision(config: QatConfig) -> str:
    """The float storage dtype of activations (and unquantized weights) that ``config``'s pipeline
    builds: the ``dtype`` of its ``convert-precision`` pass (default f16), else f32."""
    for name, options in parse_pipeline(config.pipeline_text()):
        if name == "convert-precision":
            return options.get("dtype", "f16")
    return "f32"


def built_weights(config: QatConfig) -> str:
    """The dtype the build stores MatMul/Gemm weights in: the quantized code dtype when the config
    quantizes weights (``quantization.weights``), else the float build dtype."""
    q = config.quantization
    return q.weights.code_dtype if q is not None else built_precision(config)


def built_activations(config: QatConfig) -> str:
    """The dtype activations are held in between ops: the quantized dtype when
    ``quantization.activations.where`` is ``all``, else the float build dtype."""
    q = config.quantization
    if q is not None and q.activations.where == "all":
        return q.activations.dtype
    return built_precision(config)


QUANTIZE_PASS = "quantize-weights"


def _check_precision_is_built(config: QatConfig, source: str) -> None:
    """``precision`` must describe the build the pipeline makes (an int4 config compiling an fp16
    build without a word is the bug this prevents), and ``quantization`` must have the pass that
    applies it in the pipeline (and the pass a section to apply)."""
    passes = [name for name, _ in parse_pipeline(config.pipeline_text())]
    q = config.quantization
    where = f"pipeline {config.pipeline.strip()!r}"
    if q is not None and QUANTIZE_PASS not in passes:
        raise ConfigError(
            f"{source}: quantization: the {where} has no {QUANTIZE_PASS} pass, so this section would "
            "be ignored (use a quantizing preset such as quant-fp16)"
        )
    if q is None and QUANTIZE_PASS in passes:
        raise ConfigError(
            f"{source}: pipeline: {QUANTIZE_PASS} needs a quantization: section saying how to quantize"
        )
    built = {"weights": built_weights(config), "activations": built_activations(config)}
    p = config.precision
    wrong = [
        (key, getattr(p, key), built[key])
        for key in ("weights", "activations")
        if getattr(p, key) != built[key]
    ]
    if p.accumulate != "f32":
        wrong.append(("accumulate", p.accumulate, "f32"))
    if wrong:
        said = "; ".join(f"precision.{key}: {value} (the build makes {want})" for key, value, want in wrong)
        how = (
            "quantization.weights and quantization.activations say the quantized dtypes"
            if q is not None
            else "quantized weights and activations (i4, i8, f8) need a quantization: section"
        )
        raise ConfigError(
            f"{source}: {said}: the pipeline builds {built['weights']} weights and {built['activations']} "
            f"activations with f32 accumulation ({where}); {how}, so this config would compile another "
            "build than it asks"
        )


def shipped_configs() -> list[str]:
    """File names of the configs shipped in ``mcpc.qat_configs``, sorted."""
    root = importlib.resources.files("mcpc.qat_configs")
    return sorted(p.name for p in root.iterdir() if p.name.endswith(".yaml"))


def load_config(name_or_path: str | Path) -> QatConfig:
    """Load a config: an existing path wins; else a shipped name (``fp16.yaml`` or ``fp16``).

    Raises ConfigError naming the file for anything invalid, and listing the shipped names when
    ``name_or_path`` is neither an existing file nor a shipped config.
    """
    path = Path(name_or_path)
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: cannot read config: {exc}") from None
        return parse_config(text, str(path))
    name = str(name_or_path)
    shipped = shipped_configs()
    filename = name if name.endswith(".yaml") else f"{name}.yaml"
    if "/" not in name and filename in shipped:
        resource = importlib.resources.files("mcpc.qat_configs") / filename
        return parse_config(resource.read_text(encoding="utf-8"), filename)
    raise ConfigError(
        f"{name}: no such config file, and not a shipped config (shipped: {', '.join(shipped)})"
    )
