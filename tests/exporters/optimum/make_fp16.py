"""Make the committed fp16 Hugging Face Optimum export ``llama-optimum-fp16.onnx`` (run by hand).

Run in the Optimum venv, from the repository root::

    $(tests/exporters/venv.sh optimum) tests/exporters/optimum/make_fp16.py [--out DIR]

The llama of ``make_fixtures.py`` (``tests/llm/make_decoders.py``'s config and seeded weights,
saved with ``save_pretrained``) exported by Optimum's ``main_export`` with ``dtype="fp16"`` - what
``optimum-cli export onnx --dtype fp16 --task text-generation-with-past`` runs: the model loaded
with ``torch_dtype=torch.float16``, so the weights, the past/present K/V and the logits are
float16 (the ids, mask and positions stay int64).  ``fp16.json`` records the versions, the file's
inputs, outputs and op types, and ONNX Runtime's greedy continuations (``mcpc/ort_decoder.py``'s
loop) of the llama prompt of ``tests/llm/decoders/decoders.json`` and the 11-token prompt, with
each step's top-1 margin (how far fp16 rounding is from flipping a choice); ``README.fp16.md`` the
same as text.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_fixtures as mf  # noqa: E402  (the llama folder, describe, save, versions)

from mcpc.ort_decoder import OrtDecoder, greedy  # noqa: E402

NAME = "llama-optimum-fp16.onnx"


def export_fp16(folder: Path, out: Path) -> Path:
    from optimum.exporters.onnx import main_export

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        main_export(str(folder), output=str(out), task="text-generation-with-past", opset=mf.OPSET,
                    dtype="fp16", do_validation=False)  # fmt: skip
    return out / "model.onnx"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).parent)
    out = ap.parse_args(argv).out
    out.mkdir(parents=True, exist_ok=True)
    prompt = json.loads((mf.ROOT / "tests" / "llm" / "decoders" / "decoders.json").read_text())["models"]
    prompt = prompt["llama"]["prompt"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        dst = out / NAME
        mf.save(export_fp16(mf.decoder_folder("llama", tmp), tmp / "fp16"), dst)
    dec = OrtDecoder(dst)
    entry = mf.describe(dst) | {"task": "text-generation-with-past", "dtype": "fp16", "family": "llama"}
    for key, p, n in (("", prompt, mf.NEW_TOKENS), ("11", mf.PROMPT11, 20)):
        ids, margins = greedy(dec, p, n, return_margins=True)
        entry |= {f"prompt{key}": p, f"greedy{key}": ids, f"min_margin{key}": round(min(margins), 4)}
    record = {"versions": mf._versions(), "opset": mf.OPSET, "seed": mf.md.SEED, "files": {NAME: entry}}
    (out / "fp16.json").write_text(json.dumps(record, indent=1) + "\n")
    v = record["versions"]
    ops = ", ".join(f"{k} {c}" for k, c in entry["op_types"].items())
    io = "; ".join(f"`{x['name']}` {x['dtype']} [{', '.join(map(str, x['dims']))}]"
                   for x in entry["inputs"] + entry["outputs"])  # fmt: skip
    (out / "README.fp16.md").write_text(
        "# Hugging Face Optimum fp16 export (generated — do not edit)\n\n"
        "Written by `tests/exporters/optimum/make_fp16.py` with "
        + ", ".join(f"{k} {x}" for k, x in v.items())
        + f'; opset {mf.OPSET}; `main_export(..., dtype="fp16")` of the llama of `make_fixtures.py`.\n\n'
        f"`{NAME}` ({entry['kib']} KiB): {io}.\n\nOp types: {ops}.\n\n"
        f"ONNX Runtime's greedy ids (`fp16.json`): min top-1 margin {entry['min_margin']} (llama prompt, "
        f"{mf.NEW_TOKENS} tokens), {entry['min_margin11']} (11-token prompt, 20 tokens).\n"
    )
    print(f"wrote {NAME}: greedy {entry['greedy']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
