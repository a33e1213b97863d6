"""The Python API (mcpc.load_model, mcpc.compile) and the driver's atomic writes."""

from __future__ import annotations

import pytest

import mcpc
from mcpc.driver import default_output, write_atomic
from mcpc.errors import InputError, UsageError


def test_default_output_suffixes(tmp_path):
    model = tmp_path / "m.onnx"
    assert default_output(model, "mcpb") == tmp_path / "m.mcpb"
    assert default_output(model, "asm") == tmp_path / "m.s"
    assert default_output(model, "ir") == tmp_path / "m.mcpir"
    with pytest.raises(UsageError, match="unknown emit kind 'elf'"):
        default_output(model, "elf")


def test_write_atomic_replaces_whole_file_and_cleans_up_on_error(tmp_path):
    path = tmp_path / "out.txt"
    write_atomic(path, "first")
    write_atomic(path, b"second")
    assert path.read_bytes() == b"second"

    with pytest.raises(TypeError):  # fails while writing the temp file
        write_atomic(path, 12345)
    assert path.read_bytes() == b"second"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]
    with pytest.raises(InputError, match="cannot write output"):
        write_atomic(tmp_path / "missing" / "x", "data")


def test_load_model_missing_file(tmp_path):
    with pytest.raises(InputError, match="no such model file"):
        mcpc.load_model(tmp_path / "absent.onnx")


def test_compile_module_without_output_writes_nothing(tmp_path):
    from mcpc import examples

    paths = examples.build_examples(tmp_path)
    model = next(p for p in paths if p.name == "mlp.onnx")
    before = sorted(tmp_path.iterdir())
    module = mcpc.load_model(model)
    module.verify()
    result = mcpc.compile(module, qat_config="fp32", passes="", emit="ir")
    assert result.output is None and result.program is None
    assert result.text.startswith("module @") and sorted(tmp_path.iterdir()) == before
    assert result.report["pipeline"] == [] and result.report["model"] == module.name

    written = mcpc.compile(model, qat_config="fp16.yaml", emit="ir", output=tmp_path / "x.mcpir")
    assert (tmp_path / "x.mcpir").read_text() == written.text
    assert [t["pass"].split("{")[0] for t in written.report["pass_times"]] == [
        p.split("{")[0] for p in written.report["pipeline"]
    ]


def test_written_files_get_the_usual_permissions(tmp_path):
    import os

    old = os.umask(0o022)
    try:
        path = write_atomic(tmp_path / "p.bin", b"x")
    finally:
        os.umask(old)
    assert (path.stat().st_mode & 0o777) == 0o644  # not mkstemp's 0600
