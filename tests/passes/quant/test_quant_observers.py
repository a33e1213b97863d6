"""Activation observers: EMA behaviour, min/max, percentile, and the qparams formula."""

from __future__ import annotations

import numpy as np
import pytest

from mcpc.passes.quant import EmaObserver, MinMaxObserver, PercentileObserver


def test_ema_first_batch_initialises_then_moves_by_decay():
    obs = EmaObserver(decay=0.9)
    obs.update(np.array([-2.0, 3.0]))
    assert obs.range() == (-2.0, 3.0)
    obs.update(np.array([-12.0, 13.0]))
    assert obs.range() == pytest.approx((0.9 * -2 + 0.1 * -12, 0.9 * 3 + 0.1 * 13))
    obs.update(np.array([np.nan]))  # nothing seen: no change
    assert obs.batches == 2


def test_ema_default_decay_and_range_contains_zero():
    obs = EmaObserver()
    assert obs.decay == 0.999
    obs.update(np.array([1.0, 2.0]))  # all positive: the range starts at 0
    assert obs.range() == (0.0, 2.0)
    obs.update(np.array([3.0, 4.0]))
    lo, hi = obs.range()
    assert lo == 0.0 and hi == pytest.approx(0.999 * 2 + 0.001 * 4)
    neg = EmaObserver()
    neg.update(np.array([-5.0, -1.0]))
    assert neg.range() == (-5.0, 0.0)
    scale, zp = neg.qparams(8, symmetric=False)
    assert zp == 255 and scale == np.float32(5 / 255)


def test_ema_refuses_bad_decay_and_no_data():
    with pytest.raises(ValueError, match="decay"):
        EmaObserver(decay=1.0)
    with pytest.raises(ValueError, match="no data"):
        EmaObserver().qparams(8)


def test_minmax_qparams_formula():
    obs = MinMaxObserver()
    obs.update(np.array([[-1.0, 0.5]]))
    obs.update(np.array([2.0, -0.25]))
    scale, zp = obs.qparams(8, symmetric=False)
    assert scale == np.float32(3.0 / 255)
    assert zp == round(1.0 / float(scale))  # round(-min / scale) = 85
    scale_s, zp_s = obs.qparams(8, symmetric=True)
    assert scale_s == np.float32(2.0 / 127) and zp_s == 0
    z = MinMaxObserver()
    z.update(np.zeros(4))
    assert z.qparams(4) == (np.float32(1.0), 0)


def test_zero_point_rounds_half_to_even():
    obs = MinMaxObserver()
    obs.update(np.array([-0.5, 14.5]))  # scale 1, -min/scale = 0.5 -> 0 (even)
    assert obs.qparams(4) == (np.float32(1.0), 0)
    obs = MinMaxObserver()
    obs.update(np.array([-1.5, 13.5]))  # 1.5 -> 2
    assert obs.qparams(4) == (np.float32(1.0), 2)


def test_percentile_clips_outliers():
    rng = np.random.default_rng(0)
    obs = PercentileObserver(percentile=99.0, max_samples=5000)
    mm = MinMaxObserver()
    for _ in range(20):
        x = rng.standard_normal(1000)
        x[0] = 1000.0
        obs.update(x)
        mm.update(x)
    lo, hi = obs.range()
    assert 1.8 < hi < 3.0 and -3.0 < lo < -1.8  # ~ +-2.33 for a unit normal
    assert mm.range()[1] == 1000.0
    assert obs._count <= 5000
