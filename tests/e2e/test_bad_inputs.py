"""Bad inputs through the installed console scripts, as a user meets them: each gives a clear
one-paragraph message, the documented exit code, no traceback and no output file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from mcpc.examples import decoder_block, mlp

BIN = Path(sys.executable).parent


def _run(*args, cwd):
    proc = subprocess.run([*map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=300)
    text = proc.stdout + proc.stderr
    assert "Traceback" not in text, text
    return proc.returncode, text


def _files(d: Path) -> set[str]:
    return {p.name for p in d.iterdir()}


@pytest.fixture
def work(tmp_path):
    onnx.save(mlp(), tmp_path / "mlp.onnx")
    return tmp_path


def test_truncated_onnx(work):
    data = (work / "mlp.onnx").read_bytes()
    (work / "bad.onnx").write_bytes(data[: len(data) // 3])
    before = _files(work)
    code, text = _run(BIN / "mcp-compile", "bad.onnx", cwd=work)
    assert code == 3 and "bad.onnx" in text
    assert _files(work) == before


def test_unbound_dim_names_the_dim(work):
    onnx.save(decoder_block(), work / "dec.onnx")
    before = _files(work)
    code, text = _run(BIN / "mcp-compile", "dec.onnx", cwd=work)
    assert code == 3 and "seq" in text and "--dim" in text
    assert _files(work) == before
    code, _ = _run(BIN / "mcp-compile", "dec.onnx", "--dim", "seq=16", cwd=work)
    assert code == 0 and "dec.mcpb" in _files(work)


def test_unsupported_ops_are_all_listed(work):
    nodes = [
        helper.make_node("Hardmax", ["x"], ["h"], name="first_bad"),
        helper.make_node("Relu", ["h"], ["r"], name="fine"),
        helper.make_node("Det", ["r"], ["y"], name="second_bad"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, work / "unsup.onnx")
    before = _files(work)
    code, text = _run(BIN / "mcp-compile", "unsup.onnx", cwd=work)
    assert code == 4
    assert "first_bad" in text and "Hardmax" in text and "second_bad" in text and "Det" in text
    assert "fine" not in text
    assert _files(work) == before


def test_corrupt_program_is_refused_by_sim_and_check(work):
    code, _ = _run(BIN / "mcp-compile", "mlp.onnx", cwd=work)
    assert code == 0
    data = bytearray((work / "mlp.mcpb").read_bytes())
    data[len(data) // 2] ^= 0x40
    (work / "bad.mcpb").write_bytes(bytes(data))
    np.savez(work / "in.npz", x=np.zeros((4, 256), np.float32))
    before = _files(work)
    code, text = _run(
        BIN / "mcpc", "sim", "run", "bad.mcpb", "--inputs", "in.npz", "--outputs", "o.npz", cwd=work
    )
    assert code == 3 and "bad.mcpb" in text and "corrupt" in text.lower()
    code, text = _run(BIN / "mcpc", "check", "mlp.onnx", "bad.mcpb", "--inputs", "in.npz", cwd=work)
    assert code == 3 and "bad.mcpb" in text
    (work / "foreign.mcpb").write_bytes(b"\x7fELF" + bytes(100))
    code, text = _run(BIN / "mcpc", "sim", "run", "foreign.mcpb", "--random-inputs", cwd=work)
    assert code == 3 and "not an .mcpb file" in text
    assert _files(work) == before | {"foreign.mcpb"}


def test_inputs_missing_a_tensor(work):
    _run(BIN / "mcp-compile", "mlp.onnx", cwd=work)
    np.savez(work / "in.npz", wrong=np.zeros((4, 256), np.float32))
    code, text = _run(
        BIN / "mcpc", "sim", "run", "mlp.mcpb", "--inputs", "in.npz", "--outputs", "o.npz", cwd=work
    )
    assert code == 3 and "missing x" in text
    assert not (work / "o.npz").exists()


def test_i64_ids_beyond_i32_are_refused_not_wrapped(tmp_path):
    """An i64 input is computed as i32 on the NPU: a value that would wrap is an input error."""
    import mcpc
    from mcpc.sim.api import load_program, run_program

    node = helper.make_node("Cast", ["ids"], ["y"], to=TensorProto.FLOAT, name="cast")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "ids.onnx")
    mcpc.compile(tmp_path / "ids.onnx", qat_config="fp32.yaml", output=tmp_path / "ids.mcpb")
    program = load_program(tmp_path / "ids.mcpb")
    ok = np.array([0, 5, -7, 2**31 - 1], np.int64)
    np.testing.assert_array_equal(run_program(program, {"ids": ok}).outputs["y"], ok.astype(np.float32))
    from mcpc.errors import InputError

    with pytest.raises(InputError, match="'ids'.*outside the range"):
        run_program(program, {"ids": np.array([0, 2**31, 1, 2], np.int64)})
