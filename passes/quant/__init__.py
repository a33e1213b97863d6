"""Weight and activation quantization algorithms: pure numpy functions the quantization passes call.

``QuantSpec`` says how to quantize, ``QuantizedWeight`` holds the result (unpacked codes, scales,
zero points) for a (K, N) weight used as ``x @ W``; ``quantize_rtn``, ``quantize_mse``,
``quantize_awq`` and ``quantize_gptq`` produce it; the observers calibrate activation ranges.
Formulas and costs: docs/quantization.md.
"""

from .awq import DEFAULT_ALPHAS, quantize_awq, quantize_awq_gptq
from .calib import InputStats, output_error
from .core import (
    ROUNDING_MODES,
    SCALE_DTYPES,
    QuantizedWeight,
    QuantSpec,
    round_to_int,
)
from .gptq import quantize_gptq
from .observers import EmaObserver, MinMaxObserver, Observer, PercentileObserver
from .rtn import DEFAULT_MSE_GRID, quantize_mse, quantize_rtn

__all__ = [
    "DEFAULT_ALPHAS",
    "InputStats",
    "output_error",
    "quantize_awq",
    "quantize_awq_gptq",
    "quantize_gptq",
    "DEFAULT_MSE_GRID",
    "EmaObserver",
    "MinMaxObserver",
    "Observer",
    "PercentileObserver",
    "ROUNDING_MODES",
    "SCALE_DTYPES",
    "QuantSpec",
    "QuantizedWeight",
    "quantize_mse",
    "quantize_rtn",
    "round_to_int",
]
