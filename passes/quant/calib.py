"""Statistics of a linear layer's input that the data-aware algorithms need, accumulated batch by batch.

For inputs ``x`` of shape (..., K) feeding ``x @ W``: the second moment ``H = E[x^T x]`` (K, K) —
the Hessian of the layer's squared output error, up to a factor 2 — and the mean magnitude per
input channel ``E|x_k|`` (K,).  GPTQ reads ``H``; AWQ reads both.  Accumulating lets a pass feed
calibration batches one at a time instead of holding every activation.
"""

from __future__ import annotations

import numpy as np


class InputStats:
    """Running ``sum x^T x``, ``sum |x|`` and the row count for one layer input of width K."""

    # Rows are buffered and folded into the f64 sums this many at a time: a calibration batch of a
    # few dozen tokens would otherwise pay the (K, K) f64 accumulation for every batch.
    FLUSH_ROWS = 2048

    def __init__(self, k: int):
        self.k = int(k)
        self._xtx = np.zeros((self.k, self.k), np.float64)
        self._abs = np.zeros(self.k, np.float64)
        self._pending: list[np.ndarray] = []
        self._pending_rows = 0
        self.rows = 0

    @classmethod
    def of(cls, x) -> InputStats:
        """Stats of one array of inputs (..., K); an ``InputStats`` is returned as is."""
        if isinstance(x, InputStats):
            return x
        x = np.asarray(x)
        if x.ndim < 1:
            raise ValueError("calibration inputs must have a last axis of the layer's input width K")
        s = cls(x.shape[-1])
        s.update(x)
        return s

    def update(self, x) -> None:
        x = np.asarray(x, dtype=np.float32)
        if x.shape[-1] != self.k:
            raise ValueError(f"calibration inputs have width {x.shape[-1]}, the layer takes K = {self.k}")
        x = x.reshape(-1, self.k)
        if not np.all(np.isfinite(x)):
            raise ValueError("calibration inputs hold NaN or infinity")
        self._pending.append(x)
        self._pending_rows += x.shape[0]
        self.rows += x.shape[0]
        if self._pending_rows >= self.FLUSH_ROWS:
            self._flush()

    def _flush(self) -> None:
        """Fold the buffered rows into the sums (one f32 product of all of them, added in f64)."""
        if not self._pending:
            return
        x = self._pending[0] if len(self._pending) == 1 else np.concatenate(self._pending)
        self._pending, self._pending_rows = [], 0
        self._xtx += (x.T @ x).astype(np.float64)
        self._abs += np.abs(x).sum(axis=0, dtype=np.float64)

    def _need_rows(self):
        if self.rows == 0:
            raise ValueError("no calibration inputs were seen for this layer")
        self._flush()

    @property
    def hessian(self) -> np.ndarray:
        """E[x^T x], (K, K) f64."""
        self._need_rows()
        return self._xtx / self.rows

    @property
    def mean_abs(self) -> np.ndarray:
        """E|x_k|, (K,) f64."""
        self._need_rows()
        return self._abs / self.rows


def output_error(w: np.ndarray, w_q: np.ndarray, hessian: np.ndarray) -> float:
    """E ||x W - x W_q||^2 = trace(dW^T H dW) over the calibration rows (per row, summed over N)."""
    d = np.asarray(w, np.float64) - np.asarray(w_q, np.float64)
    return float(np.sum((hessian @ d) * d))
