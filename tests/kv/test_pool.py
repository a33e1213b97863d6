"""The pool layout of a compressing decoder build (``mcpc.kv.pool``): every block ``store_kv_block``
can produce fits its slot, whatever the settings and values; descriptors and their tags."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcpc.kv import AttentionStats, KvSettings, store_kv_block
from mcpc.kv.pool import COMPRESSED, block_name, descriptor, max_block_bytes, pool_layout, slot_offset, untag

DTYPES = {"f16": np.float16, "f32": np.float32, "bf16": ml_dtypes.bfloat16}


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 64),
    head_dim=st.sampled_from([1, 16, 63, 64, 80, 128]),
    act=st.sampled_from(sorted(DTYPES)),
    quant=st.sampled_from(["fp16", "int8"]),
    policy=st.sampled_from(["none", "topk_magnitude", "topk_entropy", "heavy_hitter"]),
    ratio=st.sampled_from([0.0, 0.5, 0.95]),
    scale=st.sampled_from([1e-6, 1.0, 1e4]),
    seed=st.integers(0, 1000),
)
def test_every_stored_block_fits_its_slot(rows, head_dim, act, quant, policy, ratio, scale, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((2, rows, head_dim)) * scale).astype(DTYPES[act])
    if seed % 7 == 0:
        x[0, 0, 0] = np.nan  # kept unquantized: the largest kind of block
    s = KvSettings(quant=quant, policy=policy, sparsity_ratio=ratio if policy != "none" else 0.0)
    heat, entropy = rng.random((2, rows)), rng.random(2)
    stats = AttentionStats(heat=heat, head_entropy=entropy, first_position=0, seq_len=rows)
    for b in store_kv_block(x, s, 0, stats):
        assert b.nbytes <= max_block_bytes(rows, head_dim, np.dtype(DTYPES[act]).itemsize)


def test_slots_and_descriptor_tags():
    lay = pool_layout(layers=3, kv_heads=2, kv_blocks=5, head_dim=64, act_bytes=2)
    assert lay["slot_bytes"] == max_block_bytes(64, 64, 2) == 8208  # 4 + 8192 + 3 + 1, rounded to 16
    assert lay["pool_bytes"] == 5 * 3 * 2 * 2 * 8208 and lay["desc_bytes"] == 16 * 3 * 2 * 2 * 6
    offsets = {slot_offset(b, la, k, h, 3, 2, 8208) for b in range(5) for la in range(3) for k in (0, 1)
               for h in range(2)}  # fmt: skip
    assert len(offsets) == 60 and max(offsets) + 8208 == lay["pool_bytes"]  # disjoint, within the pool
    d = descriptor(0x1_2345_6789, 777, COMPRESSED, 1, 5, 29)
    assert int(d[0]) | int(d[1]) << 32 == 0x1_2345_6789 and int(d[2]) == 777
    assert untag(int(d[3])) == (COMPRESSED, 1, 5, 29)
    assert block_name(4, int(d[3])) == "4 (layer 29 V head 5)"


@pytest.mark.parametrize("head_dim", [16, 64, 128])
def test_the_slot_is_at_most_a_few_bytes_above_the_plain_block(head_dim):
    assert 0 < max_block_bytes(64, head_dim, 2) - 64 * head_dim * 2 <= 32
