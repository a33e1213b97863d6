"""MSE, AWQ and GPTQ: each beats RTN on the objective it optimises, and degenerates to RTN where it must."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcpc.passes.quant import (
    InputStats,
    QuantSpec,
    output_error,
    quantize_awq,
    quantize_awq_gptq,
    quantize_gptq,
    quantize_mse,
    quantize_rtn,
)


def _problem(k=128, n=64, t=2048, seed=0):
    """Correlated inputs with channel magnitudes spread over ~e^+-2 (outlier channels), a small weight."""
    rng = np.random.default_rng(seed)
    mix = rng.standard_normal((k, k)) / np.sqrt(k)
    mags = np.exp(rng.standard_normal(k))
    x = ((rng.standard_normal((t, k)) @ mix + 0.3 * rng.standard_normal((t, k))) * mags).astype(np.float32)
    w = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
    return w, x


SPECS = [QuantSpec(4, 32, True, "f16"), QuantSpec(4, 32, False, "f16"), QuantSpec(3, 0, False, "f32")]


@pytest.mark.parametrize("spec", SPECS, ids=["sym-g32", "asym-g32", "asym3-perchannel"])
def test_gptq_beats_rtn_on_calibration_output_error(spec):
    w, x = _problem()
    stats = InputStats.of(x)
    h = stats.hessian
    rtn = output_error(w, quantize_rtn(w, spec).dequantize(), h)
    plain = output_error(w, quantize_gptq(w, stats, spec).dequantize(), h)
    q = quantize_gptq(w, stats, spec, desc_act=True).dequantize()
    act = output_error(w, q, h)
    assert plain < 0.85 * rtn
    assert act < 0.75 * rtn
    # the measured output error is what trace(dW^T H dW) says
    direct = np.mean(np.sum((x.astype(np.float64) @ (w - q)) ** 2, axis=1))
    assert output_error(w, q, h) == pytest.approx(direct, rel=1e-4)


def test_gptq_clip_search_lowers_the_output_error():
    w, x = _problem(k=128, n=48, t=1024)
    stats = InputStats.of(x)
    spec = QuantSpec(4, 32, False, "f16")
    for desc_act in (False, True):
        full = quantize_gptq(w, stats, spec, desc_act=desc_act, clip_grid=(1.0,))
        searched = quantize_gptq(w, stats, spec, desc_act=desc_act)
        assert np.any(searched.scales != full.scales)
        e_full = output_error(w, full.dequantize(), stats.hessian)
        assert output_error(w, searched.dequantize(), stats.hessian) < 0.95 * e_full


def test_gptq_act_order_keeps_static_natural_groups():
    w, x = _problem(k=96, n=40)
    spec = QuantSpec(4, 32, False, "f16")
    q = quantize_gptq(w, x, spec, desc_act=True, block=32, clip_grid=(1.0,))
    h = InputStats.of(x).hessian
    np.testing.assert_array_equal(q.perm, np.argsort(-np.diag(h), kind="stable"))
    rtn = quantize_rtn(w, spec)  # static groups: the natural groups' parameters of the original weight
    np.testing.assert_array_equal(q.scales, rtn.scales)
    np.testing.assert_array_equal(q.zero_points, rtn.zero_points)
    assert q.codes.shape == w.shape and q.codes.max() <= 15
    assert quantize_gptq(w, x, spec).perm is None


def test_gptq_with_uncorrelated_inputs_is_rtn():
    """A diagonal Hessian passes no error between rows: GPTQ must give RTN's codes exactly."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((70, 20)).astype(np.float32)
    h = np.diag(rng.uniform(0.5, 2.0, 70))
    h[5, 5] = 0.0  # a channel never active
    for spec in SPECS:
        for desc_act in (False, True):
            q = quantize_gptq(w, None, spec, desc_act=desc_act, hessian=h, block=16, clip_grid=(1.0,))
            r = quantize_rtn(w, spec)
            np.testing.assert_array_equal(q.codes, r.codes)
            np.testing.assert_array_equal(q.scales, r.scales)


def test_gptq_hessian_argument_and_blocking_agree():
    w, x = _problem(k=64, n=24, t=512)
    spec = QuantSpec(4, 16, False, "f32")
    a = quantize_gptq(w, x, spec, block=128)
    b = quantize_gptq(w, None, spec, hessian=InputStats.of(x).hessian, block=128)
    c = quantize_gptq(w, InputStats.of(x), spec, block=8)
    np.testing.assert_array_equal(a.codes, b.codes)
    # lazy block updates change only the order of float additions
    assert np.mean(a.codes != c.codes) < 0.01


def test_gptq_refuses_bad_input():
    w = np.zeros((8, 4), np.float32)
    with pytest.raises(ValueError, match="calibration inputs or a Hessian"):
        quantize_gptq(w, None, QuantSpec())
    with pytest.raises(ValueError, match=r"\(8, 8\)"):
        quantize_gptq(w, None, QuantSpec(), hessian=np.eye(7))
    with pytest.raises(ValueError, match="width 5"):
        quantize_gptq(w, np.ones((3, 5)), QuantSpec())


@pytest.mark.parametrize("spec", SPECS, ids=["sym-g32", "asym-g32", "asym3-perchannel"])
def test_awq_beats_rtn_and_its_scale_is_applied_to_x(spec):
    w, x = _problem()
    stats = InputStats.of(x)
    q, s = quantize_awq(w, stats, spec)
    assert s.shape == (w.shape[0],) and np.all(s > 0)
    # the pass stores Q(diag(s) W) and feeds x / s: that product approximates x @ W
    y = (x / s) @ q.dequantize()
    err_awq = np.mean(np.sum((y.astype(np.float64) - x.astype(np.float64) @ w) ** 2, axis=1))
    err_rtn = output_error(w, quantize_rtn(w, spec).dequantize(), stats.hessian)
    assert err_awq < 0.9 * err_rtn
    # a larger scale on the channels with the larger inputs
    mags = np.abs(x).mean(axis=0)
    assert np.corrcoef(np.log(s), np.log(mags))[0, 1] > 0.99


def test_awq_then_gptq_beats_each_alone():
    w, x = _problem(k=128, n=64, t=2048)
    stats = InputStats.of(x)
    spec = QuantSpec(4, 32, False, "f16")
    q, s = quantize_awq_gptq(w, stats, spec)
    assert q.algorithm == "awq+gptq" and q.perm is not None
    both = output_error(w, q.dequantize() / s[:, None], stats.hessian)
    gptq = output_error(w, quantize_gptq(w, stats, spec, desc_act=True).dequantize(), stats.hessian)
    qa, sa = quantize_awq(w, stats, spec)
    awq = output_error(w, qa.dequantize() / sa[:, None], stats.hessian)
    assert both < 0.95 * min(gptq, awq)


def test_awq_shared_input_weights_split_by_columns():
    """Q, K, V after one LayerNorm share one s: quantize them side by side, split the columns."""
    w, x = _problem(k=64, n=48, t=512)
    spec = QuantSpec(4, 32, True, "f16")
    q, s = quantize_awq(w, x, spec)
    parts = [q.columns(0, 16), q.columns(16, 40), q.columns(40, 48)]
    assert [p.codes.shape for p in parts] == [(64, 16), (64, 24), (64, 8)]
    np.testing.assert_array_equal(np.concatenate([p.dequantize() for p in parts], axis=1), q.dequantize())
    assert all(p.algorithm == "awq" and p.spec == spec for p in parts)


def test_awq_with_alpha_zero_and_no_clip_is_rtn():
    w, x = _problem(k=64, n=16, t=256)
    spec = QuantSpec(4, 32, False, "f16")
    q, s = quantize_awq(w, x, spec, alphas=(0.0,), clip_grid=(1.0,))
    np.testing.assert_array_equal(s, np.ones(64, np.float32))
    r = quantize_rtn(w, spec)
    np.testing.assert_array_equal(q.codes, r.codes)
    np.testing.assert_array_equal(q.scales, r.scales)


@pytest.mark.parametrize("spec", SPECS + [QuantSpec(8, 64, True, "bf16", "half_away")])
def test_mse_never_worse_than_rtn_per_group(spec):
    rng = np.random.default_rng(2)
    w = rng.laplace(size=(100, 30)).astype(np.float32)  # heavy tails: clipping pays
    m, r = quantize_mse(w, spec), quantize_rtn(w, spec)
    g = spec.group_len(100)
    groups = -(-100 // g)
    pad = groups * g - 100

    def group_err(q):
        d = np.concatenate([q.dequantize() - w, np.zeros((pad, 30), np.float32)])
        return np.square(d).reshape(groups, g, 30).sum(axis=1)

    assert np.all(group_err(m) <= group_err(r))
    if spec.bits <= 4:  # at 8 bits a 2 % clip costs more than it saves: the full range stays
        assert group_err(m).sum() < 0.97 * group_err(r).sum()
    assert m.algorithm == "mse" and m.codes.min() >= spec.qmin and m.codes.max() <= spec.qmax


def test_mse_refuses_bad_grid():
    with pytest.raises(ValueError, match="grid"):
        quantize_mse(np.ones((4, 4)), QuantSpec(), grid=(1.2,))


@settings(max_examples=40, deadline=None)
@given(
    spec=st.builds(
        QuantSpec,
        bits=st.integers(2, 8),
        group_size=st.sampled_from([0, 5, 16, 32]),
        symmetric=st.booleans(),
        scale_dtype=st.sampled_from(["f32", "f16", "bf16"]),
        rounding=st.sampled_from(["half_even", "half_away"]),
    ),
    k=st.integers(1, 40),
    n=st.integers(1, 6),
    desc_act=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_data_aware_results_are_well_formed(spec, k, n, desc_act, seed):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((k, n)).astype(np.float32)
    w[rng.random((k, n)) < 0.2] = 0.0
    x = rng.standard_normal((16, k)).astype(np.float32)
    x[:, rng.random(k) < 0.2] = 0.0  # channels never active
    groups = spec.groups(k)
    g = spec.group_len(k)
    for q in (
        quantize_gptq(w, x, spec, desc_act=desc_act, block=7),
        quantize_awq(w, x, spec)[0],
        quantize_mse(w, spec),
    ):
        assert q.codes.shape == (k, n) and q.codes.dtype == spec.code_dtype
        assert q.codes.min() >= spec.qmin and q.codes.max() <= spec.qmax
        assert q.scales.shape == (groups, n)
        s = q.scales.astype(np.float32)
        assert np.all(np.isfinite(s)) and np.all(s != 0)
        assert (q.zero_points is None) == spec.symmetric
        assert np.all(np.isfinite(q.dequantize()))
    q = quantize_gptq(w, x, spec, desc_act=desc_act, block=7)
    if desc_act:
        assert sorted(q.perm.tolist()) == list(range(k))
    # GPTQ moves not-yet-quantized rows to absorb earlier errors, so its codes need not be within a
    # step of the original weight; the clipping search's are (the weight it rounds is the original)
    m = quantize_mse(w, spec)
    se = np.abs(np.repeat(m.scales.astype(np.float32), g, axis=0)[:k])
    assert np.all(np.abs(m.dequantize() - w) <= (2**spec.bits) * se + 1e-6)
    _, s = quantize_awq(w, x, spec)
    assert s.shape == (k,) and np.all(s > 0) and np.all(np.isfinite(s))


def test_input_stats_buffer_small_batches_and_flush_on_read():
    """Many small updates (buffered, folded in FLUSH_ROWS at a time) give the statistics of one big
    update; reading them mid-way flushes and later updates keep accumulating."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((5000, 24)).astype(np.float32)
    whole = InputStats.of(x)
    parts = InputStats(24)
    for i in range(0, 3000, 50):
        parts.update(x[i : i + 50])
    mid = parts.hessian.copy()
    np.testing.assert_allclose(mid, InputStats.of(x[:3000]).hessian, rtol=1e-5, atol=1e-6)
    for i in range(3000, 5000, 50):
        parts.update(x[i : i + 50])
    assert parts.rows == whole.rows == 5000
    np.testing.assert_allclose(parts.hessian, whole.hessian, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(parts.mean_abs, whole.mean_abs, rtol=1e-6)
