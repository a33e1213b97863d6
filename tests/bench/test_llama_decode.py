"""bench/llama_decode.py on a tiny Llama-family shape: the graph is a valid one-token decode step,
its roofline counts exactly the bytes the step must move, and the simulator's run is measured
against it."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from llama_decode import LlamaConfig, llama_decode_step, measure, roofline_bytes  # noqa: E402

TINY = LlamaConfig(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, ffn=96, vocab=128, max_pos=64)


def test_decode_graph_and_roofline_bytes():
    model = llama_decode_step(TINY)
    onnx.checker.check_model(model)
    names = [i.name for i in model.graph.input]
    assert names[:2] == ["input_ids", "position_ids"] and "past_value_1" in names
    assert [o.name for o in model.graph.output][:2] == ["logits", "present_key_0"]
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    # read per step: every projection and norm weight, one embedding row, one cos and one sin row
    read = sum(w.nbytes for n, w in weights.items() if n.endswith(("_proj", ".weight", "lm_head")))
    read -= weights["embed.weight"].nbytes - weights["embed.weight"][0].nbytes
    read += weights["rope.cos"][0].nbytes + weights["rope.sin"][0].nbytes
    roof = roofline_bytes(TINY, past=16)
    assert roof["weights"] == read
    kv_row = TINY.kv_heads * TINY.head_dim * 2
    assert roof["kv_read"] == 2 * 2 * 16 * kv_row and roof["kv_write"] == 2 * 2 * 17 * kv_row


def test_measure_runs_the_step_against_its_roofline(tmp_path):
    r = measure(TINY, past=16, target="mcp2026-a100", workdir=str(tmp_path))
    assert r["finite"] and r["cycles"] > 0
    assert r["ratio"] == r["cycles"] / r["roofline_cycles"]
    # it moves at least the roofline's bytes (plus the activations between kernels)
    assert r["dram_bytes"] >= r["roofline_bytes"]
    assert np.isclose(r["roofline_cycles"], r["roofline_bytes"] / 1555e9 * 1410e6)


def test_w4a16_decode_step_compiles_to_quantized_instructions(tmp_path):
    """weight_bits=4: every projection, the LM head and the embedding are int4 (opset-21 blocked
    DequantizeLinear); the step compiles to matmul_w4a16 / vdequant, stores the packed codes and
    matches ONNX Runtime on the same int4 model."""
    from dataclasses import replace

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
    from e2e_util import compile_and_run, norm_max_err

    cfg = replace(TINY, weight_bits=4)
    model = llama_decode_step(cfg)
    onnx.checker.check_model(model)
    rng = np.random.default_rng(0)
    inputs = {"input_ids": np.array([[5]], np.int64), "position_ids": np.array([[16]], np.int64)}
    for li in range(cfg.layers):
        for kind in ("key", "value"):
            inputs[f"past_{kind}_{li}"] = rng.standard_normal((1, 2, 16, 16)).astype(np.float16)
    sim, _, ref, result = compile_and_run(tmp_path, model, inputs, qat_config="fp16.yaml", dims={"past": 16})
    names = [op.name for op in result.module.main.ops]
    assert names.count("mcp.matmul_w4a16") == 7 * cfg.layers + 1 and names.count("mcp.dequantize") == 1
    assert norm_max_err(sim["logits"].astype(np.float32), ref["logits"].astype(np.float32)) < 1e-2
    f16 = compile_and_run(tmp_path, llama_decode_step(TINY), inputs, qat_config="fp16.yaml",
                          dims={"past": 16}, name="f16")[3]  # fmt: skip
    assert result.program.constants and len(result.program.constants) < 0.45 * len(f16.program.constants)
