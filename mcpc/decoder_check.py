"""The self-check of a decoder build: the rewritten module against ONNX Runtime on the ORIGINAL graph.

``check_rewrite`` runs a short served loop through the IR interpreter — a prefill of a few random
tokens, then decode steps — and the original graph through ONNX Runtime fed its own past (the
present K/V it returned the step before).  Per step it compares each layer's K/V as the cache
holds them with ONNX Runtime's present K/V (the first layer that differs is named: its K/V
projection or the layer before it broke), then the logits.  A mismatch beyond the tolerance is a
``CheckFailed`` (exit 1): a decoder build never ships a rewrite it could not reproduce.  Cost: one
prefill and ``steps`` decode calls of the interpreter and of ONNX Runtime, on batch row 0.

``paged_feeds`` builds the ``kv_*`` inputs for one call from per-sequence block tables — the
minimal host side the check and the tests need (the simulator's KV manager does the real one).
"""

from __future__ import annotations

import numpy as np
import onnx

from mcpc.errors import CheckFailed, InputError

BLOCK = 64


def paged_feeds(
    tables: list[list[int]],
    past: list[int],
    new: list[int],
    seq: int,
    max_blocks: int,
    trash: int,
    block: int = BLOCK,
) -> tuple[dict[str, np.ndarray], int]:
    """The ``kv_slot``, ``kv_gather``, ``kv_start``, ``kv_len`` inputs and the ``kv_blocks``
    register of one call: sequence b (row b of the batch) has block table ``tables[b]``, ``past[b]``
    tokens already cached and ``new[b]`` real tokens among its ``seq`` rows (the rest are padding:
    slot in the ``trash`` block, length 0).  Sequences with ``new[b] == 0`` are idle rows."""
    rows = len(tables) * seq
    slot = np.full(rows, trash * block, np.int32)
    start, length = np.zeros(rows, np.int32), np.zeros(rows, np.int32)
    gather: list[int] = []
    for b, table in enumerate(tables):
        used = -(-(past[b] + new[b]) // block) if new[b] else 0
        if used > len(table):
            raise ValueError(f"sequence {b} needs {used} blocks, its table has {len(table)}")
        first = len(gather) * block
        gather.extend(table[:used])
        for t in range(new[b]):
            pos = past[b] + t
            r = b * seq + t
            slot[r] = table[pos // block] * block + pos % block
            start[r], length[r] = first, pos + 1
    if len(gather) > max_blocks:
        raise ValueError(f"{len(gather)} blocks gathered, the build takes {max_blocks}")
    kv_gather = np.zeros(max_blocks, np.int32)
    kv_gather[: len(gather)] = gather
    feeds = {"kv_slot": slot, "kv_gather": kv_gather, "kv_start": start, "kv_len": length}
    return feeds, len(gather)


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    from mcpc.ir.onnx_large import light_model

    light = light_model(model)  # no weights: a model over 2 GB cannot be serialised for inference
    try:
        inferred = onnx.shape_inference.infer_shapes(light, strict_mode=False)
    except Exception:  # noqa: BLE001 - types then default to float
        return {}
    return {vi.name: vi.type.tensor_type.elem_type for vi in inferred.graph.value_info}


def _session(model: onnx.ModelProto, extra: list[str] = ()):
    import onnxruntime as ort

    m = onnx.ModelProto()
    m.CopyFrom(model)
    if extra:
        types = _elem_types(model)
        for name in extra:
            m.graph.output.append(
                onnx.helper.make_tensor_value_info(name, types.get(name, onnx.TensorProto.FLOAT), None)
            )
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = 1
    from mcpc.ir.onnx_large import ort_session

    return ort_session(m, opts)  # a model over 2 GB through a temporary copy with external data


def _feeds(model, dec, ids: np.ndarray, past_kv: dict[str, np.ndarray], past: int) -> dict[str, np.ndarray]:
    b, s = ids.shape
    types = {vi.name: vi.type.tensor_type.elem_type for vi in model.graph.input}
    feeds = {dec.ids: ids.astype(onnx.helper.tensor_dtype_to_np_dtype(types[dec.ids]))}
    if dec.positions in types:  # a position input the rewrite added is not the original's
        pos = np.broadcast_to(np.arange(past, past + s), (b, s))
        feeds[dec.positions] = pos.astype(onnx.helper.tensor_dtype_to_np_dtype(types[dec.positions]))
    if dec.mask:
        feeds[dec.mask] = np.ones((b, past + s), onnx.helper.tensor_dtype_to_np_dtype(types[dec.mask]))
    for layer in dec.layers:
        for kind in ("key", "value"):
            name = layer.past[kind]
            dtype = onnx.helper.tensor_dtype_to_np_dtype(types[name])
            feeds[name] = past_kv.get(name, np.zeros((b, layer.kv_heads, past, layer.head_dim), dtype))
    return feeds


def run_original(model, dec, batch: int, past: int, seq: int, extra: list[str]) -> dict[str, np.ndarray]:
    """The tensors ``extra`` of ``model`` run by ONNX Runtime on zero tokens with a zero past."""
    sess = _session(model, list(extra))
    ids = np.zeros((batch, seq), np.int64)
    out = sess.run(list(extra), _feeds(model, dec, ids, {}, past))
    return dict(zip(extra, out, strict=True))


def _norm_err(got: np.ndarray, want: np.ndarray) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def _reference(built, ids: np.ndarray, calls: list) -> list[dict[str, np.ndarray]]:
    """ONNX Runtime's outputs for each call of the check, its own present fed back as the past;
    kept on ``built`` so that the checks of one build (imported, built) run the model once."""
    cache = built.__dict__.setdefault("ort_reference", {})
    key = (tuple(int(i) for i in ids), tuple(calls))
    if key not in cache:
        dec = built.graph
        sess = _session(built.original)
        names = [o.name for o in sess.get_outputs()]
        past_kv: dict[str, np.ndarray] = {}
        refs = []
        for _, past, n in calls:
            feeds = _feeds(built.original, dec, ids[None, past : past + n], past_kv, past)
            ref = dict(zip(names, sess.run(names, feeds), strict=True))
            past_kv = {layer.past[k]: ref[layer.present[k]] for layer in dec.layers for k in ("key", "value")}
            refs.append(ref)
        cache[key] = refs
    return cache[key]


def check_rewrite(
    built,
    module,
    max_norm_err: float,
    *,
    prompt: int = 5,
    steps: int = 2,
    seed: int = 0,
    what: str = "the build",
    per_layer: bool = True,
) -> dict:
    """Hold ``module`` (the decoder module, imported or after the pipeline) to ONNX Runtime on
    ``built.original`` (a ``DecoderModule``); returns the errors measured, raises CheckFailed.

    ``per_layer``: every layer's K/V is held to ``max_norm_err`` too (the imported module, where
    any difference is the rewrite's); otherwise (a quantized or f16 build, whose K/V carry the
    build's own rounding) only the logits are, and the message names the first layer whose K/V
    exceeded the bound."""
    from mcpc.ir.interpreter import ModuleState, interpret

    dec, info = built.graph, built.decoder
    rng = np.random.default_rng(seed)
    chunk, b_max, nb = info["prefill_chunk"], info["max_batch"], info["kv_blocks"]
    max_blocks = b_max * -(-info["max_seq"] // BLOCK)
    prompt = max(1, min(prompt, chunk, info["max_seq"] - steps))
    steps = max(0, min(steps, info["max_seq"] - prompt))
    ids = rng.integers(0, info["vocab"], prompt + steps)
    state = ModuleState(module)
    calls = [("prefill", 0, prompt)] + [("decode", prompt + i, 1) for i in range(steps)]
    refs = _reference(built, ids, calls)
    table = [list(range(-(-info["max_seq"] // BLOCK)))]
    tables = table + [[] for _ in range(b_max - 1)]
    errs: dict[str, float] = {}
    first_bad = None
    for (entry, past, n), ref in zip(calls, refs, strict=True):
        seq = chunk if entry == "prefill" else 1
        feeds, used = paged_feeds(
            tables, [past] + [0] * (b_max - 1), [n] + [0] * (b_max - 1), seq, max_blocks, nb
        )
        tok = np.zeros((b_max, seq), np.int64)
        tok[0, :n] = ids[past : past + n]
        inputs = dict(feeds)
        fn = module.functions[entry]
        arg_types = {a.name: a.type.dtype.np_dtype for a in fn.args}
        inputs[dec.ids] = tok.astype(arg_types[dec.ids])
        if dec.positions:
            pos = np.zeros((b_max, seq), np.int64)
            pos[0, :n] = np.arange(past, past + n)
            inputs[dec.positions] = pos.astype(arg_types[dec.positions])
        try:
            got = interpret(module, inputs, entry, state, {"kv_blocks": used})[dec.logits]
        except InputError as exc:
            msg = f"decoder self-check: the {entry} entry of {what} does not run: {exc}"
            raise CheckFailed(msg) from None
        for layer in dec.layers:
            for kind, short in (("key", "k"), ("value", "v")):
                present = ref[layer.present[kind]][0]  # [Hkv, past + n, D]
                cache = state.globals[f"kv_{short}_{layer.index}"]
                per_head = cache.shape[0] // layer.kv_heads
                mine = np.stack(
                    [cache[h * per_head : h * per_head + past + n] for h in range(layer.kv_heads)]
                )
                e = _norm_err(mine, present)
                errs[f"layer{layer.index}.{short}"] = max(errs.get(f"layer{layer.index}.{short}", 0.0), e)
                if not e <= max_norm_err and first_bad is None:
                    first_bad = f"layer {layer.index}'s {kind} cache (normwise error {e:.3g})"
                if not e <= max_norm_err and per_layer:
                    where = "its K/V projection" + (" or the layer before it" if layer.index else "")
                    raise CheckFailed(
                        f"decoder self-check: after the {entry} call ({past} cached + {n} new tokens), "
                        f"layer {layer.index}'s {kind} cache differs from ONNX Runtime's "
                        f"'{layer.present[kind]}' (normwise error {e:.3g} > {max_norm_err:g}) in {what}: "
                        f"the rewrite of {where} does not reproduce the graph"
                    )
        e = _norm_err(got[0, :n], ref[dec.logits][0])
        errs["logits"] = max(errs.get("logits", 0.0), e)
        if not e <= max_norm_err:
            where = (
                f"the first to differ is {first_bad}"
                if first_bad
                else f"every layer's K/V agrees: the attention of layer {len(dec.layers) - 1} (its mask or "
                "scale) or the head breaks the rewrite"
            )
            raise CheckFailed(
                f"decoder self-check: the {entry} logits ({past} cached + {n} new tokens) differ from ONNX "
                f"Runtime's (normwise error {e:.3g} > {max_norm_err:g}) in {what}; {where}"
            )
    return {"tokens": prompt + steps, "max_norm_err": max_norm_err, "errors": errs, "within_tolerance": True}
