"""The decoding loop's kv_* inputs against the paged KV cache ops of the IR (mcp.kv_store,
mcp.paged_attention, run by the reference interpreter over persistent module state).

A one-layer attention "model": q/k/v are embedding rows of the token plus a position row (numpy on
the host), the cache ops run in the IR interpreter with the slots, gathered blocks, windows and
``kv_blocks`` register that ``DecoderSession`` builds from its KV manager, and the logits are the
attention output times an output matrix.  The reference attends each prefix's whole contiguous K/V
in float64 with no cache: greedy tokens and perplexity must agree, across chunked prefill, several
blocks, batched decode of sequences at different contexts, a shared prefix and block eviction.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from decoder_contract import fake_program, meta_dict

from mcpc.ir import parse_module
from mcpc.ir.interpreter import ModuleState, interpret
from mcpc.sim.decoder import DecoderSession

V, HQ, HKV, D = 40, 4, 2, 8
MAX_SEQ, BATCH, CHUNK, BLOCK = 160, 2, 16, 64
SCALE = float(np.float32(D**-0.5))


def module_text(kv_blocks: int) -> str:
    mb = -(-MAX_SEQ // BLOCK)
    rows = HKV * (kv_blocks + 1) * BLOCK

    def func(name: str, s: int) -> str:
        r, q, kv = BATCH * s, f"tensor<{BATCH}x{HQ}x{s}x{D}xf32>", f"tensor<{BATCH}x{HKV}x{s}x{D}xf32>"
        idx, g = f"tensor<{r}xi32>", f"tensor<{BATCH * mb}xi32>"
        return f"""  func @{name}(%q: {q}, %kn: {kv}, %vn: {kv}, %slot: {idx}, %gather: {g}, %start: {idx}, %len: {idx}) -> ("out": {q}) {{
    mcp.kv_store %kn, %slot {{global = "k"}} : ({kv}, {idx}) -> ()
    mcp.kv_store %vn, %slot {{global = "v"}} : ({kv}, {idx}) -> ()
    %0 = mcp.host_reg {{name = "kv_blocks"}} : () -> tensor<i32>
    %1 = mcp.paged_attention %q, %gather, %start, %len, %0 {{block_size = {BLOCK}, k_global = "k", kv_heads = {HKV}, scale = {SCALE!r}, v_global = "v"}} : ({q}, {g}, {idx}, {idx}, tensor<i32>) -> {q}
    mcp.return %1 : ({q}) -> ()
  }}
"""  # noqa: E501

    return (
        f"module @dec {{\n  global @k : tensor<{rows}x{D}xf32>\n  global @v : tensor<{rows}x{D}xf32>\n"
        f"  host_reg @kv_blocks {{max = {BATCH * mb}, min = 0}}\n"
        + func("prefill", CHUNK)
        + func("decode", 1)
        + "}\n"
    )


class Model:
    """Embedding tables (token and position) for q, k, v, and the output matrix."""

    def __init__(self, seed: int = 0):
        rng = np.random.default_rng(seed)
        f = np.float32
        self.eq, self.ek, self.ev = (rng.standard_normal((V, h * D)).astype(f) for h in (HQ, HKV, HKV))
        self.pq, self.pk = (rng.standard_normal((MAX_SEQ, h * D)).astype(f) for h in (HQ, HKV))
        self.wo = rng.standard_normal((HQ * D, V)).astype(f)

    def qkv(self, ids: np.ndarray, pos: np.ndarray):
        """[B, H, S, D] q, k, v of tokens ``ids`` at positions ``pos`` (both [B, S])."""

        def heads(x, h):
            return x.reshape(*ids.shape, h, D).transpose(0, 2, 1, 3)

        return (
            heads(self.eq[ids] + self.pq[pos], HQ),
            heads(self.ek[ids] + self.pk[pos], HKV),
            heads(self.ev[ids], HKV),
        )

    def reference_logits(self, history: list[int]) -> np.ndarray:
        """Logits at the last token of ``history``, attending all of it, in float64."""
        ids = np.asarray([history])
        q, k, v = (a.astype(np.float64) for a in self.qkv(ids, np.arange(len(history))[None]))
        out = np.zeros((HQ, D))
        for hq in range(HQ):
            kh = hq // (HQ // HKV)
            s = q[0, hq, -1] @ k[0, kh].T * SCALE
            p = np.exp(s - s.max())
            out[hq] = (p / p.sum()) @ v[0, kh]
        return out.reshape(-1) @ self.wo.astype(np.float64)


class InterpreterSession:
    """A Session over the IR interpreter: the host part of the model around the cache ops."""

    def __init__(self, model: Model, kv_blocks: int):
        meta = meta_dict(max_seq=MAX_SEQ, max_batch=BATCH, kv_blocks=kv_blocks, prefill_chunk=CHUNK, layers=1,
                         kv_heads=HKV, q_heads=HQ, head_dim=D, kv_dtype="fp32", vocab=V)  # fmt: skip
        self.program = fake_program(meta)
        self.module = parse_module(module_text(kv_blocks))
        self.state = ModuleState(self.module)
        self.model = model
        self.last_profile = None

    def run(self, inputs, entry=None, registers=None, timing_only=False):
        q, kn, vn = self.model.qkv(inputs["input_ids"], inputs["position_ids"])
        feeds = {"q": q, "kn": kn, "vn": vn, "slot": inputs["kv_slot"], "gather": inputs["kv_gather"],
                 "start": inputs["kv_start"], "len": inputs["kv_len"]}  # fmt: skip
        out = interpret(self.module, feeds, entry, self.state, registers)["out"]
        self.last_profile = {"cycles": 1}
        b, _, s, _ = out.shape
        return {"logits": out.transpose(0, 2, 1, 3).reshape(b, s, HQ * D) @ self.model.wo}


def reference_greedy(model: Model, prompt: list[int], n: int) -> list[int]:
    hist = list(prompt)
    for _ in range(n):
        hist.append(int(np.argmax(model.reference_logits(hist))))
    return hist[len(prompt) :]


def test_generate_through_the_paged_cache_ops_equals_attention_without_a_cache():
    model = Model(0)
    dec = DecoderSession(InterpreterSession(model, kv_blocks=2 * 3))
    rng = np.random.default_rng(5)
    system = rng.integers(0, V, 70).tolist()  # one full shared block, then a partial one
    prompts = [system + rng.integers(0, V, k).tolist() for k in (3, 20)] + [rng.integers(0, V, 9).tolist()]
    res = dec.generate_many(prompts, 12)
    assert res["generated_ids"] == [reference_greedy(model, p, 12) for p in prompts]
    assert res["prefix_hit_tokens"] == 64


def test_logits_of_every_step_match_and_eviction_reuses_blocks_safely():
    model = Model(1)
    dec = DecoderSession(InterpreterSession(model, kv_blocks=3))  # too few to keep anything cached long
    rng = np.random.default_rng(6)
    for length in (65, 130, 40, 100):
        prompt = rng.integers(0, V, length).tolist()
        seq, cached = dec.new_sequence(prompt)
        logits = dec.prefill([(seq, prompt[cached:])])[0]
        np.testing.assert_allclose(logits[-1], model.reference_logits(prompt), rtol=2e-4, atol=2e-4)
        hist = list(prompt)
        for _ in range(min(5, MAX_SEQ - length)):
            hist.append(int(np.argmax(logits[-1])))
            logits = dec.decode([seq], [hist[-1]])
            np.testing.assert_allclose(logits[0], model.reference_logits(hist), rtol=2e-4, atol=2e-4)
        dec.free(seq)
    assert dec.kv.evictions > 0


@pytest.mark.parametrize("prefill", [1, 16, 40])
def test_eval_ppl_through_the_paged_cache_ops(prefill):
    model = Model(2)
    dec = DecoderSession(InterpreterSession(model, kv_blocks=6))
    tokens = np.random.default_rng(7).integers(0, V, 3 * 70)
    res = dec.eval_ppl(tokens, window=70, prefill=prefill)
    nll = []
    for w in tokens.reshape(3, 70).tolist():
        for t in range(69):
            z = model.reference_logits(w[: t + 1])
            nll.append(np.log(np.exp(z - z.max()).sum()) + z.max() - z[w[t + 1]])
    assert res["perplexity"] == pytest.approx(math.exp(np.mean(nll)), rel=1e-5)
