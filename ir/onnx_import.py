"""ONNX → MCP IR: load, bind symbolic dims, fold shape subgraphs, build one ``main`` function.

``import_onnx(model, shapes, dims)`` assumes an ONNX model of default-domain opset 13–28 and
guarantees a ``Module`` that verifies, or one of these errors:

* ``InputError`` — unreadable/truncated file, checker failure (ops ONNX Runtime registers in the
  default domain that the importer handles, ``ORT_DEFAULT_DOMAIN_OPS``, are not failures), input
  dims still symbolic after binding (all of them at once, where each is used, and the ``--dim``
  line that binds them).
* ``UsageError`` — a binding wrong in itself (unknown input or dim name, negative size, rank or
  fixed dim contradicted, 0s that empty every output), listing the model's dims.
* ``DoesNotFit`` — with ``dram_bytes``, inputs larger than the target's DRAM; an import-time
  constant the host cannot allocate.
* ``UnsupportedError`` — one message for everything unsupported (``mcpc.ir.onnx_support``): the
  refused nodes grouped by (domain, op type, opset, reason) with their count and first node, plus
  unsupported input/output dtypes.
* ``McpcError`` (exit 70) — an importer bug: our type inference disagrees with ONNX's.

Import-time values are either numpy arrays (known constants) or IR ``Value``s.  A node whose
inputs are all constants is evaluated at import with the IR interpreter's ``evaluate_op`` (one
semantics definition), so shape subgraphs (Shape → Gather → Concat → Reshape …) vanish.  int64
constants stay int64 during import; an int64 tensor that reaches the IR becomes i32 (indices), and
i64 exists in the IR only at function arguments/results, with a ``mcp.cast`` right after/before.
float64 constants (initializers, Constant nodes, Cast to double) are converted to f32 — a
rounding, not a lossless conversion; float64 model inputs/outputs are unsupported.

A tensor with zero elements (an input bound with a 0, an op result with a 0 dim) holds no data, so
it is an import-time constant and never an IR op's operand or result; ops reading one get ONNX's
semantics (``_Importer._emit_empty``).  An empty input stays a (0-byte) function argument, an empty
output is returned as a 0-element ``mcp.constant``.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from mcpc.errors import (
    DoesNotFit,
    InputError,
    InternalError,
    McpcError,
    UnsupportedError,
    UsageError,
    does_not_fit,
)
from mcpc.ir import ops_nn, ops_shape  # noqa: F401  (registers the ops the handlers emit)
from mcpc.ir.core import Function, Module, Operation, Value
from mcpc.ir.dtypes import I32, I64, DType, dtype_from_numpy
from mcpc.ir.interpreter import evaluate_op
from mcpc.ir.onnx_handlers import DOMAIN_HANDLERS, HANDLERS, onnx_dtype
from mcpc.ir.onnx_handlers_genai import ORT_DEFAULT_DOMAIN_OPS
from mcpc.ir.onnx_shapes import (
    _graph_inputs,
    _model_dims,
    _onnx_shapes,
    bind_input_shapes,
    fix_numeric_dims,
    zero_bindings,
)
from mcpc.ir.onnx_support import DEFAULT_DOMAINS as _DEFAULT_DOMAINS
from mcpc.ir.onnx_support import check_supported, unsupported_reason  # noqa: F401  (re-exported)
from mcpc.ir.onnx_support import node_attrs as _attrs
from mcpc.ir.ops_core import ConstantOp, ReturnOp
from mcpc.ir.ops_elementwise import CastOp
from mcpc.ir.ops_shape import ConcatOp
from mcpc.ir.types import TensorType

MIN_OPSET, MAX_OPSET = 13, 28
# Import-time folding never grows constant storage past this (see ``Importer.emit``).
IMPORT_FOLD_MAX_ELEMENTS = 1 << 22


class ImporterBug(InternalError):
    """Our own type inference disagrees with ONNX's: a bug in the importer (exit code 70)."""


def import_onnx(
    model: str | Path | onnx.ModelProto,
    shapes: dict[str, tuple[int, ...]] | None = None,
    dims: dict[str, int] | None = None,
    *,
    dram_bytes: int | None = None,
) -> Module:
    """Import ``model`` (a path or a ModelProto) into a verified ``Module`` with one ``main``.

    ``shapes`` binds whole inputs (``{"input_ids": (1, 128)}``); ``dims`` binds a named dim param
    everywhere (``{"seq": 128}``).  Function arguments are the graph inputs that are not
    initializers, in order; ``result_names`` are the graph output names; every op's ``loc`` is the
    ONNX node name (``<op_type>_<index>`` when unnamed).  With ``dram_bytes`` (the target's DRAM),
    inputs that together exceed it are ``DoesNotFit`` before any import work; import-time constants
    the host cannot allocate are ``DoesNotFit`` naming the node.
    """
    proto, label, name = _load(model)
    try:
        # by path when there is one: the checker then handles external data and models over 2 GB;
        # an in-memory model over 2 GB (a decoder build's rewrite) is checked without its weights
        onnx.checker.check_model(label if isinstance(model, (str, Path)) else _checkable(proto))
    except Exception as e:  # ValidationError, or a protobuf problem
        remaining = _recheck_without_ort_ops(proto, e)
        if remaining is not None:
            raise InputError(f"{label}: not a valid ONNX model: {_first_line(remaining)}") from None
    opset = default_opset(proto, label)
    if proto.functions:
        proto = onnx.inliner.inline_local_functions(proto)
    # before binding: no --dim makes an unsupported model compile, so say that first
    check_supported(proto, label)
    bound = bind_input_shapes(proto.graph, label, shapes or {}, dims or {})
    if dram_bytes is not None:
        _check_inputs_fit(proto.graph, label, bound, dram_bytes)
    inferred = _onnx_shapes(proto, bound, label)
    importer = _Importer(proto.graph, label, name, opset, bound, inferred)
    importer.zeros = zero_bindings(shapes or {}, dims or {})
    return importer.run()


def _check_inputs_fit(graph, label: str, bound: dict[str, tuple[int, ...]], dram_bytes: int) -> None:
    """DoesNotFit when the bound inputs alone need more than ``dram_bytes`` (the target's DRAM)."""
    sizes = {}
    for inp in _graph_inputs(graph):
        bits = onnx_dtype(inp.type.tensor_type.elem_type).bits
        sizes[inp.name] = (math.prod(bound[inp.name]) * bits + 7) // 8
    total = sum(sizes.values())
    if total > dram_bytes:
        biggest = max(sizes, key=sizes.get)
        shape = "x".join(map(str, bound[biggest]))
        raise does_not_fit(
            f"{label}: the input data (largest: '{biggest}', {shape})",
            total,
            dram_bytes,
            "DRAM",
            "dram.size_bytes",
        )


def _checkable(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto``, or past protobuf's 2 GB limit (which the in-memory checker cannot serialise) its
    graph without the initializers' data (``onnx_large.light_model``)."""
    from mcpc.ir.onnx_large import light_model, too_large

    return light_model(proto) if too_large(proto) else proto


def _recheck_without_ort_ops(proto: onnx.ModelProto, error: Exception) -> Exception | None:
    """The checker's complaint about ``proto`` once the ops ONNX Runtime registers in the default
    domain and the importer handles (``ORT_DEFAULT_DOMAIN_OPS``, e.g. the GenAI builder's
    ``SimplifiedLayerNormalization``) are forgiven; None when nothing else is wrong.

    When ``error`` is "No Op registered for" one of them, the model is checked again with those
    nodes moved to ``com.microsoft`` for the check only (restored after), so every other rule
    still applies; otherwise ``error`` itself is returned."""
    if "No Op registered for" not in str(error):
        return error
    moved = [
        n for n in proto.graph.node if n.domain in _DEFAULT_DOMAINS and n.op_type in ORT_DEFAULT_DOMAIN_OPS
    ]
    if not moved:
        return error
    added = None
    if not any(o.domain == "com.microsoft" for o in proto.opset_import):
        added = proto.opset_import.add(domain="com.microsoft", version=1)
    try:
        for n in moved:
            n.domain = "com.microsoft"
        onnx.checker.check_model(_checkable(proto))
        return None
    except Exception as e:  # another problem (or a model too large to check in memory)
        return e
    finally:
        for n in moved:
            n.domain = ""
        if added is not None:
            proto.opset_import.remove(added)


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _load(model) -> tuple[onnx.ModelProto, str, str]:
    if isinstance(model, onnx.ModelProto):
        if any(
            d.dim_param.isdigit()
            for vi in [*model.graph.input, *model.graph.output, *model.graph.value_info]
            for d in vi.type.tensor_type.shape.dim
        ):  # the caller's proto stays as given
            copy = onnx.ModelProto()
            copy.CopyFrom(model)
            fix_numeric_dims(copy.graph)
            model = copy
        return model, f"model '{model.graph.name or 'model'}'", model.graph.name or "model"
    path = Path(model)
    if not path.is_file():
        raise InputError(f"{path}: no such ONNX file")
    try:
        proto = onnx.load(str(path))  # external data resolves relative to the model's folder
    except Exception as e:  # protobuf DecodeError, missing external data, ...
        raise InputError(
            f"{path}: cannot read ONNX model (truncated or not ONNX?): {_first_line(e)}"
        ) from None
    if not proto.graph.node and not proto.graph.output:
        raise InputError(f"{path}: cannot read ONNX model: the file holds no graph (truncated or not ONNX?)")
    fix_numeric_dims(proto.graph)
    return proto, str(path), path.stem


def default_opset(proto: onnx.ModelProto, label: str) -> int:
    """The default-domain opset; UnsupportedError outside 13–28."""
    versions = [o.version for o in proto.opset_import if o.domain in _DEFAULT_DOMAINS]
    if not versions:
        raise InputError(f"{label}: the model imports no default-domain (ai.onnx) opset")
    opset = versions[0]
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise UnsupportedError(
            f"{label}: ONNX opset {opset} is not supported (supported: {MIN_OPSET} to {MAX_OPSET}); "
            "convert it with onnx.version_converter.convert_version(model, 17)"
        )
    return opset


def _to_const(arr: np.ndarray) -> np.ndarray:
    """An ONNX tensor as an import-time constant (float64 → f32, documented as a rounding)."""
    if arr.dtype == np.float64:
        return arr.astype(np.float32)
    dtype_from_numpy(arr.dtype)  # ValueError for dtypes the IR lacks
    return arr


class _Importer:
    """Walks the graph once in order; also the ``ctx`` every handler receives."""

    def __init__(self, graph, label, name, opset, bound, inferred):
        self.graph, self.label, self.opset = graph, label, opset
        self.bound, self.inferred = bound, inferred
        self.module = Module(name)
        self.env: dict[str, np.ndarray | Value] = {}
        self._consts: dict[int, tuple[np.ndarray, Value]] = {}
        self.node: onnx.NodeProto | None = None
        self.loc: str | None = None
        self.attrs: dict = {}
        self._notes: dict[str, list[str]] = {}  # note -> the nodes it is about (``note``)
        self.zeros = ""  # the user's bindings holding a 0, for messages (``zero_bindings``)

    # -- driver -----------------------------------------------------------------------------
    def run(self) -> Module:
        inputs = _graph_inputs(self.graph)
        types = [TensorType(self.bound[i.name], onnx_dtype(i.type.tensor_type.elem_type)) for i in inputs]
        self.func = Function("main", types, [i.name for i in inputs])
        self.module.add_function(self.func)
        for init in self.graph.initializer:
            self.env[init.name] = self._tensor(init, f"initializer '{init.name}'")
        for arg in self.func.args:
            if arg.type.numel == 0:  # no data: a constant known at import (see ``_emit_empty``)
                self.env[arg.name] = np.empty(arg.type.shape, arg.type.dtype.np_dtype)
            elif arg.type.dtype == I64:  # i64 only at the boundary: indices are i32 inside
                self.func.append(CastOp([arg], {"to": I32}, loc=arg.name))
                self.env[arg.name] = self.func.ops[-1].result
            else:
                self.env[arg.name] = arg
        for index, node in enumerate(self.graph.node):
            self._convert(node, index)
        self._return()
        if self._notes:
            self.module.attrs["import_notes"] = [
                f"{text} ({len(locs)} node{'s' if len(locs) > 1 else ''}, first '{locs[0]}')"
                for text, locs in self._notes.items()
            ]
        try:
            self.module.verify()
        except McpcError as e:
            raise ImporterBug(f"{self.label}: internal error: the imported IR does not verify: {e}") from None
        return self.module

    def _convert(self, node: onnx.NodeProto, index: int) -> None:
        self.node, self.loc = node, node.name or f"{node.op_type}_{index}"
        self.attrs = _attrs(node)
        ins = []
        for name in node.input:
            if name == "":
                ins.append(None)
            elif name not in self.env:
                raise InputError(f"{self.where()}: uses '{name}', which no earlier node defines")
            else:
                ins.append(self.env[name])
        default = node.domain in _DEFAULT_DOMAINS
        try:
            outs = (HANDLERS[node.op_type] if default else DOMAIN_HANDLERS[node.domain, node.op_type])(
                self, ins
            )
        except MemoryError:
            raise DoesNotFit(
                f"{self.where()}: evaluating it at import needs more host memory than there is (with "
                f"inputs bound as {self.bindings()}); bind smaller dims (--dim NAME=N, --shape INPUT=AxB)"
            ) from None
        except ValueError as e:
            # shape arithmetic in a handler (broadcast, axis) rejects this node under the bound dims:
            # e.g. a sequence longer than the model's position table; the user's input, not our bug
            raise InputError(f"{self.where()}: {e} (with inputs bound as {self.bindings()})") from None
        for name, term in zip(node.output, outs, strict=False):
            if name:
                self.env[name] = term
                self._cross_check(name, term)

    def _cross_check(self, name: str, term) -> None:
        theirs = self.inferred.get(name)
        if theirs is None:
            return
        ours = self.shape(term)
        if len(theirs) != len(ours) or any(
            t is not None and t != o for t, o in zip(theirs, ours, strict=False)
        ):
            raise ImporterBug(
                f"{self.where()}: internal error: output '{name}' has shape {list(ours)} in the IR but "
                f"ONNX infers {['?' if t is None else t for t in theirs]} (an importer bug)"
            )

    def _return(self) -> None:
        args = {a.name: a for a in self.func.args}
        values = []
        for out in self.graph.output:
            declared = onnx_dtype(out.type.tensor_type.elem_type)
            if out.name in args:  # an output that is an input: return the argument itself
                values.append(args[out.name])
                continue
            if out.name not in self.env:
                raise InputError(f"{self.label}: graph output '{out.name}' is never computed")
            self.node, self.loc = None, out.name
            term = self.env[out.name]
            if isinstance(term, np.ndarray) and term.size == 0:  # no data: a literal of its type
                term = np.empty(term.shape, declared.np_dtype)
                values.append(self.func.append(ConstantOp([], {"value": term}, loc=out.name)).result)
                continue
            v = self.value(term)
            if v.type.dtype != declared:
                if not (declared == I64 and v.type.dtype == I32):
                    raise ImporterBug(
                        f"{self.label}: internal error: output '{out.name}' is {v.type} "
                        f"but declared {declared}"
                    )
                v = self.func.append(CastOp([v], {"to": I64}, loc=out.name)).result
            values.append(v)
        if self.zeros and values and all(v.type.numel == 0 for v in values):
            self._refuse_all_empty(values)
        self.func.result_names = [o.name for o in self.graph.output]
        self.func.append(ReturnOp(values))

    def _refuse_all_empty(self, values) -> None:
        """UsageError: the user's 0 bindings make every output empty.  ONNX Runtime would return
        empty arrays, but such a program computes nothing — no work to place, time or measure —
        and a 0 that empties every output is a slip (``--dim seq=0``), so no program is built.  A
        model whose own fixed shapes give only empty outputs is imported as ONNX defines it."""
        shapes = ["x".join(map(str, v.type.shape)) for v in values]
        outs = ", ".join(f"{o.name} {s}" for o, s in zip(self.graph.output, shapes, strict=True))
        raise UsageError(
            f"{self.label}: {self.zeros} makes every output empty ({outs}): there is nothing to compute "
            "(ONNX Runtime returns empty outputs), so no program is built; bind the dims that "
            f"are 0 to at least 1 (0 fits a prefill's empty past); {_model_dims(self.graph)}"
        )

    # -- the handler API -------------------------------------------------------------------
    def where(self) -> str:
        if self.node is None:
            return f"{self.label}: output '{self.loc}'"
        return f"{self.label}: node '{self.loc}' (op_type {self.node.op_type}, opset {self.opset})"

    def note(self, text: str) -> None:
        """Record how the current node is imported where that differs from ONNX Runtime's numerics
        (one line per distinct ``text``, with the nodes it concerns): the module's
        ``import_notes`` attribute, printed in the compile summary."""
        self._notes.setdefault(text, []).append(self.loc or "?")

    def unsupported(self, why: str) -> UnsupportedError:
        return UnsupportedError(f"{self.where()}: {why}")

    def attr(self, key: str, default=None):
        return self.attrs.get(key, default)

    @staticmethod
    def shape(term) -> tuple[int, ...]:
        return tuple(term.shape) if isinstance(term, np.ndarray) else term.type.shape

    @staticmethod
    def dtype(term) -> DType:
        return dtype_from_numpy(term.dtype) if isinstance(term, np.ndarray) else term.type.dtype

    def const(self, term, what: str) -> np.ndarray:
        """``term`` as a numpy array; UnsupportedError when it is only known at run time."""
        if isinstance(term, np.ndarray):
            return term
        raise self.unsupported(f"{what} must be a constant (computable at import), but it depends on inputs")

    def ints(self, term, what: str) -> list[int]:
        return [int(x) for x in self.const(term, what).reshape(-1)]

    def emit(self, cls: type[Operation], operands, attrs: dict | None = None, fold: bool = True):
        """Apply IR op ``cls``: evaluated now when every operand is a constant (and the result does
        not grow constant storage past ``IMPORT_FOLD_MAX_ELEMENTS``) unless ``fold`` is false, else
        appended to ``main``.  Returns the one result (array or Value), or a list when the op has
        several."""
        attrs = dict(attrs or {})
        operands = self._align_empty(operands)
        run_time = any(isinstance(t, Value) for t in operands)
        if run_time:  # as the op will be built: int64 constants and attributes become i32
            attrs = {k: (I32 if isinstance(v, DType) and v == I64 else v) for k, v in attrs.items()}
        probe = self._make(cls, [self._probe(t, run_time) for t in operands], attrs)  # result types
        pure = probe.results and not getattr(probe, "STATEFUL", False)  # not a store, a register read
        if pure and (
            any(0 in self.shape(t) for t in operands) or any(r.type.numel == 0 for r in probe.results)
        ):
            empty = self._emit_empty(probe, operands)
            if empty is not None:
                return empty
        if fold and all(isinstance(t, np.ndarray) for t in operands):
            budget = max(IMPORT_FOLD_MAX_ELEMENTS, sum(t.size for t in operands))
            if sum(r.type.numel for r in probe.results) <= budget:
                return self._evaluate(probe, operands)
        op = self.func.append(self._make(cls, [self.value(t) for t in operands], attrs))
        return op.results[0] if len(op.results) == 1 else list(op.results)

    def _emit_empty(self, probe: Operation, operands):
        """``emit`` where an operand or a result has no elements (``probe``: the op built on
        stand-ins of ``operands``); None when ``emit`` goes on as usual.

        A tensor with zero elements carries no data, so it is an import-time constant
        (``np.empty`` of its shape and dtype) and never reaches the IR: a result with a 0 dim is
        returned as one.  An op that reads an empty operand but has a non-empty result takes ONNX's
        semantics: a Concat drops its empty operands (one left is the result itself); with every
        operand a constant (MatMul with K = 0, a reduction over an empty axis) the interpreter
        evaluates it whatever its size (zeros, the reduction's identity).  Anything else would read
        an empty tensor to compute from run-time values, which ONNX does not define (a Gather into
        an empty axis): refused naming the node.
        """
        if all(r.type.numel == 0 for r in probe.results):
            out = [np.empty(r.type.shape, r.type.dtype.np_dtype) for r in probe.results]
            return out[0] if len(out) == 1 else out
        if not any(0 in self.shape(t) for t in operands):
            return None  # results partly empty from non-empty operands: no op of the IR does that
        if isinstance(probe, ConcatOp):
            kept = [t for t in operands if 0 not in self.shape(t)]
            return kept[0] if len(kept) == 1 else self.emit(ConcatOp, kept, dict(probe.attrs))
        if all(isinstance(t, np.ndarray) for t in operands):
            return self._evaluate(probe, operands)
        empty = next(i for i, t in enumerate(operands) if 0 in self.shape(t))
        raise InputError(
            f"{self.where()}: operand #{empty} of {probe.name} is empty (shape "
            f"{list(self.shape(operands[empty]))}) but its result {probe.results[0].type} would be "
            "computed from it with run-time values, which ONNX does not define (e.g. indices into an "
            f"empty axis); inputs bound as {self.bindings()}"
        )

    def _probe(self, term, run_time: bool) -> Value:
        """A stand-in value of ``term``'s type, for inferring result types (attached to nothing);
        with ``run_time`` an int64 constant stands as the i32 ``value`` makes of it."""
        dtype = self.dtype(term)
        return Value(TensorType(self.shape(term), I32 if run_time and dtype == I64 else dtype))

    def _align_empty(self, operands) -> list:
        """``operands`` with each empty integer constant in the index type of the others: inside the
        IR, int64 is i32 (``value``), so an empty result of an op on run-time indices is i32 while
        import-time constants are int64; an empty tensor converts freely (it holds no data)."""
        index = (np.dtype(np.int32), np.dtype(np.int64))
        full = [self.dtype(t).np_dtype for t in operands if 0 not in self.shape(t)]
        want = next((d for d in full if d in index), None)
        if want is None:
            return list(operands)
        return [
            np.empty(t.shape, want)
            if isinstance(t, np.ndarray) and t.size == 0 and t.dtype in index and t.dtype != want
            else t
            for t in operands
        ]

    def _evaluate(self, op: Operation, operands) -> np.ndarray | list[np.ndarray]:
        """``op`` (built on probes) evaluated at import on constant ``operands``."""
        try:
            out = [np.asarray(r) for r in evaluate_op(op, list(operands))]
        except (ValueError, IndexError, TypeError) as e:
            raise InputError(f"{self.where()}: evaluating {op.name} on constants failed: {e}") from None
        except InputError as e:  # a data fault ONNX leaves undefined (a gather index out of range)
            raise InputError(f"{self.where()}: {e} (inputs bound as {self.bindings()})") from None
        return out[0] if len(out) == 1 else out

    def _make(self, cls, values, attrs) -> Operation:
        try:
            return cls(values, attrs, loc=self.loc)
        except (ValueError, TypeError, KeyError) as e:
            # usually the bound dims (a sequence longer than a position table): name them
            raise InputError(
                f"{self.where()}: cannot be expressed as {cls.name}: {e} (with inputs bound as "
                f"{self.bindings()})"
            ) from None

    def bindings(self) -> str:
        """The bound input shapes as the user gave them, ``name=1x128, ...``."""
        return ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in self.bound.items())

    def value(self, term) -> Value:
        """``term`` as an IR value: constants become (cached) ``mcp.constant`` ops; int64 → i32."""
        if isinstance(term, Value):
            return term
        cached = self._consts.get(id(term))
        if cached is not None:
            return cached[1]
        arr = term
        if arr.dtype == np.int64:
            if arr.size and (arr.min() < np.iinfo(np.int32).min or arr.max() > np.iinfo(np.int32).max):
                raise self.unsupported("an int64 constant that does not fit in i32 is used at run time")
            arr = arr.astype(np.int32)
        v = self.func.append(ConstantOp([], {"value": np.array(arr, order="C")}, loc=self.loc)).result
        self._consts[id(term)] = (term, v)  # keeps ``term`` alive so its id stays unique
        return v

    def _tensor(self, proto: onnx.TensorProto, what: str) -> np.ndarray:
        try:
            arr = numpy_helper.to_array(proto)
        except KeyError:
            raise InputError(f"{self.label}: {what}: unknown ONNX element type {proto.data_type}") from None
        except (ValueError, TypeError) as e:  # data that does not fill its dims, bad external data
            raise InputError(f"{self.label}: {what}: malformed tensor data: {_first_line(e)}") from None
        try:
            return _to_const(arr)
        except (ValueError, TypeError) as e:
            raise UnsupportedError(f"{self.label}: {what}: unsupported tensor: {e}") from None

    def tensor(self, proto: onnx.TensorProto, what: str) -> np.ndarray:
        return self._tensor(proto, f"{self.where()}: {what}")
