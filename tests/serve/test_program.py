"""Step costs of a decoder build through the decoder host driver: the states the measurer builds,
and the acceptance check that one request served with exact costs has the TTFT and per-token
latency of `generate` on the same program."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from serve_helpers import policy

from mcpc.serve import ExactCost, ServedShape, Simulator
from mcpc.serve.program import measurer
from mcpc.serve.workload import Request


def contract():
    """tests/sim/decoder_contract.py: the decoder entries' documented semantics on the host, each
    call costing 1000 + 10 x (positions attended, summed over rows) cycles."""
    path = Path(__file__).parents[1] / "sim" / "decoder_contract.py"
    spec = importlib.util.spec_from_file_location("serve_decoder_contract", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


META = {"max_seq": 200, "max_batch": 2, "kv_blocks": 8, "prefill_chunk": 16}


def test_measurer_builds_the_states_it_names():
    c = contract()
    measure = measurer(c.ContractSession(c.meta_dict(**META)), "contract")
    for active, context in [(1, 1), (1, 64), (2, 65), (2, 200)]:
        assert measure("decode", active, context) == 1000 + 10 * active * context
    for chunk, past in [(1, 0), (16, 0), (7, 100), (16, 184)]:
        assert measure("prefill", chunk, past) == 1000 + 10 * (chunk * past + chunk * (chunk + 1) // 2)
    # two sequences at the longest context share their blocks: a pool of 8 blocks holds them
    assert measure("decode", 2, 200) == 1000 + 10 * 400


def test_one_request_exact_matches_generate():
    c = contract()
    from mcpc.sim.decoder import DecoderSession

    prompt, new = list(range(3, 43)), 6  # 40 prompt tokens: prefill chunks 16, 16, 8
    dec = DecoderSession(c.ContractSession(c.meta_dict(**META)))
    gen = dec.generate(prompt, max_new_tokens=new)
    decode_cycles = [s["cycles"] for s in dec.steps if s["entry"] == "decode"]

    m = c.meta_dict(**META)
    shape = ServedShape(m["max_batch"], m["max_seq"], m["prefill_chunk"], m["kv_blocks"])
    cost = ExactCost(measurer(c.ContractSession(m), "contract"), clock_hz=1e9)  # the fake's 1000 MHz
    req = Request(0, 0.0, np.asarray(prompt), new)
    sim = Simulator([req], cost, shape, policy(shape, policy="continuous"), check=True)
    (seq,) = sim.run()
    assert seq.first_token_s * 1e3 == pytest.approx(gen["ttft_ms"], rel=1e-12)
    assert [g * 1e9 for g in seq.itl] == pytest.approx(decode_cycles, rel=1e-12)
    assert (seq.finish_s - seq.first_token_s) / (new - 1) * 1e3 == pytest.approx(gen["tpot_ms"], rel=1e-12)
