"""The committed English calibration and evaluation data of the quantization accuracy harness
(tests/data): the bert-base-uncased WordPiece vocabulary is the published file, the two sentence
sets are large enough, disjoint and free of near-duplicates, and the committed token ids are what
a fresh tokenization of the text gives."""

from __future__ import annotations

import hashlib
import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest

DATA = Path(__file__).resolve().parents[1] / "data"
# sha256 of bert-base-uncased's vocab.txt as published with the model (231 508 bytes, 30 522 lines)
VOCAB_SHA256 = "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"


def _load_maker():
    spec = importlib.util.spec_from_file_location("make_token_ids", DATA / "make_token_ids.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


maker = _load_maker()


def test_vocab_is_the_published_bert_base_uncased_file():
    raw = (DATA / "bert-base-uncased" / "vocab.txt").read_bytes()
    assert hashlib.sha256(raw).hexdigest() == VOCAB_SHA256
    lines = raw.decode("utf-8").split("\n")[:-1]
    assert len(lines) == 30522
    assert [lines[i] for i in (0, 100, 101, 102, 103)] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    licence = (DATA / "bert-base-uncased" / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in licence and "Version 2.0" in licence


def _words(s: str) -> set[str]:
    return set(re.findall(r"[a-z0-9']+", s.lower()))


def test_sentence_sets_are_large_disjoint_and_varied():
    calib = maker.sentences(DATA / "minilm_calib.txt")
    evals = maker.sentences(DATA / "minilm_eval.txt")
    assert len(calib) >= 256 and len(evals) >= 64
    assert len(set(calib)) == len(calib) and len(set(evals)) == len(evals)
    assert not set(calib) & set(evals)
    # no near-duplicates anywhere: word-set Jaccard similarity of any two sentences stays below 0.5
    every = [_words(s) for s in calib + evals]
    for i, a in enumerate(every):
        for b in every[i + 1 :]:
            assert len(a & b) / len(a | b) < 0.5
    lengths = maker.lengths(calib + evals)
    assert min(lengths) <= 12 and max(lengths) >= 35  # short and long sentences both present


@pytest.mark.parametrize("which", maker.SETS)
def test_committed_token_ids_equal_a_fresh_tokenization(which):
    lines = maker.sentences(DATA / f"minilm_{which}.txt")
    with np.load(DATA / f"minilm_{which}.npz") as z:
        committed = {k: z[k] for k in z.files}
    assert sorted(committed) == sorted(maker.INPUT_NAMES)
    seq = committed["input_ids"].shape[1]
    fresh = maker.token_ids(lines, seq)
    for name, arr in fresh.items():
        assert committed[name].dtype == np.int64 and committed[name].shape == (len(lines), seq)
        np.testing.assert_array_equal(committed[name], arr, err_msg=name)
    assert max(maker.lengths(lines)) <= seq  # nothing was truncated
    ids, mask = committed["input_ids"], committed["attention_mask"]
    np.testing.assert_array_equal(mask, (ids != 0).astype(np.int64))  # padding is id 0, mask 0
    assert (ids[:, 0] == 101).all() and ids.max() < 30522  # [CLS] first, ids inside the vocabulary
    assert ((ids == 102).sum(axis=1) == 1).all()  # one [SEP] per sentence


def test_tokenizer_splits_words_into_wordpieces():
    enc = maker.tokenizer(None).encode("The Tokenizer splits Embeddings, Héllo")
    assert enc.tokens == ["[CLS]", "the", "token", "##izer", "splits", "em", "##bed", "##ding", "##s", ",",
                          "hello", "[SEP]"]  # fmt: skip
