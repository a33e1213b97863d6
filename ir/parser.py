"""The MCP IR text format — parser (grammar in ``mcpc.ir.printer``).

Errors are ``ParseError`` with ``file:line:col``, the offending line and a caret under the column.
The parser builds ops through their registered classes with the declared result types, then the
caller (or ``parse_module(verify=True)``) runs the verifier, so a well-formed but invalid module
is reported by the verifier naming the op.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from mcpc.arch.dtypes import from_storage
from mcpc.errors import ParseError
from mcpc.ir.core import OP_REGISTRY, Function, GlobalDecl, HostRegDecl, Module, Value
from mcpc.ir.dtypes import DTYPES, DType
from mcpc.ir.types import TensorType

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_.$]*")
_VALUE_TOKEN = re.compile(r"[A-Za-z0-9_.$]+")
_NUMBER = re.compile(r"[-+]?(?:inf|nan|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_TYPE_BODY = re.compile(r"((?:\d+x)*)([A-Za-z0-9]+)>")


class _Cursor:
    def __init__(self, text: str, filename: str):
        self.text = text
        self.filename = filename
        self.pos = 0

    # -- errors -------------------------------------------------------------------------------
    def error(self, message: str, pos: int | None = None) -> ParseError:
        pos = self.pos if pos is None else pos
        line_no = self.text.count("\n", 0, pos) + 1
        line_start = self.text.rfind("\n", 0, pos) + 1
        line_end = self.text.find("\n", pos)
        line = self.text[line_start : line_end if line_end >= 0 else len(self.text)]
        col = pos - line_start + 1
        caret = " " * (col - 1) + "^"
        return ParseError(f"{self.filename}:{line_no}:{col}: {message}\n  {line}\n  {caret}")

    # -- lexing -------------------------------------------------------------------------------
    def skip(self) -> None:
        while self.pos < len(self.text):
            c = self.text[self.pos]
            if c in " \t\r\n":
                self.pos += 1
            elif self.text.startswith("//", self.pos):
                end = self.text.find("\n", self.pos)
                self.pos = len(self.text) if end < 0 else end
            else:
                break

    def peek(self, s: str) -> bool:
        self.skip()
        return self.text.startswith(s, self.pos)

    def peek_word(self, word: str) -> bool:
        self.skip()
        m = _IDENT.match(self.text, self.pos)
        return bool(m) and m.group(0) == word

    def accept(self, s: str) -> bool:
        if self.peek(s):
            self.pos += len(s)
            return True
        return False

    def expect(self, s: str) -> None:
        if not self.accept(s):
            raise self.error(f"expected '{s}'")

    def expect_word(self, word: str) -> None:
        if not self.peek_word(word):
            raise self.error(f"expected '{word}'")
        self.pos += len(word)

    def regex(self, pattern: re.Pattern, what: str) -> str:
        self.skip()
        m = pattern.match(self.text, self.pos)
        if not m:
            raise self.error(f"expected {what}")
        self.pos = m.end()
        return m.group(0)

    def ident(self) -> str:
        return self.regex(_IDENT, "an identifier")

    def string(self) -> str:
        start = self.pos
        raw = self.regex(_STRING, "a string")
        try:
            return json.loads(raw)
        except json.JSONDecodeError as e:
            raise self.error(f"bad string literal: {e.msg}", start) from None

    def name(self) -> str:
        """Identifier or quoted string (after % or @)."""
        self.skip()
        return self.string() if self.peek('"') else self.ident()

    def value_name(self) -> tuple[str, str]:
        """After %: (scope key, name).  Quoted names that are not plain identifiers keep their
        quotes in the key, so an argument called "0" never collides with the result %0."""
        self.skip()
        if self.peek('"'):
            name = self.string()
            return (name if _IDENT.fullmatch(name) else json.dumps(name)), name
        tok = self.regex(_VALUE_TOKEN, "a value name")
        return tok, tok

    def at_end(self) -> bool:
        self.skip()
        return self.pos >= len(self.text)


class _Parser:
    def __init__(self, text: str, filename: str):
        self.c = _Cursor(text, filename)

    # -- types and attributes ---------------------------------------------------------------------
    def parse_type(self) -> TensorType:
        self.c.expect_word("tensor")
        self.c.expect("<")
        start = self.c.pos
        m = _TYPE_BODY.match(self.c.text, self.c.pos)
        if not m:
            raise self.c.error("expected a tensor type like tensor<1x128xf32>", start)
        dims, dt = m.group(1), m.group(2)
        if dt not in DTYPES:
            raise self.c.error(f"unknown dtype '{dt}' (expected one of {', '.join(DTYPES)})", m.start(2))
        self.c.pos = m.end()
        shape = tuple(int(d) for d in dims.split("x") if d)
        return TensorType(shape, DTYPES[dt])

    def parse_attr(self) -> Any:
        c = self.c
        c.skip()
        if c.peek("{"):
            return self.parse_dict()
        if c.peek("["):
            c.expect("[")
            items = []
            if not c.accept("]"):
                items.append(self.parse_attr())
                while c.accept(","):
                    items.append(self.parse_attr())
                c.expect("]")
            return items
        if c.peek('"'):
            return c.string()
        if c.peek_word("dense"):
            return self.parse_dense()
        if c.peek_word("true") or c.peek_word("false"):
            return c.ident() == "true"
        m = _NUMBER.match(c.text, c.pos)
        if m:
            tok = m.group(0)
            c.pos = m.end()
            if re.fullmatch(r"[-+]?\d+", tok):
                return int(tok)
            return float(tok)
        word_pos = c.pos
        word = c.ident()
        if word in DTYPES:
            return DTYPES[word]
        raise c.error(f"unexpected '{word}' in attribute value", word_pos)

    def parse_dict(self) -> dict:
        c = self.c
        c.expect("{")
        out: dict[str, Any] = {}
        if c.accept("}"):
            return out
        while True:
            c.skip()
            key_pos = c.pos
            key = c.name()
            if key in out:
                raise c.error(f"duplicate key '{key}'", key_pos)
            c.expect("=")
            out[key] = self.parse_attr()
            if c.accept("}"):
                return out
            c.expect(",")

    def parse_dense(self) -> np.ndarray:
        c = self.c
        c.expect_word("dense")
        c.expect("<")
        body_pos = c.pos
        if c.peek('"'):
            payload: Any = c.string()
        else:
            payload = self.parse_attr()
        c.expect(">")
        c.expect(":")
        ttype = self.parse_type()
        npd = ttype.dtype.np_dtype
        if isinstance(payload, str):
            if not payload.startswith("0x"):
                raise c.error("dense hex payload must start with 0x", body_pos)
            try:
                raw = bytes.fromhex(payload[2:])
            except ValueError:
                raise c.error("dense payload is not valid hex", body_pos) from None
            if len(raw) != ttype.nbytes:
                raise c.error(f"dense payload has {len(raw)} bytes, {ttype} needs {ttype.nbytes}", body_pos)
            return from_storage(raw, ttype.dtype.name, ttype.shape).copy()
        if not isinstance(payload, list) or len(payload) != ttype.numel:
            raise c.error(f"dense literal must list {ttype.numel} elements for {ttype}", body_pos)
        return (
            np.array(payload, dtype=np.float64 if ttype.dtype.is_float else None)
            .astype(npd)
            .reshape(ttype.shape)
        )

    # -- structure --------------------------------------------------------------------------------
    def parse_value_ref(self, scope: dict[str, Value]) -> Value:
        c = self.c
        c.skip()
        pos = c.pos
        c.expect("%")
        key, _ = c.value_name()
        if key not in scope:
            raise c.error(f"use of undefined value %{key}", pos)
        return scope[key]

    def parse_function(self) -> Function:
        c = self.c
        c.expect_word("func")
        c.expect("@")
        fname = c.name()
        c.expect("(")
        arg_specs = []
        if not c.accept(")"):
            while True:
                c.expect("%")
                pos = c.pos
                akey, aname = c.value_name()
                c.expect(":")
                atype = self.parse_type()
                arg_specs.append((akey, aname, atype, pos))
                if c.accept(")"):
                    break
                c.expect(",")
        c.expect("->")
        c.expect("(")
        result_specs = []
        if not c.accept(")"):
            while True:
                c.skip()
                pos = c.pos
                rname = c.string()
                c.expect(":")
                result_specs.append((rname, self.parse_type(), pos))
                if c.accept(")"):
                    break
                c.expect(",")
        func = Function(fname, [a[2] for a in arg_specs], [a[1] for a in arg_specs])
        scope: dict[str, Value] = {}
        for arg, (akey, aname, _, pos) in zip(func.args, arg_specs, strict=True):
            if akey in scope:
                raise c.error(f"duplicate argument %{aname}", pos)
            scope[akey] = arg
        if c.peek_word("attributes"):
            c.expect_word("attributes")
            func.attrs = self.parse_dict()
        c.expect("{")
        while not c.accept("}"):
            self.parse_op(func, scope)
        func.result_names = [r[0] for r in result_specs]
        outs = func.outputs
        if len(outs) != len(result_specs):
            raise c.error(f"func @{fname} declares {len(result_specs)} results but returns {len(outs)}")
        for (rname, rtype, pos), v in zip(result_specs, outs, strict=True):
            if v.type != rtype:
                raise c.error(f"result '{rname}' declared {rtype} but the returned value is {v.type}", pos)
        return func

    def parse_op(self, func: Function, scope: dict[str, Value]) -> None:
        c = self.c
        c.skip()
        op_pos = c.pos
        defs: list[tuple[str, int]] = []
        if c.peek("%"):
            while True:
                c.skip()
                def_pos = c.pos
                c.expect("%")
                defs.append((c.value_name()[0], def_pos))
                if not c.accept(","):
                    break
            c.expect("=")
        c.skip()
        name_pos = c.pos
        opname = c.ident()
        cls = OP_REGISTRY.get(opname)
        if cls is None:
            raise c.error(f"unknown op '{opname}'", name_pos)
        operands = []
        if c.peek("%"):
            operands.append(self.parse_value_ref(scope))
            while c.accept(","):
                operands.append(self.parse_value_ref(scope))
        attrs = self.parse_dict() if c.peek("{") else {}
        c.expect(":")
        c.expect("(")
        in_types = []
        if not c.accept(")"):
            in_types.append(self.parse_type())
            while c.accept(","):
                in_types.append(self.parse_type())
            c.expect(")")
        c.expect("->")
        out_types = []
        if c.accept("("):
            if not c.accept(")"):
                out_types.append(self.parse_type())
                while c.accept(","):
                    out_types.append(self.parse_type())
                c.expect(")")
        else:
            out_types.append(self.parse_type())
        if len(in_types) != len(operands):
            raise c.error(f"{opname}: {len(operands)} operands but {len(in_types)} operand types", op_pos)
        for i, (v, t) in enumerate(zip(operands, in_types, strict=True)):
            if v.type != t:
                raise c.error(f"{opname}: operand #{i} has type {v.type}, signature says {t}", op_pos)
        if len(out_types) != len(defs):
            raise c.error(f"{opname}: {len(defs)} results named but {len(out_types)} result types", op_pos)
        op = cls(operands, attrs, result_types=out_types)
        if c.peek_word("loc"):
            c.expect_word("loc")
            c.expect("(")
            op.loc = c.string()
            c.expect(")")
        for (dname, pos), r in zip(defs, op.results, strict=True):
            if dname in scope:
                raise c.error(f"value %{dname} defined twice", pos)
            scope[dname] = r
        func.append(op)

    def parse_decl(self, module: Module) -> None:
        """``global @name : type`` or ``host_reg @name {max = INT, min = INT}``."""
        c = self.c
        c.skip()
        pos = c.pos
        kind = "global" if c.peek_word("global") else "host_reg"
        c.expect_word(kind)
        c.expect("@")
        name = c.name()
        if name in module.globals or name in module.host_regs:
            raise c.error(f"@{name} declared twice", pos)
        if kind == "global":
            c.expect(":")
            module.globals[name] = GlobalDecl(name, self.parse_type())
            return
        attrs = self.parse_dict()
        bounds = {k: attrs.get(k) for k in ("min", "max")}
        if set(attrs) != {"min", "max"} or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in bounds.values()
        ):
            raise c.error(f"host_reg @{name} needs exactly {{max = INT, min = INT}}, got {attrs}", pos)
        module.host_regs[name] = HostRegDecl(name, bounds["min"], bounds["max"])

    def parse_module(self) -> Module:
        c = self.c
        c.expect_word("module")
        c.expect("@")
        module = Module(c.name())
        if c.peek_word("attributes"):
            c.expect_word("attributes")
            module.attrs = self.parse_dict()
        c.expect("{")
        while not c.accept("}"):
            c.skip()
            pos = c.pos
            if c.peek_word("global") or c.peek_word("host_reg"):
                self.parse_decl(module)
                continue
            func = self.parse_function()
            if func.name in module.functions:
                raise c.error(f"function @{func.name} defined twice", pos)
            module.add_function(func)
        if not c.at_end():
            raise c.error("unexpected text after the module")
        return module


def parse_module(text: str, filename: str = "<string>", verify: bool = True) -> Module:
    """Parse IR text into a Module; ParseError with file:line:col on bad syntax, VerifyError
    (naming the op) when the module is well-formed but invalid and ``verify`` is set."""
    module = _Parser(text, filename).parse_module()
    if verify:
        module.verify()
    return module


def parse_type(text: str) -> TensorType:
    return _Parser(text, "<type>").parse_type()


def parse_attr(text: str) -> Any:
    return _Parser(text, "<attr>").parse_attr()


__all__ = ["parse_module", "parse_type", "parse_attr", "DType"]
