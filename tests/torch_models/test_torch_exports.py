"""Transformers exported by PyTorch 2.13 end to end: the committed fixtures of ``fixtures/`` (made by
``make_fixtures.py``; these tests need only the .onnx files, never torch).

Each fixture — a BERT-style encoder, a GPT-style decoder and the decoder with ``past_key_values``,
from the dynamo and the TorchScript exporter at two opsets each — imports, matches ONNX Runtime
through the IR interpreter, compiles (fp32 and fp16) for ``mcp2026-a100`` and ``mcp2026-edge``,
simulates, and passes the ``mcpc check`` comparison with the build's own tolerances and the
normalized max error bounds (fp32 ≤ 1e-4, fp16 ≤ 2e-2).  The console scripts run on two of them;
the KV interface is checked for what it means (prefill then one decode step equals the full-sequence
decoder).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import mcpc
from mcpc.check import Tolerances, compare, is_logits, run_onnxruntime, vocabulary_sizes
from mcpc.ir.interpreter import interpret
from mcpc.ir.onnx_import import import_onnx
from mcpc.sim.api import load_program, run_program

FIXTURES = Path(__file__).with_name("fixtures")
MODELS = ("bert", "gpt", "gpt_kv")
EXPORTS = ("dynamo-op18", "dynamo-op20", "torchscript-op17", "torchscript-op20")
NAMES = [f"{m}-{e}" for m in MODELS for e in EXPORTS]
TARGETS = ("mcp2026-a100", "mcp2026-edge")
BOUND = {"fp32": 1e-4, "fp16": 2e-2}
BIN = Path(sys.executable).parent
BATCH, SEQ, PAST = 2, 12, 7  # the KV fixtures run a decode step: seq 1 after PAST cached positions


def _path(name: str) -> Path:
    path = FIXTURES / f"{name}.onnx"
    if not path.is_file():
        pytest.fail(
            f"{path.name} is missing: regenerate with tests/torch_models/make_fixtures.py", pytrace=False
        )
    return path


def dims_for(name: str, seq: int | None = None, past: int = PAST) -> dict[str, int]:
    """The ``--dim`` bindings the fixtures' named dims take: a decode step for the KV fixtures."""
    if name.startswith("gpt_kv"):
        return {"batch": BATCH, "seq": 1 if seq is None else seq, "past_seq": past}
    return {"batch": BATCH, "seq": SEQ if seq is None else seq}


def _vocabulary(model: onnx.ModelProto) -> int:
    """Rows of the embedding table ``input_ids`` indexes (read from the graph, not assumed)."""
    inits = {t.name: t for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Gather" and n.input[1] == "input_ids" and n.input[0] in inits:
            return int(inits[n.input[0]].dims[0])
    raise AssertionError("no embedding Gather on input_ids")


def make_inputs(model: onnx.ModelProto, dims: dict[str, int], seed: int = 0) -> dict[str, np.ndarray]:
    """Token ids in the model's vocabulary, a padding mask (every row but the first padded, at
    least one real token), and N(0, 1) past keys/values of the bound shapes."""
    rng = np.random.default_rng(seed)
    b, s = dims["batch"], dims["seq"]
    feeds: dict[str, np.ndarray] = {}
    for vi in model.graph.input:
        if vi.name == "input_ids":
            feeds[vi.name] = rng.integers(1, _vocabulary(model), (b, s), dtype=np.int64)
        elif vi.name == "attention_mask":
            lengths = [max(s - 3 * row, 1) for row in range(b)]
            feeds[vi.name] = (np.arange(s)[None, :] < np.array(lengths)[:, None]).astype(np.int64)
        elif vi.name.startswith("past_"):
            shape = [d.dim_value or dims[d.dim_param] for d in vi.type.tensor_type.shape.dim]
            feeds[vi.name] = rng.standard_normal(shape).astype(np.float32)
        else:
            raise AssertionError(f"unexpected input {vi.name!r}")
    return feeds


def test_every_fixture_is_committed_small_and_named_as_exported():
    for name in NAMES:
        path = _path(name)
        assert path.stat().st_size < 2_000_000, name
        assert b'File "/' not in path.read_bytes(), f"{name}: a machine path in its stack traces"
        model = onnx.load(str(path))
        assert model.producer_name == "pytorch" and model.producer_version.startswith("2.13.0"), name
        assert [o.version for o in model.opset_import if o.domain == ""] == [int(name[-2:])], name
        params = {d.dim_param for i in model.graph.input for d in i.type.tensor_type.shape.dim}
        want = {"batch", "seq", "past_seq"} if name.startswith("gpt_kv") else {"batch", "seq"}
        assert params - {""} == want, (name, params)
    readme = (FIXTURES / "README.md").read_text()
    assert "torch 2.13.0" in readme and all(f"`{n}.onnx`" in readme for n in NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_interpreter_on_import_matches_onnxruntime(name):
    """Chain link 1: the imported IR, interpreted in fp32, is the exported model."""
    path = _path(name)
    dims = dims_for(name)
    feeds = make_inputs(onnx.load(str(path)), dims, seed=1)
    ours, ref = interpret(import_onnx(path, dims=dims), feeds), run_onnxruntime(path, feeds)
    assert set(ours) == set(ref)
    for out, r in ref.items():
        assert compare(out, ours[out], r, rtol=0, atol=0).norm_max_err <= 1e-5, out


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("config", ["fp32", "fp16"])
@pytest.mark.parametrize("name", NAMES)
def test_compiled_and_simulated_passes_check(name, config, target, tmp_path):
    """What ``mcpc check`` decides with the tolerances the build recorded (elementwise for fp32
    builds), the norm bound and cosine, and a run free of NaNs and overflows."""
    path = _path(name)
    dims = dims_for(name)
    feeds = make_inputs(onnx.load(str(path)), dims, seed=2)
    prog = tmp_path / "m.mcpb"
    mcpc.compile(path, target=target, qat_config=config, output=prog, dims=dims)
    program = load_program(prog)
    tol, vocab = Tolerances.of_program(program.meta), vocabulary_sizes(path)
    sim = run_program(program, feeds)
    ref = run_onnxruntime(path, feeds)
    assert set(sim.outputs) == set(ref)
    for out, r in ref.items():
        c = tol.compare(out, sim.outputs[out], r, top1=is_logits(out, r.shape, vocab))
        assert c.passed and c.norm_max_err <= BOUND[config] and c.cosine >= 0.9999, c
    assert sim.profile["cycles"] > 0
    assert sim.profile["numeric"]["clean"], sim.profile["numeric"]


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MCPC_DEBUG"}
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize(
    ("name", "config", "target"),
    [("gpt_kv-dynamo-op20", "fp16", "mcp2026-edge"), ("bert-torchscript-op17", "fp32", "mcp2026-a100")],
)
def test_console_scripts_compile_then_check(name, config, target, tmp_path):
    """The user's commands: ``mcp-compile --dim ...`` then ``mcpc check`` (exit 0, JSON passed)."""
    path = _path(name)
    dims = dims_for(name)
    np.savez(tmp_path / "in.npz", **make_inputs(onnx.load(str(path)), dims, seed=3))
    prog, report = tmp_path / "m.mcpb", tmp_path / "check.json"
    dim_args = [a for k, v in dims.items() for a in ("--dim", f"{k}={v}")]
    compiled = _run(
        str(BIN / "mcp-compile"),
        "--target",
        target,
        "--qat-config",
        config,
        *dim_args,
        "-o",
        str(prog),
        str(path),
    )
    assert compiled.returncode == 0, compiled.stderr
    checked = _run(
        str(BIN / "mcpc"),
        "check",
        str(path),
        str(prog),
        "--inputs",
        str(tmp_path / "in.npz"),
        "--json",
        str(report),
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    result = json.loads(report.read_text())
    assert result["passed"] and result["precision"] == config
    assert {o["name"] for o in result["outputs"]} == {o.name for o in onnx.load(str(path)).graph.output}
    assert all(o["norm_max_err"] <= BOUND[config] for o in result["outputs"])


def _simulate(path: Path, dims: dict[str, int], feeds: dict[str, np.ndarray], tmp: Path) -> dict:
    prog = tmp / f"{path.stem}-{'-'.join(map(str, dims.values()))}.mcpb"
    mcpc.compile(path, target="mcp2026-a100", qat_config="fp32", output=prog, dims=dims)
    return run_program(load_program(prog), feeds).outputs


@pytest.mark.parametrize("exporter", EXPORTS)
def test_prefill_then_decode_step_equals_the_full_decoder(exporter, tmp_path):
    """The KV interface means what it says, on the simulator: a prefill (past_seq 0) of n tokens,
    then one decode step fed the presents, gives the logits of the plain decoder on n + 1 tokens
    (the fixtures share weights), and its presents hold all n + 1 positions."""
    kv, full = _path(f"gpt_kv-{exporter}"), _path(f"gpt-{exporter}")
    n = 9
    ids = np.random.default_rng(4).integers(1, _vocabulary(onnx.load(str(full))), (BATCH, n + 1))
    empty = np.zeros((BATCH, 4, 0, 16), np.float32)
    names = [f"{k}_{i}" for i in range(2) for k in ("key", "value")]
    pre = _simulate(
        kv,
        dims_for("gpt_kv", n, 0),
        {"input_ids": ids[:, :n], **{f"past_{k}": empty for k in names}},
        tmp_path,
    )
    step = _simulate(
        kv,
        dims_for("gpt_kv", 1, n),
        {"input_ids": ids[:, n:], **{f"past_{k}": pre[f"present_{k}"] for k in names}},
        tmp_path,
    )
    whole = _simulate(full, dims_for("gpt", n + 1), {"input_ids": ids}, tmp_path)["logits"]
    assert compare("prefill", pre["logits"], whole[:, :n], 0, 0).norm_max_err <= 1e-5
    assert compare("decode", step["logits"], whole[:, n:], 0, 0).norm_max_err <= 1e-5
    assert all(step[f"present_{k}"].shape == (BATCH, 4, n + 1, 16) for k in names)


def test_sequence_beyond_the_position_table_is_a_clear_error(tmp_path):
    """128 positions (RoPE tables): a longer bound sequence is the user's error, exit 3."""
    path = _path("gpt-dynamo-op20")
    r = _run(
        str(BIN / "mcp-compile"),
        "--dim",
        "batch=1",
        "--dim",
        "seq=200",
        "-o",
        str(tmp_path / "m.mcpb"),
        str(path),
    )
    assert r.returncode == 3 and "do not broadcast" in r.stderr and "input_ids=1x200" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "m.mcpb").exists()
