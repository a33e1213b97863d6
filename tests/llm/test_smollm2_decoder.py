"""SmolLM2-135M's decode-with-past graph as a decoder build (``mcp-compile --max-seq``): one fp32
program whose prefill and decode entries, run by a simulator ``Session`` over the paged cache,
give ONNX Runtime's own KV loop's 20 greedy tokens.  Slow (≈ 2.5 min to build with both
self-checks, ≈ 1 min to simulate on a quiet 2-core machine); needs the ``llm`` extra, else skips
naming the install command (the one skip this project allows)."""

from __future__ import annotations

import pytest
from conftest import OPTIONAL_EXTRA_SKIP
from decoder_models import paged_greedy
from export_smollm2 import ensure_exported, missing_extra
from ort_greedy import greedy

import mcpc
from mcpc.ir.decoder_import import DecoderBuild
from mcpc.sim.session import Session

# arbitrary token ids (no tokenizer needed); ONNX Runtime's continuation is the reference
PROMPT = [504, 3458, 5069, 10227, 33447, 690, 260, 23790, 2707, 28]


@pytest.mark.slow
def test_fp32_decoder_build_generates_onnx_runtimes_greedy_tokens_on_the_simulator():
    problem = missing_extra()
    if problem:
        pytest.skip(f"{OPTIONAL_EXTRA_SKIP}: llm ({problem})")
    path = ensure_exported()["decode"]
    result = mcpc.compile(path, qat_config="fp32", decoder=DecoderBuild(max_seq=128, prefill_chunk=16))
    info = result.program.meta["decoder"]
    assert (info["layers"], info["q_heads"], info["kv_heads"], info["head_dim"]) == (30, 9, 3, 64)
    imported, built = result.report["decoder_check"]
    assert imported["errors"]["logits"] < 1e-4 and built["errors"]["logits"] < 1e-4
    session = Session(result)

    def run(entry, inputs, registers):
        return session.run(inputs, entry=entry, registers=registers)["logits"]

    want = list(greedy(path, PROMPT, 20))
    assert paged_greedy(run, info, [PROMPT], 20, [[0, 1]]) == [want]
