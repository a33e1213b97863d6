"""YAML files of the serving simulator (workloads, policies, cost files) validated by pydantic, with
errors that name the file and the key path (``arrival.rate_per_s: ...``), never a traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from mcpc.errors import ConfigError
from mcpc.qat_configs.schema import _describe, parse_yaml_mapping


class Section(BaseModel):
    """A config mapping: unknown keys are errors (a typo must never be a silently ignored setting)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def load_yaml(path: Path, what: str) -> dict:
    """The mapping at the top of YAML (or JSON) file ``path``; ConfigError naming it otherwise."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the {what}: {exc.strerror or exc}") from None
    return parse_yaml_mapping(text, str(path), what)


def validate(model: type[BaseModel], data: Any, source: str) -> Any:
    """``model.model_validate(data)``; ConfigError listing every bad key path of ``source``."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: " + "; ".join(_describe(e) for e in exc.errors())) from None
