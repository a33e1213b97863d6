"""``mcpc sim generate`` and ``mcpc sim eval-ppl``: the served decoding loop of a decoder build
(``mcp-compile --max-seq N``) on the simulator, through ``decoder.DecoderSession``.

Registered on ``sim_group`` by ``sim/cli.py``.  Exit codes as ``sim run``'s: 2 for a usage
mistake (a program that is not a decoder build, token ids outside the vocabulary, a prompt longer
than max_seq, an option missing), 3 for an unreadable file, 5 for a simulator trap, 6 when the
prompts need more KV blocks than the build has.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from mcpc.errors import InputError, UsageError
from mcpc.fileio import write_atomic

from .cli import _Guarded, _json_bytes

_PATH = click.Path(path_type=Path, dir_okay=False)


def _load_npy(path: Path, what: str):
    import numpy as np

    try:
        arr = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: cannot read {what} as a .npy file ({exc})") from None
    if arr.dtype.kind not in "iu":
        raise UsageError(f"{path}: {what} must be integer token ids, not {arr.dtype}")
    return arr


def _read_prompts(path: Path) -> list[list[int]]:
    """One JSON list of token ids a line (blank lines skipped)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read the prompts ({exc})") from None
    prompts = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            ids = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{path}:{n}: not JSON ({exc.msg})") from None
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise UsageError(f"{path}:{n}: expected a JSON list of integer token ids")
        prompts.append(ids)
    if not prompts:
        raise UsageError(f"{path}: no prompt in the file")
    return prompts


def _tokenizer(path: Path):
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise UsageError(
            "--tokenizer needs the `tokenizers` package: pip install 'mcpc[quant]' (or: pip install "
            "tokenizers)"
        ) from None
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # the Rust side raises its own exception types
        raise InputError(f"{path}: cannot load the tokenizer ({exc})") from None


def _print_timing(console, r: dict) -> None:
    console.print(f"target {r['target']} at {r['clock_mhz']:g} MHz")
    console.print(
        f"TTFT                {r['ttft_ms']:.4g} ms (prefill; {r['prefill_cycles']:,} prefill cycles in all)"
    )
    if r["cycles_per_token"] is None:
        console.print("time per token      n/a (one new token: no decode step ran)")
    else:
        console.print(
            f"time per token      {r['tpot_ms']:.4g} ms = {r['cycles_per_token']:,.0f} cycles = "
            f"{r['latency_us_per_token']:.4g} µs (mean decode step of {r['decode_steps']})"
        )
        console.print(
            f"DRAM roofline       {r['roofline_us_per_token']:.4g} µs per step (compulsory bytes: weights + "
            f"inputs + outputs + KV in use, / {r['dram_bandwidth_gbps']:g} GB/s): "
            f"the step takes {r['roofline_ratio']:.2f}x it"
        )
        _print_bound(console, r)
    shared = (
        "" if r["kv_bytes"] == r["kv_bytes_unshared"] else f" ({r['kv_bytes_unshared']:,} without sharing)"
    )
    console.print(f"KV bytes (peak)     {r['kv_bytes']:,}{shared}")
    win = r.get("dynamic_window")
    if win:
        console.print(
            f"Dynamic window      {win['narrowed_rows']} of {win['rows']} rows narrowed; left edge mean "
            f"{win['mean_left']:.2f} (max {win['max_left']}), {win['mean_width']:.1f} positions attended "
            "on average"
        )
    store = r.get("kv_store")
    if store:
        k = store["settings"]
        policy = "" if k["policy"] == "none" else f", {k['policy']} dropping {k['sparsity_ratio']:g}"
        console.print(
            f"KV stored as        {k['quant']}{policy}: {store['stored_blocks']} full blocks stored, "
            f"{store['fp16_retained_head_blocks']} head blocks kept unquantized by the error check "
            f"(quant_tol {k['quant_tol']:g})"
        )
        per_step = r.get("kvcomp_cycles_per_token")
        if per_step is not None and store.get("compressed_by", "").startswith("kvcomp"):
            console.print(
                f"KV compression      kvcomp on the NPU: {per_step:,.0f} cycles per decode step (mean, "
                "in the time per token)"
            )


PER_STEP_LINES = 32  # decode steps printed one per line; more are summarised (all are in --json)


def _print_bound(console, r: dict) -> None:
    """Each decode step's cycles beside its DRAM roofline, its dependency-chain latency and the bound
    roofline / 0.85 + chain (docs/timing.md, "The dependency chain")."""
    from .decoder import ROOFLINE_EFFICIENCY

    bound = r.get("decode_bound_cycles")
    if bound is None:
        return
    cyc, roof, chain = r["decode_cycles"], r["decode_roofline_cycles"], r["decode_chain_cycles"]
    console.print(
        f"bound               roofline / {ROOFLINE_EFFICIENCY:g} + dependency chain = "
        f"{r['bound_cycles_per_token']:,.0f} cycles per step (mean; chain "
        f"{r['chain_cycles_per_token']:,.0f}): "
        + ("every step within it" if r["within_bound"] else "some step exceeds it")
    )
    rows = list(range(len(cyc)))
    if len(rows) > PER_STEP_LINES:  # the steps furthest over their bound
        rows = sorted(sorted(rows, key=lambda i: bound[i] - cyc[i])[:PER_STEP_LINES])
        console.print(f"  ({PER_STEP_LINES} of {len(cyc)} steps, the closest to their bound; all in --json)")
    console.print("  step  context      cycles    roofline       chain       bound")
    for i in rows:
        console.print(
            f"  {i:4d}  {r['decode_context'][i]:7d}  {cyc[i]:10,d}  {roof[i]:10,.0f}  {chain[i]:10,d}  "
            f"{bound[i]:10,.0f}"
        )


@click.command("generate", cls=_Guarded)
@click.argument("program", type=_PATH)
@click.option("--prompt-ids", type=_PATH, help="Prompt token ids, a .npy shaped (n,) or (1, n).")
@click.option(
    "--prompts",
    "prompts_path",
    type=_PATH,
    help="Several prompts, a .jsonl file: one JSON list of ids a line.",
)
@click.option("--prompt", "prompt_text", default=None, help="Prompt text (needs --tokenizer).")
@click.option(
    "--tokenizer", type=_PATH, help="A tokenizer.json (the `tokenizers` package) for --prompt and the output."
)
@click.option("--max-new-tokens", type=int, required=True, help="Tokens to generate per prompt (greedy).")
@click.option("--no-prefix-sharing", is_flag=True, help="Store every prompt's blocks on its own.")
@click.option("--json", "json_path", type=_PATH, help="Write the report as JSON.")
def generate_command(
    program, prompt_ids, prompts_path, prompt_text, tokenizer, max_new_tokens, no_prefix_sharing, json_path
):
    """Greedy decoding of PROGRAM (a decoder build: mcp-compile --max-seq N) with its KV cache in
    the simulated NPU memory; prints the tokens, TTFT, time per output token and KV bytes."""
    from rich.console import Console

    from .decoder import DecoderSession

    given = [v for v in (prompt_ids, prompts_path, prompt_text) if v is not None]
    if len(given) != 1:
        raise UsageError(
            f"give exactly one of --prompt-ids IDS.npy, --prompts FILE.jsonl, --prompt TEXT "
            f"(got {len(given)})"
        )
    if prompt_text is not None and tokenizer is None:
        raise UsageError("--prompt TEXT needs --tokenizer tokenizer.json to turn the text into token ids")
    tok = _tokenizer(tokenizer) if tokenizer is not None else None
    if prompt_ids is not None:
        arr = _load_npy(prompt_ids, "the prompt ids")
        if arr.ndim == 2 and arr.shape[0] == 1:
            arr = arr[0]
        if arr.ndim != 1:
            raise UsageError(f"{prompt_ids}: prompt ids must be shaped (n,) or (1, n), not {arr.shape}")
        prompts = [arr.tolist()]
    elif prompts_path is not None:
        prompts = _read_prompts(prompts_path)
    else:
        prompts = [tok.encode(prompt_text).ids]
    dec = DecoderSession(program, prefix_sharing=not no_prefix_sharing)
    console = Console(soft_wrap=True, highlight=False)
    conv = dec.meta.convention
    if conv and conv.get("line"):  # how the compile read the model's own I/O names
        console.print(conv["line"])
    extent = ((dec.session.program.program.meta or {}).get("decoder") or {}).get("row_extent") or {}
    refused = (extent.get("prefill") or {}).get("refused")
    if refused:  # said at compile time too; TTFT below pays for it
        console.print(f"note: the prefill runs every call at its full chunk (row extents refused: {refused})")
    report = dec.generate_many(prompts, max_new_tokens)
    many = prompts_path is not None  # --prompts: one list per prompt, even for a file of one
    outs = report["generated_ids"] if len(prompts) > 1 else [report["generated_ids"]]
    if many:
        report["generated_ids"] = outs
    if tok is not None:
        texts = [tok.decode(ids) for ids in outs]
        report["generated_text"] = texts if many else texts[0]
    for i, ids in enumerate(outs):
        label = f"prompt {i}" if many else "prompt"
        console.print(f"{label} ({len(prompts[i])} tokens) -> {' '.join(map(str, ids))}")
        if tok is not None:
            console.print(f"  {tok.decode(ids)!r}")
    if report["prefix_hit_tokens"]:
        console.print(f"prefix cache        {report['prefix_hit_tokens']} prompt tokens reused")
    _print_timing(console, report)
    if json_path:
        write_atomic(json_path, _json_bytes(report))


@click.command("eval-ppl", cls=_Guarded)
@click.argument("program", type=_PATH)
@click.option(
    "--tokens",
    "tokens_path",
    type=_PATH,
    required=True,
    help="Token ids, .npy: 1-D, or 2-D with one window a row.",
)
@click.option(
    "--window", type=int, default=None, help="Window length W (1-D tokens: cut into n // W windows)."
)
@click.option("--prefill", type=int, default=16, show_default=True, help="Tokens of each window prefilled.")
@click.option("--json", "json_path", type=_PATH, help="Write the report as JSON.")
def eval_ppl_command(program, tokens_path, window, prefill, json_path):
    """Perplexity of PROGRAM (a decoder build) over non-overlapping windows, through the served
    path: a prefill of each window's first P tokens, then one decode step per token."""
    from rich.console import Console

    from .decoder import DecoderSession

    tokens = _load_npy(tokens_path, "the tokens")
    if tokens.ndim == 1 and window is None:
        raise UsageError("--window W is needed for 1-D tokens (cut into n // W windows)")
    dec = DecoderSession(program)
    report = dec.eval_ppl(tokens, window, prefill)
    console = Console(soft_wrap=True, highlight=False)
    console.print(
        f"perplexity          {report['perplexity']:.4f} over {report['windows']} window(s) of "
        f"{report['window']} ({report['predictions']} predictions, prefill {report['prefill']})"
    )
    _print_timing(console, report)
    if json_path:
        write_atomic(json_path, _json_bytes(report))
