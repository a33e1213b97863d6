"""Issue 21's acceptance on SmolLM2-135M as each exporter writes it (``export_smollm2_all.py``):
the TorchScript, dynamo, Optimum and ONNX Runtime GenAI (fp32) exports of the same weights.

* a prefill with an empty past, 256 tokens, ``qat_configs/fp32.yaml``, every symbolic input dim
  bound with ``--dim`` (dims named by an expression are left to be derived), run by ``mcpc sim
  run``: logits within 1e-4 normalized max error of ONNX Runtime fp32;
* ``mcp-compile --qat-config qat_configs/fp32.yaml --max-seq 128`` with no ``--dim``, then ``mcpc
  sim generate --prompt-ids prompt11.npy --max-new-tokens 20``: the greedy ids equal ONNX
  Runtime's (recorded in the export's ``export.json`` by ``export_smollm2_all.py --check``; for
  GenAI, its generator's, which ``--check`` found equal to a plain ONNX Runtime loop's);
* the four exports' ``ttft_cycles`` of the 11-token prompt within 1.1x of each other;
* the GenAI int4 build at ``accuracy_level`` 0, an 11-token prefill: ``mcpc check`` passes.

All slow (each compile takes minutes); without the exports (``make exporter-models``) they skip
with the optional-extra reason.  Programs are built once per module in a temporary folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import OPTIONAL_EXTRA_SKIP, norm_max_err

sys.path.insert(0, str(Path(__file__).resolve().parent))
import export_smollm2_all as exports  # noqa: E402 - the sibling script

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]
FP32 = str(ROOT / "qat_configs" / "fp32.yaml")
TARGET = "mcp2026-a100"
FP32_EXPORTS = ("torchscript", "dynamo", "optimum", "genai-fp32")
PREFILL_SEQ, MAX_SEQ, TOLERANCE, TTFT_SPREAD = 256, 128, 1e-4, 1.1

pytestmark = pytest.mark.slow


def _export(name: str) -> tuple[Path, dict]:
    """The export's model.onnx and its export.json, or skip naming the command that makes them."""
    root = exports.exports_dir()
    path, record = exports.model_path(name, root), root / name / "export.json"
    if not path.is_file() or not record.is_file():
        pytest.skip(
            f"{OPTIONAL_EXTRA_SKIP}: exporters (no SmolLM2 {name} export in {root}; "
            "`make exporter-models` makes them with the llm extra and the exporter venvs)"
        )
    return path, json.loads(record.read_text())


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MCPC_DEBUG"}
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, env=env, timeout=3600)


def _onnxruntime(path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    return sess.run(["logits"], feeds)[0]


@pytest.mark.parametrize("name", FP32_EXPORTS)
def test_empty_past_prefill_matches_onnx_runtime(name, tmp_path):
    path, record = _export(name)
    feeds = exports.prefill_feeds(record, PREFILL_SEQ)
    inputs = tmp_path / "prefill.npz"
    np.savez(inputs, **feeds)
    prog, outs = tmp_path / "prefill.mcpb", tmp_path / "out.npz"
    dims = [a for k, v in exports.dim_bindings(record, feeds).items() for a in ("--dim", f"{k}={v}")]
    done = _run(BIN / "mcp-compile", "-t", TARGET, "--qat-config", FP32, *dims, "-o", prog, path)
    assert done.returncode == 0, f"mcp-compile {' '.join(dims)} exited {done.returncode}:\n{done.stderr}"
    done = _run(BIN / "mcpc", "sim", "run", prog, "--inputs", inputs, "--outputs", outs)
    assert done.returncode == 0, f"mcpc sim run exited {done.returncode}:\n{done.stderr}"
    got = np.load(outs)["logits"]
    want = _onnxruntime(path, feeds)
    err = norm_max_err(got, want)
    assert err <= TOLERANCE, f"{name}: prefill logits normalized max error {err:.2e} > {TOLERANCE}"


_GENERATED: dict[str, dict] = {}


def _generate(name: str, folder: Path) -> dict:
    """The export's --max-seq build run by ``mcpc sim generate`` on the 11-token prompt: its JSON
    report (memoised: the ttft test reuses the builds)."""
    if name in _GENERATED:
        return _GENERATED[name]
    path, _ = _export(name)
    prompt = folder / "prompt11.npy"
    np.save(prompt, exports.prompt_ids())
    prog, report = folder / f"{name}.mcpb", folder / f"{name}.json"
    done = _run(
        BIN / "mcp-compile", "-t", TARGET, "--qat-config", FP32, "--max-seq", MAX_SEQ, "-o", prog, path
    )
    result = {"compile": done}
    if done.returncode == 0:
        args = ("sim", "generate", prog, "--prompt-ids", prompt, "--max-new-tokens", exports.NEW_TOKENS)
        result["generate"] = done = _run(BIN / "mcpc", *args, "--json", report)
        if done.returncode == 0:
            result["report"] = json.loads(report.read_text())
    _GENERATED[name] = result
    return result


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("smollm2_exporters")


@pytest.mark.parametrize("name", FP32_EXPORTS)
def test_max_seq_build_generates_onnx_runtimes_greedy_ids(name, build_dir):
    _, record = _export(name)
    want = record.get("og_greedy") or record.get("ort_greedy")
    assert want, f"{name}: export.json has no ONNX Runtime greedy ids (run export_smollm2_all.py --check)"
    result = _generate(name, build_dir)
    for step in ("compile", "generate"):
        done = result.get(step)
        assert done is None or done.returncode == 0, (
            f"{name}: {step} exited {done.returncode}:\n{done.stderr}"
        )
    assert result["report"]["generated_ids"] == want


def test_prefill_cycles_agree_across_exporters(build_dir):
    """Every fp32 export generates, and the ttft_cycles of those that do are within 1.1x (both
    problems are reported together: a missing build does not hide a spread among the others)."""
    ttft, missing = {}, []
    for name in FP32_EXPORTS:
        result = _generate(name, build_dir)
        if "report" in result:
            ttft[name] = result["report"]["ttft_cycles"]
        else:
            done = result.get("generate") or result["compile"]
            last = done.stderr.strip().splitlines()[-1:] or [""]
            missing.append(f"{name}: no --max-seq generation to time (exit {done.returncode}): {last[0]}")
    spread = max(ttft.values()) / min(ttft.values()) if ttft else float("nan")
    problems = list(missing)
    if ttft and spread > TTFT_SPREAD:
        problems.append(f"ttft_cycles of the 11-token prompt spread {spread:.2f}x: {ttft}")
    assert not problems, "\n".join(problems)


def test_genai_int4_prefill_at_accuracy_level_0_passes_check(tmp_path):
    """The int4 build with its MatMulNBits at ``accuracy_level`` 0 (ONNX Runtime dequantizes exactly),
    an 11-token prefill with every dim bound (``kv_cache_dim=64`` among them): ``mcpc check``
    at the fp32 tolerance."""
    from smollm2_baseline import accuracy_level_0

    path, record = _export("genai-int4")
    model = accuracy_level_0(path, tmp_path / "int4-acc0.onnx")
    feeds = exports.prefill_feeds(record, exports.PROMPT_LEN)
    inputs = tmp_path / "prefill.npz"
    np.savez(inputs, **feeds)
    dims = [a for k, v in exports.dim_bindings(record, feeds).items() for a in ("--dim", f"{k}={v}")]
    prog = tmp_path / "prefill.mcpb"
    done = _run(BIN / "mcp-compile", "-t", TARGET, "--qat-config", FP32, *dims, "-o", prog, model)
    assert done.returncode == 0, f"mcp-compile {' '.join(dims)} exited {done.returncode}:\n{done.stderr}"
    done = _run(BIN / "mcpc", "check", model, prog, "--inputs", inputs)
    assert done.returncode == 0, f"mcpc check exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
