"""The MCP IR text format — printer.  ``parse_module(print_module(m))`` prints identically.

Grammar (informal)::

    module   := 'module' '@' NAME ['attributes' dict] '{' decl* func* '}'
    decl     := 'global' '@' NAME ':' type | 'host_reg' '@' NAME dict   -- dict: {max = INT, min = INT}
    func     := 'func' '@' NAME '(' [arg (',' arg)*] ')' '->' '(' [res (',' res)*] ')'
                ['attributes' dict] '{' op* '}'
    arg      := VALUE ':' type
    res      := STRING ':' type                   -- the output's name
    op       := [VALUE (',' VALUE)* '='] OPNAME [VALUE (',' VALUE)*] [dict]
                ':' '(' [type (',' type)*] ')' '->' results ['loc' '(' STRING ')']
    results  := type | '(' [type (',' type)*] ')'
    type     := 'tensor' '<' (INT 'x')* DTYPE '>'
    attr     := INT | FLOAT | 'true' | 'false' | STRING | DTYPE | '[' attr,* ']' | dict
              | 'dense' '<' ('"0x' HEX '"' | '[' scalars ']') '>' ':' type
    dict     := '{' [KEY '=' attr (',' KEY '=' attr)*] '}'
    VALUE    := '%' (IDENT | STRING)

Op results are numbered ``%0, %1, …`` in order of definition; function arguments keep the model's
input names (quoted when they are not plain identifiers).  Attribute dicts are printed with sorted
keys, floats with ``repr`` (exact round trip), tensors with more than 8 elements as the hex of
their little-endian bytes (sub-byte types packed two per byte, low nibble first, as stored).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np

from mcpc.arch.dtypes import to_storage
from mcpc.ir.core import Function, Module, Operation, Value
from mcpc.ir.dtypes import DType, dtype_from_numpy
from mcpc.ir.types import TensorType

_PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_.$]*$")
INLINE_TENSOR_LIMIT = 8


def format_name(name: str) -> str:
    """An identifier as printed after % or @: bare when plain, else a JSON-quoted string."""
    return name if _PLAIN.match(name) else json.dumps(name)


def format_float(x: float) -> str:
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    r = repr(x)
    return r if any(c in r for c in ".en") else r + ".0"


def format_tensor(a: np.ndarray) -> str:
    ttype = TensorType(a.shape, dtype_from_numpy(a.dtype))
    if a.size <= INLINE_TENSOR_LIMIT:
        flat = a.reshape(-1)
        if ttype.dtype.is_float:
            items = [format_float(float(x)) for x in flat]
        elif ttype.dtype.name == "i1":
            items = ["true" if x else "false" for x in flat]
        else:
            items = [str(int(x)) for x in flat]
        return f"dense<[{', '.join(items)}]> : {ttype}"
    raw = to_storage(a)  # little-endian, sub-byte types packed two per byte (low nibble first)
    return f'dense<"0x{raw.hex().upper()}"> : {ttype}'


def format_attr(value: Any) -> str:
    """One attribute value in the text syntax (see module docstring)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return format_float(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, DType):
        return value.name
    if isinstance(value, np.ndarray):
        return format_tensor(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(format_attr(v) for v in value) + "]"
    if isinstance(value, dict):
        return format_dict(value)
    raise TypeError(f"cannot print attribute value of type {type(value).__name__}")


def format_dict(d: dict) -> str:
    return "{" + ", ".join(f"{format_name(k)} = {format_attr(d[k])}" for k in sorted(d)) + "}"


class _Namer:
    def __init__(self, func: Function):
        self.names: dict[int, str] = {}
        for a in func.args:
            self.names[id(a)] = "%" + format_name(a.name)
        self.counter = 0

    def define(self, v: Value) -> str:
        name = f"%{self.counter}"
        self.counter += 1
        self.names[id(v)] = name
        return name

    def __call__(self, v: Value) -> str:
        try:
            return self.names[id(v)]
        except KeyError:
            return "%<undefined>"


def print_op(op: Operation, namer: _Namer) -> str:
    parts = []
    if op.results:
        parts.append(", ".join(namer.define(r) for r in op.results) + " = ")
    parts.append(op.name)
    if op.operands:
        parts.append(" " + ", ".join(namer(v) for v in op.operands))
    if op.attrs:
        parts.append(" " + format_dict(op.attrs))
    ins = ", ".join(str(v.type) for v in op.operands)
    outs = [str(r.type) for r in op.results]
    res = outs[0] if len(outs) == 1 else "(" + ", ".join(outs) + ")"
    parts.append(f" : ({ins}) -> {res}")
    if op.loc is not None:
        parts.append(f" loc({json.dumps(op.loc)})")
    return "".join(parts)


def print_function(func: Function, indent: str = "  ") -> str:
    namer = _Namer(func)
    args = [f"{namer(a)}: {a.type}" for a in func.args]
    results = [f"{json.dumps(n)}: {v.type}" for n, v in zip(func.result_names, func.outputs, strict=False)]
    head = f"{indent}func @{format_name(func.name)}({', '.join(args)}) -> ({', '.join(results)})"
    if func.attrs:
        head += " attributes " + format_dict(func.attrs)
    lines = [head + " {"]
    for op in func.ops:
        lines.append(indent * 2 + print_op(op, namer))
    lines.append(indent + "}")
    return "\n".join(lines)


def print_module(module: Module) -> str:
    """The whole module as text, ending in a newline."""
    head = f"module @{format_name(module.name)}"
    if module.attrs:
        head += " attributes " + format_dict(module.attrs)
    decls = [f"  global @{format_name(g.name)} : {g.type}" for g in module.globals.values()]
    decls += [
        f"  host_reg @{format_name(r.name)} {format_dict({'min': r.min, 'max': r.max})}"
        for r in module.host_regs.values()
    ]
    body = [*decls, *(print_function(f) for f in module.functions.values())]
    return "\n".join([head + " {", *body, "}"]) + "\n"
