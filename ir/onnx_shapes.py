"""Shapes at ONNX import: binding the graph inputs' symbolic dims, and ONNX's own shape inference.

``bind_input_shapes`` turns ``--shape``/``--dim`` bindings into a static shape per real graph input
(InputError naming every dim still symbolic with the ``--dim`` line; UsageError, listing the model's
dims, for a wrong binding).  ``input_dims``, ``dim_line`` and ``may_be_empty`` (the KV-cache hint
for a 0) serve ``mcpc inspect-model`` too.  ``_onnx_shapes`` runs ONNX's shape inference on the
bound model, which the importer uses to cross-check its own inference.  ``mcpc.ir.onnx_import``
re-exports these names.
"""

from __future__ import annotations

import ast
import shlex

import onnx

from mcpc.errors import InputError, UnsupportedError, UsageError
from mcpc.ir.onnx_large import light_model

_SHAPE_DATA_MAX_ELEMENTS = 4096  # initializers this small are kept for ONNX's data propagation


def _graph_inputs(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    """Graph inputs that are real inputs (initializers listed as inputs are constants)."""
    inits = {t.name for t in graph.initializer}
    return [i for i in graph.input if i.name not in inits]


def fix_numeric_dims(graph: onnx.GraphProto) -> int:
    """Turn, in place, every dim named by a decimal number (``"2"``: torch's dynamo exporter names
    the fixed dims of inputs so, e.g. the heads of ``past_key_values.*`` [s44, "2", s36, "16"]) of
    the graph's inputs, outputs and value infos into that fixed size; returns how many changed."""
    changed = 0
    for vi in [*graph.input, *graph.output, *graph.value_info]:
        if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
            continue
        for d in vi.type.tensor_type.shape.dim:
            if not d.HasField("dim_value") and d.dim_param.isdigit():
                d.dim_value = int(d.dim_param)  # clears dim_param (one-of)
                changed += 1
    return changed


def input_dims(graph: onnx.GraphProto) -> dict[str, list[tuple[str, int]]]:
    """Every symbolic dim param of the real inputs, in order of first use: name -> [(input, axis)]."""
    found: dict[str, list[tuple[str, int]]] = {}
    for inp in _graph_inputs(graph):
        if inp.type.HasField("tensor_type") and inp.type.tensor_type.HasField("shape"):
            for axis, d in enumerate(inp.type.tensor_type.shape.dim):
                if not d.HasField("dim_value") and d.dim_param:
                    found.setdefault(d.dim_param, []).append((inp.name, axis))
    return found


def dim_line(names, known: dict[str, int] | None = None) -> str:
    """The ready-to-paste ``--dim a=N --dim b=N`` for ``names`` (a bound size where ``known`` has
    one), each argument quoted for a POSIX shell where it needs it (a name with spaces or shell
    characters: ``--dim 'a + b=N'``)."""
    known = known or {}
    return " ".join("--dim " + shlex.quote(f"{n}={known.get(n, 'N')}") for n in names)


# -- dims named by an expression --------------------------------------------------------------
# Exporters name a dim computed from others by its expression: Optimum's attention_mask is
# [batch_size, "past_sequence_length + sequence_length"], the dynamo exporter's outputs "s0 + s70".
# Such a dim is derived from the names it reads once they are bound, not asked for.

_EXPR_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
             ast.FloorDiv: lambda a, b: a // b}  # fmt: skip


def dim_expression(param: str) -> ast.expr | None:
    """The parsed expression of a dim param that is one (names and integers joined by ``+ - *
    //``, parentheses, unary minus), None for a plain name or anything else (an opaque symbol)."""
    try:
        tree = ast.parse(param.strip(), mode="eval").body
    except (SyntaxError, ValueError):
        return None
    return tree if not isinstance(tree, ast.Name) and _arithmetic(tree) else None


def _arithmetic(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return True
    if isinstance(node, ast.Constant):
        return type(node.value) is int
    if isinstance(node, ast.UnaryOp):
        return isinstance(node.op, ast.USub) and _arithmetic(node.operand)
    if isinstance(node, ast.BinOp):
        return type(node.op) in _EXPR_OPS and _arithmetic(node.left) and _arithmetic(node.right)
    return False


def expression_names(tree: ast.expr) -> list[str]:
    """The names an expression reads, in order of first appearance."""
    return list(dict.fromkeys(n.id for n in ast.walk(tree) if isinstance(n, ast.Name)))


def _evaluate(tree: ast.expr, values: dict[str, int]) -> int:
    if isinstance(tree, ast.Constant):
        return int(tree.value)
    if isinstance(tree, ast.Name):
        return values[tree.id]
    if isinstance(tree, ast.UnaryOp):
        return -_evaluate(tree.operand, values)
    return _EXPR_OPS[type(tree.op)](_evaluate(tree.left, values), _evaluate(tree.right, values))


def binding_names(found: dict[str, list[tuple[str, int]]]) -> list[str]:
    """The dims a user binds, given ``input_dims``: every plain name, and in place of a dim named
    by an expression the names it reads (the expression itself is derived from them)."""
    names: list[str] = []
    for param in found:
        tree = dim_expression(param)
        for n in expression_names(tree) if tree is not None else [param]:
            if n not in names:
                names.append(n)
    return names


def _canonical(name: str, params) -> str:
    """``name`` as the model spells it: a binding of an expression is matched whitespace aside
    (``--dim past_sequence_length+sequence_length=5``)."""
    if name in params:
        return name
    squeezed = "".join(name.split())
    return next((p for p in params if "".join(p.split()) == squeezed), name)


def derive_dims(found, learned: dict[str, int], usage) -> None:
    """Bind in ``learned`` (in place) each dim named by an expression of bound names, and a single
    unbound name of an expression bound itself when the name enters it with coefficient 1 (``a + b``
    bound with ``b``: a = value − b).  ``usage(text)`` makes the UsageError of an expression bound
    to another value than its names give."""
    exprs = {p: t for p in found if (t := dim_expression(p)) is not None}
    changed = True
    while changed:
        changed = False
        for param, tree in exprs.items():
            names = expression_names(tree)
            unknown = [n for n in names if n not in learned]
            if not unknown:
                try:
                    value = _evaluate(tree, learned)
                except ZeroDivisionError:
                    raise usage(f"dim '{param}' divides by 0 with {_given(names, learned)}") from None
                if value < 0:
                    raise usage(f"dim '{param}' is {value} < 0 with {_given(names, learned)}")
                if param not in learned:
                    learned[param] = value
                    changed = True
                elif learned[param] != value:
                    raise usage(
                        f"--dim '{param}={learned[param]}' disagrees with {_given(names, learned)}, "
                        f"which give {value}"
                    )
            elif len(unknown) == 1 and param in learned:
                (u,) = unknown
                try:
                    f = [_evaluate(tree, {**learned, u: x}) for x in (0, 1, 2)]
                except ZeroDivisionError:
                    continue
                if f[1] - f[0] == 1 and f[2] - f[1] == 1 and learned[param] - f[0] >= 0:
                    learned[u] = learned[param] - f[0]
                    changed = True


def _given(names, learned: dict[str, int]) -> str:
    return ", ".join(f"{n}={learned[n]}" for n in names)


def _model_dims(graph: onnx.GraphProto) -> str:
    """The model's symbolic dims for a usage error: ``batch (input_ids dim 0, ...), seq (...)``."""
    found = input_dims(graph)
    if not found:
        return "the model's inputs have no symbolic dims"
    uses = "; ".join(f"{n} ({', '.join(f'{i} dim {a}' for i, a in where)})" for n, where in found.items())
    text = f"the model's symbolic dims: {uses}"
    if any(dim_expression(p) is not None for p in found):
        text += f" (a dim named by an expression is derived: bind {dim_line(binding_names(found))})"
    return text


_SHAPE_ONLY = ("Shape", "Size")  # read an input's shape, never its elements
_PASS_THROUGH = ("Identity", "Cast")  # same shape as their input: look at their consumers instead


def _gqa_past(node: onnx.NodeProto, name: str, axis: int) -> bool:
    """``name`` is the past_key/past_value (inputs 3, 4) of a com.microsoft GroupQueryAttention and
    ``axis`` its sequence axis (2): an empty past is a first prompt, as the KV-cache Concat."""
    if node.op_type != "GroupQueryAttention" or node.domain != "com.microsoft" or axis != 2:
        return False
    return name in node.input[3:5]


def may_be_empty(graph: onnx.GraphProto, name: str, axis: int, rank: int) -> bool:
    """Whether 0 along ``axis`` of input ``name`` is the KV-cache pattern ``mcpc inspect-model``
    points out: every consumer (through Identity, Cast and one-input Concat, which pass the tensor
    on) only reads its shape (Shape, Size), is a Concat along ``axis`` with other inputs — a
    prefill's ``past_key`` of length 0 concatenated with the new keys — or is the past K/V of a
    GroupQueryAttention along its sequence axis.

    A hint only: import accepts a 0 for any dim (an empty tensor is a value like any other, see
    ``mcpc.ir.onnx_import``) and refuses only what ONNX leaves undefined.
    """
    consumers: dict[str, list[onnx.NodeProto]] = {}

    def collect(g: onnx.GraphProto) -> None:  # subgraphs (If, Loop) read outer names too
        for node in g.node:
            for i in node.input:
                consumers.setdefault(i, []).append(node)
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    collect(a.g)

    collect(graph)
    todo, seen = [name], set()
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for node in consumers.get(current, []):
            if node.op_type in _SHAPE_ONLY and node.domain in ("", "ai.onnx"):
                continue
            one_input = len([i for i in node.input if i]) == 1
            if node.domain in ("", "ai.onnx") and (
                node.op_type in _PASS_THROUGH or (node.op_type == "Concat" and one_input)
            ):
                todo.extend(o for o in node.output if o)
                continue
            if _gqa_past(node, current, axis):
                continue
            if node.op_type != "Concat" or node.domain not in ("", "ai.onnx"):
                return False
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            concat_axis = attrs.get("axis", 0)
            if (
                concat_axis + (rank if concat_axis < 0 else 0) != axis
                or len([i for i in node.input if i]) < 2
            ):
                return False
    return True


def bind_input_shapes(
    graph: onnx.GraphProto, label: str, shapes: dict[str, tuple[int, ...]], dims: dict[str, int]
) -> dict[str, tuple[int, ...]]:
    """Static shape of every real graph input after binding.

    A whole-input binding also teaches the dim params it covers (``shapes={"ids": (1, 128)}`` on
    ``ids: [batch, seq]`` binds ``seq=128`` for every other input).  Raises UsageError, listing
    the model's dims, for a binding that is wrong in itself: an unknown input or dim name, a
    negative size, a rank or fixed dim the model contradicts, or conflicting bindings (a 0 is a
    size like any other: the importer gives empty tensors ONNX's semantics).  Raises InputError
    naming every dim still symbolic after binding, with the ready-to-paste ``--dim`` line.
    """
    inputs = _graph_inputs(graph)
    names = [i.name for i in inputs]
    known = input_dims(graph)

    def usage(text: str) -> UsageError:
        return UsageError(f"{label}: {text}; {_model_dims(graph)}")

    bindable = set(known) | set(binding_names(known))
    dims = {_canonical(name, known): value for name, value in dims.items()}
    for name, value in dims.items():
        if name not in bindable:
            raise usage(f"--dim {name}={value}: the model has no input dim named '{name}'")
        if int(value) < 0:
            raise usage(f"--dim {name}={value}: a size must be >= 0")
    for name, value in shapes.items():
        text = f"--shape {name}={'x'.join(map(str, value))}"
        if name not in names:
            raise usage(f"{text}: '{name}' is not an input (inputs: {names})")
        if any(int(d) < 0 for d in value):
            raise usage(f"{text}: sizes must be >= 0")
    learned = {k: int(v) for k, v in dims.items()}
    for inp in inputs:
        if inp.name not in shapes:
            continue
        want = tuple(int(d) for d in shapes[inp.name])
        tt = inp.type.tensor_type
        if tt.HasField("shape"):
            text = f"--shape {inp.name}={'x'.join(map(str, want))}"
            if len(tt.shape.dim) != len(want):
                raise usage(f"{text} has rank {len(want)}, but the input has rank {len(tt.shape.dim)}")
            for pos, (d, w) in enumerate(zip(tt.shape.dim, want, strict=True)):
                if d.HasField("dim_value") and d.dim_value != w:
                    raise usage(f"{text}: dim {pos} is fixed to {d.dim_value} by the model, not {w}")
                if d.HasField("dim_param") and d.dim_param:
                    if learned.setdefault(d.dim_param, w) != w:
                        raise usage(
                            f"dim '{d.dim_param}' is bound to both {learned[d.dim_param]} and {w} "
                            f"(input '{inp.name}', dim {pos})"
                        )
    derive_dims(known, learned, usage)
    bound: dict[str, tuple[int, ...]] = {}
    unnamed: list[str] = []  # inputs with an unknown rank or an unnamed symbolic dim, and how to bind
    for inp in inputs:
        if inp.name in shapes:
            bound[inp.name] = tuple(int(d) for d in shapes[inp.name])
            continue
        if not inp.type.HasField("tensor_type"):
            raise UnsupportedError(
                f"{label}: input '{inp.name}' is not a tensor (sequences/maps are unsupported)"
            )
        tt = inp.type.tensor_type
        if not tt.HasField("shape"):
            unnamed.append(
                f"input '{inp.name}' has an unknown rank: bind it with --shape {inp.name}=1x128 (e.g.)"
            )
            continue
        shape = []
        for pos, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value"):
                shape.append(d.dim_value)
            elif d.dim_param in learned:
                shape.append(learned[d.dim_param])
            elif not d.dim_param:
                pattern = "x".join(_dim_hint(e, i == pos, learned) for i, e in enumerate(tt.shape.dim))
                what = f"input '{inp.name}' dim {pos} is symbolic (unnamed)"
                unnamed.append(f"{what}: bind it with --shape {inp.name}={pattern}")
        bound[inp.name] = tuple(shape)
    missing = {n: where for n, where in known.items() if n not in learned}
    if missing or unnamed:
        parts = []
        if missing:
            ask = [n for n in binding_names(missing) if n not in learned]
            uses = "; ".join(
                f"'{n}' ({', '.join(f'input {i!r} dim {a}' for i, a in known.get(n, []))})"
                if known.get(n)
                else f"'{n}'"
                for n in ask
            )
            parts.append(f"{len(ask)} symbolic dim(s) are unbound: {uses}; bind them with {dim_line(ask)}")
            derived = [f"'{n}'" for n in missing if dim_expression(n) is not None]
            if derived:
                parts[-1] += f" ({', '.join(derived)} follow from them)"
            first = next(i for i in inputs if i.name == next(iter(missing.values()))[0][0])
            if all(i == first.name for w in missing.values() for i, _ in w):  # one input holds them all
                hint = (
                    _dim_hint(d, d.dim_param in missing, learned) for d in first.type.tensor_type.shape.dim
                )
                parts[-1] += f" or --shape {first.name}=" + "x".join(hint)
        raise InputError(
            f"{label}: " + "; ".join(parts + unnamed) + " (mcpc inspect-model MODEL shows every input)"
        )
    return bound


def _dim_hint(d, is_this: bool, learned: dict[str, int]) -> str:
    """How one dim reads in a suggested ``--shape`` value: its size when known, N for one to
    choose, its param name (or ?) for other unknowns."""
    if d.HasField("dim_value"):
        return str(d.dim_value)
    if is_this:
        return "N"
    return str(learned.get(d.dim_param, d.dim_param or "?"))


def _onnx_shapes(
    proto: onnx.ModelProto, bound: dict[str, tuple[int, ...]], label: str = "model"
) -> dict[str, list[int | None]]:
    """ONNX's own shape inference on the bound model: name -> dims (None where unknown).

    Used as a cross-check of our inference; failures of ONNX inference are not fatal, except a
    type error ONNX's strict inference finds (an input of a type the op does not accept, an output
    declared with another element type than the graph computes): that model is not valid ONNX,
    and is refused as bad input naming the node (``_refuse_type_errors``).
    """
    # A light copy: small initializers (shape data for data_prop) are kept, large ones become typed
    # inputs, so weights are never copied (and multi-GB models stay under protobuf's 2 GB limit).
    # Exporter value_info is dropped: it may hold stale symbolic dims.
    m = light_model(proto, keep_elements=_SHAPE_DATA_MAX_ELEMENTS, value_info=False)
    for inp in m.graph.input:
        if inp.name in bound and inp.type.HasField("tensor_type"):
            shape = inp.type.tensor_type.shape
            del shape.dim[:]
            for d in bound[inp.name]:
                shape.dim.add().dim_value = d
    for out in m.graph.output:
        if out.type.HasField("tensor_type"):
            out.type.tensor_type.ClearField("shape")
    try:
        m = onnx.shape_inference.infer_shapes(m, strict_mode=True, data_prop=True)
    except onnx.shape_inference.InferenceError as e:
        if any(0 in shape for shape in bound.values()):
            _refuse_type_errors_without_zeros(m, label)
        else:
            _refuse_type_errors(str(e), label)
        try:
            m = onnx.shape_inference.infer_shapes(m, strict_mode=False, data_prop=True)
        except Exception:
            return {}
    except Exception:
        return {}
    found: dict[str, list[int | None]] = {}
    for vi in list(m.graph.value_info) + list(m.graph.output):
        tt = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and tt.HasField("shape"):
            found[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    return found


# Strict inference failures that mean the model itself is inconsistent (not that inference is
# incomplete, e.g. an op ONNX cannot infer): refused as bad input.
_TYPE_ERROR_MARKS = ("[TypeInferenceError]", "type mismatch", "elem type", "Type Error")


def _refuse_type_errors_without_zeros(m: onnx.ModelProto, label: str) -> None:
    """``_refuse_type_errors`` for a binding with a 0: ONNX's inference may fail on a node the 0
    leaves undefined (a Reshape copying a 0 dim the input lacks) and cascade into type errors, which
    say nothing of the model; so the model is judged with every bound 0 read as 1 (the importer
    then names the node the 0 breaks)."""
    probe = onnx.ModelProto()
    probe.CopyFrom(m)
    for inp in probe.graph.input:
        if inp.type.HasField("tensor_type"):
            for d in inp.type.tensor_type.shape.dim:
                if d.HasField("dim_value") and d.dim_value == 0:
                    d.dim_value = 1
    try:
        onnx.shape_inference.infer_shapes(probe, strict_mode=True, data_prop=True)
    except onnx.shape_inference.InferenceError as e:
        _refuse_type_errors(str(e), label)


def _refuse_type_errors(message: str, label: str) -> None:
    first = message.strip().splitlines()[0] if message.strip() else message
    if any(mark in message for mark in _TYPE_ERROR_MARKS):
        raise InputError(f"{label}: not a valid ONNX model: {first}")


def zero_bindings(shapes: dict[str, tuple[int, ...]], dims: dict[str, int]) -> str:
    """The user's bindings that hold a 0, as they were written (``--dim past_seq=0``, ``--shape
    ids=1x0``); "" when there is none."""
    given = [f"--dim {k}=0" for k, v in dims.items() if int(v) == 0]
    given += [f"--shape {k}={'x'.join(map(str, v))}" for k, v in shapes.items() if 0 in tuple(v)]
    return " ".join(given)
