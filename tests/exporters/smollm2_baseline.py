"""Run issue 21's acceptance commands on the SmolLM2 exports of ``export_smollm2_all.py`` and record
what each command did (command line, exit code, seconds, the end of its message, the figures).

Per export, three steps (``--steps`` picks some):

* ``inspect``: ``mcpc inspect-model MODEL`` (its text kept in ``NAME.inspect.txt``);
* ``prefill``: a prefill of ``--seq`` tokens (256) after an empty past, ``qat_configs/fp32.yaml``,
  every plain-named symbolic input dim bound with ``--dim`` from the feeds' shapes
  (``export_smollm2_all.dim_bindings``), then ``mcpc sim run --inputs``; the logits' normalized max
  error against ONNX Runtime fp32 (graph optimizations off).  For ``genai-int4`` the graph's
  ``MatMulNBits`` are first rewritten to ``accuracy_level`` 0 (ONNX Runtime then dequantizes
  exactly), the prompt is 11 tokens, and ``mcpc check`` is run as well;
* ``generate``: ``mcp-compile --qat-config qat_configs/fp32.yaml --max-seq 128`` (no ``--dim``) and
  ``mcpc sim generate --prompt-ids prompt11.npy --max-new-tokens 20 --json``: the ids against ONNX
  Runtime's recorded by ``export_smollm2_all.py --check``, and ``ttft_cycles``.

Results go to ``OUT/NAME.json`` after every step (a long run shows its progress) and a table to
``OUT/baseline.md``; programs and logs stay in OUT (default ``baseline/`` beside the exports,
outside git).  Project venv::

    .venv/bin/python tests/exporters/smollm2_baseline.py [--only NAME,...] [--steps inspect,prefill]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import export_smollm2_all as exports  # noqa: E402 - the sibling script

BIN = Path(sys.executable).parent
ROOT = exports.ROOT
FP32 = ROOT / "qat_configs" / "fp32.yaml"
TARGET = "mcp2026-a100"
STEPS = ("inspect", "prefill", "generate")
NAMES = tuple(exports.EXPORTS)


def run(args: list, log: Path) -> dict:
    """Run a command; its stdout+stderr in ``log``; returns the command, exit code, seconds and the
    last lines of its output (the message a user sees)."""
    args = [str(a) for a in args]
    env = {k: v for k, v in os.environ.items() if k != "MCPC_DEBUG"}
    t0 = time.perf_counter()
    with open(log, "w") as f:
        done = subprocess.run(args, stdout=f, stderr=subprocess.STDOUT, env=env)
    text = log.read_text(errors="replace").strip().splitlines()
    shown = [shlex.quote(Path(a).name) if a.startswith("/") else shlex.quote(a) for a in args]
    shown[0] = Path(args[0]).name
    return {
        "command": " ".join(shown),
        "exit": done.returncode,
        "seconds": round(time.perf_counter() - t0, 1),
        "tail": text[-12:],
    }


def norm_max_err(y: np.ndarray, r: np.ndarray) -> float:
    y, r = np.asarray(y, np.float64), np.asarray(r, np.float64)
    if y.shape != r.shape:
        return float("inf")
    scale = np.max(np.abs(r))
    return float(np.max(np.abs(y - r)) / scale) if scale > 0 else float(np.max(np.abs(y - r)))


def onnxruntime_logits(path: Path, feeds: dict) -> np.ndarray:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    return sess.run(["logits"], feeds)[0]


def accuracy_level_0(src: Path, dst: Path) -> Path:
    """``src`` with every MatMulNBits' ``accuracy_level`` set to 0, saved as ``dst`` (weights in one
    external file beside it)."""
    import onnx

    if dst.is_file():
        return dst
    m = onnx.load(str(src))
    for n in m.graph.node:
        if n.op_type == "MatMulNBits":
            for a in n.attribute:
                if a.name == "accuracy_level":
                    a.i = 0
    onnx.save(m, str(dst), save_as_external_data=True, location=dst.name + ".data")
    return dst


def step_inspect(name: str, model: Path, out: Path) -> dict:
    res = run([BIN / "mcpc", "inspect-model", model], out / f"{name}.inspect.txt")
    lines = (out / f"{name}.inspect.txt").read_text(errors="replace").splitlines()
    res["bind_line"] = [ln.strip() for ln in lines if "--dim" in ln or "--max-seq" in ln]
    res["ops_line"] = [ln.strip() for ln in lines if ln.startswith("ops:")]
    res["not_ok"] = [ln.strip() for ln in lines if ln.startswith("  ") and ln.rstrip().split()[-1:] != ["ok"]]
    res["not_ok"] = [ln for ln in res["not_ok"] if "UNSUPPORTED" in ln.upper() or "refused" in ln]
    del res["tail"]
    return res


def step_prefill(name: str, model: Path, record: dict, out: Path, seq: int) -> dict:
    if name == "genai-int4":
        model = accuracy_level_0(model, out / "genai-int4-acc0.onnx")
        seq = exports.PROMPT_LEN
    feeds = exports.prefill_feeds(record, seq)
    inputs = out / f"{name}.prefill.npz"
    np.savez(inputs, **feeds)
    dims = exports.dim_bindings(record, feeds)
    prog = out / f"{name}.prefill.mcpb"
    dim_args = [a for k, v in dims.items() for a in ("--dim", f"{k}={v}")]
    res = {"seq": seq, "dims": dims}
    res["compile"] = c = run(
        [BIN / "mcp-compile", "-t", TARGET, "--qat-config", FP32, *dim_args, "-o", prog, model],
        out / f"{name}.prefill.compile.log",
    )
    if c["exit"]:
        return res
    outs = out / f"{name}.prefill.out.npz"
    res["sim_run"] = r = run(
        [BIN / "mcpc", "sim", "run", prog, "--inputs", inputs, "--outputs", outs],
        out / f"{name}.prefill.run.log",
    )
    if r["exit"]:
        return res
    got = np.load(outs)["logits"]
    want = onnxruntime_logits(model, feeds)
    res["logits_norm_max_err"] = norm_max_err(got, want)
    res["top1_agreement"] = float((got.argmax(-1) == want.argmax(-1)).mean())
    if name == "genai-int4":
        res["check"] = run(
            [BIN / "mcpc", "check", model, prog, "--inputs", inputs], out / f"{name}.prefill.check.log"
        )
    return res


def step_generate(name: str, model: Path, record: dict, out: Path, max_seq: int) -> dict:
    prompt = out / "prompt11.npy"
    np.save(prompt, exports.prompt_ids())
    prog, report = out / f"{name}.maxseq.mcpb", out / f"{name}.generate.json"
    res = {"max_seq": max_seq}
    res["compile"] = c = run(
        [BIN / "mcp-compile", "-t", TARGET, "--qat-config", FP32, "--max-seq", max_seq, "-o", prog, model],
        out / f"{name}.maxseq.compile.log",
    )
    if c["exit"]:
        return res
    args = ["sim", "generate", prog, "--prompt-ids", prompt, "--max-new-tokens", exports.NEW_TOKENS]
    res["generate"] = g = run([BIN / "mcpc", *args, "--json", report], out / f"{name}.generate.log")
    if g["exit"]:
        return res
    rep = json.loads(report.read_text())
    res["ids"] = rep["generated_ids"]
    res["ttft_cycles"] = rep.get("ttft_cycles")
    return res


def reference_ids(name: str) -> list[int] | None:
    """The ids ``export_smollm2_all.py --check`` recorded (GenAI: its generator's), or None."""
    record = json.loads((exports.model_path(name).parent / "export.json").read_text())
    return record.get("og_greedy") or record.get("ort_greedy")


def cell(name: str, step: dict | None) -> str:
    """One table cell: the first failing command's exit and message, or the step's figures."""
    if not step:
        return "not run"
    for key in ("compile", "sim_run", "generate"):
        s = step.get(key)
        if s and s["exit"]:
            last = next((ln for ln in reversed(s["tail"]) if ln.strip()), "")
            return f"{key} exit {s['exit']}: {last[:300]}"
    if "logits_norm_max_err" in step:
        return f"ok, nme {step['logits_norm_max_err']:.1e}, top-1 {step['top1_agreement']:.3f}"
    if "ids" in step:
        want = reference_ids(name)
        if want is None:
            return f"ids {step['ids']} (no ORT reference: run export_smollm2_all.py --check)"
        return "20 ids equal ORT's" if step["ids"] == want else f"ids differ: {step['ids']} vs {want}"
    return "?"


def table(out: Path) -> str:
    rows = [
        "| export | inspect-model | prefill (empty past) | --max-seq generate | ttft_cycles |",
        "|---|---|---|---|---|",
    ]
    for name in NAMES:
        path = out / f"{name}.json"
        if not path.is_file():
            continue
        r = json.loads(path.read_text())

        ins = r.get("inspect") or {}
        ins_cell = f"exit {ins.get('exit')}; " + "; ".join(ins.get("ops_line", []) + ins.get("bind_line", []))
        gen = r.get("generate") or {}
        ttft = gen.get("ttft_cycles", "")
        rows.append(
            f"| {name} | {ins_cell[:400]} | {cell(name, r.get('prefill'))} | {cell(name, gen)} | {ttft} |"
        )
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help=f"comma-separated subset of {', '.join(NAMES)}")
    ap.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated subset of {', '.join(STEPS)}")
    ap.add_argument("--out", type=Path, help="results folder (default: baseline/ beside the exports)")
    ap.add_argument("--seq", type=int, default=256, help="prefill tokens (default 256)")
    ap.add_argument("--max-seq", type=int, default=128)
    opts = ap.parse_args(argv)
    root = exports.exports_dir()
    out = opts.out or root / "baseline"
    out.mkdir(parents=True, exist_ok=True)
    names = opts.only.split(",") if opts.only else list(NAMES)
    steps = opts.steps.split(",")
    for name in names:
        model = exports.model_path(name, root)
        if not model.is_file():
            print(f"{name}: no {model}; skipped", flush=True)
            continue
        record = json.loads((model.parent / "export.json").read_text())
        path = out / f"{name}.json"
        result = json.loads(path.read_text()) if path.is_file() else {}
        for step in steps:
            print(f"{name}: {step} ...", flush=True)
            if step == "inspect":
                result[step] = step_inspect(name, model, out)
            elif step == "prefill":
                result[step] = step_prefill(name, model, record, out, opts.seq)
            elif step == "generate":
                result[step] = step_generate(name, model, record, out, opts.max_seq)
            else:
                ap.error(f"unknown step {step}")
            path.write_text(json.dumps(result, indent=1, default=str) + "\n")
            print(f"{name}: {step}: {json.dumps(result[step], default=str)[:600]}", flush=True)
        (out / "baseline.md").write_text(table(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
