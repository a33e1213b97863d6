"""Correctness chain, link 2: the IR interpreter on the *compiled* IR (after every pass, tiles
included) and the functional simulator on the binary agree bit for bit, on whole models, for
every target and both builds; and the token bits order every cross-engine memory conflict, so
the decoupled engines compute what the sequential stream means.  Link 1 (ONNX Runtime vs
interpreter on the imported IR) lives in tests/ir; the accuracy against ONNX Runtime of the binary
in test_end_to_end."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from e2e_util import TARGETS

import mcpc
from mcpc.arch.isa import decode_program
from mcpc.backend.hazards import check_hazards
from mcpc.examples import causal_mask, decoder_block, encoder_block, mlp
from mcpc.ir.interpreter import interpret
from mcpc.sim.api import run_program
from mcpc.sim.loader import from_program


def _models():
    rng = np.random.default_rng(7)
    yield "mlp", mlp(), {"x": rng.standard_normal((4, 256)).astype(np.float32)}, None
    x = rng.standard_normal((1, 64, 256)).astype(np.float32)
    yield "encoder", encoder_block(), {"x": x, "mask": causal_mask(64)}, None
    yield "decoder", decoder_block(), {"x": x[:, :48]}, {"seq": 48}


@pytest.mark.parametrize("qat_config", ["fp32.yaml", "fp16.yaml"])
@pytest.mark.parametrize("target", TARGETS)
def test_simulator_is_bit_exact_with_interpreter_on_compiled_ir(tmp_path, target, qat_config):
    for name, model, inputs, dims in _models():
        path = tmp_path / f"{name}.onnx"
        onnx.save(model, path)
        result = mcpc.compile(path, target=target, qat_config=qat_config, dims=dims)
        check_hazards(decode_program(result.program.text))  # tokens order every memory conflict
        want = interpret(result.module, inputs)
        got = run_program(from_program(result.program), inputs).outputs
        assert set(got) == set(want)
        for out, w in want.items():
            g = got[out]
            assert g.dtype == w.dtype and g.shape == w.shape, (name, out)
            same = np.ascontiguousarray(g).view(np.uint8) == np.ascontiguousarray(w).view(np.uint8)
            assert same.all(), (
                f"{name}/{out} on {target} {qat_config}: simulator differs from the interpreter"
            )
