"""A paged KV cache in module state: writing new K/V rows to their cache slots, and attention of
query rows over the blocks of their sequence.

The cache of one layer is a pair of ``global``s (``ir/ops_state.py``), K and V, each
``tensor<[H * P, D] x dtype>`` for H KV heads: head ``h`` owns rows ``[h·P, (h+1)·P)``, and inside
them slot ``s`` (``s = block · block_size + offset``) is row ``h·P + s``.  ``P`` is a whole number
of blocks.  The host (a KV manager) owns the block tables and passes, per call, which slot each
new token writes and which blocks each query row reads — the layout vLLM's paged attention uses.

* ``mcp.kv_store new, slot {global}`` — ``new`` [B, H, S, D], ``slot`` i32 [B·S]: for every
  (b, h, t), row ``h·P + slot[b·S + t]`` of the global becomes ``new[b, h, t]``.
* ``mcp.paged_attention q, gather, start, length, nblocks {k_global, v_global, kv_heads, scale,
  block_size}`` — ``q`` [B, Hq, S, D], ``gather`` i32 [G] block ids, ``start``/``length`` i32 [B·S],
  ``nblocks`` a scalar (a host register) ≤ G: the blocks in use.  For KV head ``kh`` the gathered
  buffer is ``Gk[j·block_size + o] = K[kh·P + gather[j]·block_size + o]`` for j < nblocks (V alike);
  query head ``hq`` reads KV head ``hq // (Hq / kv_heads)``; row ``r = b·S + t`` attends
  ``[start[r], start[r] + length[r])`` of the gathered buffer (``numerics.attention_rows``; length 0
  gives zeros).  A slot, block id or window outside its range is a run-time error (the simulator
  traps): the indices are data, so no compile-time proof covers them.

With ``heat_global`` set (decoder builds whose KV policy or dynamic window needs it,
``ir/decoder_import.enable_attention_heat``) ``mcp.paged_attention`` also writes the attention
heat of the call into that f32 global ``[rows, Hq]``: for gathered position ``j < nblocks ·
block_size`` and query head ``hq``, row ``heat_row + j`` column ``hq`` = the sum over the call's
query rows of head ``hq`` of the probability they give position j (0 where no window reaches;
rows from ``nblocks · block_size`` on are left as they were) — ``numerics.attention_rows``'s
``heat``.  The op then has a side effect and is never removed.

What the ops need from the module (that the globals exist, agree with each other and with the
operands) is checked by ``ir/state.py``.
"""

from __future__ import annotations

from mcpc.ir.core import Attr
from mcpc.ir.dtypes import I32
from mcpc.ir.ops_state import StateOp, _check_scalar


def _check_index(t, n: int, what: str) -> None:
    if t.dtype != I32 or t.shape != (n,):
        raise ValueError(f"{what} must be tensor<{n}xi32>, got {t}")


class KVStoreOp(StateOp):
    """``mcp.kv_store new, slot {global}``: scatter the rows of ``new`` [B, H, S, D] to their slots
    (``slot`` i32 [B·S]) in each head's part of the cache global.  No result; never removed."""

    name = "mcp.kv_store"
    NUM_OPERANDS = 2
    NUM_RESULTS = 0
    HAS_SIDE_EFFECTS = True
    ATTRS = {"global": Attr("str", doc="the cache global written (K or V of one layer)")}

    @classmethod
    def infer_types(cls, operand_types, attrs):
        new, slot = operand_types
        if new.rank != 4:
            raise ValueError(f"the new rows must be [batch, heads, seq, head_dim], got {new}")
        b, _, s, _ = new.shape
        _check_index(slot, b * s, "the slots")
        return []


class PagedAttentionOp(StateOp):
    """``mcp.paged_attention q, gather, start, length, nblocks {k_global, v_global, kv_heads, scale,
    block_size = 64}`` -> [B, Hq, S, D] in q's dtype: each query row's attention over the rows of its
    sequence in the paged K/V cache (see the module docstring)."""

    name = "mcp.paged_attention"
    NUM_OPERANDS = 5
    ATTRS = {
        "k_global": Attr("str"),
        "v_global": Attr("str"),
        "kv_heads": Attr("int"),
        "scale": Attr("float"),
        "block_size": Attr("int", 64),
        "heat_global": Attr("str", "", doc="f32 global receiving the attention heat ('' = none)"),
        "heat_row": Attr("int", 0, doc="the global's row of gathered position 0 (this layer's part)"),
    }

    @property
    def HAS_SIDE_EFFECTS(self) -> bool:  # noqa: N802 (the attribute dce reads)
        return bool(self.attrs.get("heat_global"))

    @classmethod
    def infer_types(cls, operand_types, attrs):
        q, gather, start, length, nblocks = operand_types
        if q.rank != 4 or not q.dtype.is_float:
            raise ValueError(f"q must be a float [batch, q_heads, seq, head_dim], got {q}")
        b, hq, s, _ = q.shape
        kv = int(attrs.get("kv_heads", 0))
        if kv < 1 or hq % kv:
            raise ValueError(f"kv_heads {kv} must be >= 1 and divide the {hq} query heads")
        if int(attrs.get("block_size", 64)) < 1:
            raise ValueError("block_size must be >= 1")
        if gather.dtype != I32 or gather.rank != 1:
            raise ValueError(f"the block ids must be a rank-1 i32 tensor, got {gather}")
        _check_index(start, b * s, "the window starts")
        _check_index(length, b * s, "the window lengths")
        _check_scalar(nblocks, "the block count")
        return [q]
