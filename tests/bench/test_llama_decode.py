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
