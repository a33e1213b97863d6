"""The entry point: one layer block of K or V -> stored blocks per head -> values back."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcpc.errors import InternalError
from mcpc.kv import AttentionStats, KVBlockCorrupt, KvSettings, keep_count, load_kv_block, store_kv_block
from mcpc.kv.quant import dequantize_rows, quantize_rows


def _stats(heads, rows, rng):
    return AttentionStats(head_entropy=rng.random(heads), heat=rng.random((heads, rows)), seq_len=rows)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 3),
    st.integers(1, 64),
    st.sampled_from([16, 64, 96]),
    st.sampled_from(["f16", "f32"]),
    st.sampled_from(["fp16", "int8"]),
    st.sampled_from(["none", "topk_magnitude", "topk_entropy", "heavy_hitter"]),
    st.integers(0, 2**16),
)
def test_store_then_load(heads, rows, cols, act, quant, policy, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((heads, rows, cols)) * 3).astype(np.float16 if act == "f16" else np.float32)
    s = KvSettings(quant=quant, policy=policy, sparsity_ratio=0.7 if policy != "none" else 0.0)
    stored = store_kv_block(x, s, layer=0, stats=_stats(heads, rows, rng))
    assert len(stored) == heads
    kept_total = 0
    for h, b in enumerate(stored):
        y = load_kv_block(b, act, f"layer 0 K head {h} block 0")
        assert y.shape == (rows, cols) and y.dtype == x.dtype
        assert (b.rows, b.cols) == (rows, cols) and b.nbytes == len(b.data)
        assert b.density == b.kept / (rows * cols)
        kept = y != 0
        kept_total += b.kept
        if quant == "fp16":  # unquantized: the kept values exactly, the others 0
            assert b.kind == act and not b.fp16_retained and b.quant_error is None
            assert (y[kept] == x[h][kept]).all() and int(kept.sum()) <= b.kept
        else:
            assert b.kind == "int8" and not b.fp16_retained and b.quant_error < s.quant_tol
            err = np.abs(y.astype(np.float64) - x[h]).max(where=kept, initial=0.0)
            assert err <= 0.0084 * np.abs(x[h].astype(np.float64)).max()
    if policy in ("topk_magnitude", "topk_entropy"):
        per_tile = sum(keep_count(rows * min(64, cols - c), 0.7) for c in range(0, cols, 64))
        if policy == "topk_magnitude":
            assert kept_total == heads * per_tile
        else:
            assert kept_total == keep_count(heads * rows * cols, 0.7)
    elif policy == "heavy_hitter":
        assert kept_total == heads * max(keep_count(rows, 0.7), min(rows, 16)) * cols
    else:
        assert kept_total == heads * rows * cols


def test_a_block_failing_the_check_is_retained_unquantized():
    x = np.ones((2, 64, 64), np.float16)
    x[1, 5, 7] = np.inf  # not finite: quantization error is not finite
    x[0, 3, 3] = np.nan
    tiny = (np.random.default_rng(0).standard_normal((1, 64, 64)) * 1e-7).astype(np.float32)
    for block, kind in ((x, "f16"), (tiny, "f32")):  # tiny: fp16 scales are subnormal, error > 0.02
        stored = store_kv_block(block, KvSettings(quant="int8"), layer=4)
        for h, b in enumerate(stored):
            assert b.fp16_retained and b.kind == kind and not b.quant_error < 0.02
            y = load_kv_block(b, kind)
            assert y.tobytes() == block[h].tobytes()  # stored as is, NaN and inf included
    big = np.ones((1, 64, 64), np.float16)
    big[0, 0, 0] = np.float16(3e4)
    ok = store_kv_block(big, KvSettings(quant="int8"), layer=0)[0]
    assert ok.kind == "int8" and ok.quant_error < 0.02  # row-wise scales absorb the outlier row
    tight = store_kv_block(big, KvSettings(quant="int8", quant_tol=1e-5), layer=0)[0]
    assert tight.fp16_retained and tight.quant_error == ok.quant_error


def test_int8_blocks_are_smaller_than_fp16_ones():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 64, 64)).astype(np.float16)
    f16 = sum(b.nbytes for b in store_kv_block(x, KvSettings(), 0))
    i8 = sum(b.nbytes for b in store_kv_block(x, KvSettings(quant="int8"), 0))
    assert f16 == 3 * (4 + 1 + 8192 + 1) and i8 == 3 * (4 + 64 * 3 + 1 + 4096 + 1)
    assert f16 / i8 >= 1.85
    sparse = store_kv_block(x, KvSettings(quant="int8", policy="topk_magnitude", sparsity_ratio=0.7), 0)
    assert [b.tiles for b in sparse] == [("bitmap",)] * 3
    assert sum(b.nbytes for b in sparse) == 3 * (4 + 192 + 1 + 512 + 1229 + 1)
    very = store_kv_block(x, KvSettings(quant="int8", policy="topk_magnitude", sparsity_ratio=0.95), 0)
    assert [b.tiles for b in very] == [("coords",)] * 3 and all(b.density < 0.125 for b in very)


def test_per_layer_ratios():
    s = KvSettings(policy="topk_magnitude", sparsity_ratio=0.7, per_layer={0: 0.0, 2: 0.5})
    assert (s.ratio(0), s.ratio(1), s.ratio(2)) == (0.0, 0.7, 0.5)
    x = np.random.default_rng(0).standard_normal((1, 64, 64)).astype(np.float32)
    assert [store_kv_block(x, s, layer)[0].kept for layer in range(3)] == [4096, 1229, 2048]
    assert KvSettings(sparsity_ratio=0.7).ratio(1) == 0.0  # no policy, nothing dropped
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        KvSettings(policy="topk_magnitude", per_layer={3: 1.0})


def test_policies_without_their_statistics_are_an_internal_error():
    x = np.ones((2, 64, 16), np.float16)
    with pytest.raises(InternalError, match="topk_entropy policy needs"):
        store_kv_block(x, KvSettings(policy="topk_entropy", sparsity_ratio=0.7), layer=1)
    with pytest.raises(InternalError, match="heavy_hitter policy needs"):
        store_kv_block(x, KvSettings(policy="heavy_hitter", sparsity_ratio=0.7), layer=1)
    with pytest.raises(InternalError, match="f16, f32 or bf16"):
        store_kv_block(x.astype(np.int32), KvSettings(), layer=1)
    with pytest.raises(InternalError, match=r"1..64 rows"):
        store_kv_block(np.ones((2, 65, 16), np.float16), KvSettings(), layer=1)
    with pytest.raises(ValueError, match="quant_tol must be > 0"):
        KvSettings(quant="int8", quant_tol=0)


def test_all_zero_block_and_bf16():
    z = np.zeros((1, 10, 64), np.float16)
    b = store_kv_block(z, KvSettings(quant="int8", policy="topk_magnitude", sparsity_ratio=0.7), 0)[0]
    assert b.kind == "int8" and b.quant_error == 0.0 and (load_kv_block(b, "f16") == 0).all()
    import ml_dtypes

    x = np.linspace(-2, 2, 64 * 8).reshape(1, 64, 8).astype(ml_dtypes.bfloat16)
    b = store_kv_block(x, KvSettings(), 0)[0]
    assert b.kind == "bf16" and load_kv_block(b).tobytes() == x[0].tobytes()


def test_load_refuses_a_corrupt_block_naming_it():
    x = np.random.default_rng(1).standard_normal((1, 64, 64)).astype(np.float16)
    b = store_kv_block(x, KvSettings(quant="int8"), 0)[0]
    bad = bytearray(b.data)
    bad[100] ^= 0x10
    with pytest.raises(KVBlockCorrupt, match="KV block layer 2 V head 0 block 5: CRC-8 mismatch"):
        load_kv_block(bytes(bad), "f16", "layer 2 V head 0 block 5")


def test_int8_load_uses_the_quant_kernels():
    x = np.random.default_rng(2).standard_normal((1, 64, 32)).astype(np.float16)
    b = store_kv_block(x, KvSettings(quant="int8"), 0)[0]
    assert load_kv_block(b, "f16").tobytes() == dequantize_rows(quantize_rows(x[0]), "f16").tobytes()


def test_settings_json_round_trip():
    import json

    s = KvSettings("int8", 0.01, "heavy_hitter", 0.6, {2: 0.5, 0: 0.0}, 8, True, 32)

    data = json.loads(json.dumps(s.to_json()))
    assert data["per_layer"] == {"0": 0.0, "2": 0.5}
    assert KvSettings.from_json(data) == s and KvSettings.from_json(KvSettings().to_json()) == KvSettings()
    assert s.compresses and not KvSettings().compresses and KvSettings(quant="int8").compresses
    assert not KvSettings(policy="topk_magnitude").compresses  # a policy with ratio 0 drops nothing
    with pytest.raises(ValueError, match="unknown KV settings"):
        KvSettings.from_json({**data, "bits": 8})


def _attention(q, k, v):
    s = q.astype(np.float64) @ k.astype(np.float64).T / np.sqrt(q.shape[1])
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ v.astype(np.float64)


def test_int8_kv_barely_moves_attention_and_sparsity_moves_it_more():
    """What the compressed cache costs where it is used: attention over 4 blocks (256 positions) of
    K/V read back from their stored blocks, against the fp16 values (normwise relative error of the
    output)."""
    rng = np.random.default_rng(5)
    k = rng.standard_normal((256, 64)).astype(np.float16)
    v = rng.standard_normal((256, 64)).astype(np.float16)
    q = (rng.standard_normal((8, 64)) * 2).astype(np.float16)  # logits of std 2
    exact = _attention(q, k, v)

    def error(settings):
        blocks = [
            np.concatenate(
                [
                    load_kv_block(store_kv_block(x[None, j : j + 64], settings, 0)[0], "f16")
                    for j in range(0, 256, 64)
                ]
            )  # fmt: skip
            for x in (k, v)
        ]
        got = _attention(q, *blocks)
        return np.linalg.norm(got - exact) / np.linalg.norm(exact)

    int8 = error(KvSettings(quant="int8"))
    sparse = error(KvSettings(quant="int8", policy="topk_magnitude", sparsity_ratio=0.7))
    # about 1 % here (an attention output averages V, so its norm is small next to a weight's
    # error); dropping 70 % of K and V element-wise by magnitude costs far more (about 85 %)
    assert int8 < 2e-2 and sparse > 10 * int8


@settings(max_examples=80, deadline=None)
@given(
    st.integers(1, 64),
    st.sampled_from([8, 64, 100, 128]),
    st.sampled_from(["f16", "f32"]),
    st.sampled_from(["fp16", "int8"]),
    st.sampled_from(["none", "topk_magnitude", "topk_entropy", "heavy_hitter"]),
    st.sampled_from([0.0, 0.5, 0.7, 0.9, 0.95, 0.99]),
    st.integers(0, 2**16),
)
def test_nominal_block_bytes_match_what_is_stored(rows, cols, act, quant, policy, ratio, seed):
    """The size a timing-only run charges: what store_kv_block produces (int8 passing, an even
    entropy split, no recent token), coordinate tiles within one byte per delta of 128 elements."""
    from mcpc.kv.store import nominal_block_bytes

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, rows, cols)).astype(np.float16 if act == "f16" else np.float32)
    s = KvSettings(quant=quant, policy=policy, sparsity_ratio=ratio if policy != "none" else 0.0)
    stats = AttentionStats(head_entropy=np.ones(2), heat=rng.random((2, rows)), seq_len=10**6)
    stored = store_kv_block(x, s, 0, stats)
    nominal = nominal_block_bytes(s, 0, 2, rows, cols, act)
    assert len(nominal) == len(stored)
    for b, want in zip(stored, nominal, strict=True):
        assert not b.fp16_retained
        if "coords" in b.tiles:
            slack = sum(min(b.kept, rows * 64 // 128) for _ in b.tiles)
            assert abs(b.nbytes - want) <= slack
        else:
            assert b.nbytes == want
