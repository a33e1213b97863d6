"""The paged KV cache ops (ir/ops_kv.py): text, verifier, and the interpreter against a plain
numpy attention over each sequence's contiguous K/V."""

from pathlib import Path

import numpy as np
import pytest

from mcpc.arch import numerics as nx
from mcpc.errors import InputError, VerifyError
from mcpc.ir import parse_module, print_module
from mcpc.ir.interpreter import ModuleState, interpret

# 2 sequences x 1 new token, 4 query heads over 2 KV heads of 8, blocks of 4 rows, 3 blocks + 1 trash
# block per head (16 rows a head); up to 2 blocks a sequence.
STEP = (Path(__file__).parents[1] / "data" / "paged_step.mcpir").read_text()
BLOCK, PER_HEAD, TRASH = 4, 16, 3


def _reference(q, ks, vs, scale):
    """out[b, hq] = softmax(q·K_b^T·scale)·V_b in f64 over sequence b's whole K/V (kv head hq // 2)."""
    out = np.zeros(q.shape, np.float64)
    for b in range(q.shape[0]):
        for hq in range(q.shape[1]):
            k, v = np.asarray(ks[b])[:, hq // 2], np.asarray(vs[b])[:, hq // 2]  # [L, D]
            s = q[b, hq, 0].astype(np.float64) @ k.T * scale
            p = np.exp(s - s.max())
            out[b, hq, 0] = (p / p.sum()) @ v
    return out


def test_paged_ops_round_trip_as_text():
    module = parse_module(STEP)
    assert print_module(parse_module(print_module(module))) == print_module(module)


def test_interleaved_sequences_attend_only_their_own_blocks():
    """Two sequences decode 7 steps each, their blocks interleaved in the cache (seq 0 owns blocks 2
    and 0, seq 1 block 1 then the trash block is never read); every step equals numpy."""
    module = parse_module(STEP)
    state, rng = ModuleState(module), np.random.default_rng(1)
    tables = {0: [2, 0], 1: [1]}
    ks, vs = {0: [], 1: []}, {0: [], 1: []}
    scale = float(np.float32(8**-0.5))
    for step in range(7):
        lens = [step + 1, min(step + 1, 4)]  # sequence 1 stops growing after its one block is full
        slot1 = tables[1][0] * BLOCK + step if step < 4 else TRASH * BLOCK
        slot = np.array([tables[0][step // BLOCK] * BLOCK + step % BLOCK, slot1], np.int32)
        q = rng.standard_normal((2, 4, 1, 8)).astype(np.float32)
        kn, vn = (rng.standard_normal((2, 2, 1, 8)).astype(np.float32) for _ in range(2))
        for b in (0, 1):
            if b == 0 or step < 4:
                ks[b].append(kn[b, :, 0])
                vs[b].append(vn[b, :, 0])
        nb0 = -(-lens[0] // BLOCK)
        gather = np.array([*tables[0][:nb0], tables[1][0], 0, 0][:4], np.int32)
        inputs = {
            "q": q, "kn": kn, "vn": vn, "slot": slot, "gather": gather,
            "start": np.array([0, nb0 * BLOCK], np.int32), "len": np.array(lens, np.int32),
        }  # fmt: skip
        out = interpret(module, inputs, "step", state, {"kv_blocks": nb0 + 1})["out"]
        np.testing.assert_allclose(out, _reference(q, ks, vs, scale), rtol=1e-5, atol=1e-6)
    # sequence 1's writes after its block filled went to slot 0 of the trash block, never read back
    np.testing.assert_array_equal(state.globals["k"][TRASH * BLOCK], kn[1, 0, 0])
    assert not state.globals["k"][TRASH * BLOCK + 1 : PER_HEAD].any()


def test_a_row_of_length_zero_is_zero_and_the_kernel_is_the_interpreters():
    q = np.random.default_rng(2).standard_normal((3, 8)).astype(np.float16)
    k = np.random.default_rng(3).standard_normal((12, 8)).astype(np.float16)
    out = nx.attention_rows(q, k, k, np.array([0, 4, 0]), np.array([4, 8, 0]), 0.5, "f16")
    assert out.dtype == np.float16 and not out[2].any()
    again = nx.attention_rows(q[1:2], k, k, np.array([4]), np.array([8]), 0.5, "f16")
    np.testing.assert_array_equal(again[0], out[1])  # a row's result does not depend on its neighbours


def _inputs(**over):
    z = np.zeros
    base = {
        "q": z((2, 4, 1, 8), np.float32),
        "kn": z((2, 2, 1, 8), np.float32), "vn": z((2, 2, 1, 8), np.float32),
        "slot": np.array([0, 4], np.int32), "gather": np.array([0, 1, 0, 0], np.int32),
        "start": np.array([0, 4], np.int32), "len": np.array([1, 1], np.int32),
    }  # fmt: skip
    return {**base, **over}


@pytest.mark.parametrize(
    ("over", "regs", "match"),
    [
        ({"slot": np.array([0, 16], np.int32)}, 2, r"slot 16 at index 1 is outside \[0, 16\)"),
        ({"gather": np.array([0, 4, 0, 0], np.int32)}, 2, r"block id 4 at index 1 is outside \[0, 4\)"),
        ({"len": np.array([1, 5], np.int32)}, 2, r"row 1 attends \[4, 9\), outside the 8 gathered rows"),
    ],
)
def test_indices_outside_the_cache_are_refused(over, regs, match):
    module = parse_module(STEP)
    with pytest.raises(InputError, match=match):
        interpret(module, _inputs(**over), "step", ModuleState(module), {"kv_blocks": regs})


def test_the_verifier_bounds_the_block_count_and_checks_the_cache_shape():
    too_many = STEP.replace("@kv_blocks {max = 4, min = 0}", "@kv_blocks {max = 5, min = 0}")
    with pytest.raises(VerifyError, match=r"block count in \[0, 5\] can leave \[0, 4\]"):
        parse_module(too_many).verify()
    odd = STEP.replace("global @v : tensor<32x8xf32>", "global @v : tensor<30x8xf32>")
    with pytest.raises(VerifyError, match="is not a KV cache of 2 head"):
        parse_module(odd).verify()
    missing = STEP.replace('global = "k"', 'global = "kk"')
    with pytest.raises(VerifyError, match="no global @kk is declared"):
        parse_module(missing).verify()
