"""ONNX's own transformer ops of opset 23/24 (``ir/onnx_handlers_attention.py``): ``Attention``,
``RMSNormalization``, ``RotaryEmbedding``, each as a single-node model over its optional inputs and
attributes — the imported module run by the IR interpreter matches ONNX Runtime (normalized max
error ≤ 1e-5) and onnx.reference; one case of each also compiled (fp32) and run on the simulator.
What is not supported is refused naming the node and why."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import pytest
from conftest import make_model, norm_max_err
from onnx import TensorProto, helper, numpy_helper

import mcpc
from mcpc.errors import UnsupportedError
from mcpc.ir.interpreter import interpret
from mcpc.ir.onnx_import import import_onnx
from mcpc.sim.api import load_program, run_program

TOL = 1e-5
_rng = np.random.default_rng(23)
_ELEM = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int64): TensorProto.INT64,
         np.dtype(np.bool_): TensorProto.BOOL}  # fmt: skip


def f(*shape):
    return _rng.standard_normal(shape).astype(np.float32)


@dataclass
class Case:
    id: str
    op: str
    data: dict  # graph inputs, in node order ("" entries of ``order`` skip an optional input)
    attrs: dict = field(default_factory=dict)
    opset: int = 23
    order: list | None = None
    n_out: int = 1
    consts: dict = field(default_factory=dict)  # initializers
    ort: bool = True  # False where ONNX Runtime 1.32 refuses what the specification defines
    ref: bool = True  # False where onnx.reference departs from ONNX Runtime (the oracle)

    def model(self) -> onnx.ModelProto:
        order = self.order if self.order is not None else [*self.data, *self.consts]
        outs = [f"y{i}" for i in range(self.n_out)]
        if self.op == "Attention" and self.n_out == 4:  # the QK output alone beside Y
            outs[1:3] = ["", ""]
        node = helper.make_node(self.op, order, outs, name=f"{self.op.lower()}_node", **self.attrs)
        inputs = [helper.make_tensor_value_info(k, _ELEM[v.dtype], v.shape) for k, v in self.data.items()]
        inits = [numpy_helper.from_array(v, k) for k, v in self.consts.items()]
        graph = helper.make_graph([node], "g", inputs, [], inits)
        probe = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        known = {
            vi.name: vi for vi in onnx.shape_inference.infer_shapes(probe, strict_mode=True).graph.value_info
        }
        return make_model([node], inputs, [known[o] for o in outs if o], inits, self.opset)


def _causal(s, t, offset=0):
    return np.where(np.arange(t)[None] <= np.arange(s)[:, None] + offset, 0.0, -np.inf).astype(np.float32)


_PAD_MASK = np.ones((2, 1, 3, 5), np.bool_)
_PAD_MASK[1, ..., :2] = False  # the second sequence left-padded by two keys
_ALL_MASKED = np.zeros((3, 4), np.float32)
_ALL_MASKED[1] = -np.inf  # query row 1 sees no key: its output is 0

CASES = [
    Case("rms_last", "RMSNormalization", {"x": f(2, 3, 8), "w": f(8)}, {"epsilon": 1e-6}),
    Case("rms_axis1", "RMSNormalization", {"x": f(2, 3, 4), "w": f(3, 4)}, {"axis": 1}),
    Case("rms_default_eps_4d", "RMSNormalization", {"x": f(1, 2, 3, 16), "w": f(16)}),
    Case("rope_4d_halves", "RotaryEmbedding", {"x": f(2, 4, 3, 8), "cos": f(2, 3, 4), "sin": f(2, 3, 4)}),
    Case(
        "rope_4d_interleaved",
        "RotaryEmbedding",
        {"x": f(1, 2, 5, 8), "cos": f(1, 5, 4), "sin": f(1, 5, 4)},
        {"interleaved": 1},
    ),  # fmt: skip
    Case(
        "rope_3d_num_heads",
        "RotaryEmbedding",
        {"x": f(2, 3, 16), "cos": f(2, 3, 4), "sin": f(2, 3, 4)},
        {"num_heads": 2},
    ),  # fmt: skip
    Case(
        "rope_partial_dim",
        "RotaryEmbedding",
        {"x": f(1, 2, 3, 8), "cos": f(1, 3, 2), "sin": f(1, 3, 2)},
        {"rotary_embedding_dim": 4},
    ),  # fmt: skip
    Case(
        "rope_position_ids",
        "RotaryEmbedding",
        {"x": f(2, 3, 2, 8), "cos": f(16, 4), "sin": f(16, 4), "pos": np.array([[0, 1], [5, 9]], np.int64)},
    ),  # fmt: skip
    Case(
        "rope_position_ids_3d_interleaved_partial",
        "RotaryEmbedding",
        {"x": f(1, 4, 12), "cos": f(8, 2), "sin": f(8, 2), "pos": np.array([[3, 4, 5, 6]], np.int64)},
        {"num_heads": 2, "interleaved": 1, "rotary_embedding_dim": 4},
    ),  # fmt: skip
    Case("attn_4d_plain", "Attention", {"q": f(2, 2, 3, 8), "k": f(2, 2, 5, 8), "v": f(2, 2, 5, 8)}),
    Case(
        "attn_4d_gqa_scale_float_mask",
        "Attention",
        {"q": f(1, 4, 3, 8), "k": f(1, 2, 5, 8), "v": f(1, 2, 5, 6), "m": f(3, 5)},
        {"scale": 0.3},
    ),  # fmt: skip
    Case(
        "attn_dynamo_form",
        "Attention",  # as the dynamo exporter writes SDPA: 4-D, float mask, scale
        {
            "q": f(2, 4, 3, 16),
            "k": f(2, 4, 7, 16),
            "v": f(2, 4, 7, 16),
            "m": np.broadcast_to(_causal(3, 7, 4), (2, 1, 3, 7)).copy(),
        },
        {"scale": 0.25},
    ),  # fmt: skip
    Case(
        "attn_bool_mask_padded",
        "Attention",
        {"q": f(2, 2, 3, 4), "k": f(2, 2, 5, 4), "v": f(2, 2, 5, 4), "m": _PAD_MASK},
    ),  # fmt: skip
    Case(
        "attn_short_mask_padded_with_inf",
        "Attention",
        {"q": f(1, 1, 2, 4), "k": f(1, 1, 6, 4), "v": f(1, 1, 6, 4), "m": f(2, 4)},
        ort=False,  # ONNX Runtime: "inconsistent total_sequence_length"; the specification pads with -inf
    ),  # fmt: skip
    Case(
        "attn_causal",
        "Attention",
        {"q": f(1, 2, 4, 8), "k": f(1, 2, 4, 8), "v": f(1, 2, 4, 8)},
        {"is_causal": 1},
    ),  # fmt: skip
    Case(
        "attn_past_causal_present",
        "Attention",
        {
            "q": f(1, 2, 2, 4),
            "k": f(1, 2, 2, 4),
            "v": f(1, 2, 2, 4),
            "pk": f(1, 2, 3, 4),
            "pv": f(1, 2, 3, 4),
        },
        {"is_causal": 1},
        order=["q", "k", "v", "", "pk", "pv"],
        n_out=3,
    ),  # fmt: skip
    Case(
        "attn_past_mask_gqa",
        "Attention",
        {
            "q": f(2, 4, 1, 4),
            "k": f(2, 1, 1, 4),
            "v": f(2, 1, 1, 4),
            "m": f(2, 1, 1, 4),
            "pk": f(2, 1, 3, 4),
            "pv": f(2, 1, 3, 4),
        },
        n_out=3,
    ),  # fmt: skip
    Case(
        "attn_3d_heads",
        "Attention",
        {"q": f(2, 3, 16), "k": f(2, 5, 8), "v": f(2, 5, 8)},
        {"q_num_heads": 4, "kv_num_heads": 2},
    ),  # fmt: skip
    Case(
        "attn_softcap",
        "Attention",
        {"q": f(1, 2, 3, 4) * 4, "k": f(1, 2, 3, 4), "v": f(1, 2, 3, 4)},
        {"softcap": 2.0, "is_causal": 1},
    ),  # fmt: skip
    Case(
        "attn_fully_masked_row",
        "Attention",
        {"q": f(1, 1, 3, 4), "k": f(1, 1, 4, 4), "v": f(1, 1, 4, 4), "m": _ALL_MASKED},
    ),  # fmt: skip
    Case(
        "attn_constant_fully_masked_row",
        "Attention",
        {"q": f(1, 1, 3, 4), "k": f(1, 1, 4, 4), "v": f(1, 1, 4, 4)},
        consts={"m": _ALL_MASKED},
    ),  # fmt: skip
    Case(
        "attn_nonpad_causal_opset24",  # per-sequence key counts, a run-time input
        "Attention",
        {"q": f(2, 2, 3, 4), "k": f(2, 2, 5, 4), "v": f(2, 2, 5, 4), "n": np.array([5, 4], np.int64)},
        {"is_causal": 1},
        opset=24,
        order=["q", "k", "v", "", "", "", "n"],
    ),
    Case(
        "attn_nonpad_mask_gqa_opset24",
        "Attention",
        {
            "q": f(2, 4, 1, 4),
            "k": f(2, 2, 6, 4),
            "v": f(2, 2, 6, 4),
            "m": f(1, 6),
            "n": np.array([3, 6], np.int64),
        },
        opset=24,
        order=["q", "k", "v", "m", "", "", "n"],
    ),
    *[
        Case(
            f"attn_qk_output_mode{mode}",
            "Attention",
            {"q": f(1, 2, 3, 4), "k": f(1, 2, 4, 4), "v": f(1, 2, 4, 4), "m": f(3, 4)},
            {"qk_matmul_output_mode": mode, "softcap": 3.0},
            n_out=4,
            ref=mode != 0,  # onnx.reference's mode 0 is after the softcap; ONNX Runtime's before it
        )
        for mode in range(4)
    ],
    Case(
        "attn_softmax_precision_opset24",
        "Attention",
        {"q": f(1, 2, 2, 4), "k": f(1, 2, 3, 4), "v": f(1, 2, 3, 4)},
        {"softmax_precision": TensorProto.FLOAT},
        opset=24,
    ),  # fmt: skip
]


def _feeds(case: Case) -> dict:
    return dict(case.data)


def _ort(model, feeds):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds), strict=True))


def _close(got: dict, want: dict, what: str) -> None:
    for name, ref in want.items():
        assert got[name].shape == ref.shape, f"{what} {name}: shape {got[name].shape} vs {ref.shape}"
        err = norm_max_err(got[name], ref)
        assert err <= TOL, f"{what} {name}: error {err}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_op_matches_onnxruntime_and_reference(case: Case, ref_run):
    model = case.model()
    got = interpret(import_onnx(model), _feeds(case))
    if case.ort:
        _close(got, _ort(model, _feeds(case)), "onnxruntime")
    if case.ref:
        _close(got, ref_run(model, _feeds(case)), "reference")


@pytest.mark.parametrize(
    "case_id", ["rms_last", "rope_position_ids", "attn_dynamo_form", "attn_fully_masked_row"]
)
def test_compiled_build_on_the_simulator_matches_onnxruntime(case_id, tmp_path):
    case = next(c for c in CASES if c.id == case_id)
    model = case.model()
    onnx.save(model, tmp_path / "m.onnx")
    mcpc.compile(tmp_path / "m.onnx", qat_config="fp32", output=tmp_path / "m.mcpb")
    got = run_program(load_program(tmp_path / "m.mcpb"), _feeds(case)).outputs
    _close(got, _ort(model, _feeds(case)), "simulator vs onnxruntime")


def test_nonpad_kv_seqlen_beside_a_past_is_refused_naming_why():
    data = {"q": f(1, 1, 2, 4), "k": f(1, 1, 2, 4), "v": f(1, 1, 2, 4), "pk": f(1, 1, 1, 4),
            "pv": f(1, 1, 1, 4), "n": np.array([2], np.int64)}  # fmt: skip
    case = Case("x", "Attention", data, opset=24, order=["q", "k", "v", "", "pk", "pv", "n"], n_out=3)
    with pytest.raises(UnsupportedError, match="node 'attention_node'.*nonpad_kv_seqlen cannot be combined"):
        import_onnx(case.model())


def test_rms_norm_stash_type_other_than_float_is_refused():
    case = Case("x", "RMSNormalization", {"x": f(2, 4), "w": f(4)}, {"stash_type": TensorProto.DOUBLE})
    with pytest.raises(UnsupportedError, match="node 'rmsnormalization_node'.*stash_type"):
        import_onnx(case.model())
