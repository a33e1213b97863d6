"""``kvcomp``: the functional semantics of KV-block compression on the NPU, and the host runtime's
way of issuing it (docs/isa.md, docs/kv-cache.md "Who writes what").

The instruction compresses one layer's K or V of one 64-token block, every KV head, with the one
implementation in ``mcpc.kv`` (``value_mask`` then ``encode_heads``, what ``store_kv_block`` does):
it reads the block's unrounded rows (those of earlier calls from the head's pool slot, where it
appended them; the new ones from the plain view, where ``scatter`` wrote them), and writes the
rounded rows back into the view, the slot (the unrounded rows of a block being filled, or the
stored bytes of a full one, CRC-8 last) and the head's descriptor.  What needs host state comes in
the descriptor the host wrote before: the slot's address, ``topk_entropy``'s per-head budget
(word 2) and ``heavy_hitter``'s token choice (a u64 after the slot's rows).

``run_kvcomp`` is how ``sim/kv_store.py`` issues a call's ``kvcomp``s: after the call, on the ST
queue, one after another (independent blocks: each starts when the previous one leaves the engine
and the DRAM channel).  The step is charged the sum of their busy cycles.  Their completion latency
(the DRAM latency of the last write) is not added: the next call reads the cache only through a
``kvdecomp`` that waits for the ``scatter`` of its own new rows, which follows a DRAM load of the
embedding row and of the first layer's weights, so at least one DRAM latency passes between the
next call's start and its first read of what ``kvcomp`` wrote (an assumption stated in
docs/timing.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from mcpc.arch.dtypes import NUMPY_DTYPES
from mcpc.arch.isa import Instr

from .machine import Fault, Machine, dram_rows

POLICY_NAMES = ("none", "topk_magnitude", "topk_entropy", "heavy_hitter")
BLOCK_TOKENS = 64
MASK_BYTES = 8  # heavy_hitter's token choice: a u64 after the slot's rows, bit r = row r


def geometry(row_bytes: int, kv_dtype: str) -> tuple[int, int]:
    """(values a row D, element size) of a ``kvcomp``/``kvdecomp`` block row."""
    esize = NUMPY_DTYPES[kv_dtype].itemsize
    return row_bytes // (BLOCK_TOKENS * esize), esize


def check_fields(f: Any) -> str | None:
    """Why the fields of a ``kvcomp`` are illegal (None when they are not)."""
    if f.kv_dtype not in ("f16", "f32", "bf16"):
        return f"kvcomp with kv_dtype {f.kv_dtype} (f16, f32 or bf16 only)"
    d, esize = geometry(f.row_bytes, f.kv_dtype)
    if d < 1 or f.row_bytes != BLOCK_TOKENS * d * esize:
        return f"kvcomp row_bytes {f.row_bytes} is not 64 rows of {f.kv_dtype} values"
    if not 1 <= f.tokens <= BLOCK_TOKENS or f.lo >= f.tokens:
        return f"kvcomp tokens {f.tokens}, lo {f.lo}: need 0 <= lo < tokens <= 64"
    if f.block >= f.limit or f.heads < 1:
        return f"kvcomp block {f.block} outside [0, limit {f.limit}) or heads {f.heads} < 1"
    if f.ratio >= 10**6 or f.tol == 0:
        return f"kvcomp ratio {f.ratio} (millionths, below 10^6) or tol {f.tol} (millionths, above 0)"
    return None


def execute(m: Machine, f: Any) -> tuple[list[int], list[int]]:
    """Run one ``kvcomp`` (fields ``f``, already checked by ``check_fields``) on ``m``: returns each
    head's stored bytes and how many rows it wrote back into the view (for the cost).  Raises Fault
    naming the block when a descriptor is not plain or an address leaves DRAM."""
    from mcpc.kv import encode_heads, load_kv_block, value_mask
    from mcpc.kv.codec import KIND_CODES
    from mcpc.kv.pool import COMPRESSED, PLAIN, block_name, descriptor, untag

    d, esize = geometry(f.row_bytes, f.kv_dtype)
    dtype = NUMPY_DTYPES[f.kv_dtype]
    heads, limit, b, lo, n = f.heads, f.limit, f.block, f.lo, f.tokens
    entries = [f.desc + 16 * (h * limit + b) for h in range(heads)]
    descs = [[int(w) for w in dram_rows(m, e, 1, 16, 16)[0].view("<u4")] for e in entries]
    views = [f.dram + (h * limit + b) * f.row_bytes for h in range(heads)]
    x = np.empty((heads, n, d), dtype)
    token_rows = np.zeros((heads, n), bool)
    budgets = np.zeros(heads, np.int64)
    policy = POLICY_NAMES[f.policy] if f.full else "none"
    for h, (a_lo, a_hi, word2, word) in enumerate(descs):
        if word & 0xFF != PLAIN:
            raise Fault(f"kvcomp: KV block {block_name(b, word)}: descriptor kind {word & 0xFF}, not plain")
        slot = a_lo | a_hi << 32
        if lo:
            x[h, :lo] = _read(m, slot, lo * d * esize).view(dtype).reshape(lo, d)
        x[h, lo:] = _read(m, views[h] + lo * d * esize, (n - lo) * d * esize).view(dtype).reshape(n - lo, d)
        if policy == "heavy_hitter":
            bits = int(_read(m, slot + f.row_bytes, MASK_BYTES).view("<u8")[0])
            token_rows[h] = [(bits >> r) & 1 for r in range(n)]
        budgets[h] = word2
    mask = value_mask(x, policy, f.ratio / 1e6 if policy == "topk_magnitude" else 0.5, token_rows, budgets)
    stored = encode_heads(x, mask, "int8" if f.quant else "fp16", f.tol / 1e6)
    writes, sizes, rewritten = [], [], []
    for h, s in enumerate(stored):
        kind_tag = KIND_CODES[s.kind] + 1
        first = lo if (lo and not f.full and descs[h][2] >> 24 == kind_tag) else 0
        rows = np.ascontiguousarray(load_kv_block(s, f.kv_dtype)[first:], dtype).view(np.uint8).reshape(-1)
        writes.append((h, first, rows, s, kind_tag))
        sizes.append(s.nbytes)
        rewritten.append(n - first)
    for h, first, rows, s, kind_tag in writes:  # everything was read above: now write
        a_lo, a_hi, _, word = descs[h]
        slot = a_lo | a_hi << 32
        _write(m, views[h] + first * d * esize, rows)
        _, kv, head, layer = untag(word)
        if f.full:
            _write(m, slot, np.frombuffer(s.data, np.uint8))
            entry = descriptor(slot, s.nbytes, COMPRESSED, kv, head, layer)
        else:
            _write(m, slot + lo * d * esize, np.ascontiguousarray(x[h, lo:n]).view(np.uint8).reshape(-1))
            entry = np.array([a_lo, a_hi, s.nbytes | kind_tag << 24, word], np.uint32)
        _write(m, entries[h], entry.astype("<u4").view(np.uint8))
    return sizes, rewritten


def _read(m: Machine, addr: int, n: int) -> np.ndarray:
    return dram_rows(m, addr, 1, n, n)[0] if n else np.zeros(0, np.uint8)


def _write(m: Machine, addr: int, data: np.ndarray) -> None:
    if data.size:
        dram_rows(m, addr, 1, data.size, data.size)[0][...] = data


def nominal(f: Any) -> tuple[list[int], list[int]]:
    """What a timing-only run charges for ``kvcomp`` (no values to compress): each head's stored
    bytes from ``nominal_block_bytes`` (INT8 passing its check, ...: docs/kv-cache.md) and the rows
    written back as when the stored kind does not change."""
    from mcpc.kv import KvSettings, nominal_block_bytes

    d, _ = geometry(f.row_bytes, f.kv_dtype)
    policy = POLICY_NAMES[f.policy] if f.full else "none"
    settings = KvSettings(
        quant="int8" if f.quant else "fp16",
        policy=policy,
        sparsity_ratio=f.ratio / 1e6 if policy != "none" else 0.0,
    )
    sizes = nominal_block_bytes(settings, 0, f.heads, f.tokens, d, f.kv_dtype)
    rows = f.tokens if f.full or f.lo == 0 else f.tokens - f.lo
    return sizes, [rows] * f.heads


def run_kvcomp(session: Any, instrs: Sequence[Instr], timing_only: bool) -> dict:
    """Execute ``instrs`` (``kvcomp``s the host issues after a call) on ``session``'s machine, or only
    cost them in a timing-only run; returns their cycles and DRAM bytes (module docstring)."""
    from .execute import compile_instr
    from .timing import instr_cost

    target = session.program.target
    machine = None if timing_only else session._machine
    busy = latency = read = write = 0
    for i in instrs:
        fn, args, _ = compile_instr(i, target)
        if timing_only:
            from .execute import timing_twin

            fn = timing_twin(fn)
        fn(machine, args)
        c = args[-1][0] if args else instr_cost(i, target)
        busy += c.busy
        latency = c.tail
        read += c.dram_read
        write += c.dram_write
    return {
        "cycles": busy,
        "latency_cycles": latency,
        "dram_read_bytes": read,
        "dram_write_bytes": write,
        "instructions": len(instrs),
    }
