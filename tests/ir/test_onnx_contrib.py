"""ONNX Runtime's fused ``com.microsoft`` ops (what ``onnxruntime.transformers.optimizer`` writes):
each a one-node model against ONNX Runtime's CPU kernel, every optional input and attribute, with
the IR interpreter (normalized max error ≤ 1e-5, integer outputs exact) and, for each op, a compiled
fp32 build run on the simulator.  Run-time masks are graph inputs; the folded variant makes every
input an initializer, so the node is evaluated at import."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import _ort_run, norm_max_err
from onnx import TensorProto, helper, numpy_helper

from mcpc.errors import UnsupportedError
from mcpc.ir.interpreter import interpret
from mcpc.ir.onnx_import import import_onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from e2e_util import compile_and_run  # noqa: E402

_rng = np.random.default_rng(2026)
_ELEM = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int32): TensorProto.INT32}
LOWEST = float(np.finfo(np.float32).min)


def f(*shape, scale=1.0):
    return (_rng.standard_normal(shape) * scale).astype(np.float32)


def i32(*values):
    return np.array(values, dtype=np.int32)


@dataclass
class Case:
    id: str
    op: str
    data: dict  # graph inputs (initializers in the folded variant)
    consts: dict = field(default_factory=dict)  # always initializers (weights)
    order: list = field(default_factory=list)  # node inputs by name, "" for an omitted one
    outs: list = field(default_factory=lambda: [TensorProto.FLOAT])  # element type per output; None skips
    attrs: dict = field(default_factory=dict)

    def model(self, folded: bool = False) -> onnx.ModelProto:
        """The one-node model, its outputs typed with the shapes ONNX Runtime computes (ONNX's shape
        inference does not know these ops; the checker wants every graph output shaped)."""
        feeds = {} if folded else self.data
        shapes = [r.shape for r in _ort_run(self._model(folded, None), feeds).values()]
        model = self._model(folded, shapes)
        onnx.checker.check_model(model)
        return model

    def _model(self, folded: bool, shapes) -> onnx.ModelProto:
        names = [f"y{i}" if t is not None else "" for i, t in enumerate(self.outs)]
        node = helper.make_node(
            self.op, self.order, names, name=f"{self.op}_node", domain="com.microsoft", **self.attrs
        )
        consts = {**self.consts, **(self.data if folded else {})}
        inits = [numpy_helper.from_array(v, k) for k, v in consts.items()]
        data = {} if folded else self.data
        inputs = [helper.make_tensor_value_info(k, _ELEM[v.dtype], v.shape) for k, v in data.items()]
        typed = [(n, t) for n, t in zip(names, self.outs, strict=True) if n]
        shapes = shapes or [None] * len(typed)
        outputs = [helper.make_tensor_value_info(n, t, s) for (n, t), s in zip(typed, shapes, strict=True)]
        opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
        graph = helper.make_graph([node], "g", inputs, outputs, inits)
        model = helper.make_model(graph, opset_imports=opsets)
        model.ir_version = helper.find_min_ir_version_for(opsets[:1])
        return model


def _x_w(batch=2, seq=4, hidden=16, heads=4, sizes=None):
    total = sum(sizes) if sizes else 3 * hidden
    return {"x": f(batch, seq, hidden)}, {"w": f(hidden, total, scale=0.4), "b": f(total, scale=0.2)}


def attention(id, mask=None, past=None, ab=None, heads=4, sizes=None, **attrs):
    data, consts = _x_w(heads=heads, sizes=sizes)
    order = ["x", "w", "b"]
    for name, value in (("mask", mask), ("past", past), ("ab", ab)):
        order.append(name if value is not None else "")
        if value is not None:
            data[name] = value
    while order[-1] == "":
        order.pop()
    if sizes:
        attrs["qkv_hidden_sizes"] = list(sizes)
    outs = [TensorProto.FLOAT] * (2 if past is not None else 1)
    return Case(id, "Attention", data, consts, order, outs, {"num_heads": heads, **attrs})


B, S, P = 2, 4, 3
PAST = f(2, B, 4, P, 4)
ATTENTION = [
    attention("no_mask"),
    attention("no_bias_input", mask=None),
    attention("unidirectional", unidirectional=1),
    attention("scale", scale=0.3),
    attention("1d_end", mask=i32(3, 1)),
    attention("1d_end_zero_row", mask=i32(0, 2)),  # every key of batch 0 masked: uniform, as ORT
    attention("1d_end_unidirectional", mask=i32(2, 4), unidirectional=1),
    attention("1d_end_start", mask=i32(4, 3, 1, 2)),
    attention("1d_other_length", mask=i32(3, 2, 0, 3, 5, 0, 0, 0)),  # 3B+2: the CPU kernel reads ends
    attention("2d", mask=i32([1, 1, 0, 1], [0, 1, 1, 1])),
    attention("2d_all_masked_filter_lowest", mask=i32([1, 1, 0, 1], [0, 0, 0, 0]), mask_filter_value=LOWEST),
    attention("2d_unidirectional", mask=i32([1, 1, 0, 1], [0, 0, 0, 1]), unidirectional=1),
    attention(
        "2d_unidirectional_filter_lowest",
        mask=i32([0, 1, 0, 1], [0, 0, 0, 1]),
        unidirectional=1,
        mask_filter_value=LOWEST,
    ),
    attention("2d_filter_small", mask=i32([1, 1, 0, 1], [0, 1, 1, 1]), mask_filter_value=-3.0),
    attention("3d", mask=(_rng.random((B, S, S)) > 0.4).astype(np.int32)),
    attention("3d_unidirectional", mask=(_rng.random((B, S, S)) > 0.4).astype(np.int32), unidirectional=1),
    attention("attention_bias_broadcast", ab=f(1, 4, S, S, scale=2.0)),
    attention(
        "attention_bias_mask_unidirectional", mask=i32(3, 2), ab=f(B, 4, S, S, scale=2.0), unidirectional=1
    ),
    attention("qkv_hidden_sizes", sizes=(16, 16, 8)),
    attention("heads_2", heads=2, mask=i32(4, 2)),
    attention("past", past=PAST),
    attention("past_unidirectional", past=PAST, unidirectional=1),
    attention(
        "past_unidirectional_2d",
        past=PAST,
        unidirectional=1,
        mask=i32([0, 1, 1, 1, 1, 1, 1], [1] * 5 + [0, 0]),
    ),
    attention("past_1d", past=PAST, unidirectional=1, mask=i32(6, 7)),
    attention("past_3d", past=PAST, mask=(_rng.random((B, S, P + S)) > 0.4).astype(np.int32)),
    attention("present_without_past", unidirectional=1, mask=i32(3, 4)),
]
ATTENTION[-1].outs.append(TensorProto.FLOAT)  # present [2, B, N, S, H] of the new K, V alone
ATTENTION[1].order[2] = ""  # Attention without its bias input


def mha(id, mask=None, ab=None, past=None, kv_len=S, bias=True, bnsh=False, heads=4, **attrs):
    """MultiHeadAttention with separate query/key/value ([B, L, D], or [B, N, L, H] with ``bnsh``)."""
    data = {"q": f(B, S, 16)}
    if bnsh:
        data.update(k=f(B, heads, kv_len, 16 // heads), v=f(B, heads, kv_len, 16 // heads))
    else:
        data.update(k=f(B, kv_len, 16), v=f(B, kv_len, 16))
    consts = {"bias": f(48, scale=0.2)} if bias else {}
    order = ["q", "k", "v", "bias" if bias else ""]
    for name, value in (("mask", mask), ("ab", ab)):
        order.append(name if value is not None else "")
        if value is not None:
            data[name] = value
    if past is not None:
        data.update(pk=past[0], pv=past[1])
        order += ["pk", "pv"]
    while order[-1] == "":
        order.pop()
    outs = [TensorProto.FLOAT] * (3 if past is not None else 1)
    return Case(id, "MultiHeadAttention", data, consts, order, outs, {"num_heads": heads, **attrs})


MHA_PAST = (f(B, 4, P, 4), f(B, 4, P, 4))
MHA = [
    mha("no_mask"),
    mha("no_bias", bias=False, scale=0.4),
    mha("key_padding_1d", mask=i32(3, 1)),
    mha("key_padding_2d_filter_lowest", mask=i32([1, 1, 0, 1], [0, 0, 0, 0]), mask_filter_value=LOWEST),
    mha(
        "attention_3d_unidirectional", mask=(_rng.random((B, S, S)) > 0.4).astype(np.int32), unidirectional=1
    ),
    mha("cross_attention", kv_len=6, mask=i32([1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1])),
    mha("bnsh_key_value", bias=False, bnsh=True, kv_len=5),
    mha("attention_bias", ab=f(1, 4, S, S, scale=2.0), mask=i32(4, 2)),
    mha(
        "past_unidirectional_2d",
        past=MHA_PAST,
        unidirectional=1,
        mask=i32([0, 1, 1, 1, 1, 1, 1], [1] * 5 + [0, 0]),
    ),
]

W, PT, ST = f(12, 8), f(6, 8), f(2, 8)
EMB = {"W": W, "P": PT, "g": f(8) + 1, "b": f(8)}
IDS = i32([1, 2, 3, 11], [4, 5, 0, 0])
EMBED = [
    Case(
        "all_inputs_and_outputs",
        "EmbedLayerNormalization",
        {"ids": IDS, "seg": i32([0, 1, 1, 0], [1, 0, 0, 1]), "mask": i32([1, 1, 2, 0], [1, 0, 1, 1])},
        {**EMB, "S": ST},
        ["ids", "seg", "W", "P", "S", "g", "b", "mask"],
        [TensorProto.FLOAT, TensorProto.INT32, TensorProto.FLOAT],
        {"epsilon": 1e-5},
    ),
    Case(
        "no_segment_no_mask",
        "EmbedLayerNormalization",
        {"ids": IDS},
        EMB,
        ["ids", "", "W", "P", "", "g", "b"],
        [TensorProto.FLOAT, TensorProto.INT32],
        {"epsilon": 1e-12},
    ),
    Case(
        "position_ids_1xS",
        "EmbedLayerNormalization",
        {"ids": IDS, "mask": i32([1, 1, 1, 0], [1, 1, 0, 0]), "pos": i32([3, 2, 5, 0])},
        EMB,
        ["ids", "", "W", "P", "", "g", "b", "mask", "pos"],
        [TensorProto.FLOAT, TensorProto.INT32, TensorProto.FLOAT],
    ),
    Case(
        "position_ids_BxS_sum_only",
        "EmbedLayerNormalization",
        {"ids": IDS, "seg": i32([0, 1, 1, 0], [1, 0, 0, 1]), "pos": i32([3, 2, 5, 0], [0, 1, 2, 3])},
        {**EMB, "S": ST},
        ["ids", "seg", "W", "P", "S", "g", "b", "", "pos"],
        [TensorProto.FLOAT, None, TensorProto.FLOAT],
    ),
]

SKIP = [
    Case(
        "all_inputs_and_outputs",
        "SkipLayerNormalization",
        {"x": f(2, 3, 8), "skip": f(2, 3, 8)},
        {"g": f(8) + 1, "beta": f(8), "bias": f(8)},
        ["x", "skip", "g", "beta", "bias"],
        [TensorProto.FLOAT] * 4,
        {"epsilon": 1e-5},
    ),
    Case(
        "no_beta_sum_output",
        "SkipLayerNormalization",
        {"x": f(2, 3, 8), "skip": f(2, 3, 8)},
        {"g": f(8) + 1, "bias": f(8)},
        ["x", "skip", "g", "", "bias"],
        [TensorProto.FLOAT, None, None, TensorProto.FLOAT],
    ),
    Case(
        "skip_SxH",
        "SkipLayerNormalization",
        {"x": f(2, 3, 8), "skip": f(3, 8)},
        {"g": f(8) + 1, "beta": f(8)},
        ["x", "skip", "g", "beta"],
    ),
    Case(
        "skip_1xSxH_stats",
        "SkipLayerNormalization",
        {"x": f(2, 3, 8), "skip": f(1, 3, 8)},
        {"g": f(8) + 1},
        ["x", "skip", "g"],
        [TensorProto.FLOAT, TensorProto.FLOAT, TensorProto.FLOAT],
    ),
]

ACTIVATIONS = [
    Case("bias_gelu", "BiasGelu", {"a": f(2, 3, 8, scale=2.0)}, {"bias": f(8)}, ["a", "bias"]),
    Case("fast_gelu_bias", "FastGelu", {"x": f(2, 3, 8, scale=2.0)}, {"bias": f(8)}, ["x", "bias"]),
    Case("fast_gelu", "FastGelu", {"x": f(3, 8, scale=3.0)}, {}, ["x"]),
    Case("gelu", "Gelu", {"x": f(3, 8, scale=3.0)}, {}, ["x"]),
    Case("fused_matmul", "FusedMatMul", {"a": f(2, 3, 5)}, {"b": f(5, 4)}, ["a", "b"]),
    Case(
        "fused_matmul_trans_alpha",
        "FusedMatMul",
        {"a": f(2, 5, 3)},
        {"b": f(2, 4, 5)},
        ["a", "b"],
        attrs={"transA": 1, "transB": 1, "alpha": 0.5},
    ),
]

CASES = ATTENTION + MHA + EMBED + SKIP + ACTIVATIONS


def _check(case: Case, model: onnx.ModelProto, feeds: dict, ort_run) -> None:
    ref = ort_run(model, feeds)
    got = interpret(import_onnx(model), feeds)
    assert list(got) == list(ref)
    for name, r in ref.items():
        g = got[name]
        assert g.shape == r.shape and g.dtype == r.dtype, (name, g.shape, g.dtype, r.shape, r.dtype)
        if r.dtype.kind in "iub":
            np.testing.assert_array_equal(g, r)
        else:
            assert norm_max_err(g, r) <= 1e-5, (name, norm_max_err(g, r))


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.op}-{c.id}")
def test_matches_onnxruntime(case, ort_run):
    _check(case, case.model(), case.data, ort_run)


FOLDED = [c for c in CASES if c.op in ("Attention", "MultiHeadAttention", "EmbedLayerNormalization")][::3]


@pytest.mark.parametrize("case", FOLDED, ids=lambda c: f"{c.op}-{c.id}")
def test_folded_at_import_matches_onnxruntime(case, ort_run):
    _check(case, case.model(folded=True), {}, ort_run)


def test_masked_attention_differs_from_unmasked(ort_run):
    """The mask is read at run time: another mask, another answer (ORT agrees on both)."""
    case = attention("probe", mask=i32(4, 4))
    module = import_onnx(case.model())
    full = interpret(module, case.data)["y0"]
    short = interpret(module, {**case.data, "mask": i32(2, 4)})["y0"]
    assert norm_max_err(short, full) > 1e-2
    assert norm_max_err(short, ort_run(case.model(), {**case.data, "mask": i32(2, 4)})["y0"]) <= 1e-5


# One compiled fp32 build per op (and per mask form of Attention), run on the simulator.
COMPILED = [
    "Attention-1d_end_start",
    "Attention-2d_unidirectional",
    "Attention-3d",
    "Attention-attention_bias_mask_unidirectional",
    "Attention-qkv_hidden_sizes",
    "Attention-past_unidirectional_2d",
    "MultiHeadAttention-cross_attention",
    "MultiHeadAttention-past_unidirectional_2d",
    "MultiHeadAttention-bnsh_key_value",
    "Attention-present_without_past",
    "SkipLayerNormalization-skip_SxH",
    "FastGelu-fast_gelu",
    "Gelu-gelu",
    "EmbedLayerNormalization-all_inputs_and_outputs",
    "EmbedLayerNormalization-position_ids_BxS_sum_only",
    "SkipLayerNormalization-all_inputs_and_outputs",
    "BiasGelu-bias_gelu",
    "FastGelu-fast_gelu_bias",
    "FusedMatMul-fused_matmul_trans_alpha",
]


@pytest.mark.parametrize("key", COMPILED)
def test_compiled_fp32_on_the_simulator(key, tmp_path):
    (case,) = [c for c in CASES if f"{c.op}-{c.id}" == key]
    sim, _, ref, _ = compile_and_run(tmp_path, case.model(), case.data)
    for name, r in ref.items():
        if r.dtype.kind in "iub":
            np.testing.assert_array_equal(sim[name], r)
        else:
            assert norm_max_err(sim[name], r) <= 1e-5, (name, norm_max_err(sim[name], r))


@pytest.mark.parametrize(
    "case, why",
    [
        (attention("mask_4d", mask=np.ones((B, 1, 6, 6), np.int32)), r"4-D mask_index is not supported"),
        (attention("rotary", do_rotary=1), r"do_rotary=1 is not supported"),
        (attention("shared_buffer", past=PAST, past_present_share_buffer=1), r"past_present_share_buffer=1"),
        (
            Case(
                "trans_batch",
                "FusedMatMul",
                {"a": f(2, 3, 5)},
                {"b": f(5, 4)},
                ["a", "b"],
                attrs={"transBatchA": 1},
            ),
            r"transBatchA=1 is not supported",
        ),
    ],
    ids=lambda v: v.id if isinstance(v, Case) else "",
)
def test_refused_naming_the_node(case, why):
    # ONNX Runtime refuses these too (or runs them on other devices): outputs shaped by hand
    model = case._model(False, [(2, 4, 16), (2, 2, 4, 7, 4)][: len(case.outs)])
    # a static refusal (DOMAIN_CHECKS, before import) names the op and the node in the grouped
    # message; one that needs shapes names them in the handler's
    before = rf"{case.op} \(com\.microsoft opset 1\), 1 node '{case.op}_node': "
    during = rf"node '{case.op}_node' \(op_type {case.op}.*"
    with pytest.raises(UnsupportedError, match=rf"({before}|{during}){why}"):
        import_onnx(model)
