"""Decoder builds (ir/decoder_graph.py, ir/decoder_import.py, mcpc/decoder_check.py): recognition
of both naming conventions, the refusals, and greedy generation through the IR interpreter's
prefill + decode entries over a paged cache equal to ONNX Runtime's own KV loop."""

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from decoder_models import make_decoder, ort_greedy, paged_greedy

from mcpc.decoder_check import check_rewrite
from mcpc.errors import CheckFailed, UnsupportedError, UsageError
from mcpc.ir import ops
from mcpc.ir.decoder_import import DecoderBuild, import_decoder
from mcpc.ir.interpreter import ModuleState, interpret

FIXTURES = Path(__file__).parents[1] / "torch_models" / "fixtures"


def _ops(fn, cls):
    return [op for op in fn.ops if isinstance(op, cls)]


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"naming": "torch", "scale": "q", "mask": "where", "guard": True},
        {"scale": "div", "kv_heads": 4},
        {"naming": "torch", "kv_heads": 1, "layers": 3},
    ],
)
def test_both_conventions_are_recognised_and_rewritten(kw):
    built = import_decoder(make_decoder(**kw), DecoderBuild(max_seq=100, max_batch=2, prefill_chunk=8))
    layers, kv = kw.get("layers", 2), kw.get("kv_heads", 2)
    info = built.decoder
    assert info["layers"] == layers and info["kv_heads"] == kv and info["q_heads"] == 4
    assert (info["max_batch"], info["kv_blocks"], info["prefill_chunk"], info["vocab"]) == (2, 4, 8, 48)
    assert info["inputs"] == {"ids": "input_ids", "positions": "position_ids"}
    assert built.scales == [pytest.approx(8**-0.5)] * layers
    m = built.module
    assert list(m.functions) == ["prefill", "decode"]
    assert sorted(m.globals) == sorted(f"kv_{k}_{i}" for i in range(layers) for k in "kv")
    assert m.globals["kv_k_0"].type.shape == (kv * 5 * 64, 8)
    assert (m.host_regs["kv_blocks"].min, m.host_regs["kv_blocks"].max) == (0, 4)
    for fn, seq in ((m.functions["prefill"], 8), (m.functions["decode"], 1)):
        assert fn.arg_names == ["input_ids", "position_ids", "kv_slot", "kv_gather", "kv_start", "kv_len"]
        assert fn.result_names == ["logits"] and fn.outputs[0].type.shape == (2, seq, 48)
        assert len(_ops(fn, ops.KVStoreOp)) == 2 * layers and len(_ops(fn, ops.PagedAttentionOp)) == layers
    errs = check_rewrite(built, m, 1e-4)["errors"]
    assert max(errs.values()) < 1e-4


def _refusal(model, match):
    with pytest.raises(UnsupportedError, match=match):
        import_decoder(model, DecoderBuild(max_seq=64))


def test_a_graph_without_past_is_refused():
    _refusal(FIXTURES / "gpt-dynamo-op20.onnx", "no past K/V inputs")


def test_positions_computed_from_the_past_length_are_refused_naming_the_node():
    """A Range from the past length (not a Slice of a table by it) cannot take per-sequence positions."""
    _refusal(
        make_decoder(positions="past_shape"), r"node '/Shape_\d+' \(Shape\) reads 'past_key_values.0.key'"
    )


def test_a_past_without_its_present_output_is_refused():
    model = make_decoder()
    outs = [o for o in model.graph.output if o.name != "present.1.value"]
    del model.graph.output[:]
    model.graph.output.extend(outs)
    _refusal(model, "past input 'past_key_values.1.value' has no present output 'present.1.value'")


def test_a_concat_along_another_axis_is_refused():
    model = make_decoder()
    node = next(n for n in model.graph.node if n.output[0] == "present.0.key")
    node.attribute[0].i = 3
    _refusal(model, r"node '/cat0key' \(Concat\) extends 'past_key_values.0.key' .* along axis 3")


def test_other_outputs_are_refused():
    model = make_decoder()
    model.graph.output.append(onnx.helper.make_tensor_value_info("t1", onnx.TensorProto.FLOAT, None))
    _refusal(model, r"outputs \['logits', 't1'\] remain")


def test_a_mask_that_is_not_causal_fails_the_self_check_naming_the_layer():
    """A sliding window of 2 has the structure of a mask; its meaning differs, which the self-check
    finds in layer 1's K/V (computed from layer 0's attention)."""
    built = import_decoder(make_decoder(window=2), DecoderBuild(max_seq=64))
    with pytest.raises(CheckFailed, match="layer 1's (key|value) cache differs .* layer before it"):
        check_rewrite(built, built.module, 1e-4)


def test_build_options_are_checked():
    with pytest.raises(UsageError, match="--prefill-chunk 80 exceeds --max-seq 64"):
        DecoderBuild(64, prefill_chunk=80)
    with pytest.raises(UsageError, match="--kv-blocks 2 holds fewer than the 3 blocks"):
        DecoderBuild(130, kv_blocks=2)
    assert DecoderBuild(130, max_batch=3).num_blocks == 9 and DecoderBuild(130).chunk == 64


def test_a_max_seq_beyond_the_position_table_is_refused():
    """GPT-2's learned positions (512 rows here) and our fixture's RoPE tables (128 rows, gathered
    at position_ids by the build) bound --max-seq."""
    with pytest.raises(
        UsageError, match=r"wpe/Gather' \(Gather\) gathers .* \(512 positions\).*--max-seq 600"
    ):
        import_decoder(
            Path(__file__).parents[1] / "llm" / "decoders" / "gpt2-with-past.onnx", DecoderBuild(600)
        )
    with pytest.raises(UsageError, match=r"\(128 positions\) at 'position_ids': --max-seq 129"):
        import_decoder(FIXTURES / "gpt_kv-torchscript-op17.onnx", DecoderBuild(129))


def _ir_greedy(built, prompts, new, tables):
    """Greedy decoding through the interpreter's prefill and decode entries (``paged_greedy``)."""
    state = ModuleState(built.module)

    def run(entry, inputs, registers):
        return interpret(built.module, inputs, entry, state, registers)["logits"]

    return paged_greedy(run, built.decoder, prompts, new, tables)


def test_greedy_generation_through_the_interpreter_equals_onnx_runtime():
    """50 prompt tokens in chunks of 16 then 24 generated: the context crosses into a second
    block; the sequence's blocks are 3 then 1 of a 4-block cache (block 4 the trash)."""
    model = make_decoder(seed=3)
    built = import_decoder(model, DecoderBuild(max_seq=128, kv_blocks=4, prefill_chunk=16))
    prompt = list(np.random.default_rng(5).integers(0, 48, 50))
    want = ort_greedy(model, prompt, 24)
    assert _ir_greedy(built, [prompt], 24, [[3, 1]]) == [want]
    assert len(set(want)) > 3  # a real continuation, not one repeated token


@pytest.mark.parametrize("name", ["gpt_kv-torchscript-op17.onnx", "gpt_kv-dynamo-op20.onnx"])
def test_batched_greedy_generation_of_our_torch_fixture_equals_onnx_runtime(name):
    """Our torch fixtures take RoPE positions from the past length (cos/sin sliced by it): the
    build gathers them at position_ids instead.  Two sequences (prompts of 7 and 12 tokens, chunks
    of 8, so one is idle in the second prefill call) decode 24 tokens together, each at its own
    context; each equals ONNX Runtime's loop on that sequence alone."""
    model = onnx.load(FIXTURES / name)
    built = import_decoder(model, DecoderBuild(max_seq=100, max_batch=2, kv_blocks=4, prefill_chunk=8))
    assert built.decoder["inputs"]["positions"] == "position_ids"
    rng = np.random.default_rng(7)
    prompts = [list(rng.integers(0, 256, 7)), list(rng.integers(0, 256, 12))]
    want = [ort_greedy(model, p, 24) for p in prompts]
    assert _ir_greedy(built, prompts, 24, [[2, 1], [0, 3]]) == want


DECODERS = Path(__file__).parents[1] / "llm" / "decoders"


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_the_three_small_families_generate_onnx_runtimes_24_greedy_tokens(family):
    """transformers exports (past_key_values.{i}, attention_mask, position_ids) of Llama (GQA,
    RoPE), Qwen2 (q/k/v biases) and GPT-2 (fused QKV through Split): one build each, prompt in
    chunks of 4, 24 tokens through the interpreter equal to decoders.json (ONNX Runtime's KV loop)."""
    record = json.loads((DECODERS / "decoders.json").read_text())["models"][family]
    built = import_decoder(DECODERS / record["file"], DecoderBuild(max_seq=64, prefill_chunk=4))
    assert built.decoder["kv_heads"] == record["kv_heads"] and built.decoder["q_heads"] == record["q_heads"]
    assert _ir_greedy(built, [record["prompt"]], 24, [[0]]) == [record["greedy"]]
