"""``mcpc check --per-node`` on MiniLM-L3 (the real fixture): the fp16 build stays within its budget
at every stored node output (the attention mask's float32 minimum saturating to −65504 is not a
loss), and a build with its largest matmul weight negated is caught at the kernel of that matmul.
Slow: two compiles and per-node runs of the real model."""

from __future__ import annotations

import sys
from pathlib import Path

import onnx
import pytest

from mcpc import driver
from mcpc.per_node import per_node

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "real_models"))
from real_model import MINILM, dim_bindings, realistic_inputs  # noqa: E402

pytestmark = pytest.mark.slow


def _stored(config: str) -> str:
    """``config``'s pipeline with intermediates sent through DRAM (``keep-in-sram=false``): by default
    they stay in SRAM and only a few node outputs are ever stored, so few could be compared."""
    from mcpc.passes import format_pipeline

    text = format_pipeline(driver.resolve_passes(config, None))
    return text.replace("keep-in-sram=true", "keep-in-sram=false")


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    try:
        path = MINILM.path()
    except LookupError as e:
        pytest.fail(str(e), pytrace=False)
    model = onnx.load(str(path))
    return path, model, realistic_inputs(model, 2, 16), dim_bindings(model, 2, 16)


def test_fp16_build_passes_at_every_stored_node(minilm, tmp_path):
    path, _, inputs, dims = minilm
    prog = tmp_path / "fp16.mcpb"
    driver.compile(str(path), "mcp2026-edge", "fp16", dims=dims, output=prog, passes=_stored("fp16"))
    report = per_node(path, prog, inputs, mask="attention_mask")
    assert report["first_bad"] is None, report["nodes"][report["first_bad"] or 0]
    assert len(report["nodes"]) >= 60  # every layer's attention, feed-forward and norms
    ops = {r["op_type"] for r in report["nodes"]}
    assert {"LayerNormalization", "Softmax", "Erf", "Add"} <= ops


def test_negated_weight_found_at_its_matmul(minilm, tmp_path, negate_largest_weight):
    path, model, inputs, dims = minilm
    broken = onnx.ModelProto()
    broken.CopyFrom(model)
    weight = negate_largest_weight(broken).split("[")[0]
    src = tmp_path / "broken.onnx"
    onnx.save(broken, str(src))
    prog = tmp_path / "broken.mcpb"
    driver.compile(str(src), "mcp2026-edge", "fp32", dims=dims, output=prog, passes=_stored("fp32"))
    report = per_node(path, prog, inputs, mask="attention_mask")
    assert report["first_bad"] is not None
    first = report["nodes"][report["first_bad"]]
    readers = {n.name for n in model.graph.node if weight in n.input}
    transposed = {n.output[0] for n in model.graph.node if n.op_type == "Transpose" and weight in n.input}
    readers |= {n.name for n in model.graph.node if set(n.input) & transposed}
    assert first["kernel"] in readers, (weight, first["node"], first["kernel"])
