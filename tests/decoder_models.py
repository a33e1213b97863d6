"""Small random-weight decoders with past, built with onnx.helper, for the decoder-build tests.

``make_decoder`` writes the attention the way exporters do — K/V concatenated with the past along
axis 2, GQA by Unsqueeze/Expand/Reshape, Q·K^T with the scale on the scores, on Q or as a Div,
the causal (+ padding) mask built in-graph from the past length and ``attention_mask`` and applied
by an additive Where mask or by a Where on the scores, Softmax, optionally SDPA's IsNaN guard,
then ·V — so that recognition, its refusals and the served loop are tested on graphs of both
naming conventions without an exporter.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper


def make_decoder(
    naming: str = "hf",
    layers: int = 2,
    q_heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 8,
    vocab: int = 48,
    scale: str = "scores",
    mask: str = "add",
    guard: bool = False,
    positions: str = "input",
    window: int | None = None,
    seed: int = 0,
) -> onnx.ModelProto:
    """A decoder with past: ``naming`` "hf" (past_key_values.{i}.key, attention_mask, position_ids)
    or "torch" (past_key_<i>, no attention_mask); ``positions`` "input" (position_ids) or
    "past_shape" (computed from the past length, which a paged build must refuse); ``window``
    makes the mask a sliding window (not plain causal: the self-check must catch it)."""
    rng = np.random.default_rng(seed)
    hidden = q_heads * head_dim
    nodes, inits = [], []
    count = [0]

    def w(shape, std=0.35):
        name = f"w{len(inits)}"
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * std).astype(np.float32), name))
        return name

    def c(value, dtype=np.int64):
        name = f"c{len(inits)}"
        inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def n(op, ins, **attrs):
        count[0] += 1
        out = f"t{count[0]}"
        nodes.append(h.make_node(op, ins, [out], name=f"/{op}_{count[0]}", **attrs))
        return out

    def past_name(i, kind):
        return f"past_key_values.{i}.{kind}" if naming == "hf" else f"past_{kind}_{i}"

    def present_name(i, kind):
        return f"present.{i}.{kind}" if naming == "hf" else f"present_{kind}_{i}"

    inputs = [h.make_tensor_value_info("input_ids", T.INT64, ["batch", "seq"])]
    if naming == "hf":
        inputs.append(h.make_tensor_value_info("attention_mask", T.INT64, ["batch", "total"]))
    if positions == "input":
        inputs.append(h.make_tensor_value_info("position_ids", T.INT64, ["batch", "seq"]))
    for i in range(layers):
        for kind in ("key", "value"):
            inputs.append(
                h.make_tensor_value_info(past_name(i, kind), T.FLOAT, ["batch", kv_heads, "past", head_dim])
            )
    x = n("Gather", [w((vocab, hidden), 1.0), "input_ids"])
    # the past length and the query positions, as exporters compute them for the causal mask
    p = n("Gather", [n("Shape", [past_name(0, "key")]), c(2)], axis=0)
    s = n("Gather", [n("Shape", ["input_ids"]), c(1)], axis=0)
    total = n("Add", [p, s])
    qpos = n("Range", [p, total, c(1)])
    kpos = n("Range", [c(0), total, c(1)])
    allowed = n("LessOrEqual", [n("Unsqueeze", [kpos, c([0])]), n("Unsqueeze", [qpos, c([1])])])  # [S, T]
    if window is not None:
        lo = n("Sub", [n("Unsqueeze", [qpos, c([1])]), c(window)])
        allowed = n("And", [allowed, n("Greater", [n("Unsqueeze", [kpos, c([0])]), lo])])
    if naming == "hf":
        pad = n("Unsqueeze", [n("Cast", ["attention_mask"], to=T.BOOL), c([1, 2])])  # [B, 1, 1, T]
        allowed = n("And", [allowed, pad])
    table = w((128, hidden), 0.5)
    pos = n("Gather", [table, "position_ids"]) if positions == "input" else n("Gather", [table, qpos])
    x = n("Add", [x, pos])
    group = q_heads // kv_heads
    for i in range(layers):

        def heads(t, count_):
            return n("Transpose", [n("Reshape", [t, c([0, 0, count_, head_dim])])], perm=[0, 2, 1, 3])

        xn = n("LayerNormalization", [x, c(np.ones(hidden), np.float32)], axis=-1)
        q = heads(n("MatMul", [xn, w((hidden, hidden))]), q_heads)
        k = heads(n("MatMul", [xn, w((hidden, kv_heads * head_dim))]), kv_heads)
        v = heads(n("MatMul", [xn, w((hidden, kv_heads * head_dim))]), kv_heads)
        kv = {}
        for kind, new in (("key", k), ("value", v)):
            nodes.append(
                h.make_node(
                    "Concat",
                    [past_name(i, kind), new],
                    [present_name(i, kind)],
                    name=f"/cat{i}{kind}",
                    axis=2,
                )
            )
            t = present_name(i, kind)
            if group > 1:  # repeat_kv
                t = n("Expand", [n("Unsqueeze", [t, c([2])]), c([1, 1, group, 1, 1])])
                t = n("Reshape", [t, c([0, q_heads, -1, head_dim])])
            kv[kind] = t
        factor = c(head_dim**-0.5, np.float32)
        if scale == "q":
            q = n("Mul", [q, factor])
        scores = n("MatMul", [q, n("Transpose", [kv["key"]], perm=[0, 1, 3, 2])])
        if scale == "scores":
            scores = n("Mul", [scores, factor])
        elif scale == "div":
            scores = n("Div", [scores, c(head_dim**0.5, np.float32)])
        if mask == "add":
            scores = n("Add", [scores, n("Where", [allowed, c(0.0, np.float32), c(-1e9, np.float32)])])
        else:
            scores = n("Where", [allowed, scores, c(-np.inf, np.float32)])
        probs = n("Softmax", [scores], axis=-1)
        if guard:
            probs = n("Where", [n("IsNaN", [probs]), c(0.0, np.float32), probs])
        a = n("MatMul", [probs, kv["value"]])
        a = n("Reshape", [n("Transpose", [a], perm=[0, 2, 1, 3]), c([0, 0, hidden])])
        x = n("Add", [x, n("MatMul", [a, w((hidden, hidden))])])
        up = n(
            "Relu",
            [
                n(
                    "MatMul",
                    [n("LayerNormalization", [x, c(np.ones(hidden), np.float32)]), w((hidden, 2 * hidden))],
                )
            ],
        )
        x = n("Add", [x, n("MatMul", [up, w((2 * hidden, hidden))])])
    x = n("LayerNormalization", [x, c(np.ones(hidden), np.float32)], axis=-1)
    nodes.append(h.make_node("MatMul", [x, w((hidden, vocab))], ["logits"], name="/lm_head"))
    outputs = [h.make_tensor_value_info("logits", T.FLOAT, ["batch", "seq", vocab])]
    for i in range(layers):
        for kind in ("key", "value"):
            outputs.append(
                h.make_tensor_value_info(
                    present_name(i, kind), T.FLOAT, ["batch", kv_heads, "total", head_dim]
                )
            )
    graph = h.make_graph(nodes, f"decoder_{naming}", inputs, outputs, inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def ort_greedy(model, prompt, new):
    """ONNX Runtime's own KV loop on one sequence: the prompt with an empty past, then one token a
    step fed the present K/V it returned."""
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    ins = {i.name: i for i in model.graph.input}
    pasts = [n for n in ins if n.startswith("past")]
    feeds = {}
    for p in pasts:
        dims = ins[p].type.tensor_type.shape.dim
        feeds[p] = np.zeros((1, dims[1].dim_value, 0, dims[3].dim_value), np.float32)
    out = []
    step = np.array([prompt], np.int64)
    for _ in range(new):
        past = feeds[pasts[0]].shape[2]
        feeds["input_ids"] = step
        if "position_ids" in ins:
            feeds["position_ids"] = np.arange(past, past + step.shape[1])[None]
        if "attention_mask" in ins:
            feeds["attention_mask"] = np.ones((1, past + step.shape[1]), np.int64)
        res = dict(zip(names, sess.run(names, feeds), strict=True))
        out.append(int(res["logits"][0, -1].argmax()))
        for p in pasts:
            feeds[p] = res[p.replace("past_key_values", "present").replace("past_", "present_")]
        step = np.array([[out[-1]]], np.int64)
    return out


def paged_greedy(run, info: dict, prompts: list, new: int, tables: list) -> list[list[int]]:
    """Greedy decoding of ``prompts`` (one per batch row) through a decoder build's entries:
    ``run(entry, inputs, registers) -> logits``; chunked prefill calls (a row idle once its prompt
    is in), then decode calls with every sequence at its own context; the kv_* inputs from the
    block ``tables`` (``mcpc.decoder_check.paged_feeds``), as the host's KV manager would."""
    from mcpc.decoder_check import paged_feeds
    from mcpc.sim.decoder import prefill_rows_in_use

    chunk, nb, b_max = info["prefill_chunk"], info["kv_blocks"], info["max_batch"]
    gather = b_max * -(-info["max_seq"] // 64)

    def call(entry, toks, past):
        seq = chunk if entry == "prefill" else 1
        rows = [len(t) for t in toks]
        feeds, used = paged_feeds(tables, past, rows, seq, gather, nb)
        ids, pos = np.zeros((b_max, seq), np.int64), np.zeros((b_max, seq), np.int64)
        for b, t in enumerate(toks):
            ids[b, : len(t)] = t
            pos[b, : len(t)] = np.arange(past[b], past[b] + len(t))
        feeds[info["inputs"]["ids"]] = ids
        feeds[info["inputs"]["positions"]] = pos
        regs = {"kv_blocks": used}
        if entry == "prefill" and info.get("prefill_rows"):  # the leading token rows in use
            regs[info["prefill_rows"]] = prefill_rows_in_use(rows, seq)
        logits = run(entry, feeds, regs)
        return [int(logits[b, n - 1].argmax()) if n else None for b, n in enumerate(rows)]

    first = [None] * len(prompts)
    for start in range(0, max(map(len, prompts)), chunk):  # each chunk after the cached past
        past = [min(start, len(p)) for p in prompts]
        got = call("prefill", [p[start : start + chunk] for p in prompts], past)
        first = [g if g is not None else f for g, f in zip(got, first, strict=True)]
    outs = [[t] for t in first]
    for i in range(new - 1):
        got = call("decode", [[o[-1]] for o in outs], [len(p) + i for p in prompts])
        for o, g in zip(outs, got, strict=True):
            o.append(g)
    return outs
