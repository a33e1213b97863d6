"""``mcpc sweep``: the grid, a config that cannot build as a row with its reason, resuming (after a
cut-short line and after a real kill), the process pool giving the rows of one process, and Ray
(the optional extra ``ray``) giving the rows of the process pool."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import require_extra

import mcpc.qat_configs
from mcpc.cli import cli
from mcpc.measure import WALL_TIME_METRICS
from mcpc.sweep import read_rows, resolve_configs

BIN = Path(sys.executable).parent
# a config the schema accepts but that cannot be built today (quantized weights): a reason row
INT4 = """\
schema: 1
name: int4-wish
precision: {weights: i4, activations: f16, accumulate: f32}
pipeline: fp16
check: {max_norm_err: 5.0e-2, min_cosine: 0.999}
"""


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _comparable(rows: list[dict]) -> dict[str, dict]:
    """Rows by name without the wall times (the only figures that differ from run to run)."""
    out = {}
    for r in rows:
        r = json.loads(json.dumps(r))
        for k in WALL_TIME_METRICS:
            (r.get("metrics") or {}).pop(k, None)
        out[r["name"]] = r
    return out


def _sweep(*args: str):
    return CliRunner().invoke(cli, ["sweep", *args], catch_exceptions=False)


def test_resolve_configs_names_paths_and_globs(tmp_path):
    shipped = sorted(p.stem for p in (Path(mcpc.qat_configs.__file__).parent).glob("*.yaml"))
    assert resolve_configs(None) == shipped and {"fp16", "fp32", "qat_w4a16"} <= set(shipped)
    assert resolve_configs("fp3*") == ["fp32"]
    (tmp_path / "a.yaml").write_text(INT4)
    assert resolve_configs(f"{tmp_path}/*.yaml,fp16") == [str(tmp_path / "a.yaml"), "fp16"]
    result = CliRunner().invoke(cli, ["sweep", "x.onnx", "--configs", "fp17"])
    assert result.exit_code == 3  # the model is checked first
    model = tmp_path / "m.onnx"
    model.write_bytes(b"")
    result = CliRunner().invoke(cli, ["sweep", str(model), "--configs", "fp17"])
    assert result.exit_code == 2 and "fp17" in result.output and "fp16.yaml" in result.output
    result = CliRunner().invoke(cli, ["sweep", str(model), "--targets", "mcp2026-a1000"])
    assert result.exit_code == 2 and "mcp2026-a1000" in result.output


@pytest.fixture(scope="module")
def one_process_sweep(examples_dir, tmp_path_factory):
    """mlp over fp16, fp32 and an unbuildable config x two targets, in this process."""
    d = tmp_path_factory.mktemp("sweep")
    (d / "int4.yaml").write_text(INT4)
    out = d / "s.jsonl"
    args = [str(examples_dir / "mlp.onnx"), "--configs", f"fp16,fp32,{d / 'int4.yaml'}",
            "--targets", "mcp2026-a100,mcp2026-edge", "-o", str(out)]  # fmt: skip
    result = _sweep(*args)
    return d, args, out, result


def test_sweep_rows_and_reason_rows(one_process_sweep):
    _, _, out, result = one_process_sweep
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r for r in _rows(out)}
    assert sorted(rows) == sorted(
        f"{c}@{t}" for c in ("fp16", "fp32", "int4") for t in ("mcp2026-a100", "mcp2026-edge")
    )
    for t in ("mcp2026-a100", "mcp2026-edge"):
        f16, f32, i4 = rows[f"fp16@{t}"], rows[f"fp32@{t}"], rows[f"int4@{t}"]
        assert f16["status"] == f32["status"] == "ok" and f16["kind"] == "mcpc-sweep"
        assert f16["config"] == "fp16" and f16["target"] == t
        # fp16 weights are half the bytes; fp32 is the more accurate build
        assert f16["metrics"]["weight_bytes"] * 2 == f32["metrics"]["weight_bytes"]
        assert f32["metrics"]["max_norm_err"] < f16["metrics"]["max_norm_err"] < 0.05
        assert i4["status"] == "error" and i4["exit_code"] == 3
        assert "int4.yaml" in i4["reason"] and "precision" in i4["reason"]
    # the edge target (a lower clock, LPDDR) takes longer than the data-center one
    assert (
        rows["fp16@mcp2026-edge"]["metrics"]["latency_us"]
        > rows["fp16@mcp2026-a100"]["metrics"]["latency_us"]
    )
    assert "int4@mcp2026-edge" in result.output and "exit 3" in result.output


def test_a_finished_sweep_is_not_redone_and_a_cut_line_is_dropped(one_process_sweep, tmp_path):
    _, args, out, _ = one_process_sweep
    lines = out.read_text().splitlines(keepends=True)
    # interrupted while writing the fourth row: three rows and half a line
    partial = tmp_path / "p.jsonl"
    partial.write_text("".join(lines[:3]) + lines[3][: len(lines[3]) // 2])
    assert len(read_rows(partial)) == 3 and partial.read_text() == "".join(lines[:3])
    partial.write_text("".join(lines[:3]) + lines[3][: len(lines[3]) // 2])
    args = [*args[:-1], str(partial)]
    result = _sweep(*args)
    assert result.exit_code == 0, result.output
    assert "3 resumed" in result.output
    resumed = _rows(partial)
    assert len(resumed) == 6 and resumed[:3] == [json.loads(x) for x in lines[:3]]
    assert _comparable(resumed).keys() == _comparable(_rows(out)).keys()
    # a finished sweep: nothing is run again, the file is unchanged
    before = partial.read_text()
    again = _sweep(*args)
    assert again.exit_code == 0 and "6 resumed" in again.output and partial.read_text() == before


def test_calibration_data_goes_to_the_quantizing_configs_only():
    from mcpc.sweep import grid

    specs = grid("m.onnx", ["fp16", "qat_w4a16", "no-such-config.yaml"], ["mcp2026-a100"], calib="c.npz")
    assert [s.calib for s in specs] == [None, "c.npz", "c.npz"]


def test_a_kv_cache_config_in_a_single_graph_sweep_is_a_row_with_its_reason(examples_dir, tmp_path):
    """The shipped qat_w4a16_kv8* configs hold kv_cache settings, which only a decoder build has: in
    a sweep of a single-graph model they are rows with the compiler's reason (exit 2), not builds
    that silently drop the section, and not a crash of the sweep."""
    out = tmp_path / "s.jsonl"
    result = _sweep(str(examples_dir / "mlp.onnx"), "--configs", "qat_w4a16_kv8*",
                    "--targets", "mcp2026-a100", "-o", str(out))  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = _rows(out)
    assert sorted(r["config"] for r in rows) == ["qat_w4a16_kv8", "qat_w4a16_kv8_sparse"]
    for r in rows:
        assert r["status"] == "error" and r["exit_code"] == 2
        assert "kv_cache" in r["reason"] and "decoder build" in r["reason"]


def test_a_corrupt_sweep_file_is_refused(tmp_path, examples_dir):
    out = tmp_path / "s.jsonl"
    out.write_text('{"key": "x", "status": "ok"}\nnot json\n{"key": "y", "status": "ok"}\n')
    result = _sweep(
        str(examples_dir / "mlp.onnx"), "--configs", "fp16", "--targets", "mcp2026-a100", "-o", str(out)
    )
    assert result.exit_code == 3 and "s.jsonl:2" in result.output


@pytest.mark.slow
def test_a_killed_sweep_resumes(examples_dir, tmp_path):
    """A real interruption: the sweep process is killed (SIGKILL) after its first row."""
    out = tmp_path / "s.jsonl"
    cmd = [str(BIN / "mcpc"), "sweep", str(examples_dir / "encoder_block.onnx"), "--configs", "fp16,fp32",
           "--inputs", str(examples_dir / "encoder_block.npz"), "-o", str(out)]  # fmt: skip
    before = _kill_after_first_row(cmd, out)
    assert 1 <= len(before) < 6, "the sweep should have been killed halfway"
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"{len(before)} resumed" in done.stdout
    after = _rows(out)
    assert len(after) == 6 and after[: len(before)] == before
    assert len({r["key"] for r in after}) == 6 and all(r["status"] == "ok" for r in after)


@pytest.mark.slow
def test_process_pool_gives_the_rows_of_one_process(one_process_sweep, tmp_path):
    _, args, out, _ = one_process_sweep
    pooled = tmp_path / "j2.jsonl"
    result = _sweep(*args[:-1], str(pooled), "-j", "2")
    assert result.exit_code == 0, result.output
    assert _comparable(_rows(pooled)) == _comparable(_rows(out))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def ray_head():
    """A Ray head on loopback with 2 CPUs, started here in its own session; yields its address."""
    require_extra("ray", "ray")
    port = _free_port()
    # a home of its own: Ray keeps an auth token under ~/.ray, and one left there by an earlier Ray
    # session of the same user makes the new head refuse the sweep's connection
    home = tempfile.mkdtemp(prefix="mcpc-ray-home-")
    env = {**os.environ, "HOME": home}
    head = subprocess.Popen(
        [str(BIN / "ray"), "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={port}",
         "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=env,
    )  # fmt: skip
    head.env = env
    try:
        yield f"127.0.0.1:{port}", head
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(90)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait(30)
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def ray_address():
    with ray_head() as (address, head):
        yield address, head


def _sweep_on_ray(args: list[str], address: str, head: subprocess.Popen) -> subprocess.CompletedProcess:
    cmd = [str(BIN / "mcpc"), "sweep", *args, "--ray-address", address]
    deadline = time.monotonic() + 180
    while True:  # the head takes a while to come up; until then the sweep says it cannot connect
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=head.env)
        if done.returncode == 0 or time.monotonic() > deadline or head.poll() is not None:
            return done
        assert "cannot connect" in done.stderr, done.stderr
        time.sleep(2)


@pytest.mark.slow
def test_ray_gives_the_rows_of_the_process_pool(one_process_sweep, ray_address, tmp_path):
    _, args, out, _ = one_process_sweep
    on_ray = tmp_path / "ray.jsonl"
    done = _sweep_on_ray([*args[:-1], str(on_ray)], *ray_address)
    assert done.returncode == 0, done.stderr
    assert _comparable(_rows(on_ray)) == _comparable(_rows(out))


def _kill_after_first_row(cmd: list[str], out: Path) -> list[dict]:
    """Run ``cmd`` in a session of its own and SIGKILL all of it (pool workers included, as a
    cancelled CI job is) once the first row is in ``out``; returns the rows written."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None:
            if out.exists() and out.read_text().count("\n") >= 1:
                break
            time.sleep(0.01)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    return _rows(out) if out.exists() else []


@pytest.mark.slow
def test_minilm_sweep_pool_resume_and_ray(ray_address, tmp_path):
    """The acceptance sweep: MiniLM-L3 over every shipped QAT config x 3 targets with -j 2, killed
    after its first row and resumed, then the same grid on Ray: identical rows."""
    import numpy as np
    import onnx

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "real_models"))
    from real_model import MINILM, dim_bindings, realistic_inputs

    try:
        model_path = MINILM.path()
    except LookupError as e:
        pytest.fail(str(e), pytrace=False)
    model = onnx.load(str(model_path), load_external_data=False)
    np.savez(tmp_path / "in.npz", **realistic_inputs(model, 1, 16))
    dims = [a for k, v in dim_bindings(model, 1, 16).items() for a in ("--dim", f"{k}={v}")]
    out = tmp_path / "pool.jsonl"
    args = [str(model_path), *dims, "--inputs", str(tmp_path / "in.npz"), "-o", str(out)]
    n = len(resolve_configs(None)) * 3
    before = _kill_after_first_row([str(BIN / "mcpc"), "sweep", *args, "-j", "2"], out)
    assert 1 <= len(before) < n, "the sweep should have been killed halfway"
    done = subprocess.run([str(BIN / "mcpc"), "sweep", *args, "-j", "2"], capture_output=True, text=True,
                          timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"{len(before)} resumed" in done.stdout
    rows = _rows(out)
    assert len(rows) == n and rows[: len(before)] == before and len({r["key"] for r in rows}) == n
    on_ray = tmp_path / "ray.jsonl"
    done = _sweep_on_ray([*args[:-1], str(on_ray)], *ray_address)
    assert done.returncode == 0, done.stderr
    assert _comparable(_rows(on_ray)) == _comparable(rows)
    ok = [r for r in rows if r["status"] == "ok"]
    assert {r["config"] for r in ok} >= {"fp16", "fp32"}
    for r in ok:  # the float builds agree closely; a quantized one within its config's check bound
        from mcpc.qat_configs.schema import load_config

        bound = 0.999 if r["config"] in ("fp16", "fp32") else load_config(r["config"]).check.min_cosine
        assert r["metrics"]["min_cosine"] >= bound, (r["name"], r["metrics"]["min_cosine"], bound)


def test_a_build_runs_on_one_blas_thread_wherever_it_runs(monkeypatch):
    """Calibrated quantization rounds differently with another BLAS thread count (GPTQ's Hessian
    products), so measure_build fixes it: a row must not depend on the pool, Ray or this process."""
    from threadpoolctl import threadpool_info, threadpool_limits

    import mcpc.measure as measure

    seen = []
    monkeypatch.setattr(
        measure, "_measure_build", lambda spec: seen.append([i["num_threads"] for i in threadpool_info()
                                                             if i["user_api"] == "blas"]) or {}
    )  # fmt: skip
    with threadpool_limits(limits=2, user_api="blas"):
        measure.measure_build(None)
        outside = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
    assert seen and seen[0] and all(n == measure.BUILD_BLAS_THREADS for n in seen[0])
    assert outside == [min(2, n) for n in outside] and outside  # restored after the build
