"""The quantization accuracy section of ``make bench`` (``measure_quant_accuracy``): skipped by
--quick, --cases and --no-quant (the full run is the MiniLM report that
tests/quant/test_minilm_accuracy.py checks)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import run as bench_run  # noqa: E402


@pytest.mark.parametrize("flags", [["--quick"], ["--cases", "mlp"], ["--no-quant"]])
def test_quant_section_is_skipped_on_request(flags):
    args = bench_run.parse_args([*flags])
    assert bench_run.measure_quant_accuracy(args) is None


def test_quant_section_reports_why_without_the_model(monkeypatch):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "quant"))
    import minilm_eval

    def missing():
        raise LookupError("install the models extra")

    monkeypatch.setattr(minilm_eval.MINILM.__class__, "path", lambda self: missing())
    report = bench_run.measure_quant_accuracy(bench_run.parse_args([]))
    assert report == {"skipped": "install the models extra"}
