"""Pass registry, pipeline text syntax and the pass manager.

A pass is a frozen dataclass whose fields are its options::

    @register_pass
    @dataclass(frozen=True)
    class QuantizeWeightsPass(Pass):
        '''Assumes: ... Guarantees: ...'''

        name: ClassVar[str] = "quantize-weights"
        group_size: int = 32

        def apply(self, module, ctx): ...

Pipeline text is ``name{key=value,key2=value},name2``: passes are separated by commas outside
braces, option keys are the field names in kebab-case (``group-size=32``; snake_case is accepted
too), values are converted to the field's type (int, float, bool, str, tuple of ints ``1x2x3``).
``format_pipeline`` writes every option, so its output parses back to equal pass objects.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import time
import typing
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TextIO

from mcpc.errors import McpcError, UsageError, VerifyError

_PASS_NAME = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*\Z")
# Characters that would break the pipeline grammar inside a str option value.
_RESERVED = set("{},= \t\n")


@dataclass
class PassContext:
    """What a pass may consult besides the module: the target, the QAT config, free-form notes.

    ``target`` and ``config`` are None when the caller has none (e.g. IR-only tests); a pass that
    needs one raises ``PassError`` naming itself.
    """

    target: Any = None
    config: Any = None
    notes: dict[str, Any] = field(default_factory=dict)


class Pass:
    """Base class of all passes.  Subclasses are frozen dataclasses registered with ``register_pass``.

    Assumes ``apply`` receives a module that verifies; guarantees nothing itself — each pass states
    in its docstring what it assumes and guarantees, and the manager verifies after it.
    """

    name: ClassVar[str]

    def apply(self, module, ctx: PassContext):  # pragma: no cover - abstract
        raise NotImplementedError(f"pass {self.name!r} does not implement apply()")


# The option value types a pass field may have, by their type annotation.
_TUPLE_OF_INTS = tuple[int, ...]
_OPTION_TYPES = (int, float, bool, str, _TUPLE_OF_INTS)


class PassRegistry:
    """Passes by name.  The module-level ``REGISTRY`` is the one the CLI uses; tests may make their own."""

    def __init__(self) -> None:
        self._passes: dict[str, type[Pass]] = {}

    def register(self, cls: type[Pass]) -> type[Pass]:
        """Validate ``cls`` (frozen dataclass, kebab-case ``name``, supported option types) and add it.

        Raises TypeError for a malformed pass class (a programming error, not a user error) and
        ValueError for a name already taken by a different class.
        """
        name = getattr(cls, "name", None)
        if not isinstance(name, str) or not _PASS_NAME.match(name):
            raise TypeError(f"{cls.__qualname__}.name must be a kebab-case string, got {name!r}")
        if not dataclasses.is_dataclass(cls) or not cls.__dataclass_params__.frozen:
            raise TypeError(f"pass {name!r} ({cls.__qualname__}) must be a frozen dataclass")
        if not callable(getattr(cls, "apply", None)):
            raise TypeError(f"pass {name!r} ({cls.__qualname__}) has no apply(module, ctx) method")
        for f in _option_fields(cls):
            if not f.has_default:
                raise TypeError(f"pass {name!r}: option {f.name!r} needs a default value")
        previous = self._passes.get(name)
        if previous is not None and previous.__qualname__ != cls.__qualname__:
            raise ValueError(
                f"pass name {name!r} is registered twice ({previous.__qualname__}, {cls.__qualname__})"
            )
        self._passes[name] = cls
        return cls

    def get(self, name: str) -> type[Pass] | None:
        return self._passes.get(name)

    def names(self) -> list[str]:
        return sorted(self._passes)

    def __contains__(self, name: object) -> bool:
        return name in self._passes


REGISTRY = PassRegistry()


def register_pass(cls: type[Pass]) -> type[Pass]:
    """Class decorator adding a pass to the global ``REGISTRY`` (apply it above ``@dataclass``)."""
    return REGISTRY.register(cls)


class _Option(typing.NamedTuple):
    name: str  # the dataclass field name (snake_case)
    type: Any  # one of _OPTION_TYPES
    has_default: bool


def _option_fields(cls: type) -> list[_Option]:
    """The options (init fields) of a pass class with resolved types; TypeError if a type is unsupported."""
    hints = typing.get_type_hints(cls)
    options = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        tp = hints[f.name]
        if tp not in _OPTION_TYPES:
            raise TypeError(f"pass {cls.name!r}: option {f.name!r} has unsupported type {tp!r}")
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        options.append(_Option(f.name, tp, has_default))
    return options


# --------------------------------------------------------------------------------------------
# Pipeline text


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


# --------------------------------------------------------------------------------------------
# Running


@dataclass
class PassTiming:
    """Wall time of one pass and of the verification that followed it."""

    pass_text: str
    seconds: float
    verify_seconds: float


class PassManager:
    """Runs passes in order, verifying the module before the first and after every pass.

    Guarantees: the returned module verified after the last pass (when ``verify_each``); a
    VerifyError is re-raised naming the pass after which the module became invalid; other errors
    propagate unchanged (McpcErrors keep their exit code; anything else gets a note naming the pass).
    """

    def __init__(
        self,
        passes: Sequence[Pass],
        verify_each: bool = True,
        print_ir_after_all: TextIO | None = None,
        time_passes: bool = False,
    ) -> None:
        self.passes = list(passes)
        self.verify_each = verify_each
        self.print_ir_after_all = print_ir_after_all
        self.time_passes = time_passes
        self.timings: list[PassTiming] = []

    def run(self, module, ctx: PassContext | None = None):
        """Apply every pass to ``module`` and return the result (passes may return a new module)."""
        ctx = ctx if ctx is not None else PassContext()
        self.timings = []
        if self.verify_each:
            try:
                module.verify()
            except VerifyError as exc:
                raise VerifyError(f"input module is invalid before any pass ran: {exc.message}") from exc
        for p in self.passes:
            text = format_pass(p)
            start = time.perf_counter()
            try:
                result = p.apply(module, ctx)
            except McpcError:
                raise
            except Exception as exc:
                if hasattr(exc, "add_note"):  # Python >= 3.11; the CLI shows notes in its report
                    exc.add_note(f"while running pass {text}")
                raise
            if result is None:
                raise TypeError(f"pass {p.name!r} returned None instead of a module")
            module = result
            applied = time.perf_counter()
            if self.verify_each:
                try:
                    module.verify()
                except VerifyError as exc:
                    raise VerifyError(f"IR is invalid after pass {text}: {exc.message}") from exc
            self.timings.append(PassTiming(text, applied - start, time.perf_counter() - applied))
            if self.print_ir_after_all is not None:
                from mcpc.ir import print_module

                print(f"// ----- IR after {text} ----- //", file=self.print_ir_after_all)
                print(print_module(module), file=self.print_ir_after_all)
        return module

    def timing_table(self):
        """A rich Table of per-pass wall times (pass, verify, share of total)."""
        from rich.table import Table

        total = sum(t.seconds + t.verify_seconds for t in self.timings) or 1e-12
        table = Table(title="pass timing", title_justify="left")
        table.add_column("pass")
        table.add_column("apply ms", justify="right")
        table.add_column("verify ms", justify="right")
        table.add_column("share", justify="right")
        for t in self.timings:
            share = (t.seconds + t.verify_seconds) / total
            table.add_row(
                t.pass_text, f"{t.seconds * 1e3:.2f}", f"{t.verify_seconds * 1e3:.2f}", f"{share:.0%}"
            )
        table.add_row(
            "total",
            f"{sum(t.seconds for t in self.timings) * 1e3:.2f}",
            f"{sum(t.verify_seconds for t in self.timings) * 1e3:.2f}",
            "100%",
        )
        return table

    def print_timings(self, file: TextIO | None = None) -> None:
        """Print ``timing_table()`` to ``file`` (default stderr)."""
        from rich.console import Console

        Console(file=file or sys.stderr).print(self.timing_table())
