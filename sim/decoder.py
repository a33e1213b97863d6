"""The served decoding loop on the simulator: a decoder build's `prefill`/`decode` entries over a
paged KV cache that lives in the simulated NPU memory (docs/simulator.md, "Decoding").

    dec = DecoderSession("smollm2.mcpb")
    result = dec.generate([1, 2, 3], max_new_tokens=20)      # greedy
    result["generated_ids"], result["ttft_ms"], result["tpot_ms"]
    dec.eval_ppl(tokens, window=256, prefill=16)["perplexity"]

A decoder build (``mcp-compile --max-seq N``) records its shape in META["decoder"] (``DecoderMeta``).
This module owns a ``KVManager`` (which block holds which token of which sequence) and turns its
block tables into each call's inputs (``step_inputs``, a pure function): ``kv_slot`` (the slot each
new row writes; padding rows the trash block), ``kv_gather`` (the blocks to gather, sequences
concatenated), ``kv_start``/``kv_len`` (where row r's sequence starts in the gathered buffer and how
many positions it attends), the padded ids and positions, and the ``kv_blocks`` host register.
K/V never leave the simulated NPU: the host sends ids and slots and reads logits.

Timing comes from the Session's profile of each call: TTFT is the prefill cycles of the prompt,
time per output token the mean decode step; beside them the DRAM roofline of a decode step, its
compulsory DRAM bytes (sim/roofline.py: the weight bytes a step reads + its inputs and outputs +
the KV bytes in use at that context) / the target's DRAM bandwidth, the
latency of the step's dependency chain (sim/chain.py) and the bound roofline / 0.85 + chain.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mcpc.errors import InputError, UsageError

from .kv_manager import KVManager
from .roofline import compulsory_dram_bytes, entry_io_bytes, finish, step_weight_bytes

KV_INPUTS = ("kv_slot", "kv_gather", "kv_start", "kv_len")
# The bound a decode step is held to (issue 10): roofline / ROOFLINE_EFFICIENCY + its chain latency.
ROOFLINE_EFFICIENCY = 0.85
KV_BLOCKS_REG = "kv_blocks"
_DTYPE_ALIASES = {"fp32": "f32", "fp16": "f16", "bf16": "bf16", "int8": "i8", "uint8": "u8"}


@dataclass(frozen=True)
class DecoderMeta:
    """The decoder shape a build records in META["decoder"]."""

    max_seq: int
    max_batch: int
    block: int
    kv_blocks: int
    prefill_chunk: int
    layers: int
    kv_heads: int
    q_heads: int
    head_dim: int
    kv_dtype: str
    vocab: int
    logits: str
    ids: str
    positions: str | None
    kv_quant: dict | None
    heat: dict | None = None  # the attention heat global the program writes (docs/decoding.md)
    kv_pool: dict | None = None  # a compressing build's pool and descriptor table (mcpc.kv.pool)
    prefill_rows: str | None = None  # the host register of a prefill's token rows in use
    convention: dict | None = None  # the model's I/O convention the compile found (ir/exporter_family.py)
    eos_ids: tuple[int, ...] = ()  # generation stops after these (ir.decoder_import.eos_ids)

    def call_registers(self, entry: str, used: int, rows: Sequence[int]) -> dict[str, int]:
        """The host registers of one call: ``kv_blocks`` = ``used``, and for ``prefill`` (when the
        build has the register) the token rows in use, ``prefill_rows_in_use(rows, chunk)``."""
        regs = {KV_BLOCKS_REG: int(used)}
        if entry == "prefill" and self.prefill_rows:
            regs[self.prefill_rows] = prefill_rows_in_use(rows, self.prefill_chunk)
        return regs

    @property
    def blocks_per_seq(self) -> int:
        return -(-self.max_seq // self.block)

    @classmethod
    def from_program(cls, loaded: Any) -> DecoderMeta:
        """META["decoder"] of a loaded program; UsageError when the program is not a decoder build
        (no such entry, or no `prefill`/`decode` entry pair)."""
        src = loaded.source
        meta = (loaded.program.meta or {}).get("decoder")
        missing = [e for e in ("prefill", "decode") if e not in loaded.entries]
        if not isinstance(meta, dict) or missing:
            have = ", ".join(loaded.entries) or "none"
            raise UsageError(
                f"{src}: not a decoder build (entry points: {have}; no "
                f"{'decoder metadata' if not isinstance(meta, dict) else 'entry ' + ', '.join(missing)}): "
                "compile the model with `mcp-compile --max-seq N` to get the prefill/decode pair"
            )
        try:
            ins = meta["inputs"]
            out = cls(
                **{k: int(meta[k]) for k in ("max_seq", "max_batch", "block", "kv_blocks", "prefill_chunk")},
                **{k: int(meta[k]) for k in ("layers", "kv_heads", "q_heads", "head_dim", "vocab")},
                kv_dtype=_DTYPE_ALIASES.get(str(meta["kv_dtype"]), str(meta["kv_dtype"])),
                logits=str(meta["logits"]),
                ids=str(ins["ids"]),
                positions=None if ins.get("positions") is None else str(ins["positions"]),
                kv_quant=meta.get("kv_quant"),
                heat=meta.get("heat"),
                kv_pool=meta.get("kv_pool"),
                prefill_rows=meta.get("prefill_rows"),
                convention=meta.get("convention"),
                eos_ids=tuple(int(i) for i in meta.get("eos_ids") or ()),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(
                f"{src}: META decoder entry is malformed ({type(exc).__name__}: {exc})"
            ) from None
        for entry in ("prefill", "decode"):
            io = loaded.io.get(entry, {})
            names = {b["name"] for b in io.get("inputs", [])}
            need = [n for n in (*KV_INPUTS, out.ids, out.positions) if n and n not in names]
            if need or out.logits not in {b["name"] for b in io.get("outputs", [])}:
                raise InputError(
                    f"{src}: entry {entry!r} does not take the decoder inputs its META names "
                    f"(missing: {', '.join(need) or 'the output ' + out.logits})"
                )
        return out


def block_bytes(meta: DecoderMeta) -> int:
    """Bytes one KV block holds in NPU memory: K and V of every layer and kv head for ``block``
    tokens, in ``kv_dtype``.  An INT8 cache adds, per head_dim values, its fp16 scale and u8 zero
    point; a ``kv_quant`` entry that states ``bytes_per_block`` is taken as it is."""
    from mcpc.arch.dtypes import nbytes

    quant = meta.kv_quant or {}
    if "bytes_per_block" in quant:
        return int(quant["bytes_per_block"])
    vectors = meta.layers * 2 * meta.kv_heads * meta.block  # (layer, K|V, head, token) rows
    per_vector = nbytes(meta.kv_dtype, meta.head_dim)
    if meta.kv_dtype in ("i8", "u8"):
        per_vector += 3  # fp16 scale + u8 zero point per group of head_dim values
    return vectors * per_vector


@dataclass
class StepItem:
    """One sequence in one call: its block table (covering every position through the new ones),
    how many tokens precede this call (past), and the new token ids."""

    blocks: Sequence[int]
    past: int
    tokens: Sequence[int]


def step_inputs(meta: DecoderMeta, rows: int, items: Sequence[StepItem]) -> tuple[dict[str, np.ndarray], int]:
    """The inputs of one call of an entry with ``rows`` query rows per sequence (prefill_chunk or
    1) for ``items`` (batch slots 0..len-1; the rest padding), and the ``kv_blocks`` register value.

    Row r = b*rows + t: ``kv_slot`` = slot of position past_b + t (padding rows: the trash block's
    first slot), ``kv_start`` = 64 * (blocks of the sequences before b), ``kv_len`` = past_b + t + 1
    (0 for padding), ids/positions padded with 0; ``kv_gather`` = the block tables concatenated,
    padded with the trash block id.
    """
    B, S, blk = meta.max_batch, rows, meta.block
    if len(items) > B:
        raise InputError(f"{len(items)} sequences in one call, more than the build's max_batch {B}")
    trash = meta.kv_blocks
    slot = np.full(B * S, trash * blk, np.int32)
    start = np.zeros(B * S, np.int32)
    length = np.zeros(B * S, np.int32)
    gather = np.full(B * meta.blocks_per_seq, trash, np.int32)
    ids = np.zeros((B, S), np.int64)
    pos = np.zeros((B, S), np.int64)
    used = 0
    for b, it in enumerate(items):
        n, past = len(it.tokens), int(it.past)
        total = past + n
        nblk = -(-total // blk)
        if n > S or n == 0:
            raise InputError(f"sequence in batch slot {b}: {n} new tokens, the entry takes 1..{S}")
        if total > meta.max_seq or len(it.blocks) < nblk:
            raise InputError(
                f"sequence in batch slot {b}: {total} positions need {nblk} blocks "
                f"(block table has {len(it.blocks)}, max_seq {meta.max_seq})"
            )
        gather[used : used + nblk] = it.blocks[:nblk]
        r = b * S + np.arange(n)
        p = past + np.arange(n)
        slot[r] = np.asarray(it.blocks, np.int64)[p // blk] * blk + p % blk
        start[r] = used * blk
        length[r] = p + 1
        ids[b, :n] = np.asarray(it.tokens, np.int64)
        pos[b, :n] = p
        used += nblk
    inputs = {"kv_slot": slot, "kv_gather": gather, "kv_start": start, "kv_len": length, meta.ids: ids}
    if meta.positions:
        inputs[meta.positions] = pos
    return inputs, used


def prefill_rows_in_use(rows: Sequence[int], chunk: int) -> int:
    """The leading token rows a prefill call computes (``docs/decoding.md``, "Prefill row
    extents"): batch slot b's ``rows[b]`` tokens lie in rows b·chunk …, so through the last
    sequence's last token; at least 1."""
    last = [b * chunk + int(n) for b, n in enumerate(rows) if n]
    return max(last, default=1)


def _narrow_windows(
    inputs: dict[str, np.ndarray], rows: int, items: Sequence[StepItem], seqs: Sequence[Any],
    left: Callable[[Any, int], int],
) -> None:  # fmt: skip
    """The dynamic attention window: row r = b*rows + t (position past_b + t) attends from
    ``left(seq_b, position)`` on: its ``kv_start`` moves right by that much and ``kv_len`` shrinks."""
    start, length = inputs["kv_start"], inputs["kv_len"]
    for b, (it, seq) in enumerate(zip(items, seqs, strict=True)):
        for t in range(len(it.tokens)):
            r, pos = b * rows + t, it.past + t
            edge = min(max(int(left(seq, pos)), 0), pos)
            start[r] += edge
            length[r] -= edge


def _window_report(steps: Sequence[dict]) -> dict | None:
    """Where the dynamic window put the rows of ``steps`` (prefill and decode): how many rows, how
    many attended fewer positions than the causal mask allows, the mean and largest left edge and
    the mean width (positions attended); None without a dynamic window."""
    lefts = [e for s in steps if s.get("window") for e in s["window"][0]]
    widths = [w for s in steps if s.get("window") for w in s["window"][1]]
    if not lefts:
        return None
    return {
        "rows": len(lefts), "narrowed_rows": sum(e > 0 for e in lefts),
        "mean_left": float(np.mean(lefts)), "max_left": int(max(lefts)), "mean_width": float(np.mean(widths)),
    }  # fmt: skip


def _nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Negative log-likelihood of ``targets`` under each row of ``logits``, in float64."""
    z = np.asarray(logits, np.float64)
    m = z.max(axis=-1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(z - m).sum(axis=-1))
    return lse - z[np.arange(len(targets)), targets]


class DecoderSession:
    """Runs a decoder build's `prefill`/`decode` entries over one KV manager (module docstring).

    ``prefix_sharing``: prompts sharing full 64-token blocks store them once (KVManager).
    ``timing_only``: calls compute no values (cycles only; logits come back as None): for cost
    measurements, never for generate/eval_ppl.  ``bytes_per_block``: a block's bytes in NPU memory
    (an int or ``f(block_id)``; default ``block_bytes(meta)``); ``kv.set_block_bytes`` records a
    compressed block's own size.  A build whose META ``kv_quant`` compresses the cache stores its
    blocks through ``compressed`` (sim/kv_store.py, docs/kv-cache.md): sizes are the stored bytes,
    and ``bytes_per_block`` is refused.
    """

    def __init__(
        self,
        program: Any,
        prefix_sharing: bool = True,
        timing_only: bool = False,
        bytes_per_block: int | Callable[[int], int] | None = None,
    ):
        from .session import Session

        # a Session (or an object with its run/last_profile/program) is used as it is
        self.session = (
            program if hasattr(program, "run") and hasattr(program, "program") else Session(program)
        )
        loaded = self.session.program
        self.meta = DecoderMeta.from_program(loaded)
        self.target = loaded.target
        self.source = loaded.source
        self.timing_only = timing_only
        self.compressed = None  # the stored blocks of a compressing build (sim/kv_store.py)
        self.heat = None  # the attention the sequences' positions received (a build with heat)
        if self.meta.heat is not None:
            from .kv_store import AttentionHeat

            self.heat = AttentionHeat(self.meta, self.session, timing_only)
        if self.meta.kv_quant is not None and "quant" in self.meta.kv_quant:
            from mcpc.kv import KvSettings

            from .kv_store import CompressedKV

            if bytes_per_block is not None:
                raise UsageError(
                    f"{self.source}: the build stores its KV cache compressed (META decoder.kv_quant): a "
                    "block's bytes are what was stored in it, so bytes_per_block cannot be given"
                )
            try:
                settings = KvSettings.from_json(self.meta.kv_quant)
            except (TypeError, ValueError) as exc:
                raise InputError(f"{self.source}: META decoder.kv_quant is malformed ({exc})") from None
            self.compressed = CompressedKV(settings, self.meta, self.session, timing_only, self.heat)
            bytes_per_block = 0  # a block holds what was stored in it: set after each call
        self.kv = KVManager(
            self.meta.kv_blocks,
            self.meta.block,
            block_bytes(self.meta) if bytes_per_block is None else bytes_per_block,
            max_tokens=self.meta.max_seq,
            prefix_sharing=prefix_sharing,
        )
        self._peak = self._peak_unshared = 0  # a compressing build's peaks, after each call's stores
        self.weight_bytes = len(loaded.program.constants)
        self.step_weight_bytes = step_weight_bytes(loaded, "decode")
        self.bytes_per_us = self.target.dram.bandwidth_gbps * 1e3
        self.steps: list[dict] = []  # one record per call: entry, cycles, sequences, kv_bytes
        self._next_id = 0

    # ------------------------------------------------------------------ one call of an entry
    def new_sequence(self, prompt: Sequence[int] = ()) -> tuple[int, int]:
        """A fresh sequence id and the number of ``prompt`` tokens already cached (prefix hit)."""
        seq, self._next_id = self._next_id, self._next_id + 1
        return seq, self.kv.add_sequence(seq, prompt)

    def free(self, seq) -> None:
        self.kv.free(seq)
        if self.heat is not None:
            self.heat.free(seq)

    def _call(self, entry: str, pairs: Sequence[tuple[Any, Sequence[int]]]) -> np.ndarray | None:
        """Append each pair's tokens to its sequence and run ``entry`` once over them; logits
        [len(pairs), rows, vocab] (None when timing-only)."""
        rows = self.meta.prefill_chunk if entry == "prefill" else 1
        items = []
        for seq, toks in pairs:
            past = self.kv.num_tokens(seq)
            self.kv.append(seq, toks)
            items.append(StepItem(self.kv.block_table(seq), past, toks))
        inputs, used = step_inputs(self.meta, rows, items)
        seqs = [seq for seq, _ in pairs]
        window = None
        if self.heat is not None and self.heat.min_window is not None:
            full = inputs["kv_len"].copy()
            _narrow_windows(inputs, rows, items, seqs, self.heat.window_left)
            real = full > 0  # the rows of the call's tokens: their left edges and widths
            window = ((full - inputs["kv_len"])[real].tolist(), inputs["kv_len"][real].tolist())
        written = self._written(items, seqs) if self.compressed is not None else {}
        if self.compressed is not None:
            self.compressed.before_call(inputs["kv_gather"][:used], written)
        regs = self.meta.call_registers(entry, used, [len(it.tokens) for it in items])
        out = self.session.run(inputs, entry=entry, registers=regs, timing_only=self.timing_only)
        if self.heat is not None:
            blk, done = self.meta.block, []
            used_before = 0  # the sequence's first row in the gathered buffer (step_inputs' kv_start)
            for b, (seq, it) in enumerate(zip(seqs, items, strict=True)):
                total, base = it.past + len(it.tokens), used_before * blk
                r = b * rows + np.arange(len(it.tokens))  # the rows' attended spans [left, pos]
                left = inputs["kv_start"][r].astype(np.int64) - base
                done.append((seq, base, total, np.stack([left, it.past + np.arange(len(it.tokens))], 1)))
                used_before += -(-total // blk)
            self.heat.after_call(done)
        if self.compressed is not None:
            self._store_blocks(written)
        prof = self.session.last_profile
        # the call's compulsory DRAM bytes (sim/roofline.py, the one definition): the entry's weights
        # read once + its inputs + its outputs + the KV blocks its sequences hold after the call
        weights = (
            self.step_weight_bytes if entry == "decode" else step_weight_bytes(self.session.program, entry)
        )
        io = entry_io_bytes(self.session.program, entry)
        kv_bytes = self.kv.bytes_of([s for s, _ in pairs])
        need = compulsory_dram_bytes(weights, io[0], io[1], kv_bytes)
        if "macs_by_dtype" in prof:  # a simulator profile: its roofline counts the same KV
            finish(
                prof,
                self.target,
                weights,
                io,
                kv_bytes,
                (prof.get("roofline") or {}).get("chain_latency_cycles"),
            )
        # the kvcomps the host issued after the call (sim/kvcomp.py): the step's compression work
        kvc = self.compressed.last_kvcomp if self.compressed is not None and self.compressed.kvcomp else {}
        attention = sum(r["cycles"] for r in prof.get("ir_ops", []) if r["ir_op"] == "mcp.paged_attention")
        self.steps.append(
            {"entry": entry, "cycles": int(prof["cycles"]) + kvc.get("cycles", 0), "sequences": len(pairs),
             "kvcomp_cycles": kvc.get("cycles", 0),
             "kvcomp_dram_bytes": kvc.get("dram_read_bytes", 0) + kvc.get("dram_write_bytes", 0),
             "context": [it.past + len(it.tokens) for it in items],
             "kv_bytes": kv_bytes, "compulsory_dram_bytes": need, "attention_cycles": int(attention),
             "dram_read_bytes": int(prof.get("dram_read_bytes", 0)),
             "chain_cycles": (prof.get("roofline") or {}).get("chain_latency_cycles"), "window": window}
        )  # fmt: skip
        if self.timing_only:
            return None
        logits = out[self.meta.logits]
        return np.asarray(logits).reshape(self.meta.max_batch, rows, -1)[: len(pairs)]

    def _written(
        self, items: Sequence[StepItem], seqs: Sequence[Any]
    ) -> dict[int, tuple[int, int, int, Any]]:
        """The blocks a call writes: block id -> (first row written, rows held after the call,
        position of the block's first row, the sequence writing it)."""
        blk = self.meta.block
        written: dict[int, tuple[int, int, int, Any]] = {}
        for it, seq in zip(items, seqs, strict=True):
            past, total = it.past, it.past + len(it.tokens)
            for j in range(past // blk, -(-total // blk)):
                lo = max(past - j * blk, 0)
                written[int(it.blocks[j])] = (lo, min(total - j * blk, blk), j * blk, seq)
        return written

    def _store_blocks(self, written: dict[int, tuple[int, int, int, Any]]) -> None:
        """Store the blocks the call wrote (compressing build) and update their sizes and the peaks."""
        for bid in self.compressed.after_call(written):
            self.kv.set_block_bytes(bid, self.compressed.size(bid))
        self._peak = max(self._peak, self.kv.kv_bytes)
        self._peak_unshared = max(self._peak_unshared, self.kv.unshared_bytes)

    def prefill(self, pairs: Sequence[tuple[Any, Sequence[int]]]) -> list[np.ndarray | None]:
        """Prefill several sequences at once (each its own tokens, in chunks of ``prefill_chunk``,
        appended after what it already holds); returns each one's logits [n, vocab]."""
        C, B = self.meta.prefill_chunk, self.meta.max_batch
        out: list[list[np.ndarray]] = [[] for _ in pairs]
        done = [0] * len(pairs)
        while True:
            active = [i for i, (_, toks) in enumerate(pairs) if done[i] < len(toks)][:B]
            if not active:
                break
            chunk = [(pairs[i][0], list(pairs[i][1][done[i] : done[i] + C])) for i in active]
            logits = self._call("prefill", chunk)
            for k, i in enumerate(active):
                n = len(chunk[k][1])
                if logits is not None:
                    out[i].append(logits[k, :n])
                done[i] += n
        return [np.concatenate(o) if o else None for o in out]

    def decode(self, seqs: Sequence[Any], tokens: Sequence[int]) -> np.ndarray | None:
        """One decode step: ``tokens[i]`` appended to ``seqs[i]`` (1..max_batch sequences, each at
        its own context); returns logits [len(seqs), vocab]."""
        if len(seqs) != len(tokens):
            raise InputError(f"decode: {len(seqs)} sequences but {len(tokens)} tokens")
        logits = self._call("decode", [(s, [int(t)]) for s, t in zip(seqs, tokens, strict=True)])
        return None if logits is None else logits[:, 0]

    # ------------------------------------------------------------------ checks
    def _check_ids(self, ids: Sequence[int], what: str) -> list[int]:
        arr = np.asarray(ids)
        if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
            raise UsageError(f"{what}: expected a 1-D list of integer token ids, got {arr.dtype} {arr.shape}")
        bad = arr[(arr < 0) | (arr >= self.meta.vocab)]
        if bad.size:
            raise UsageError(
                f"{what}: token id {int(bad[0])} is outside the vocabulary [0, {self.meta.vocab})"
            )
        return [int(t) for t in arr]

    def _ms(self, cycles: float) -> float:
        return cycles / (self.target.clock_mhz * 1e3)

    # ------------------------------------------------------------------ generate
    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int) -> dict:
        """Greedy continuation of one prompt (``generate_many`` of one)."""
        return self.generate_many([prompt_ids], max_new_tokens)

    def generate_many(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> dict:
        """Greedy continuation of each prompt, through one KV manager: prompts in groups of
        ``max_batch``, each group's prompts prefilled one after another (so that a prompt reuses the
        full blocks the ones before it cached: they are not recomputed), then decoded together (one
        decode step for the whole group).  A prompt's TTFT counts its group's prefill cycles up to
        the end of its own.

        A continuation stops early after an end-of-sequence id the build recorded (``eos_ids``: from
        the model's genai_config.json, generation_config.json or config.json: ``ir.decoder_import.eos_ids``),
        as ONNX Runtime GenAI's generator and transformers' ``generate`` do.

        Returns the report (see docs/simulator.md "Decoding"): generated_ids (a list, or a list of
        lists for several prompts), ttft_ms, tpot_ms, cycles_per_token, latency_us_per_token,
        roofline_us_per_token, kv_bytes, kv_bytes_unshared, ...
        """
        if self.timing_only:
            raise UsageError("generate needs values: open the DecoderSession without timing_only")
        if max_new_tokens < 1:
            raise UsageError(f"--max-new-tokens must be at least 1, not {max_new_tokens}")
        prompts = [self._check_ids(p, f"prompt {i}") for i, p in enumerate(prompts)]
        for i, p in enumerate(prompts):
            if not p:
                raise UsageError(f"prompt {i} is empty: give at least one token id")
            if len(p) + max_new_tokens - 1 > self.meta.max_seq:
                raise UsageError(
                    f"prompt {i}: {len(p)} tokens + {max_new_tokens} new ones need "
                    f"{len(p) + max_new_tokens - 1} positions, more than the build's max_seq "
                    f"{self.meta.max_seq} (shorten them, or compile with a larger --max-seq)"
                )
        first = len(self.steps)
        generated: list[list[int]] = [[] for _ in prompts]
        ttft_cycles: list[int] = [0] * len(prompts)
        cached: list[int] = [0] * len(prompts)
        B = self.meta.max_batch
        for g0 in range(0, len(prompts), B):
            group = list(range(g0, min(g0 + B, len(prompts))))
            seqs, mark = {}, len(self.steps)
            for i in group:  # one after another, so that a prompt reuses the blocks of the ones before
                seqs[i], cached[i] = self.new_sequence(prompts[i])
                logits = self.prefill([(seqs[i], prompts[i][cached[i] :])])[0]
                ttft_cycles[i] = sum(step["cycles"] for step in self.steps[mark:])
                generated[i].append(int(np.argmax(logits[-1])))
            live = [i for i in group if not self._finished(generated[i], max_new_tokens)]
            while live:
                out = self.decode([seqs[i] for i in live], [generated[i][-1] for i in live])
                for k, i in enumerate(live):
                    generated[i].append(int(np.argmax(out[k])))
                for i in [i for i in live if self._finished(generated[i], max_new_tokens)]:
                    self.free(seqs[i])
                live = [i for i in live if not self._finished(generated[i], max_new_tokens)]
            for i in group:
                if seqs[i] in self.kv:
                    self.free(seqs[i])
        report = self._timing(self.steps[first:])
        report.update(
            generated_ids=generated[0] if len(prompts) == 1 else generated,
            prompt_tokens=[len(p) for p in prompts] if len(prompts) > 1 else len(prompts[0]),
            prefix_hit_tokens=sum(cached),
            ttft_ms=float(np.mean([self._ms(c) for c in ttft_cycles])),
            ttft_cycles=ttft_cycles if len(prompts) > 1 else ttft_cycles[0],
        )
        return report

    def _finished(self, ids: list[int], max_new_tokens: int) -> bool:
        """A continuation is done at ``max_new_tokens`` or after an end-of-sequence id (kept)."""
        return len(ids) >= max_new_tokens or (bool(ids) and ids[-1] in self.meta.eos_ids)

    def _timing(self, steps: list[dict]) -> dict:
        """Decode-step means (prefill excluded), roofline and KV bytes over ``steps``."""
        dec = [s for s in steps if s["entry"] == "decode"]
        mhz = self.target.clock_mhz
        out = {
            "target": self.target.name,
            "clock_mhz": mhz,
            "prefill_cycles": sum(s["cycles"] for s in steps if s["entry"] == "prefill"),
            "decode_steps": len(dec),
            "kv_bytes": self.kv.peak_kv_bytes if self.compressed is None else self._peak,
            "kv_bytes_unshared": (
                self.kv.peak_unshared_bytes if self.compressed is None else self._peak_unshared
            ),
            "kv_block_bytes": block_bytes(self.meta),
            "weight_bytes": self.weight_bytes,
            "weight_bytes_per_step": self.step_weight_bytes,
            "kv_store": None if self.compressed is None else self.compressed.report(),
            "dram_bandwidth_gbps": self.target.dram.bandwidth_gbps,
            "dynamic_window": _window_report(steps),
        }
        if dec:
            cyc = float(np.mean([s["cycles"] for s in dec]))
            # the compulsory bytes of each step (weights once + inputs + outputs + KV in use) ÷ bandwidth
            roof = float(np.mean([s["compulsory_dram_bytes"] / self.bytes_per_us for s in dec]))
            per_cycle = self.bytes_per_us / mhz  # DRAM bytes a cycle
            roof_cyc = [s["compulsory_dram_bytes"] / per_cycle for s in dec]
            chain = [s["chain_cycles"] for s in dec]
            bound = None
            if None not in chain:
                bound = [r / ROOFLINE_EFFICIENCY + c for r, c in zip(roof_cyc, chain, strict=True)]
            out.update(
                cycles_per_token=cyc,
                latency_us_per_token=cyc / mhz,
                tpot_ms=self._ms(cyc),
                roofline_us_per_token=roof,
                roofline_ratio=(cyc / mhz) / roof if roof else None,
                decode_cycles=[s["cycles"] for s in dec],
                decode_context=[sum(s["context"]) for s in dec],
                decode_kv_bytes=[s["kv_bytes"] for s in dec],
                decode_attention_cycles=[s["attention_cycles"] for s in dec],
                decode_kvcomp_cycles=[s["kvcomp_cycles"] for s in dec],
                kvcomp_cycles_per_token=float(np.mean([s["kvcomp_cycles"] for s in dec])),
                decode_roofline_cycles=roof_cyc,
                decode_chain_cycles=chain,
                decode_bound_cycles=bound,
                roofline_cycles_per_token=float(np.mean(roof_cyc)),
                chain_cycles_per_token=None if bound is None else float(np.mean(chain)),
                bound_cycles_per_token=None if bound is None else float(np.mean(bound)),
                within_bound=None
                if bound is None
                else all(s["cycles"] <= b for s, b in zip(dec, bound, strict=True)),
            )
        else:  # one new token: no decode step was run
            out.update(
                cycles_per_token=None, latency_us_per_token=None, tpot_ms=None, roofline_us_per_token=None
            )
        return out

    # ------------------------------------------------------------------ perplexity
    def eval_ppl(self, tokens: Any, window: int | None = None, prefill: int = 16) -> dict:
        """Perplexity over non-overlapping windows through the served path: each window a fresh
        sequence, a prefill of its first ``prefill`` tokens, then one decode step per token; token
        t+1 scored from the logits at t (W - 1 predictions per window), ppl = exp(mean NLL), in
        float64.  ``tokens``: 1-D (cut into len // window windows) or 2-D (one window a row).
        Windows run ``max_batch`` at a time."""
        if self.timing_only:
            raise UsageError("eval_ppl needs values: open the DecoderSession without timing_only")
        arr = np.asarray(tokens)
        if arr.ndim == 1:
            if not window or window < 2:
                raise UsageError(f"--window must be at least 2, not {window}")
            n = arr.size // window
            if n == 0:
                raise UsageError(f"{arr.size} tokens make no window of {window}")
            arr = arr[: n * window].reshape(n, window)
        elif arr.ndim == 2:
            if window is not None and window != arr.shape[1]:
                raise UsageError(
                    f"--window {window} does not match the rows of a 2-D token array ({arr.shape[1]})"
                )
            window = arr.shape[1]
        else:
            raise UsageError(f"tokens must be 1-D or 2-D, not {arr.ndim}-D")
        if window < 2 or window > self.meta.max_seq:
            raise UsageError(f"window {window} must lie in [2, max_seq {self.meta.max_seq}]")
        if not 1 <= prefill <= window - 1:
            raise UsageError(f"--prefill {prefill} must lie in [1, window - 1 = {window - 1}]")
        rows = [self._check_ids(r, f"window {i}") for i, r in enumerate(arr)]
        first = len(self.steps)
        nll: list[np.ndarray] = []
        B = self.meta.max_batch
        for g0 in range(0, len(rows), B):
            group = rows[g0 : g0 + B]
            seqs = [self.new_sequence()[0] for _ in group]  # fresh: no prefix reuse across windows
            logits = [
                [lg] for lg in self.prefill([(s, r[:prefill]) for s, r in zip(seqs, group, strict=True)])
            ]
            for t in range(prefill, window - 1):
                out = self.decode(seqs, [r[t] for r in group])
                for k in range(len(group)):
                    logits[k].append(out[k][None])
            for k, r in enumerate(group):
                nll.append(_nll(np.concatenate(logits[k]), np.asarray(r[1:])))
                self.free(seqs[k])
        flat = np.concatenate(nll)
        report = self._timing(self.steps[first:])
        report.update(
            perplexity=float(math.exp(flat.mean())),
            mean_nll=float(flat.mean()),
            windows=len(rows),
            window=window,
            prefill=prefill,
            predictions=int(flat.size),
            ttft_ms=self._ms(report["prefill_cycles"] / len(rows)),
        )
        return report
