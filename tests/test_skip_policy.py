"""The skip policy of tests/conftest.py: only an optional extra not installed may skip a test."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = Path(__file__).with_name("conftest.py")


def _pytest_on(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "test_case.py").write_text(body)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_plain_skip_fails_the_run(tmp_path):
    result = _pytest_on(tmp_path, "import pytest\n\ndef test_a():\n    pytest.skip('not ready')\n")
    assert result.returncode == pytest.ExitCode.TESTS_FAILED, result.stdout
    assert "FORBIDDEN SKIP" in result.stdout and "skips: 1 (0 for optional extras" in result.stdout


def test_a_missing_optional_extra_may_skip(tmp_path):
    body = (
        "from conftest import require_extra\n\n"
        "def test_a():\n    require_extra('mcpc_no_such_module', 'llm')\n"
    )
    result = _pytest_on(tmp_path, body)
    assert result.returncode == 0, result.stdout
    assert "skips: 1 (1 for optional extras" in result.stdout and "FORBIDDEN" not in result.stdout


def test_a_missing_chromium_may_skip_a_browser_test(tmp_path):
    body = (
        "import os\n\nfrom conftest import require_chromium\n\n"
        "def test_a():\n    os.environ['PATH'] = ''\n    require_chromium()\n"
    )
    result = _pytest_on(tmp_path, body)
    assert result.returncode == 0, result.stdout
    assert "skips: 1 (1 for optional extras or Chromium" in result.stdout and "FORBIDDEN" not in result.stdout
