"""``mcpc check --per-node``: every ONNX node output the program stores, scored against ONNX
Runtime in graph order; a build with one weight negated is caught at the kernel of the matmul that
reads that weight, and not before."""

from __future__ import annotations

import json

import onnx
import pytest
from click.testing import CliRunner

from mcpc import driver
from mcpc.cli import cli
from mcpc.fileio import read_npz
from mcpc.per_node import per_node


@pytest.fixture(scope="module")
def builds(examples_dir, tmp_path_factory):
    """encoder_block compiled fp32 and fp16, and fp32 from a copy with its largest weight negated:
    ``(model path, inputs path, {name: program path}, the negated weight's name)``."""
    from conftest import _negate_largest_weight

    out = tmp_path_factory.mktemp("per_node")
    model = examples_dir / "encoder_block.onnx"
    broken = onnx.load(str(model))
    changed = _negate_largest_weight(broken)
    onnx.save(broken, str(out / "broken.onnx"))
    progs = {}
    for name, src, config in (
        ("fp32", model, "fp32"),
        ("fp16", model, "fp16"),
        ("broken", out / "broken.onnx", "fp32"),
    ):
        progs[name] = out / f"{name}.mcpb"
        # every node output stored (kept in SRAM, intermediates would have no DRAM value to compare)
        passes = (
            "fold-constants,dce," if config == "fp32" else "fold-constants,convert-precision{dtype=f16},dce,"
        )
        passes += "tile-matmul,npu-schedule{keep-in-sram=false}"
        driver.compile(str(src), qat_config=config, passes=passes, output=progs[name])
    return model, examples_dir / "encoder_block.npz", progs, changed.split("[")[0]


@pytest.mark.parametrize("build", ["fp32", "fp16"])
def test_a_faithful_build_passes_at_every_node(builds, build):
    model, inputs, progs, _ = builds
    report = per_node(model, progs[build], read_npz(inputs))
    assert report["first_bad"] is None, report["nodes"][report["first_bad"] or 0]
    graph = [n.name for n in onnx.load(str(model), load_external_data=False).graph.node]
    order = [graph.index(r["node"]) for r in report["nodes"]]
    assert order == sorted(order) and len(order) >= 10  # graph order, most stored values compared
    assert {"ln1", "softmax", "residual1", "ln2"} <= {r["node"] for r in report["nodes"]}
    assert {r["dtype"] for r in report["nodes"] if r["op_type"] == "Softmax"} == {
        "float32" if build == "fp32" else "float16"
    }
    reasons = {s["reason"] for s in report["not_compared"]}
    # e.g. the matmuls whose epilogue (bias, activation) is fused into their kernel
    assert "no store writes it (a fused kernel keeps it in SRAM)" in reasons
    skipped = {s["tensor"] for s in report["not_compared"]}
    assert not skipped & {r["tensor"] for r in report["nodes"]}


def test_a_negated_weight_is_found_at_its_matmul(builds):
    model, inputs, progs, weight = builds
    report = per_node(model, progs["broken"], read_npz(inputs))
    first = report["nodes"][report["first_bad"]]
    graph = onnx.load(str(model), load_external_data=False).graph
    readers = {n.name for n in graph.node if weight in n.input}
    assert first["kernel"] in readers, (weight, first)  # the kernel of the matmul reading the weight
    assert all(r["passed"] for r in report["nodes"][: report["first_bad"]])


def test_cli_per_node_table_and_json(builds, tmp_path):
    model, inputs, progs, weight = builds
    out = tmp_path / "r.json"
    res = CliRunner().invoke(cli, ["check", str(model), str(progs["broken"]), "--inputs", str(inputs),
                                   "--per-node", "--json", str(out)])  # fmt: skip
    assert res.exit_code == 1, res.output  # the outputs decide the exit status, as without --per-node
    report = json.loads(out.read_text())["per_node"]
    first = report["nodes"][report["first_bad"]]
    assert f"first node outside the budget: {first['node']} ({first['op_type']})" in res.output
    assert f"stored by the kernel of {first['kernel']}" in res.output
    assert "FIRST FAIL" in res.output and "node outputs compared" in res.output
    ok = CliRunner().invoke(
        cli, ["check", str(model), str(progs["fp32"]), "--inputs", str(inputs), "--per-node"]
    )
    assert ok.exit_code == 0, ok.output
    assert "every compared node output is within the budget" in ok.output
