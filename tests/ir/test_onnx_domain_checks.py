"""The static refusals of the com.microsoft handlers (``DOMAIN_CHECKS``): decided from the node
alone, before import, so that every refused node of a model is named in one message (exit 4) and
``mcpc inspect-model`` marks it unsupported with the reason."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

from mcpc.cli import cli
from mcpc.errors import UnsupportedError
from mcpc.ir.onnx_handlers import DOMAIN_CHECKS, DOMAIN_HANDLERS
from mcpc.ir.onnx_import import import_onnx
from mcpc.ir.onnx_support import unsupported_reason

MS = "com.microsoft"


def node(op, inputs, outputs=("y",), **attrs):
    return helper.make_node(op, list(inputs), list(outputs), name="n", domain=MS, **attrs)


GQA_IN = ["qkv", "", "", "pk", "pv", "seqlens", "total"]
GQA_OUT = ["y", "present_k", "present_v"]
NBITS = {"K": 64, "N": 32, "bits": 4, "block_size": 32}
# (node, the words of its refusal; None: accepted)
CASES = {
    "attention-ok": (node("Attention", ["x", "w", "b"], num_heads=2), None),
    "attention-rotary": (
        node("Attention", ["x", "w"], num_heads=2, do_rotary=1),
        "do_rotary=1 is not supported",
    ),
    "attention-share": (
        node("Attention", ["x", "w"], num_heads=2, past_present_share_buffer=1),
        "past_present_share_buffer=1 is not supported",
    ),
    "attention-past-len": (
        node("Attention", ["x", "w", "", "", "past", "", "plen"], num_heads=2),
        "input 6 (past_sequence_length, a shared past/present buffer)",
    ),
    "attention-heads": (node("Attention", ["x", "w"]), "num_heads=0 is not valid"),
    "attention-sizes": (
        node("Attention", ["x", "w"], num_heads=2, qkv_hidden_sizes=[8, 6, 8]),
        "qkv_hidden_sizes=[8, 6, 8] are not three sizes",
    ),
    "attention-present-v-size": (
        node("Attention", ["x", "w"], ["y", "present"], num_heads=2, qkv_hidden_sizes=[8, 8, 4]),
        "the present output is used but qkv_hidden_sizes=[8, 8, 4]",
    ),
    "mha-ok": (node("MultiHeadAttention", ["q", "k", "v"], ["y", "", "", "qk_unread"], num_heads=2), None),
    "mha-packed": (node("MultiHeadAttention", ["qkv"], num_heads=2), "packed QKV or packed KV inputs"),
    "mha-packed-kv": (node("MultiHeadAttention", ["q", "kv"], num_heads=2), "packed QKV or packed KV inputs"),
    "mha-qk": (
        node("MultiHeadAttention", ["q", "k", "v"], ["y", "", "", "qk"], num_heads=2),
        "output 3 (qk) is used",
    ),
    "mha-past-alone": (
        node("MultiHeadAttention", ["q", "k", "v", "", "", "", "pk"], num_heads=2),
        "past_key and past_value must be given together",
    ),
    "mha-cache-indirection": (
        node("MultiHeadAttention", ["q", "k", "v", "", "", "", "", "", "", "ci"], num_heads=2),
        "input 9 (cache_indirection) is not supported",
    ),
    "embed-segments": (
        node("EmbedLayerNormalization", ["ids", "seg", "word", "pos", "", "g", "b"]),
        "segment_ids and segment_embedding must be given together",
    ),
    "fused-matmul-ok": (node("FusedMatMul", ["a", "b"], transA=1, alpha=0.5), None),
    "fused-matmul-batch": (node("FusedMatMul", ["a", "b"], transBatchB=1), "transBatchB=1 is not supported"),
    "gqa-ok": (node("GroupQueryAttention", GQA_IN, GQA_OUT, num_heads=4, kv_num_heads=2), None),
    "gqa-smooth": (
        node("GroupQueryAttention", GQA_IN, GQA_OUT, num_heads=4, kv_num_heads=2, smooth_softmax=1),
        "smooth_softmax=1 is not supported",
    ),
    "gqa-heads": (
        node("GroupQueryAttention", GQA_IN, GQA_OUT, num_heads=3, kv_num_heads=2),
        "num_heads=3, kv_num_heads=2: num_heads must be a multiple",
    ),
    "gqa-position-ids": (
        node("GroupQueryAttention", [*GQA_IN, "", "", "pos"], GQA_OUT, num_heads=4, kv_num_heads=2),
        "input 9 (position_ids) is not supported",
    ),
    "gqa-attention-bias": (
        node("GroupQueryAttention", [*GQA_IN, "", "", "", "ab"], GQA_OUT, num_heads=4, kv_num_heads=2),
        "input 10 (attention_bias) is not supported",
    ),
    "gqa-head-sink": (
        node("GroupQueryAttention", [*GQA_IN, "", "", "", "", "hs"], GQA_OUT, num_heads=4, kv_num_heads=2),
        "input 11 (head_sink) is not supported",
    ),
    "gqa-qk-output": (
        node("GroupQueryAttention", GQA_IN, [*GQA_OUT, "qk"], num_heads=4, kv_num_heads=2),
        "output 3 (output_qk) is used",
    ),
    "gqa-no-total": (
        node("GroupQueryAttention", GQA_IN[:6], GQA_OUT, num_heads=4, kv_num_heads=2),
        "inputs 5 (seqlens_k) and 6 (total_sequence_length) are required",
    ),
    "gqa-key-alone": (
        node(
            "GroupQueryAttention", ["q", "k", "", "pk", "pv", "s", "t"], GQA_OUT, num_heads=4, kv_num_heads=2
        ),
        "key and value must be both given or both omitted",
    ),
    "gqa-rotary-no-cache": (
        node("GroupQueryAttention", GQA_IN, GQA_OUT, num_heads=4, kv_num_heads=2, do_rotary=1),
        "do_rotary=1 needs inputs 7 (cos_cache) and 8 (sin_cache)",
    ),
    "rope-packed": (
        node("RotaryEmbedding", ["x", "pos", "cos", "sin"], is_packed_batching=1),
        "is_packed_batching=1 is not supported",
    ),
    "sln-mean": (
        node("SkipSimplifiedLayerNormalization", ["x", "s", "g"], ["y", "mean"]),
        "output 1 (mean) is requested",
    ),
    "gbq-bits": (node("GatherBlockQuantized", ["d", "i", "s"], bits=2), "bits=2 is not supported"),
    "gbq-block": (node("GatherBlockQuantized", ["d", "i", "s"], block_size=24), "block_size=24 is not valid"),
    "nbits-ok": (node("MatMulNBits", ["a", "b", "s"], accuracy_level=4, **NBITS), None),
    "nbits-level": (
        node("MatMulNBits", ["a", "b", "s"], **NBITS | {"accuracy_level": 5}),
        "accuracy_level=5",
    ),
    "nbits-bits": (node("MatMulNBits", ["a", "b", "s"], **NBITS | {"bits": 3}), "bits=3 is not supported"),
}


@pytest.mark.parametrize("key", CASES)
def test_static_refusal_before_import(key):
    n, words = CASES[key]
    used = {"y", "present", "qk", "mean"}  # the names some node or graph output reads here
    reason = unsupported_reason(n, 17, used)
    assert reason is None if words is None else words in reason, reason


def test_every_domain_check_is_exercised_and_checks_a_handled_op():
    for key in DOMAIN_CHECKS:
        assert key in DOMAIN_HANDLERS, key
    refused = {CASES[k][0].op_type for k in CASES if CASES[k][1] is not None}
    assert {t for _, t in DOMAIN_CHECKS} <= refused


def _two_refused_model():
    """x → FusedMatMul (transBatchA) and Attention (do_rotary), plus an accepted FusedMatMul."""
    f = TensorProto.FLOAT
    vi = helper.make_tensor_value_info
    w = helper.make_tensor("w", f, [8, 24], [0.0] * 192)
    nodes = [
        helper.make_node("FusedMatMul", ["x", "m"], ["mm"], name="mm_batch", domain=MS, transBatchA=1),
        helper.make_node("FusedMatMul", ["x", "m"], ["ok"], name="mm_ok", domain=MS, alpha=2.0),
        helper.make_node(
            "Attention", ["x", "w"], ["att"], name="att_rotary", domain=MS, num_heads=2, do_rotary=1
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "two",
        [vi("x", f, [1, 4, 8]), vi("m", f, [8, 8])],
        [vi("mm", f, [1, 4, 8]), vi("ok", f, [1, 4, 8]), vi("att", f, [1, 4, 8])],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])


def test_two_refused_contrib_nodes_are_listed_in_one_message(tmp_path):
    with pytest.raises(UnsupportedError) as e:
        import_onnx(_two_refused_model())
    msg = str(e.value)
    assert e.value.exit_code == 4
    assert msg.startswith("model 'two': 2 nodes cannot be imported, in 2 groups: ")
    assert "FusedMatMul (com.microsoft opset 1), 1 node 'mm_batch': transBatchA=1 is not supported" in msg
    assert "Attention (com.microsoft opset 1), 1 node 'att_rotary': do_rotary=1 is not supported" in msg
    assert "mm_ok" not in msg


def test_cli_compile_exit_4_and_inspect_model_shows_both(tmp_path):
    model = tmp_path / "two.onnx"
    model.write_bytes(_two_refused_model().SerializeToString())
    built = CliRunner().invoke(cli, ["compile", str(model), "-o", str(tmp_path / "two.mcpb")])
    assert built.exit_code == 4, built.output
    assert "Traceback" not in built.output and not (tmp_path / "two.mcpb").exists()
    assert "'mm_batch': transBatchA=1" in built.output and "'att_rotary': do_rotary=1" in built.output
    text = CliRunner().invoke(cli, ["inspect-model", str(model)]).output
    assert "2 node(s) unsupported" in text, text
    assert "FusedMatMul (com.microsoft opset 1), 1 node 'mm_batch': transBatchA=1 is not supported" in text
    assert "Attention (com.microsoft opset 1), 1 node 'att_rotary': do_rotary=1 is not supported" in text
