"""Tokenize the committed English sentences into the token-id arrays MiniLM takes.

    .venv/bin/python tests/data/make_token_ids.py [--seq 48]

Reads ``minilm_calib.txt`` and ``minilm_eval.txt`` (one sentence a line) beside this file and writes
``minilm_calib.npz`` and ``minilm_eval.npz``: int64 arrays named like the model's inputs
(``input_ids``, ``attention_mask``; ``--names`` adds ``token_type_ids`` for an export that takes
it), the batch axis leading (one row per sentence, in file order) and every row padded with id 0
to ``--seq`` tokens, as ``mcp-compile --calib`` and ``mcpc check --inputs`` read them.

The tokenizer is the ``tokenizers`` package's ``BertWordPieceTokenizer`` over the committed
bert-base-uncased WordPiece vocabulary (``bert-base-uncased/vocab.txt``, lowercasing, accents
stripped, ``[CLS] ... [SEP]``): nothing is downloaded.  A sentence longer than ``--seq`` tokens is
truncated (keeping the final ``[SEP]``) and counted on stdout; the committed data has none.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
VOCAB = HERE / "bert-base-uncased" / "vocab.txt"
SETS = ("calib", "eval")
DEFAULT_SEQ = 48  # the longest committed sentence is 44 tokens
INPUT_NAMES = ("input_ids", "attention_mask")
KNOWN_NAMES = ("input_ids", "attention_mask", "token_type_ids")


def sentences(path: Path) -> list[str]:
    """The non-empty lines of ``path``, stripped."""
    return [s.strip() for s in path.read_text(encoding="utf-8").splitlines() if s.strip()]


def tokenizer(seq: int | None):
    """A lowercasing WordPiece tokenizer over the committed vocabulary; with ``seq``, padding and
    truncation to exactly ``seq`` tokens."""
    from tokenizers import BertWordPieceTokenizer

    tok = BertWordPieceTokenizer(str(VOCAB), lowercase=True)
    if seq is not None:
        tok.enable_truncation(max_length=seq)
        tok.enable_padding(length=seq, pad_id=tok.token_to_id("[PAD]"), pad_token="[PAD]")
    return tok


def token_ids(lines: list[str], seq: int, names=INPUT_NAMES) -> dict[str, np.ndarray]:
    """``{name: int64 [len(lines), seq]}`` for each of ``names`` (input_ids, attention_mask,
    token_type_ids)."""
    unknown = [n for n in names if n not in KNOWN_NAMES]
    if unknown:
        raise ValueError(f"unknown input names {unknown} (known: {', '.join(KNOWN_NAMES)})")
    enc = tokenizer(seq).encode_batch(lines)
    fields = {"input_ids": "ids", "attention_mask": "attention_mask", "token_type_ids": "type_ids"}
    return {n: np.array([getattr(e, fields[n]) for e in enc], dtype=np.int64) for n in names}


def lengths(lines: list[str]) -> list[int]:
    """Token count of each sentence, [CLS] and [SEP] included, without truncation."""
    return [len(e.ids) for e in tokenizer(None).encode_batch(lines)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=DEFAULT_SEQ, help="tokens per row (padded/truncated)")
    ap.add_argument("--names", default=",".join(INPUT_NAMES), help="arrays to write, comma-separated")
    ap.add_argument("--out-dir", type=Path, default=HERE)
    args = ap.parse_args(argv)
    names = tuple(n.strip() for n in args.names.split(",") if n.strip())
    for which in SETS:
        lines = sentences(HERE / f"minilm_{which}.txt")
        arrays = token_ids(lines, args.seq, names)
        cut = sum(n > args.seq for n in lengths(lines))
        out = args.out_dir / f"minilm_{which}.npz"
        np.savez_compressed(out, **arrays)
        print(f"{out.name}: {len(lines)} sentences x {args.seq} tokens, {cut} truncated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
