"""Fuzzing the ONNX door: mutated graphs (wrong ranks, negative and huge dims, cycles, dangling
inputs, bad attributes and initializers, unknown opsets, truncated or corrupted protobufs) and bad
``--dim`` bindings.  Every one compiles or is refused as a user error (see fuzzlib)."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from fuzzlib import FUZZ, SEED_MODELS, user_error_only
from hypothesis import given
from hypothesis import strategies as st

import mcpc

CORPUS = Path(__file__).parent / "corpus" / "onnx"

HOSTILE_INTS = [-(2**63), -(2**31), -7, -1, 0, 1, 2, 3, 5, 16, 2**31 - 1, 2**31, 10**12, 2**63 - 1]
OPS = ["MatMul", "Add", "Relu", "Softmax", "Transpose", "Reshape", "Gather", "Concat", "Expand",
       "ReduceMean", "Cast", "Where", "Slice", "Split", "Gemm", "LayerNormalization", "NoSuchOp",
       ""]  # fmt: skip
ints = st.one_of(st.sampled_from(HOSTILE_INTS), st.integers(-(2**63), 2**63 - 1))


def _tensor_names(model: onnx.ModelProto) -> list[str]:
    g = model.graph
    names = [v.name for v in g.input] + [t.name for t in g.initializer]
    for n in g.node:
        names += list(n.output)
    return names or ["x"]


def _mutate(model: onnx.ModelProto, data) -> None:
    """Apply one mutation drawn from ``data`` to ``model`` in place."""
    g = model.graph
    kind = data.draw(st.sampled_from(["dim", "rank", "elem", "input", "output", "delete", "op", "attr",
                                      "init", "opset", "graph_io"]), label="kind")  # fmt: skip
    values = list(g.input) + list(g.output)
    if kind == "dim" and values:
        v = data.draw(st.sampled_from(values))
        dims = v.type.tensor_type.shape.dim
        if dims:
            d = dims[data.draw(st.integers(0, len(dims) - 1))]
            if data.draw(st.booleans()):
                d.dim_value = data.draw(st.sampled_from(HOSTILE_INTS[4:]))  # protobuf: >= 0 by use
            else:
                d.dim_param = data.draw(st.sampled_from(["batch", "seq", "", "x y", "9", "n" * 300]))
    elif kind == "rank" and values:
        dims = data.draw(st.sampled_from(values)).type.tensor_type.shape.dim
        if dims and data.draw(st.booleans()):
            del dims[data.draw(st.integers(0, len(dims) - 1))]
        else:
            dims.add().dim_value = data.draw(st.sampled_from([0, 1, 2, 7]))
    elif kind == "elem" and values:
        data.draw(st.sampled_from(values)).type.tensor_type.elem_type = data.draw(st.integers(0, 30))
    elif kind == "input" and g.node:
        node = data.draw(st.sampled_from(list(g.node)))
        if node.input:
            i = data.draw(st.integers(0, len(node.input) - 1))
            node.input[i] = data.draw(st.sampled_from(_tensor_names(model) + ["", "dangling"]))
    elif kind == "output" and g.node:
        node = data.draw(st.sampled_from(list(g.node)))
        if node.output:
            i = data.draw(st.integers(0, len(node.output) - 1))
            node.output[i] = data.draw(st.sampled_from(_tensor_names(model) + ["", "fresh"]))
    elif kind == "delete" and g.node:
        del g.node[data.draw(st.integers(0, len(g.node) - 1))]
    elif kind == "op" and g.node:
        data.draw(st.sampled_from(list(g.node))).op_type = data.draw(st.sampled_from(OPS))
    elif kind == "attr" and g.node:
        node = data.draw(st.sampled_from(list(g.node)))
        name = data.draw(st.sampled_from(["axis", "perm", "transB", "keepdims", "to", "epsilon"]))
        for a in list(node.attribute):
            if a.name == name:
                node.attribute.remove(a)
        if data.draw(st.booleans()):
            attr = onnx.helper.make_attribute(name, data.draw(st.lists(ints, min_size=1, max_size=5)))
        else:
            attr = onnx.helper.make_attribute(name, data.draw(ints))
        node.attribute.append(attr)
    elif kind == "init" and g.initializer:
        t = data.draw(st.sampled_from(list(g.initializer)))
        what = data.draw(st.sampled_from(["dims", "type", "truncate"]))
        if what == "dims":
            t.dims[:] = data.draw(st.lists(st.sampled_from(HOSTILE_INTS[3:]), max_size=4))
        elif what == "type":
            t.data_type = data.draw(st.integers(0, 30))
        elif t.raw_data:
            t.raw_data = t.raw_data[: data.draw(st.integers(0, len(t.raw_data) - 1))]
    elif kind == "opset":
        model.opset_import[0].version = data.draw(st.integers(-1, 40))
        if data.draw(st.booleans()):
            model.opset_import[0].domain = data.draw(st.sampled_from(["", "ai.onnx", "com.example"]))
    elif kind == "graph_io":
        if data.draw(st.booleans()) and g.output:
            g.output[0].name = data.draw(st.sampled_from(_tensor_names(model) + ["nowhere"]))
        elif g.input:
            del g.input[data.draw(st.integers(0, len(g.input) - 1))]


def _compile(path: Path, dims: dict, config: str) -> None:
    with user_error_only(f"compile {path.name} dims={dims} config={config}"):
        mcpc.compile(str(path), qat_config=config, dims=dims)


@pytest.mark.parametrize("seed", sorted(SEED_MODELS))
@FUZZ
@given(data=st.data())
def test_mutated_graphs_are_compiled_or_refused(tmp_path_factory, seed, data):
    build, dims = SEED_MODELS[seed]
    model = build()
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        _mutate(model, data)
    path = tmp_path_factory.mktemp("onnx") / "model.onnx"
    raw = model.SerializeToString()
    how = data.draw(st.sampled_from(["as is", "truncate", "flip"]), label="bytes")
    if how == "truncate":
        raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
    elif how == "flip":
        pos = data.draw(st.lists(st.integers(0, len(raw) - 1), min_size=1, max_size=8))
        buf = bytearray(raw)
        for p in pos:
            buf[p] ^= 1 << data.draw(st.integers(0, 7))
        raw = bytes(buf)
    path.write_bytes(raw)
    _compile(path, dims, data.draw(st.sampled_from(["fp32", "fp16"])))


@FUZZ
@given(
    name=st.sampled_from(["batch", "seq", "unknown", ""]),
    value=st.sampled_from(HOSTILE_INTS),
    seed=st.sampled_from(sorted(SEED_MODELS)),
)
def test_hostile_dim_bindings_are_refused_or_compiled(tmp_path_factory, name, value, seed):
    build, dims = SEED_MODELS[seed]
    path = tmp_path_factory.mktemp("dims") / f"{seed}.onnx"
    onnx.save(build(), path)
    _compile(path, {**dims, name: value}, "fp16")


@pytest.mark.parametrize("path", sorted(CORPUS.glob("*.onnx")), ids=lambda p: p.name)
def test_corpus(path):
    """Inputs that once broke the importer stay refused as user errors."""
    _compile(path, {"batch": 2, "seq": 4}, "fp16")
