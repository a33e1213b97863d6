"""Prefill row extents (docs/decoding.md, "Prefill row extents"): one ``prefill`` program run at
several chunk lengths gives the interpreter's logits bit for bit on the rows in use, costs cycles
that grow with the length (a 1-token call far below a full chunk), and timing-only runs cost the
same cycles as functional ones."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import mcpc
from mcpc.backend.row_extent import NotRowLocal, token_axes
from mcpc.decoder_check import paged_feeds
from mcpc.ir.decoder_import import PREFILL_ROWS_REG, DecoderBuild
from mcpc.ir.interpreter import ModuleState, interpret
from mcpc.ir.parser import parse_module
from mcpc.sim import Session
from mcpc.sim.decoder import prefill_rows_in_use

LLAMA = Path(__file__).parents[1] / "llm" / "decoders" / "llama-with-past.onnx"
CHUNK = 32


@pytest.fixture(scope="module")
def build():
    return mcpc.compile(LLAMA, qat_config="fp16", decoder=DecoderBuild(max_seq=64, prefill_chunk=CHUNK))


def _inputs(build, n: int):
    info = build.program.meta["decoder"]
    feeds, used = paged_feeds([[0]], [0], [n], CHUNK, 1, info["kv_blocks"])
    ids = np.zeros((1, CHUNK), np.int64)
    ids[0, :n] = np.arange(3, 3 + n)
    pos = np.zeros((1, CHUNK), np.int64)
    pos[0, :n] = np.arange(n)
    return {"input_ids": ids, "position_ids": pos, **feeds}, used


def test_prefill_follows_the_chunk_length(build):
    info = build.program.meta["decoder"]
    assert info["prefill_rows"] == PREFILL_ROWS_REG
    ext = info["row_extent"]["prefill"]
    assert ext["rows"] == CHUNK and ext["counted"] > 0 and "refused" not in ext
    cycles = {}
    for n in (1, 5, 17, CHUNK):
        inputs, used = _inputs(build, n)
        regs = {"kv_blocks": used, PREFILL_ROWS_REG: n}
        want = interpret(build.module, inputs, "prefill", ModuleState(build.module), regs)["logits"]
        session = Session(build)
        got = session.run(inputs, entry="prefill", registers=regs)["logits"]
        np.testing.assert_array_equal(got[0, :n], want[0, :n], err_msg=f"{n} tokens")
        cycles[n] = session.last_profile["cycles"]
        timing = Session(build)
        timing.run(inputs, entry="prefill", registers=regs, timing_only=True)
        assert timing.last_profile["cycles"] == cycles[n]
    assert cycles[1] < cycles[5] < cycles[17] < cycles[CHUNK]
    assert cycles[1] < 0.8 * cycles[CHUNK]
    # the decode entry has no extent: it reads no such register
    assert "decode" not in info["row_extent"]


def test_prefill_refuses_a_run_without_the_row_count(build):
    inputs, used = _inputs(build, 3)
    with pytest.raises(mcpc.errors.InputError, match=PREFILL_ROWS_REG):
        Session(build).run(inputs, entry="prefill", registers={"kv_blocks": used})


def test_rows_in_use_of_a_call():
    assert prefill_rows_in_use([5], 8) == 5
    assert prefill_rows_in_use([8, 3], 8) == 11  # padded per sequence: through the last one's tokens
    assert prefill_rows_in_use([2, 0], 8) == 2


def test_analysis_refuses_an_op_mixing_token_rows():
    text = """
module @m {
  func @prefill(%p: tensor<1x4xf32>) -> ("y": tensor<1x1xf32>) {
    %0 = mcp.reduce_sum %p {axes = [1], keepdims = true} : (tensor<1x4xf32>) -> tensor<1x1xf32>
    mcp.return %0 : (tensor<1x1xf32>) -> ()
  }
}
"""
    fn = parse_module(text).functions["prefill"]
    with pytest.raises(NotRowLocal, match="reduction over the token rows"):
        token_axes(fn, 4)
    text = text.replace("mcp.reduce_sum %p {axes = [1], keepdims = true}", "mcp.neg %p").replace("1x1", "1x4")
    fn = parse_module(text).functions["prefill"]
    assert token_axes(fn, 4)[fn.outputs[0]] == (1,)


_ROPE_ANGLES = """
module @m {
  func @prefill(%p: tensor<1x4xf32>, %f: tensor<1x8x1xf32>) -> ("y": tensor<1x4x8xf32>) {
    %1 = mcp.reshape %p {shape = [1, 1, 4]} : (tensor<1x4xf32>) -> tensor<1x1x4xf32>
    %2 = mcp.matmul %f, %1 {out = f32} : (tensor<1x8x1xf32>, tensor<1x1x4xf32>) -> tensor<1x8x4xf32>
    %3 = mcp.transpose %2 {perm = [0, 2, 1]} : (tensor<1x8x4xf32>) -> tensor<1x4x8xf32>
    mcp.return %3 : (tensor<1x4x8xf32>) -> ()
  }
}
"""


def test_analysis_follows_token_rows_through_a_matmuls_b_columns():
    """RoPE's angles as Optimum exports them, inv_freq[:, None] @ positions[None, :] then a
    transpose: the positions are B, its columns the token rows; column n of the product reads
    column n of B only, so the rows stay row-local and the transpose brings them back to axis 1."""
    fn = parse_module(_ROPE_ANGLES).functions["prefill"]
    tok = token_axes(fn, 4)
    matmul = next(op for op in fn.ops if op.name == "mcp.matmul")
    assert tok[matmul.results[0]] == (2,)
    assert tok[fn.outputs[0]] == (1,)


_MIXING = """
module @m {
  func @prefill(%p: tensor<1x4xf32>, %f: tensor<8x4xf32>) -> ("y": tensor<RESULT>) {
    %0 = mcp.reshape %p {shape = [4, 1]} : (tensor<1x4xf32>) -> tensor<4x1xf32>
    %1 = mcp.matmul A, B {out = f32} : (tensor<TA>, tensor<TB>) -> tensor<RESULT>
    mcp.return %1 : (tensor<RESULT>) -> ()
  }
}
"""


@pytest.mark.parametrize(
    "a, b, ta, tb, result, why",
    [
        # the positions as B's rows, its contraction axis: every output reads every token
        ("%f", "%0", "8x4xf32", "4x1xf32", "8x1xf32", "contraction axis"),
        # token rows in A's rows and in B's columns: out[m, n] mixes token m with token n
        ("%0", "%p", "4x1xf32", "1x4xf32", "4x4xf32", "both matmul operands"),
    ],
)
def test_analysis_refuses_a_matmul_mixing_token_rows(a, b, ta, tb, result, why):
    text = _MIXING.replace("A, B", f"{a}, {b}").replace("TA", ta).replace("TB", tb).replace("RESULT", result)
    with pytest.raises(NotRowLocal, match=why):
        token_axes(parse_module(text).functions["prefill"], 4)


def test_two_sequences_a_call_padded_per_sequence():
    """A --max-batch 2 build: slot 1's rows follow slot 0's C rows; the extent runs through slot
    1's last token, and both sequences' rows in use are the interpreter's."""
    chunk = 8
    built = mcpc.compile(
        LLAMA, qat_config="fp32", decoder=DecoderBuild(max_seq=64, max_batch=2, prefill_chunk=chunk)
    )
    info = built.program.meta["decoder"]
    assert "refused" not in info["row_extent"]["prefill"]
    cycles = []
    for rows in ([8, 3], [5, 0], [2, 2]):
        feeds, used = paged_feeds([[0], [1]], [0, 0], rows, chunk, 2, info["kv_blocks"])
        ids, pos = np.zeros((2, chunk), np.int64), np.zeros((2, chunk), np.int64)
        for b, n in enumerate(rows):
            ids[b, :n], pos[b, :n] = np.arange(7 + b, 7 + b + n), np.arange(n)
        inputs = {"input_ids": ids, "position_ids": pos, **feeds}
        regs = {"kv_blocks": used, PREFILL_ROWS_REG: prefill_rows_in_use(rows, chunk)}
        want = interpret(built.module, inputs, "prefill", ModuleState(built.module), regs)["logits"]
        session = Session(built)
        got = session.run(inputs, entry="prefill", registers=regs)["logits"]
        for b, n in enumerate(rows):
            np.testing.assert_array_equal(got[b, :n], want[b, :n], err_msg=f"{rows}: slot {b}")
        cycles.append(session.last_profile["cycles"])
    assert cycles[1] < cycles[2] < cycles[0]  # 5 rows < 8 + 2 rows < 8 + 3 rows


def test_w4a16_build_follows_the_chunk_length():
    """W4A16 quantizes the embedding table too: its gathered codes are dequantized per token row,
    which the analysis accepts as row-local; the quantized matmuls read the count."""
    chunk = 16
    built = mcpc.compile(LLAMA, qat_config="qat_w4a16", decoder=DecoderBuild(max_seq=64, prefill_chunk=chunk))
    ext = built.program.meta["decoder"]["row_extent"]["prefill"]
    assert "refused" not in ext and ext["counted"] > 0
    cycles = []
    for n in (2, chunk):
        feeds, used = paged_feeds([[0]], [0], [n], chunk, 1, built.program.meta["decoder"]["kv_blocks"])
        ids, pos = np.zeros((1, chunk), np.int64), np.zeros((1, chunk), np.int64)
        ids[0, :n], pos[0, :n] = np.arange(11, 11 + n), np.arange(n)
        inputs = {"input_ids": ids, "position_ids": pos, **feeds}
        regs = {"kv_blocks": used, PREFILL_ROWS_REG: n}
        want = interpret(built.module, inputs, "prefill", ModuleState(built.module), regs)["logits"]
        session = Session(built)
        got = session.run(inputs, entry="prefill", registers=regs)["logits"]
        np.testing.assert_array_equal(got[0, :n], want[0, :n])
        cycles.append(session.last_profile["cycles"])
    assert cycles[0] < cycles[1]
