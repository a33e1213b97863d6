"""The ONNX Runtime reference for served decoding: a decoder graph "with past" run in its own KV loop.

A with-past graph takes the new tokens and the K/V of everything before them and returns the
logits of the new tokens and the extended K/V.  Both naming conventions in use are understood:
``past_key_values.{i}.key|value`` -> ``present.{i}.key|value`` (transformers exports, with an
``attention_mask`` over past and new tokens and ``position_ids``) and ``past_key_<i>`` /
``past_value_<i>`` -> ``present_key_<i>`` / ``present_value_<i>`` (torch exports); any other naming
(torch's dynamo exporter: ``past_key_values.layers.{i}.keys`` -> ``cache.layers.{i}.keys``) is read by
structure, each present output being ``Concat(past input, new)`` (``concat_pairs``).

* ``greedy(model, prompt_ids, max_new_tokens)``: a prefill of the prompt with past length 0, then
  one token per step, feeding each step's present back as the next step's past -> the greedy ids;
* ``ort_nll(model, tokens, window, prefill=16)``: the negative log-likelihoods of eval-ppl's
  protocol (non-overlapping windows, each a fresh sequence: a prefill of the first ``prefill``
  tokens, then one decode step per token; token t+1 scored from the logits at t, so window − 1
  values per window); ``perplexity(nll) = exp(mean nll)``.

``model`` is a path or an ``OrtDecoder`` (make one to reuse its session across calls).  ONNX
Runtime runs on the CPU with graph optimizations off (plain op-by-op semantics, as ``mcpc check``
runs it).  numpy and onnxruntime only.  ``mcpc ci``'s perplexity budgets compare a decoder build's
``mcpc sim eval-ppl`` figure with ``ort_nll`` on the same windows; ``tests/llm/ort_greedy.py`` is
the command-line form (the reference figures beside ``mcpc sim generate`` / ``eval-ppl``).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

_HF_PAST = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")
_TORCH_PAST = re.compile(r"^past_(key|value)_(\d+)$")
_FLOATS = {"tensor(float)": np.float32, "tensor(float16)": np.float16}
_INTS = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}


class OrtDecoder:
    """One ONNX Runtime session over a with-past decoder graph, its structure read from the graph.

    ``kv_heads`` / ``head_dim`` are needed only when the past inputs leave those axes symbolic.
    ``optimize`` turns on ONNX Runtime's basic graph optimizations (constant folding among them:
    SmolLM2's steps get ~3x faster, its logits differ in the last bits); off by default."""

    def __init__(
        self,
        path: str | Path,
        kv_heads: int | None = None,
        head_dim: int | None = None,
        optimize: bool = False,
    ):
        import onnxruntime as ort

        self.path = Path(path)
        opts = ort.SessionOptions()
        level = ort.GraphOptimizationLevel
        opts.graph_optimization_level = level.ORT_ENABLE_BASIC if optimize else level.ORT_DISABLE_ALL
        opts.log_severity_level = 3
        self.session = ort.InferenceSession(str(self.path), opts, providers=["CPUExecutionProvider"])
        ins = {i.name: i for i in self.session.get_inputs()}
        outs = [o.name for o in self.session.get_outputs()]
        past: dict[tuple[int, str], str] = {}
        for name in ins:
            if m := _HF_PAST.match(name):
                past[(int(m.group(1)), m.group(2))] = name
            elif m := _TORCH_PAST.match(name):
                past[(int(m.group(2)), m.group(1))] = name
        if past:
            self.layers = len(past) // 2
            want = {(i, kv) for i in range(self.layers) for kv in ("key", "value")}
            if set(past) != want:
                raise ValueError(
                    f"{self.path}: past_key_values.<i>.key|value or past_key_<i> / past_value_<i> inputs "
                    "not for every layer 0..n-1: not a decoder graph with past"
                )
            self.past_names = [past[(i, kv)] for i in range(self.layers) for kv in ("key", "value")]
            self.present_names = []
            for name in self.past_names:
                hf = _HF_PAST.match(name)
                cand = f"present.{hf.group(1)}.{hf.group(2)}" if hf else name.replace("past_", "present_", 1)
                if cand not in outs:
                    raise ValueError(f"{self.path}: input {name} has no present output {cand}")
                self.present_names.append(cand)
        else:
            pairs = concat_pairs(self.path)
            if not pairs or len(pairs) % 2:
                raise ValueError(
                    f"{self.path}: no past_key_values.<i>.key|value or past_key_<i> / past_value_<i> inputs "
                    "and no graph output that is Concat(past input, new) of a graph input: not a decoder "
                    "graph with past"
                )
            self.layers = len(pairs) // 2
            self.past_names = [p for p, _ in pairs]
            self.present_names = [q for _, q in pairs]
        rest = [o for o in outs if o not in self.present_names]
        self.logits_name = "logits" if "logits" in rest else (rest[0] if len(rest) == 1 else None)
        if self.logits_name is None:
            raise ValueError(f"{self.path}: cannot tell the logits among the outputs {rest}")
        if "input_ids" not in ins:
            raise ValueError(f"{self.path}: no input_ids input")
        if ins["input_ids"].type not in _INTS:
            raise ValueError(f"{self.path}: input_ids is {ins['input_ids'].type}, not int64 or int32")
        self.ids_dtype = _INTS[ins["input_ids"].type]
        self.has_mask = "attention_mask" in ins
        self.has_positions = "position_ids" in ins
        first = ins[self.past_names[0]]
        if first.type not in _FLOATS:
            raise ValueError(f"{self.path}: {first.name} is {first.type}, not float or float16")
        self.kv_dtype = _FLOATS[first.type]
        # a dim named by its number ("2": torch's dynamo exporter writes fixed dims of inputs so) is fixed
        shape = [int(d) if isinstance(d, str) and d.isdigit() else d for d in first.shape]
        self.kv_heads = shape[1] if isinstance(shape[1], int) else kv_heads
        self.head_dim = shape[3] if isinstance(shape[3], int) else head_dim
        if self.kv_heads is None or self.head_dim is None:
            raise ValueError(f"{self.path}: {first.name} {shape} has symbolic heads/head_dim; pass them")
        self.vocab = None  # known after the first run

    def run(
        self,
        ids: np.ndarray,
        past: list[np.ndarray] | None,
        past_len: int,
        mask: np.ndarray | None = None,
        positions: np.ndarray | None = None,
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """One call: ``ids`` [batch, seq] new tokens at positions past_len .. past_len + seq − 1 after
        ``past`` (None: past length 0) -> (logits [batch, seq, vocab], present K/V in layer order).
        ``mask`` [batch, past_len + seq] and ``positions`` [batch, seq] replace the all-ones mask and
        the positions past_len.. (a left-padded batch: ``greedy_left_padded``); a graph without that
        input ignores them."""
        ids = np.asarray(ids)
        b, s = ids.shape
        if past is None:
            if past_len != 0:
                raise ValueError("past is None but past_len is not 0")
            past = [np.zeros((b, self.kv_heads, 0, self.head_dim), self.kv_dtype) for _ in self.past_names]
        feeds = {"input_ids": ids.astype(self.ids_dtype)}
        if self.has_mask:
            feeds["attention_mask"] = np.ones((b, past_len + s), np.int64) if mask is None else mask
        if self.has_positions:
            pos = np.arange(past_len, past_len + s, dtype=np.int64)
            feeds["position_ids"] = np.broadcast_to(pos, (b, s)).copy() if positions is None else positions
        feeds.update(zip(self.past_names, past, strict=True))
        out = self.session.run([self.logits_name, *self.present_names], feeds)
        self.vocab = out[0].shape[-1]
        return out[0], out[1:]


def concat_pairs(path: str | Path) -> list[tuple[str, str]]:
    """The (past input, present output) pairs of the with-past graph at ``path`` read by structure
    (``mcpc.ir.decoder_graph.concat_pairs``; torch's dynamo exporter through transformers:
    ``past_key_values.layers.{i}.keys`` -> ``cache.layers.{i}.keys``).  Reads the graph only (no
    weights)."""
    import onnx

    from mcpc.ir.decoder_graph import concat_pairs as pairs_of

    return pairs_of(onnx.load(str(path), load_external_data=False).graph)


def _decoder(model: str | Path | OrtDecoder) -> OrtDecoder:
    return model if isinstance(model, OrtDecoder) else OrtDecoder(model)


def greedy(
    model: str | Path | OrtDecoder,
    prompt_ids,
    max_new_tokens: int,
    return_margins: bool = False,
):
    """ONNX Runtime's greedy continuation of ``prompt_ids`` (1-D): a prefill of the prompt with past
    length 0, then one token per step.  With ``return_margins``, also each step's top-1 minus
    top-2 logit (how safely the choice is made)."""
    dec = _decoder(model)
    prompt = [int(t) for t in np.asarray(prompt_ids).reshape(-1)]
    if not prompt:
        raise ValueError("empty prompt")
    tokens: list[int] = []
    margins: list[float] = []
    ids, past, past_len = np.array([prompt]), None, 0
    for _ in range(max_new_tokens):
        logits, past = dec.run(ids, past, past_len)
        past_len += ids.shape[1]
        last = logits[0, -1].astype(np.float64)
        nxt = int(np.argmax(last))
        top2 = np.partition(last, -2)[-2:]
        tokens.append(nxt)
        margins.append(float(top2[1] - top2[0]))
        ids = np.array([[nxt]])
    return (tokens, margins) if return_margins else tokens


def greedy_left_padded(
    model: str | Path | OrtDecoder, prompts, max_new_tokens: int, pad_id: int = 0
) -> list[list[int]]:
    """ONNX Runtime's greedy continuations of several prompts run as one batch, the way Hugging
    Face's ``generate`` batches them: each prompt left-padded with ``pad_id`` to the longest, an
    ``attention_mask`` 0 on the pads, ``position_ids`` the running count of real tokens minus one
    (1 on the pads, as transformers sets them), then one step of the whole batch a token.  Every
    row runs all ``max_new_tokens`` steps.  The graph must take ``attention_mask``."""
    dec = _decoder(model)
    if not dec.has_mask:
        raise ValueError(f"{dec.path}: no attention_mask input: a left-padded batch cannot be masked")
    rows = [[int(t) for t in np.asarray(p).reshape(-1)] for p in prompts]
    if not rows or not all(rows):
        raise ValueError("no prompts, or an empty one")
    width = max(map(len, rows))
    ids = np.array([[pad_id] * (width - len(r)) + r for r in rows], np.int64)
    mask = np.array([[0] * (width - len(r)) + [1] * len(r) for r in rows], np.int64)
    pos = np.where(mask == 1, np.cumsum(mask, 1) - 1, 1)
    out: list[list[int]] = [[] for _ in rows]
    past, past_len = None, 0
    for _ in range(max_new_tokens):
        logits, past = dec.run(ids, past, past_len, mask=mask, positions=pos)
        past_len += ids.shape[1]
        nxt = logits[:, -1].astype(np.float64).argmax(-1)
        for k, t in enumerate(nxt):
            out[k].append(int(t))
        ids = nxt[:, None].astype(np.int64)
        pos = pos[:, -1:] + 1
        mask = np.concatenate([mask, np.ones((len(rows), 1), np.int64)], 1)
    return out


def windows(tokens, window: int | None) -> np.ndarray:
    """eval-ppl's windows: a 1-D array cut into ⌊n / window⌋ rows (the rest dropped), or a 2-D array
    taken as one window a row."""
    t = np.asarray(tokens)
    if t.ndim == 1:
        if window is None or window < 2:
            raise ValueError(f"1-D tokens need a window length of at least 2, got {window}")
        n = t.size // window
        if n == 0:
            raise ValueError(f"{t.size} tokens make no window of {window}")
        return t[: n * window].reshape(n, window)
    if t.ndim == 2:
        if window is not None and window != t.shape[1]:
            raise ValueError(f"tokens of shape {t.shape} are windows of {t.shape[1]}, not {window}")
        return t
    raise ValueError(f"tokens must be 1-D or 2-D, got shape {t.shape}")


def _nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """−log softmax(logits)[target] in f64; logits [..., vocab], targets [...]."""
    x = logits.astype(np.float64)
    m = x.max(-1, keepdims=True)
    lse = m[..., 0] + np.log(np.exp(x - m).sum(-1))
    return lse - np.take_along_axis(x, targets[..., None], -1)[..., 0]


def ort_nll(
    model: str | Path | OrtDecoder,
    tokens,
    window: int | None = None,
    prefill: int = 16,
    batch: int | None = None,
) -> np.ndarray:
    """Per-position NLL [windows, W − 1] of eval-ppl's protocol under ONNX Runtime.

    Each window is a fresh sequence: a prefill of its first ``prefill`` tokens (past length 0), then
    one decode step per token up to W − 2; entry t is −log p(token t+1 | tokens ≤ t).  ``batch``
    windows run together as rows of one call (default: all of them; rows are independent, so the
    result equals one window at a time up to ONNX Runtime's batched rounding)."""
    dec = _decoder(model)
    w = windows(tokens, window)
    n, width = w.shape
    if not 1 <= prefill < width:
        raise ValueError(f"prefill {prefill} must be in [1, window {width})")
    batch = n if batch is None else batch
    out = np.empty((n, width - 1), np.float64)
    for lo in range(0, n, batch):
        rows = w[lo : lo + batch]
        logits, past = dec.run(rows[:, :prefill], None, 0)
        out[lo : lo + len(rows), :prefill] = _nll(logits, rows[:, 1 : prefill + 1])
        for t in range(prefill, width - 1):
            logits, past = dec.run(rows[:, t : t + 1], past, t)
            out[lo : lo + len(rows), t] = _nll(logits[:, 0], rows[:, t + 1])
    return out


def perplexity(nll: np.ndarray) -> float:
    """exp(mean NLL)."""
    return float(np.exp(np.mean(nll)))
