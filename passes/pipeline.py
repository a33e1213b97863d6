"""Pipeline text: parsing it into passes and writing passes back as text.

Pipeline text is ``name{key=value,key2=value},name2``: passes are separated by commas outside
braces, option keys are the field names in kebab-case (``group-size=32``; snake_case is accepted
too), values are converted to the field's type (int, float, bool, str, tuple of ints ``1x2x3``).
``format_pipeline`` writes every option, so its output parses back to equal pass objects.
Syntax errors name the column with a caret; unknown passes and options list the valid ones.
"""

from __future__ import annotations

import typing
from collections.abc import Iterable
from typing import Any

from mcpc.errors import UsageError
from mcpc.passes.registry import REGISTRY, Pass, PassRegistry, _option_fields

# Characters that would break the pipeline grammar inside a str option value.
_RESERVED = set("{},= \t\n")


def _syntax_error(text: str, col: int, what: str) -> UsageError:
    caret = " " * col + "^"
    return UsageError(f"invalid pipeline at column {col + 1}: {what}\n  {text}\n  {caret}")


class _Spec(typing.NamedTuple):
    name: str
    options: dict[str, str]
    column: int  # 0-based column of the pass name, for error messages after parsing


def _parse(text: str) -> list[_Spec]:
    """Recursive-descent parser over the pipeline grammar; errors carry the column and a caret."""
    specs: list[_Spec] = []
    pos, n = 0, len(text)

    def skip_ws() -> None:
        nonlocal pos
        while pos < n and text[pos].isspace():
            pos += 1

    def word(what: str) -> str:
        nonlocal pos
        start = pos
        while pos < n and (text[pos].isalnum() or text[pos] in "-_.+"):
            pos += 1
        if pos == start:
            found = repr(text[pos]) if pos < n else "end of text"
            raise _syntax_error(text, pos, f"expected {what}, found {found}")
        return text[start:pos]

    skip_ws()
    if pos == n:
        return specs
    while True:
        skip_ws()
        column = pos
        name = word("a pass name")
        options: dict[str, str] = {}
        skip_ws()
        if pos < n and text[pos] == "{":
            pos += 1
            skip_ws()
            if pos < n and text[pos] == "}":
                pos += 1
            else:
                while True:
                    skip_ws()
                    key_col = pos
                    key = word(f"an option name for pass {name!r}")
                    skip_ws()
                    if pos >= n or text[pos] != "=":
                        raise _syntax_error(text, pos, f"expected '=' after option {key!r}")
                    pos += 1
                    skip_ws()
                    value_start = pos
                    while pos < n and text[pos] not in "{},=" and not text[pos].isspace():
                        pos += 1
                    value = text[value_start:pos]
                    if key in options:
                        raise _syntax_error(text, key_col, f"option {key!r} given twice for pass {name!r}")
                    options[key] = value
                    skip_ws()
                    if pos < n and text[pos] == ",":
                        pos += 1
                        continue
                    if pos < n and text[pos] == "}":
                        pos += 1
                        break
                    found = repr(text[pos]) if pos < n else "end of text"
                    raise _syntax_error(
                        text, pos, f"expected ',' or '}}' in options of {name!r}, found {found}"
                    )
        specs.append(_Spec(name, options, column))
        skip_ws()
        if pos == n:
            return specs
        if text[pos] != ",":
            raise _syntax_error(text, pos, f"expected ',' between passes, found {text[pos]!r}")
        pos += 1


def parse_pipeline(text: str) -> list[tuple[str, dict[str, str]]]:
    """Split pipeline text into ``(pass name, {option: raw value})`` pairs, in order.

    Commas inside braces do not split; whitespace around names, keys, values and separators is
    ignored; the empty (or all-blank) text is the empty pipeline.  Raises UsageError naming the
    column for any syntax error.  Does not check that passes or options exist (see
    ``build_pipeline``).
    """
    return [(s.name, s.options) for s in _parse(text)]


_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def _convert(pass_name: str, key: str, raw: str, tp: type) -> Any:
    """Convert one raw option string to the field type; UsageError naming pass and option if it fails."""

    def bad(expected: str) -> UsageError:
        return UsageError(f"pass {pass_name!r}: option {key!r} expects {expected}, got {raw!r}")

    if tp is bool:
        low = raw.lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise bad("a boolean (true/false)")
    if tp is int:
        try:
            return int(raw, 0)
        except ValueError:
            raise bad("an integer") from None
    if tp is float:
        try:
            return float(raw)
        except ValueError:
            raise bad("a number") from None
    if tp is str:
        return raw
    # tuple of ints: "1x2x3"; the empty string is the empty tuple
    if raw == "":
        return ()
    try:
        return tuple(int(part) for part in raw.split("x"))
    except ValueError:
        raise bad("integers joined by 'x' (e.g. 1x128)") from None


def _kebab(field_name: str) -> str:
    return field_name.replace("_", "-")


def build_pass(name: str, options: dict[str, str], registry: PassRegistry | None = None) -> Pass:
    """Instantiate pass ``name`` from raw option strings; UsageError listing valid passes/options."""
    registry = registry or REGISTRY
    cls = registry.get(name)
    if cls is None:
        known = ", ".join(registry.names()) or "(none are registered)"
        raise UsageError(f"unknown pass {name!r}; registered passes: {known}")
    fields = {_kebab(f.name): f for f in _option_fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, raw in options.items():
        f = fields.get(_kebab(key))
        if f is None:
            valid = ", ".join(sorted(fields)) or "(it takes no options)"
            raise UsageError(f"pass {name!r} has no option {key!r}; valid options: {valid}")
        kwargs[f.name] = _convert(name, _kebab(key), raw, f.type)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:  # a pass's __post_init__ may reject a value combination
        raise UsageError(f"pass {name!r}: {exc}") from None


def build_pipeline(text: str, registry: PassRegistry | None = None) -> list[Pass]:
    """Parse pipeline text and instantiate every pass; UsageError for syntax, unknown pass or option."""
    passes = []
    for spec in _parse(text):
        try:
            passes.append(build_pass(spec.name, spec.options, registry))
        except UsageError as exc:
            raise UsageError(f"{exc.message} (pipeline column {spec.column + 1})") from None
    return passes


def _format_value(p: Pass, key: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return "x".join(str(int(v)) for v in value)
    if isinstance(value, float):
        return repr(value)
    text = str(value)
    if isinstance(value, str) and (text == "" or _RESERVED & set(text)):
        raise ValueError(f"pass {p.name!r}: option {key!r} value {text!r} cannot be written as pipeline text")
    return text


def format_pass(p: Pass) -> str:
    """One pass as pipeline text, every option written out (``name{key=value,...}`` or ``name``)."""
    opts = [
        f"{_kebab(f.name)}={_format_value(p, f.name, getattr(p, f.name))}" for f in _option_fields(type(p))
    ]
    return f"{p.name}{{{','.join(opts)}}}" if opts else p.name


def format_pipeline(passes: Iterable[Pass]) -> str:
    """Pipeline text that ``build_pipeline`` turns back into equal pass objects."""
    return ",".join(format_pass(p) for p in passes)
