"""The attention heat of ``mcp.paged_attention`` / ``vattn`` (docs/decoding.md, "Attention heat"):
the heat table the simulator writes equals the IR interpreter's bit for bit and a numpy
recomputation from Q and K, rows past the positions in use are not written, and the heat costs
cycles only in a program that asks for it."""

from pathlib import Path

import numpy as np
import pytest

import mcpc
from mcpc.arch.isa import vattn_heat_offset
from mcpc.errors import VerifyError
from mcpc.ir import parse_module
from mcpc.ir.interpreter import ModuleState, interpret
from mcpc.sim import Session

STEP = (Path(__file__).parents[1] / "data" / "paged_step.mcpir").read_text()
BLOCK, HEAT_ROW = 4, 4  # blocks of 4 rows; the heat of gathered position j is row 4 + j of @heat


def _with_heat(text: str, rows: int = 20) -> str:
    decl = f"  global @heat : tensor<{rows}x4xf32>\n"
    text = text.replace("  host_reg @kv_blocks", decl + "  host_reg @kv_blocks")
    return text.replace('v_global = "v"}', f'v_global = "v", heat_global = "heat", heat_row = {HEAT_ROW}}}')


@pytest.fixture(scope="module", params=["fp32", "fp16"])
def builds(request):
    plain = mcpc.compile(parse_module(STEP), qat_config=request.param)
    heat = mcpc.compile(parse_module(_with_heat(STEP)), qat_config=request.param)
    return plain, heat


def _walk(module, steps=8, seed=1):
    """Two sequences, one new token each per step (sequence 0 over blocks 2 then 0, sequence 1 over
    block 1): (inputs, registers) per step, as tests/backend/test_paged_kv_lowering.py walks them."""
    dtype = {a.name: a.type.dtype.name for a in module.functions["step"].args}
    rng = np.random.default_rng(seed)
    out = []
    for t in range(steps):
        lens = [t + 1, min(t + 1, BLOCK)]
        nb0 = -(-lens[0] // BLOCK)
        inputs = {
            "q": rng.standard_normal((2, 4, 1, 8)) * 2, "kn": rng.standard_normal((2, 2, 1, 8)),
            "vn": rng.standard_normal((2, 2, 1, 8)),
            "slot": np.array([[2, 0][t // BLOCK] * BLOCK + t % BLOCK, 4 + t if t < BLOCK else 12], np.int32),
            "gather": np.array([*[2, 0][:nb0], 1, 0, 0][:4], np.int32),
            "start": np.array([0, nb0 * BLOCK], np.int32), "len": np.array(lens, np.int32),
        }  # fmt: skip
        inputs = {k: v.astype(np.float16) if dtype[k] == "f16" else v for k, v in inputs.items()}
        inputs = {k: v.astype(np.float32) if dtype[k] == "f32" else v for k, v in inputs.items()}
        out.append((inputs, {"kv_blocks": nb0 + 1}))
    return out


def _numpy_heat(q, k_cache, gather, start, length, n_blocks, scale):
    """Heat [positions, q_heads] in float64 from Q and the K cache: softmax of each row's scores."""
    b, hq, s, d = q.shape
    per_head = k_cache.shape[0] // 2
    rows = (gather[:n_blocks, None] * BLOCK + np.arange(BLOCK)).reshape(-1)
    heat = np.zeros((n_blocks * BLOCK, hq))
    for hd in range(hq):
        kh = hd // (hq // 2)
        k = k_cache[kh * per_head + rows].astype(np.float64)
        for r in range(b * s):
            s0, n = int(start[r]), int(length[r])
            if n:
                z = k[s0 : s0 + n] @ q.reshape(b, hq, d)[r // s, hd].astype(np.float64) * scale
                p = np.exp(z - z.max())
                heat[s0 : s0 + n, hd] += p / p.sum()
    return heat


def test_heat_is_the_interpreters_bit_for_bit_and_numpys(builds):
    _, built = builds
    state, session = ModuleState(built.module), Session(built)
    scale = 0.35355339
    for step, (inputs, regs) in enumerate(_walk(built.module)):
        want = interpret(built.module, inputs, "step", state, regs)["out"]
        np.testing.assert_array_equal(session.run(inputs, registers=regs)["out"], want)
        heat = session.persistent_buffer("heat")
        np.testing.assert_array_equal(heat, state.globals["heat"])  # every row, untouched ones too
        n = regs["kv_blocks"] * BLOCK
        used = heat[HEAT_ROW : HEAT_ROW + n]
        ref = _numpy_heat(inputs["q"], state.globals["k"], inputs["gather"], inputs["start"], inputs["len"],
                          regs["kv_blocks"], scale)  # fmt: skip
        half = state.globals["k"].dtype == np.float16  # Q rounded to f16 inside the fp16 build
        np.testing.assert_allclose(used, ref, rtol=5e-3 if half else 1e-5, atol=1e-4 if half else 1e-6)
        # one query row per head and sequence: each head's heat sums to the 2 rows' probabilities
        np.testing.assert_allclose(used.sum(axis=0), 2.0, rtol=1e-5)
        assert not heat[:HEAT_ROW].any(), "rows before heat_row are another layer's"
        if step == 0:
            assert not heat[HEAT_ROW + n :].any(), "rows past the positions in use are not written"


def test_heat_costs_cycles_only_when_asked(builds):
    plain, heat = builds
    vattn = [i for i in plain.program.instructions() if i.op == "vattn"]
    assert vattn and all(i.fields["heat"] == 0 for i in vattn)
    assert "heat" not in {g for g in plain.module.globals}
    with_heat = [i for i in heat.program.instructions() if i.op == "vattn"]
    assert all(i.fields["heat"] == 1 for i in with_heat)
    cycles = []
    for built in (plain, heat):
        session = Session(built)
        for inputs, regs in _walk(built.module, steps=6):
            session.run(inputs, registers=regs)
        cycles.append(session.last_profile["cycles"])
        session.run(inputs, registers=regs, timing_only=True)  # timing-only: the same cycles, no values
        assert session.last_profile["cycles"] == cycles[-1]
    assert cycles[1] > cycles[0], cycles


def test_the_heat_table_follows_the_result_rounded_to_4_bytes():
    assert vattn_heat_offset(3, 3, "f16") == 20 and vattn_heat_offset(4, 8, "f32") == 128


def test_a_heat_global_too_small_is_refused():
    with pytest.raises(VerifyError, match=r"heat global @heat .* must be f32 \[rows, 4\] with rows 4\.\.20"):
        mcpc.compile(parse_module(_with_heat(STEP, rows=16)), qat_config="fp32")
