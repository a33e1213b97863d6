"""Activation range observers for calibration: MinMax, EMA and percentile.

Each observer sees batches of an activation through ``update(x)`` and answers ``qparams(bits,
symmetric)`` with one per-tensor (scale, zero_point):

* asymmetric (unsigned codes in [0, 2^bits - 1]):
  ``scale = (max - min) / (2^bits - 1)``, ``zero_point = round(-min / scale)``;
* symmetric (signed codes, zero point 0): ``scale = max(|min|, |max|) / (2^(bits-1) - 1)``.

The observed range always contains 0 (so 0 is exactly representable, and padding or masked
positions quantize exactly); a range of width 0 gives scale 1.  Rounding is ``round_to_int``
half to even.  NaNs in a batch are ignored; a batch of only NaNs or of no elements changes nothing.
"""

from __future__ import annotations

import numpy as np

from .core import F32, round_to_int


class Observer:
    """Base: a running (min, max) and the qparams formula; subclasses define how a batch moves it."""

    def __init__(self):
        self.min: float | None = None
        self.max: float | None = None
        self.batches = 0

    @staticmethod
    def _finite(x) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32).reshape(-1)
        return x[~np.isnan(x)]

    def update(self, x) -> None:
        x = self._finite(x)
        if x.size == 0:
            return
        self._observe(x)
        self.batches += 1

    def _observe(self, x: np.ndarray) -> None:
        raise NotImplementedError

    def range(self) -> tuple[float, float]:
        """The calibrated (min, max), widened to contain 0; ValueError before any data."""
        if self.min is None or self.max is None:
            raise ValueError(f"{type(self).__name__} has seen no data: calibrate before asking for qparams")
        return min(float(self.min), 0.0), max(float(self.max), 0.0)

    def qparams(self, bits: int = 8, symmetric: bool = False) -> tuple[np.float32, int]:
        """(scale, zero_point) for ``bits``-bit codes (module docstring)."""
        if not 2 <= int(bits) <= 16:
            raise ValueError(f"activation bits must be in 2..16, got {bits!r}")
        lo, hi = self.range()
        if symmetric:
            amax = max(-lo, hi)
            scale = F32(amax / ((1 << (bits - 1)) - 1)) if amax > 0 else F32(1)
            return scale, 0
        qmax = (1 << bits) - 1
        scale = F32((hi - lo) / qmax) if hi > lo else F32(1)
        zp = int(np.clip(round_to_int(np.float32(-lo) / scale), 0, qmax))
        return scale, zp


class MinMaxObserver(Observer):
    """The smallest and largest value over every batch seen."""

    def _observe(self, x):
        lo, hi = float(x.min()), float(x.max())
        self.min = lo if self.min is None else min(self.min, lo)
        self.max = hi if self.max is None else max(self.max, hi)


class EmaObserver(Observer):
    """Exponential moving average of each batch's min and max: the first batch sets them, then
    ``min = decay * min + (1 - decay) * batch_min`` (likewise max).  Each batch's min/max are taken
    with 0 included, so the range always contains 0."""

    def __init__(self, decay: float = 0.999):
        super().__init__()
        if not 0.0 <= float(decay) < 1.0:
            raise ValueError(f"EMA decay must lie in [0, 1), got {decay!r}")
        self.decay = float(decay)

    def _observe(self, x):
        lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
        if self.min is None:
            self.min, self.max = lo, hi
        else:
            d = self.decay
            self.min = d * self.min + (1.0 - d) * lo
            self.max = d * self.max + (1.0 - d) * hi


class PercentileObserver(Observer):
    """The ``100 - percentile`` and ``percentile`` percentiles of every value seen (outliers
    clipped).  Keeps at most ``max_samples`` values: when more arrive, the kept ones are thinned to
    every other one and later batches are sampled at twice the stride, so memory stays bounded, every
    batch weighs alike and the result is deterministic."""

    def __init__(self, percentile: float = 99.99, max_samples: int = 1 << 22):
        super().__init__()
        if not 50.0 < float(percentile) <= 100.0:
            raise ValueError(f"percentile must lie in (50, 100], got {percentile!r}")
        self.percentile = float(percentile)
        self.max_samples = max(2, int(max_samples))
        self._samples: list[np.ndarray] = []
        self._count = 0
        self._stride = 1

    def _observe(self, x):
        x = x[:: self._stride].copy()
        self._samples.append(x)
        self._count += x.size
        while self._count > self.max_samples:
            v = np.concatenate(self._samples)[::2]
            self._samples, self._count = [v], v.size
            self._stride *= 2
        self.min = self.max = None  # computed on demand

    def range(self) -> tuple[float, float]:
        if self._count and self.min is None:
            v = np.concatenate(self._samples)
            self._samples = [v]
            self.min = float(np.percentile(v, 100.0 - self.percentile))
            self.max = float(np.percentile(v, self.percentile))
        return super().range()
