"""A host model of a decoder build's entries for the decoding-loop tests (test_decoder.py,
test_sim_generate_cli.py): ``ContractSession`` implements the documented semantics of the `prefill` and
`decode` entries over a KV store of (token, position) per slot, with logits a pseudo-random
function of the token ids attended (``ref_logits``); ``ref_greedy`` is the greedy loop over the
token history alone, with no cache.
"""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import numpy as np

from mcpc.sim.decoder import DecoderMeta

VOCAB = 50


def meta_dict(**kw) -> dict:
    d = {"max_seq": 200, "max_batch": 2, "block": 64, "kv_blocks": 8, "prefill_chunk": 16, "layers": 2,
         "kv_heads": 2, "q_heads": 4, "head_dim": 8, "kv_dtype": "fp16", "vocab": VOCAB, "logits": "logits",
         "inputs": {"ids": "input_ids", "positions": "position_ids"}, "kv_quant": None}  # fmt: skip
    d.update(kw)
    return d


def _bindings(meta: dict | None, entry: str) -> dict:
    """The entry's I/O bindings (names, dtypes, shapes as a decoder build declares them; the
    roofline counts their bytes)."""
    if not meta or "max_batch" not in meta:  # a malformed META: the session refuses it first
        return {"inputs": [], "outputs": []}
    B, S = meta["max_batch"], meta["prefill_chunk"] if entry == "prefill" else 1
    per_seq = -(-meta["max_seq"] // meta["block"])
    shapes = {
        "input_ids": ("i64", [B, S]),
        "position_ids": ("i64", [B, S]),
        "kv_slot": ("i32", [B * S]),
        "kv_gather": ("i32", [B * per_seq]),
        "kv_start": ("i32", [B * S]),
        "kv_len": ("i32", [B * S]),
    }
    return {
        "inputs": [{"name": n, "dtype": d, "shape": sh} for n, (d, sh) in shapes.items()],
        "outputs": [{"name": "logits", "dtype": "f32", "shape": [B, S, meta["vocab"]]}],
    }


def fake_program(meta: dict | None, entries=("prefill", "decode"), weight_bytes=10_000):
    io = {e: _bindings(meta, e) for e in entries}
    return SimpleNamespace(
        source="fake.mcpb",
        entries={e: (i, 1) for i, e in enumerate(entries)},
        io=io,
        program=SimpleNamespace(
            meta={} if meta is None else {"decoder": meta}, constants=bytes(weight_bytes)
        ),
        target=SimpleNamespace(name="fake", clock_mhz=1000.0, dram=SimpleNamespace(bandwidth_gbps=100.0)),
    )


def ref_logits(history: tuple[int, ...]) -> np.ndarray:
    """The reference model: logits a pseudo-random function of the token history."""
    seed = int.from_bytes(hashlib.sha256(repr(history).encode()).digest()[:8], "little")
    return np.random.default_rng(seed).standard_normal(VOCAB).astype(np.float32)


class ContractSession:
    """The decoder entries' contract on the host (module docstring)."""

    def __init__(self, meta: dict):
        self.program = fake_program(meta)
        self.m = DecoderMeta.from_program(self.program)
        self.store: dict[int, tuple[int, int]] = {}
        self.last_profile = None
        self.runs = 0

    def run(self, inputs, entry=None, registers=None, timing_only=False):
        m, blk = self.m, self.m.block
        S = m.prefill_chunk if entry == "prefill" else 1
        ids, pos = inputs["input_ids"], inputs["position_ids"]
        assert ids.shape == pos.shape == (m.max_batch, S)
        for name in ("kv_slot", "kv_start", "kv_len"):
            assert inputs[name].shape == (m.max_batch * S,) and inputs[name].dtype == np.int32
        assert inputs["kv_gather"].shape == (m.max_batch * m.blocks_per_seq,)
        nblocks = registers["kv_blocks"]
        assert 0 <= nblocks <= m.max_batch * m.blocks_per_seq
        self.runs += 1
        self.last_profile = {"cycles": 1000 + 10 * int(inputs["kv_len"].sum()),
                             "roofline": {"chain_latency_cycles": 400}}  # fmt: skip
        if timing_only:
            return {}
        for r, slot in enumerate(inputs["kv_slot"]):  # kv_store first: a row attends itself
            assert 0 <= slot < (m.kv_blocks + 1) * blk
            self.store[int(slot)] = (int(ids.flat[r]), int(pos.flat[r]))
        gathered = [
            self.store.get(int(g) * blk + o) for g in inputs["kv_gather"][:nblocks] for o in range(blk)
        ]
        logits = np.zeros((m.max_batch * S, VOCAB), np.float32)
        for r in range(m.max_batch * S):
            start, length = int(inputs["kv_start"][r]), int(inputs["kv_len"][r])
            if length == 0:
                continue
            assert start + length <= blk * nblocks
            seen = gathered[start : start + length]
            assert [p for _, p in seen] == list(range(length)), "attended positions out of order"
            assert int(pos.flat[r]) == length - 1
            logits[r] = ref_logits(tuple(t for t, _ in seen))
        return {"logits": logits.reshape(m.max_batch, S, VOCAB)}


def ref_greedy(prompt: list[int], n: int) -> list[int]:
    hist, out = list(prompt), []
    for _ in range(n):
        out.append(int(np.argmax(ref_logits(tuple(hist)))))
        hist.append(out[-1])
    return out


class InterpreterSession:
    """The IR interpreter on a compiled decoder module behind DecoderSession's Session interface:
    the program's metadata (``program``, default the Session's), and the module state as the
    persistent buffers, so what the host writes there (stored KV blocks) is what the next call reads."""

    def __init__(self, built, program=None):
        from mcpc.ir.interpreter import ModuleState
        from mcpc.sim.session import Session

        self.module, self.state = built.module, ModuleState(built.module)
        self.program = program if program is not None else Session(built).program
        self.last_profile = None

    def run(self, inputs, entry, registers, timing_only=False):
        from mcpc.ir.interpreter import interpret

        out = interpret(self.module, inputs, entry, self.state, registers)
        self.last_profile = {"cycles": 0, "ir_ops": []}
        return out

    def persistent_view(self, name):
        return self.state.globals[name].reshape(-1)
