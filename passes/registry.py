"""Pass registry: the ``Pass`` base class, ``PassContext`` and passes by name.

A pass is a frozen dataclass whose fields are its options::

    @register_pass
    @dataclass(frozen=True)
    class QuantizeWeightsPass(Pass):
        '''Assumes: ... Guarantees: ...'''

        name: ClassVar[str] = "quantize-weights"
        group_size: int = 32

        def apply(self, module, ctx): ...

``register`` checks the class when it is added (frozen dataclass, kebab-case name, options of a
supported type with defaults), so a malformed pass fails at import, not when a pipeline names it.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

_PASS_NAME = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*\Z")


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
