"""YAML files of the serving simulator (workloads, policies, cost files) validated by pydantic, with
errors that name the file and the key path (``arrival.rate_per_s: ...``), never a traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from mcpc.errors import ConfigError


class Section(BaseModel):
    """A config mapping: unknown keys are errors (a typo must never be a silently ignored setting)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def _describe(err: dict) -> str:
    loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-")) or "(top level)"
    kind, msg = err["type"], err["msg"]
    if kind == "extra_forbidden":
        msg = "unknown key"
    elif kind == "missing":
        msg = "missing required key"
    elif kind == "value_error":
        msg = str(err.get("ctx", {}).get("error", msg))
    return f"{loc}: {msg}"


def load_yaml(path: Path, what: str) -> dict:
    """The mapping at the top of YAML (or JSON) file ``path``; ConfigError naming it otherwise."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the {what}: {exc.strerror or exc}") from None
    return parse_yaml(text, str(path), what)


def parse_yaml(text: str, source: str, what: str) -> dict:
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


def validate(model: type[BaseModel], data: Any, source: str) -> Any:
    """``model.model_validate(data)``; ConfigError listing every bad key path of ``source``."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: " + "; ".join(_describe(e) for e in exc.errors())) from None
