"""Calibration of a decoder build (``mcp-compile --max-seq N --calib TOKENS``): the input statistics
of every quantized matmul, collected by ONNX Runtime on the ORIGINAL graph with past.

A decoder build's module has two entries (``prefill``, ``decode``) over a paged KV cache, which the
reference interpreter cannot run from token ids alone; the matmuls' inputs are the same in the
original graph.  Each calibration window is one full-sequence call of that graph (past length 0,
``attention_mask`` all ones, ``position_ids`` 0..W-1), which ONNX Runtime runs with the input of
every MatMul/Gemm node added as a graph output; each input is folded into an ``InputStats``
(E[x^T x], E|x|) keyed by the node's name, which is the IR matmul's ``loc``.  The quantize-weights
pass reads them from ``ctx.notes["calibration_stats"]`` instead of running the interpreter.

The tokens: a ``.npy`` of token ids, 2-D [windows, W] (one window a row) or 1-D (one window), or an
``.npz`` holding ``input_ids`` in either shape (the single-graph builds' calibration format; other
arrays are refused: attention mask and positions are derived).  Ids must lie in the vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mcpc.errors import InputError


@dataclass(frozen=True)
class DecoderCalibration:
    """Per matmul (ONNX node name = IR loc) its ``InputStats``; ``source`` and ``samples`` (windows)
    for the report, ``tokens`` the total token count."""

    stats: dict
    source: str
    samples: int
    tokens: int


def load_tokens(path: str | Path) -> np.ndarray:
    """[windows, W] int64 token ids from ``path`` (.npy or .npz with ``input_ids``)."""
    path = Path(path)
    if path.is_dir():
        raise InputError(
            f"{path}: a decoder build (--max-seq) takes one .npy of token ids (or an .npz holding "
            "input_ids) as --calib, not a directory"
        )
    try:
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as z:
                extra = sorted(set(z.files) - {"input_ids"})
                if "input_ids" not in z.files or extra:
                    raise InputError(
                        f"{path}: a decoder build's calibration data is input_ids alone (token ids, "
                        f"[windows, W]); the file holds {', '.join(sorted(z.files)) or 'nothing'}"
                    )
                ids = z["input_ids"]
        else:
            ids = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: cannot read calibration token ids: {exc}") from None
    if ids.ndim == 1:
        ids = ids[None, :]
    if ids.ndim != 2 or ids.shape[0] == 0 or ids.shape[1] < 1 or not np.issubdtype(ids.dtype, np.integer):
        raise InputError(
            f"{path}: calibration token ids must be integers shaped (W,) or (windows, W), got "
            f"{ids.dtype} {tuple(ids.shape)}"
        )
    return ids.astype(np.int64)


def collect_decoder_stats(
    model_path: str | Path, tokens_path: str | Path, names: set[str]
) -> DecoderCalibration:
    """Run the graph with past in ``model_path`` on each window of ``tokens_path`` (past length 0)
    with ONNX Runtime and return the ``InputStats`` of the first input of each MatMul/Gemm node
    named in ``names``."""
    import onnx
    import onnxruntime as ort
    from onnx import helper

    from mcpc.ort_decoder import OrtDecoder
    from mcpc.passes.quant import InputStats

    ids = load_tokens(tokens_path)
    dec = OrtDecoder(model_path)  # reads the past/present structure (and refuses a graph without)
    model = onnx.load(str(model_path))
    wanted: dict[str, list[str]] = {}
    for node in model.graph.node:
        if node.op_type in ("MatMul", "Gemm") and node.name in names:
            wanted.setdefault(node.input[0], []).append(node.name)
    have = {o.name for o in model.graph.output}
    # the activations are in the graph's float dtype, the past K/V's
    elem = onnx.TensorProto.FLOAT16 if dec.kv_dtype == np.float16 else onnx.TensorProto.FLOAT
    for tensor in wanted:
        if tensor not in have:
            model.graph.output.append(helper.make_tensor_value_info(tensor, elem, None))
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    del model
    tensors = list(wanted)
    per_tensor: dict[str, InputStats] = {}
    vocab = None
    for row in ids:
        w = row.size
        feeds = {"input_ids": row[None, :].astype(dec.ids_dtype)}
        if dec.has_mask:
            feeds["attention_mask"] = np.ones((1, w), np.int64)
        if dec.has_positions:
            feeds["position_ids"] = np.arange(w, dtype=np.int64)[None]
        for name in dec.past_names:
            feeds[name] = np.zeros((1, dec.kv_heads, 0, dec.head_dim), dec.kv_dtype)
        if vocab is not None and (row.min() < 0 or row.max() >= vocab):
            raise InputError(f"{tokens_path}: token id {int(row.max())} is outside the vocabulary ({vocab})")
        try:
            outs = session.run([dec.logits_name, *tensors], feeds)
        except Exception as exc:  # noqa: BLE001 - ONNX Runtime's errors name the failing node
            raise InputError(
                f"{tokens_path}: ONNX Runtime could not run {model_path} on a calibration window: {exc}"
            ) from None
        vocab = outs[0].shape[-1]
        for tensor, arr in zip(tensors, outs[1:], strict=True):
            a = np.asarray(arr, np.float32).reshape(-1, arr.shape[-1])
            per_tensor.setdefault(tensor, InputStats(a.shape[-1])).update(a)
    stats = {name: per_tensor[t] for t, ns in wanted.items() if t in per_tensor for name in ns}
    return DecoderCalibration(stats, str(tokens_path), int(ids.shape[0]), int(ids.size))
