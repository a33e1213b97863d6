"""The quantization accuracy of MiniLM-L3 (the real fixture) on the committed English sentences.

    .venv/bin/python tests/quant/minilm_eval.py [--target mcp2026-a100] [--configs a,b]
                                               [--json out/quant-eval.json] [--markdown out/quant-eval.md]

Builds the fp16 reference build and every shipped quantization config of issue 9
(``QUANT_CONFIGS``; those not shipped are listed as missing) with the calibration token ids of
``tests/data/minilm_calib.npz``, and ``qat_w4a16`` also without them, as shipped; runs each on the
simulator over the 80 evaluation sentences (``tests/data/minilm_eval.npz``, one batch) beside
ONNX Runtime fp32 and ONNX Runtime's MatMulNBitsQuantizer (RTN, block 32, symmetric and
asymmetric), and prints the table of ``mcpc.quant_eval``.  ``make quant-eval`` runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "real_models"))

from real_model import MINILM  # noqa: E402

from mcpc.fileio import read_npz, write_atomic  # noqa: E402
from mcpc.qat_configs import shipped_configs  # noqa: E402
from mcpc.quant_eval import Build, evaluate, render  # noqa: E402

DATA = HERE.parent / "data"
CALIB = DATA / "minilm_calib.npz"
EVAL = DATA / "minilm_eval.npz"
OUTPUT = "461"  # the mean-pooled sentence embedding
QUANT_CONFIGS = ("qat_w4a16", "qat_mixed", "qat_int4_fp8", "qat_gptq_g128")


def _shown(path: Path) -> Path:
    """``path`` relative to the working directory (as reports record it: no machine's absolute
    paths in committed results), or as it is when that cannot be said."""
    try:
        return Path(os.path.relpath(path))
    except ValueError:  # another drive
        return path


UNCALIBRATED = ("qat_w4a16",)  # as shipped it compiles without calibration data too


def builds(configs=QUANT_CONFIGS) -> tuple[list[Build], list[str]]:
    """The builds to evaluate (fp16 first) and the requested configs that are not shipped."""
    shipped = {Path(n).stem for n in shipped_configs()}
    present = [c for c in configs if c in shipped]
    calib = _shown(CALIB)
    out = [Build("fp16")] + [Build(c, calib) for c in present]
    out += [Build(c) for c in present if c in UNCALIBRATED]
    return out, [c for c in configs if c not in shipped]


def run(configs=QUANT_CONFIGS, target: str = "mcp2026-a100") -> dict:
    """The report of ``mcpc.quant_eval.evaluate`` for MiniLM, plus ``missing`` configs."""
    todo, missing = builds(configs)
    report = evaluate(MINILM.path(), read_npz(EVAL), todo, target=target, output=OUTPUT)
    report["missing"] = missing
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="mcp2026-a100")
    ap.add_argument("--configs", default=",".join(QUANT_CONFIGS), help="comma-separated QAT config names")
    ap.add_argument("--json", dest="json_path", type=Path)
    ap.add_argument("--markdown", type=Path)
    args = ap.parse_args(argv)
    try:
        MINILM.path()
    except LookupError as e:
        raise SystemExit(str(e)) from None
    report = run(tuple(c.strip() for c in args.configs.split(",") if c.strip()), args.target)
    text = render(report)
    if report["missing"]:
        text += f"\n\nnot shipped (not measured): {', '.join(report['missing'])}"
    print(text)
    if args.json_path:
        write_atomic(args.json_path, json.dumps(report, indent=2) + "\n")
    if args.markdown:
        write_atomic(args.markdown, text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
