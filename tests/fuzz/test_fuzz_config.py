"""Fuzzing the YAML doors: QAT configs and target descriptions, mutated from the shipped files
(keys deleted, values replaced by hostile scalars, lists, maps and deep nesting, unknown keys) and
as raw text (truncated, bytes flipped).  Each is accepted or refused with a ConfigError/InputError;
a target that is accepted must also compile a small model or refuse it as a user error."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import yaml
from fuzzlib import FUZZ, tiny_mlp, user_error_only
from hypothesis import given
from hypothesis import strategies as st

import mcpc
from mcpc.arch.target import load_target
from mcpc.qat_configs.schema import load_config, parse_config

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "qat_configs").glob("*.yaml"))
TARGETS = sorted((ROOT / "arch" / "targets").glob("*.yaml"))
CORPUS = Path(__file__).parent / "corpus" / "yaml"

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from([0, -1, 1, 2**31, 2**63, 10**30, -(10**30), 0.5, -0.0, math.inf, -math.inf, math.nan]),
    st.integers(),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.sampled_from(["f16", "f32", "i4", "fp8", "bf16", "fp16", "i64", "f8e4m3fn", "mcp2026-a100"]),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                      st.dictionaries(st.text(max_size=8), inner, max_size=3)), max_leaves=8)  # fmt: skip


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*prefix, i))


def _mutate(doc, data):
    """One structural mutation of a parsed YAML document; returns the new document."""
    paths = [p for p in _paths(doc) if p]
    if not paths:
        return data.draw(values)
    path = data.draw(st.sampled_from(paths))
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    kind = data.draw(st.sampled_from(["replace", "delete", "add", "wrap"]))
    if kind == "replace":
        parent[path[-1]] = data.draw(values)
    elif kind == "delete":
        del parent[path[-1]]
    elif kind == "add" and isinstance(parent, dict):
        parent[data.draw(st.sampled_from(["bogus", "mac", "sram", "check", "precision", "size_bytes"]))] = (
            data.draw(values)
        )
    elif kind == "wrap":
        parent[path[-1]] = {"x": parent[path[-1]]} if data.draw(st.booleans()) else [parent[path[-1]]]
    return doc


def _text(data, source: Path) -> str:
    doc = copy.deepcopy(yaml.safe_load(source.read_text()))
    for _ in range(data.draw(st.integers(1, 3))):
        doc = _mutate(doc, data)
    text = yaml.safe_dump(doc, sort_keys=False)
    how = data.draw(st.sampled_from(["as is", "as is", "truncate", "flip"]))
    if how == "truncate":
        text = text[: data.draw(st.integers(0, max(len(text) - 1, 0)))]
    elif how == "flip" and text:
        pos = data.draw(st.integers(0, len(text) - 1))
        text = (
            text[:pos]
            + data.draw(st.sampled_from(["\t", ":", "{", "&a", "*a", "\x00", "'", "!!python"]))
            + (text[pos + 1 :])
        )
    return text


@FUZZ
@given(data=st.data(), source=st.sampled_from(CONFIGS))
def test_mutated_qat_configs_are_accepted_or_refused(data, source):
    text = _text(data, source)
    with user_error_only(f"QAT config mutated from {source.name}:\n{text}"):
        parse_config(text, f"fuzzed-{source.name}")


@FUZZ
@given(data=st.data(), source=st.sampled_from(TARGETS))
def test_mutated_targets_are_refused_or_compile(tmp_path_factory, data, source):
    text = _text(data, source)
    path = tmp_path_factory.mktemp("target") / "t.yaml"
    path.write_text(text)
    with user_error_only(f"target mutated from {source.name}:\n{text}"):
        target = load_target(str(path))
        model = tmp_path_factory.mktemp("m") / "mlp.onnx"
        model.write_bytes(tiny_mlp().SerializeToString())
        mcpc.compile(
            str(model), target=target if not isinstance(target, str) else str(path), dims={"batch": 2}
        )


@pytest.mark.parametrize("path", sorted(CORPUS.glob("*.yaml")), ids=lambda p: p.name)
def test_corpus(path):
    """Files that once broke a YAML door stay refused as user errors."""
    with user_error_only(str(path)):
        if path.name.startswith("target"):
            load_target(str(path))
        else:
            load_config(path)
