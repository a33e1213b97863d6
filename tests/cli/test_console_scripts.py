"""The installed console scripts ``mcp-compile`` and ``mcpc``, run as a user runs them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mcpc import __version__
from mcpc.passes import PRESETS, REGISTRY, load_all_passes, parse_pipeline

BIN = Path(sys.executable).parent


def script(name: str) -> str:
    path = BIN / name
    assert path.exists(), f"console script {name} is not installed next to {sys.executable}"
    return str(path)


def run(*args: str, cwd=None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MCPC_DEBUG"}
    return subprocess.run(args, capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


@pytest.mark.parametrize("name", ["mcp-compile", "mcpc"])
def test_version(name):
    result = run(script(name), "--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"{name}, version {__version__}"


def test_bad_option_exits_2():
    result = run(script("mcp-compile"), "--no-such-option", "m.onnx")
    assert result.returncode == 2
    assert "No such option" in result.stderr


def test_missing_model_exits_3_and_writes_nothing(tmp_path):
    result = run(script("mcp-compile"), "missing.onnx", cwd=tmp_path)
    assert result.returncode == 3
    assert result.stderr.startswith("error: missing.onnx: no such model file")
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_mcpc_compile_is_the_same_command(tmp_path):
    result = run(script("mcpc"), "compile", "missing.onnx", cwd=tmp_path)
    assert result.returncode == 3 and "no such model file" in result.stderr


def test_print_pipeline():
    load_all_passes()
    missing = [n for n, _ in parse_pipeline(PRESETS["fp16"]) if n not in REGISTRY]
    assert not missing, f"passes {missing} of the fp16 preset are not registered"
    result = run(script("mcp-compile"), "--print-pipeline")
    assert result.returncode == 0, result.stderr
    assert [n for n, _ in parse_pipeline(result.stdout)] == [n for n, _ in parse_pipeline(PRESETS["fp16"])]
    replaced = run(script("mcp-compile"), "--print-pipeline", "--passes", PRESETS["fp32"])
    assert [n for n, _ in parse_pipeline(replaced.stdout)] == [n for n, _ in parse_pipeline(PRESETS["fp32"])]
