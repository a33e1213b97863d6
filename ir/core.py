"""The MCP IR core: SSA values, operations, functions and modules.

A ``Module`` holds named ``Function``s (a decoder has ``prefill`` and ``decode``; most models have
``main``).  A function is a single block: arguments, then operations in order, ending in one
``mcp.return``.  Every value is defined once (SSA) — by a function argument or by an operation
result — and used only after its definition.

Each op is one ``Operation`` subclass with a ``name`` (``mcp.matmul``), its attribute schema and an
``infer_types`` classmethod that both builds result types and checks operands: the generic verifier
re-runs it and compares with the declared result types, so an op's shape rules live in one place.
Quantization is expressed by ops (``mcp.quantize`` / ``mcp.dequantize``) whose scales and zero points
are typed operands, never by annotations on values.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from mcpc.errors import VerifyError
from mcpc.ir.types import TensorType

# Attribute kinds understood by the generic verifier.  Values are plain Python objects:
#   int, float, bool, str, ints (list[int]), floats (list[float]), dtype (DType),
#   tensor (numpy.ndarray), dict (str -> attribute value), any.
ATTR_KINDS = ("int", "float", "bool", "str", "ints", "floats", "dtype", "tensor", "dict", "any")

OP_REGISTRY: dict[str, type[Operation]] = {}


class Attr:
    """Schema of one op attribute: its kind, and a default (``REQUIRED`` when it has none)."""

    REQUIRED: ClassVar[object] = object()

    def __init__(self, kind: str, default: Any = REQUIRED, doc: str = ""):
        if kind not in ATTR_KINDS:
            raise ValueError(f"unknown attribute kind {kind!r}")
        self.kind = kind
        self.default = default
        self.doc = doc

    @property
    def required(self) -> bool:
        return self.default is Attr.REQUIRED


class Value:
    """An SSA value: defined by a function argument or an op result; has a static tensor type."""

    __slots__ = ("type", "owner", "index", "name")

    def __init__(self, type: TensorType, owner=None, index: int = 0, name: str | None = None):
        self.type = type
        self.owner = owner  # Operation, or Function for arguments
        self.index = index
        self.name = name  # argument name (model input name); None for op results

    @property
    def is_argument(self) -> bool:
        return isinstance(self.owner, Function)

    def __repr__(self) -> str:
        owner = self.owner.name if self.owner is not None else "?"
        return f"<Value {self.name or ''}:{self.type} of {owner}#{self.index}>"


class Operation:
    """Base of every op.  Subclasses set ``name``, ``ATTRS``, ``NUM_OPERANDS`` and implement
    ``infer_types``; ``verify_extra`` adds checks that are not about result types."""

    name: ClassVar[str] = ""
    ATTRS: ClassVar[dict[str, Attr]] = {}
    NUM_OPERANDS: ClassVar[int | None] = None  # None: variadic
    NUM_RESULTS: ClassVar[int | None] = 1  # None: decided by infer_types
    IS_TERMINATOR: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.name:
            if cls.name in OP_REGISTRY and OP_REGISTRY[cls.name] is not cls:
                raise TypeError(f"op {cls.name} registered twice")
            OP_REGISTRY[cls.name] = cls

    def __init__(
        self,
        operands: Sequence[Value],
        attrs: dict[str, Any] | None = None,
        result_types: Sequence[TensorType] | None = None,
        loc: str | None = None,
    ):
        self.operands: list[Value] = list(operands)
        self.attrs: dict[str, Any] = self.complete_attrs(attrs or {})
        if result_types is None:
            result_types = self.infer_types([v.type for v in self.operands], self.attrs)
        self.results: list[Value] = [Value(t, self, i) for i, t in enumerate(result_types)]
        self.loc = loc  # the ONNX node this op came from (debug map, errors)

    # -- schema -----------------------------------------------------------------------------
    @classmethod
    def complete_attrs(cls, attrs: dict[str, Any]) -> dict[str, Any]:
        """Fill defaults for missing optional attributes (unknown names are kept for the verifier)."""
        out = dict(attrs)
        for key, spec in cls.ATTRS.items():
            if key not in out and not spec.required:
                # a copy, so a pass editing one op's list/dict default cannot change every op's
                out[key] = copy.copy(spec.default)
        return out

    @classmethod
    def infer_types(cls, operand_types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        """Result types for these operands and attributes; raise ``ValueError`` when invalid."""
        raise NotImplementedError(f"{cls.name} does not implement infer_types")

    def verify_extra(self) -> None:
        """Op-specific checks beyond result types; raise ``ValueError`` with a message."""

    # -- accessors --------------------------------------------------------------------------
    @property
    def result(self) -> Value:
        if len(self.results) != 1:
            raise ValueError(f"{self.name} has {len(self.results)} results, not one")
        return self.results[0]

    def attr(self, key: str) -> Any:
        return self.attrs[key]

    def describe(self) -> str:
        """How errors name this op: its mnemonic and, when known, the ONNX node it came from."""
        return f"{self.name}" + (f" (ONNX node '{self.loc}')" if self.loc else "")

    def verify(self) -> None:
        """Check operand count, attributes and result types; raise VerifyError naming the op."""
        try:
            self._verify_schema()
            expected = self.infer_types([v.type for v in self.operands], self.attrs)
            declared = [r.type for r in self.results]
            if list(expected) != declared:
                raise ValueError(
                    f"declared result types ({', '.join(map(str, declared))}) differ from the "
                    f"inferred ({', '.join(map(str, expected))})"
                )
            self.verify_extra()
        except (ValueError, TypeError, IndexError) as e:
            raise VerifyError(f"{self.describe()}: {e}") from None

    def _verify_schema(self) -> None:
        if self.NUM_OPERANDS is not None and len(self.operands) != self.NUM_OPERANDS:
            raise ValueError(f"expects {self.NUM_OPERANDS} operands, has {len(self.operands)}")
        if self.NUM_RESULTS is not None and len(self.results) != self.NUM_RESULTS:
            raise ValueError(f"expects {self.NUM_RESULTS} results, has {len(self.results)}")
        for key in self.attrs:
            if key not in self.ATTRS:
                valid = ", ".join(self.ATTRS) or "none"
                raise ValueError(f"unknown attribute '{key}' (valid: {valid})")
        for key, spec in self.ATTRS.items():
            if key not in self.attrs:
                raise ValueError(f"missing required attribute '{key}'")
            check_attr_kind(key, spec.kind, self.attrs[key])

    def __repr__(self) -> str:
        return f"<{self.name} at {id(self):#x}>"


def check_attr_kind(key: str, kind: str, value: Any) -> None:
    """Raise ValueError when ``value`` is not of attribute kind ``kind``."""
    import numpy as np

    from mcpc.ir.dtypes import DType

    ok = {
        "int": lambda v: isinstance(v, (int, np.integer)) and not isinstance(v, bool),
        "float": lambda v: isinstance(v, (float, int, np.floating)) and not isinstance(v, bool),
        "bool": lambda v: isinstance(v, bool),
        "str": lambda v: isinstance(v, str),
        "ints": lambda v: (
            isinstance(v, (list, tuple))
            and all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in v)
        ),
        "floats": lambda v: isinstance(v, (list, tuple)) and all(isinstance(x, (int, float)) for x in v),
        "dtype": lambda v: isinstance(v, DType),
        "tensor": lambda v: isinstance(v, np.ndarray),
        "dict": lambda v: isinstance(v, dict),
        "any": lambda v: True,
    }[kind]
    if not ok(value):
        raise ValueError(f"attribute '{key}' must be {kind}, got {type(value).__name__} {value!r}")


class Function:
    """A named single-block function: arguments (model inputs), ops, one terminating return."""

    def __init__(self, name: str, arg_types: Sequence[TensorType], arg_names: Sequence[str]):
        self.name = name
        self.args: list[Value] = [
            Value(t, self, i, n) for i, (t, n) in enumerate(zip(arg_types, arg_names, strict=True))
        ]
        self.ops: list[Operation] = []
        self.result_names: list[str] = []
        self.attrs: dict[str, Any] = {}

    # -- building ---------------------------------------------------------------------------
    def append(self, op: Operation) -> Operation:
        self.ops.append(op)
        return op

    @property
    def terminator(self) -> Operation | None:
        return self.ops[-1] if self.ops and self.ops[-1].IS_TERMINATOR else None

    @property
    def outputs(self) -> list[Value]:
        term = self.terminator
        return list(term.operands) if term is not None else []

    @property
    def arg_names(self) -> list[str]:
        return [a.name for a in self.args]

    def walk(self) -> Iterator[Operation]:
        return iter(list(self.ops))

    def uses(self) -> dict[Value, list[Operation]]:
        """Map each value to the ops that use it (in program order)."""
        users: dict[Value, list[Operation]] = {}
        for op in self.ops:
            for v in op.operands:
                users.setdefault(v, []).append(op)
        return users

    def replace_all_uses(self, old: Value, new: Value) -> None:
        """Make every op that used ``old`` use ``new`` instead."""
        for op in self.ops:
            op.operands = [new if v is old else v for v in op.operands]

    # -- checking ---------------------------------------------------------------------------
    def verify(self) -> None:
        """SSA dominance, op invariants, a single final return; VerifyError names the op."""
        where = f"func @{self.name}"
        defined: set[int] = {id(a) for a in self.args}
        if len(set(self.arg_names)) != len(self.args):
            raise VerifyError(f"{where}: duplicate argument names {self.arg_names}")
        if not self.ops or not self.ops[-1].IS_TERMINATOR:
            raise VerifyError(f"{where}: does not end with mcp.return")
        for i, op in enumerate(self.ops):
            if op.IS_TERMINATOR and i != len(self.ops) - 1:
                raise VerifyError(f"{where}: {op.describe()} is a terminator in the middle of the body")
            for j, v in enumerate(op.operands):
                if id(v) not in defined:
                    raise VerifyError(
                        f"{where}: {op.describe()}: operand #{j} is used before it is defined "
                        "(or is defined in another function)"
                    )
            op.verify()
            for r in op.results:
                defined.add(id(r))
        if len(self.result_names) != len(self.outputs):
            raise VerifyError(
                f"{where}: {len(self.outputs)} returned values but {len(self.result_names)} result names"
            )


@dataclass(frozen=True)
class GlobalDecl:
    """``global @name : type``: a persistent buffer of the module, zero-initialised when the
    program is loaded (or reset), keeping its contents from run to run of any function."""

    name: str
    type: TensorType


@dataclass(frozen=True)
class HostRegDecl:
    """``host_reg @name {max, min}``: a signed 32-bit scalar the host sets for each run, with the
    inclusive range of values the program accepts (the simulator refuses others)."""

    name: str
    min: int
    max: int


class Module:
    """A compilation unit: named functions, module attributes (e.g. build precision) and the
    program state the functions share: ``globals`` (persistent buffers) and ``host_regs``."""

    def __init__(self, name: str = "model"):
        self.name = name
        self.functions: dict[str, Function] = {}
        self.attrs: dict[str, Any] = {}
        self.globals: dict[str, GlobalDecl] = {}
        self.host_regs: dict[str, HostRegDecl] = {}

    def add_function(self, func: Function) -> Function:
        if func.name in self.functions:
            raise ValueError(f"function @{func.name} defined twice")
        self.functions[func.name] = func
        return func

    @property
    def main(self) -> Function:
        if "main" in self.functions:
            return self.functions["main"]
        return next(iter(self.functions.values()))

    def walk(self) -> Iterable[Operation]:
        for f in self.functions.values():
            yield from f.walk()

    def verify(self) -> None:
        """Verify every function; raises VerifyError naming the function and op."""
        if not self.functions:
            raise VerifyError(f"module @{self.name} has no functions")
        for f in self.functions.values():
            f.verify()
        if self.globals or self.host_regs or any(getattr(op, "STATEFUL", False) for op in self.walk()):
            from mcpc.ir.state import verify_state

            verify_state(self)
