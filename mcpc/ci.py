"""``mcpc ci CHECKS.yaml``: compile, simulate and check a list of builds, and hold each to budgets.

A checks file (docs/ci.md)::

    regression_pct: {latency_us: 5, mcpb_bytes: 1}    # optional, for --baseline
    builds:
      - name: mlp-fp16
        model: example:mlp          # a bundled example by name, or an ONNX path relative to this file
        target: mcp2026-a100        # or a list: one build per target (and per config)
        qat_config: fp16            # a shipped config name, or a path
        inputs: random              # or an .npz path
        dim: {seq: 32}              # binds symbolic dims as --dim does
        budgets: {max_latency_us: 50, max_peak_memory_bytes: 8000000, max_mcpb_bytes: 4000000,
                  min_cosine: 0.999, max_compile_s: 60}
      - name: llama-decoder         # a decoder build: max_seq (and max_batch, kv_blocks,
        model: llama-with-past.onnx #   prefill_chunk) as mcp-compile --max-seq; perplexity on
        max_seq: 64                 #   the token windows, through mcpc sim eval-ppl's path
        tokens: tokens.npy
        window: 24
        budgets: {max_ppl_change_pct: 0.5, max_ppl: 4000}

Every build is measured by ``mcpc.measure.measure_build``; this module validates the file, turns
rows into budget verdicts and compares them with a baseline.  A build that cannot be made fails
each of its budgets with the build's error; a run that produced a NaN or overflow fails the
build's ``numerics`` case whatever its budgets say.  Unknown keys, budgets, metrics, missing files
and unknown examples are errors naming the file, line and key (exit 3) before anything is built.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mcpc.errors import ConfigError
from mcpc.measure import BuildSpec

# budget key -> (metric of the row, "max" or "min", unit)
BUDGETS: dict[str, tuple[str, str, str]] = {
    "max_latency_us": ("latency_us", "max", "µs"),
    "max_latency_cycles": ("cycles", "max", "cycles"),
    "max_peak_memory_bytes": ("peak_memory_bytes", "max", "bytes"),
    "max_mcpb_bytes": ("mcpb_bytes", "max", "bytes"),
    "max_weight_bytes": ("weight_bytes", "max", "bytes"),
    "min_cosine": ("min_cosine", "min", ""),
    "max_norm_err": ("max_norm_err", "max", ""),
    "min_top1": ("min_top1", "min", ""),
    "max_compile_s": ("compile_s", "max", "s"),
    "max_ppl_change_pct": ("ppl_change_pct", "max", "%"),
    "max_ppl": ("perplexity", "max", ""),
    "max_ttft_ms": ("ttft_ms", "max", "ms"),
    "max_tpot_ms": ("tpot_ms", "max", "ms"),
    "max_kv_bytes": ("kv_bytes", "max", "bytes"),
}
# budgets only a decoder build measures (through eval-ppl's path)
DECODER_BUDGETS = ("max_ppl_change_pct", "max_ppl", "max_ttft_ms", "max_tpot_ms", "max_kv_bytes")
# metrics a baseline can hold a build to: +1 = higher is worse, -1 = lower is worse
DIRECTION: dict[str, int] = {
    "cycles": 1,
    "latency_us": 1,
    "peak_memory_bytes": 1,
    "mcpb_bytes": 1,
    "weight_bytes": 1,
    "instructions": 1,
    "dram_bytes": 1,
    "max_norm_err": 1,
    "compile_s": 1,
    "sim_s": 1,
    "min_cosine": -1,
    "min_top1": -1,
    "perplexity": 1,
    "ttft_ms": 1,
    "tpot_ms": 1,
    "kv_bytes": 1,
}
DEFAULT_REGRESSION_PCT = {"latency_us": 5.0, "peak_memory_bytes": 5.0, "mcpb_bytes": 5.0}
NUMERICS = "numerics"  # the implicit case of every build: no NaN or overflow in the simulated run
EXAMPLE_PREFIX = "example:"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


DECODER_KEYS = ("max_batch", "kv_blocks", "prefill_chunk", "tokens", "window", "prefill")


class BuildEntry(_Strict):
    """One ``builds:`` item; ``target`` and ``qat_config`` may be lists (one build per pair)."""

    name: str
    model: str
    target: str | list[str] = "mcp2026-a100"
    qat_config: str | list[str] = "fp16"
    inputs: str = "random"
    seed: int = 0
    dim: dict[str, int] = Field(default_factory=dict)
    calib: str | None = None
    set: list[str] = Field(default_factory=list)
    # a decoder build: mcp-compile --max-seq's sizes, and the windows its perplexity is measured on
    max_seq: int | None = Field(default=None, ge=1)
    max_batch: int | None = Field(default=None, ge=1)
    kv_blocks: int | None = Field(default=None, ge=1)
    prefill_chunk: int | None = Field(default=None, ge=1)
    tokens: str | None = None
    window: int | None = Field(default=None, ge=2)
    prefill: int | None = Field(default=None, ge=1)
    budgets: dict[str, float] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _decoder_keys(self) -> BuildEntry:
        decoder = [k for k in DECODER_KEYS if getattr(self, k) is not None]
        if self.max_seq is None and decoder:
            raise ValueError(f"{', '.join(decoder)} belong to a decoder build: add max_seq")
        if self.max_seq is not None:
            if self.tokens is None:
                raise ValueError("a decoder build (max_seq) needs tokens (an .npy of token ids)")
            given = [k for k in ("inputs", "dim") if k in self.model_fields_set]
            if given:
                raise ValueError(f"a decoder build (max_seq) takes tokens, not {', '.join(given)}")
        else:
            wrong = [b for b in self.budgets if b in DECODER_BUDGETS]
            if wrong:
                raise ValueError(f"{', '.join(wrong)} need a decoder build (max_seq and tokens)")
        return self

    @field_validator("budgets")
    @classmethod
    def _known_budgets(cls, v: dict[str, float]) -> dict[str, float]:
        unknown = [k for k in v if k not in BUDGETS]
        if unknown:
            raise ValueError(f"unknown budget {', '.join(unknown)} (expected one of {', '.join(BUDGETS)})")
        return v


class ChecksFile(_Strict):
    builds: list[BuildEntry] = Field(min_length=1)
    regression_pct: dict[str, float | None] = Field(default_factory=dict)

    @field_validator("regression_pct")
    @classmethod
    def _known_metrics(cls, v: dict[str, float | None]) -> dict[str, float | None]:
        unknown = [k for k in v if k not in DIRECTION]
        if unknown:
            raise ValueError(f"unknown metric {', '.join(unknown)} (expected one of {', '.join(DIRECTION)})")
        return v


@dataclass
class Build:
    """A build to run: its spec, its budgets, and the checks-file line it came from."""

    spec: BuildSpec
    budgets: dict[str, float]
    line: int


@dataclass
class Checks:
    """A validated checks file."""

    source: Path
    builds: list[Build]
    regression_pct: dict[str, float] = field(default_factory=dict)


def _lines(text: str) -> list[int]:
    """The 1-based line of each ``builds:`` item (for messages and GitHub annotations)."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return []
    for key, value in getattr(root, "value", []) if isinstance(root, yaml.MappingNode) else []:
        if key.value == "builds" and isinstance(value, yaml.SequenceNode):
            return [item.start_mark.line + 1 for item in value.value]
    return []


def load_checks(path: str | Path, example_dir: Path | None = None) -> Checks:
    """Validate a checks file.  ``example:NAME`` models are written into ``example_dir`` (built
    on first use).  Paths are relative to the file; a config or target that is not an existing
    path is taken as a shipped name."""
    from mcpc.qat_configs.schema import _describe, _unknown_key_hint, parse_yaml_mapping

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the checks file ({exc})") from None
    data = parse_yaml_mapping(text, str(path), "checks file")
    lines = _lines(text)
    try:
        checks = ChecksFile.model_validate(data)
    except ValidationError as exc:
        parts = []
        for err in exc.errors():
            loc = err["loc"]
            at = (
                f"{path}:{lines[loc[1]]}"
                if loc[:1] == ("builds",) and len(loc) > 1 and loc[1] < len(lines)
                else path
            )
            hint = _unknown_key_hint(err, ChecksFile) if err["type"] == "extra_forbidden" else ""
            parts.append(f"{at}: {_describe(err)}{hint}")
        raise ConfigError("; ".join(parts)) from None
    base = path.parent
    builds, names = [], set()
    for i, entry in enumerate(checks.builds):
        line = lines[i] if i < len(lines) else 0
        where = f"{path}:{line}: build {entry.name!r}"
        model = _model_path(entry.model, base, example_dir, where)
        inputs = entry.inputs if entry.inputs == "random" else _existing(base, entry.inputs, where, "inputs")
        calib = _existing(base, entry.calib, where, "calib") if entry.calib is not None else None
        tokens = _existing(base, entry.tokens, where, "tokens") if entry.tokens is not None else None
        targets = entry.target if isinstance(entry.target, list) else [entry.target]
        configs = entry.qat_config if isinstance(entry.qat_config, list) else [entry.qat_config]
        for target in targets:
            for config in configs:
                name = entry.name
                if len(targets) > 1 or len(configs) > 1:
                    name = f"{entry.name}/{Path(target).stem}/{Path(config).stem}"
                if name in names:
                    raise ConfigError(f"{where}: a second build named {name!r} (names must be unique)")
                names.add(name)
                spec = BuildSpec(
                    name=name,
                    model=model,
                    target=_name_or_path(base, target),
                    qat_config=_name_or_path(base, config),
                    dims=dict(entry.dim),
                    inputs=inputs,
                    seed=entry.seed,
                    calib=calib,
                    overrides=tuple(entry.set),
                    max_seq=entry.max_seq,
                    max_batch=entry.max_batch,
                    kv_blocks=entry.kv_blocks,
                    prefill_chunk=entry.prefill_chunk,
                    tokens=tokens,
                    window=entry.window,
                    prefill=entry.prefill,
                )
                builds.append(Build(spec, dict(entry.budgets), line))
    pct = dict(DEFAULT_REGRESSION_PCT)
    pct.update(checks.regression_pct)
    return Checks(path, builds, {k: v for k, v in pct.items() if v is not None})


def _existing(base: Path, ref: str, where: str, key: str) -> str:
    p = base / ref
    if not p.is_file():
        raise ConfigError(f"{where}: {key}: no such file {ref!r} (relative to the checks file: {p})")
    return str(p)


def _name_or_path(base: Path, ref: str) -> str:
    p = base / ref
    return str(p) if p.is_file() else ref


def _model_path(ref: str, base: Path, example_dir: Path | None, where: str) -> str:
    if not ref.startswith(EXAMPLE_PREFIX):
        return _existing(base, ref, where, "model")
    from mcpc.examples import build_examples

    name = ref[len(EXAMPLE_PREFIX) :]
    if example_dir is None:
        raise ConfigError(f"{where}: model {ref!r}: bundled examples need a work directory")
    path = example_dir / f"{name}.onnx"
    if not path.is_file():
        example_dir.mkdir(parents=True, exist_ok=True)
        built = [p.stem for p in build_examples(example_dir) if p.suffix == ".onnx"]
        if name not in built:
            raise ConfigError(
                f"{where}: model {ref!r}: no such bundled example (examples: {', '.join(built)})"
            )
    return str(path)


# -- verdicts ------------------------------------------------------------------------------------


def _fmt(value: float, unit: str) -> str:
    if isinstance(value, float) and not value.is_integer():
        text = f"{value:.7g}"
    else:
        text = f"{int(value):,}"
    return f"{text} {unit}".strip()


def judge(build: Build, row: dict) -> list[dict[str, Any]]:
    """One verdict per budget plus the ``numerics`` case: ``{case, metric, limit, measured,
    passed, message}``."""
    verdicts = []
    failed_build = row.get("status") != "ok"
    why = f"build failed (exit {row.get('exit_code')}): {row.get('reason')}" if failed_build else ""
    for budget, limit in build.budgets.items():
        metric, kind, unit = BUDGETS[budget]
        measured = None if failed_build else row["metrics"].get(metric)
        if failed_build:
            passed, message = False, why
        elif measured is None:
            passed, message = False, f"{metric} was not measured for this build (no such output)"
        else:
            passed = measured <= limit if kind == "max" else measured >= limit
            op = ("<=" if passed else ">") if kind == "max" else (">=" if passed else "<")
            message = f"{metric} {_fmt(measured, unit)} {op} {_fmt(limit, unit)}"
        verdicts.append(
            dict(case=budget, metric=metric, limit=limit, measured=measured, passed=passed, message=message)
        )
    problem = row.get("numeric")
    verdicts.append(
        dict(
            case=NUMERICS,
            metric=None,
            limit=None,
            measured=None,
            passed=not failed_build and not problem,
            message=why if failed_build else (problem or "no NaN or overflow in the simulated run"),
        )
    )
    return verdicts


def compare_baseline(rows: list[dict], baseline: dict, pct: dict[str, float]) -> list[dict[str, Any]]:
    """Per build and metric of ``pct`` present on both sides: ``{build, metric, old, new, delta_pct,
    limit_pct, regressed}``; builds absent from either side are skipped (listed by the caller)."""
    old_rows = {b["name"]: b for b in baseline.get("builds", []) if b.get("status") == "ok"}
    out = []
    for row in rows:
        old = old_rows.get(row["name"])
        if old is None or row.get("status") != "ok":
            continue
        for metric, limit in pct.items():
            a, b = old.get("metrics", {}).get(metric), row["metrics"].get(metric)
            if a is None or b is None:
                continue
            delta = (b - a) / abs(a) * 100 if a else (0.0 if b == a else float("inf"))
            regressed = DIRECTION[metric] * delta > limit
            out.append(
                dict(
                    build=row["name"],
                    metric=metric,
                    old=a,
                    new=b,
                    delta_pct=delta,
                    limit_pct=limit,
                    regressed=regressed,
                )
            )
    return out


def read_baseline(path: str | Path) -> dict:
    """A baseline (the JSON of ``mcpc ci --json`` / ``--update-baseline``); InputError when unreadable."""
    from mcpc.errors import InputError

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: no such baseline file (write one with --update-baseline)") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: not a readable baseline JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("builds"), list):
        raise InputError(f"{path}: not an mcpc ci result (no 'builds' list)")
    return data


def result_document(checks: Checks, builds: list[Build], rows: dict[str, dict], regressions) -> dict:
    """The JSON of a ci run (``--json``, ``--update-baseline``, ``mcpc report``)."""
    out_builds = []
    for b in builds:
        row = dict(rows[b.spec.name])
        row["line"] = b.line
        row["budgets"] = judge(b, row)
        row["regressions"] = [r for r in regressions if r["build"] == b.spec.name]
        out_builds.append(row)
    passed = all(v["passed"] for r in out_builds for v in r["budgets"]) and not any(
        r["regressed"] for r in regressions
    )
    return {"kind": "mcpc-ci", "checks_file": str(checks.source), "passed": passed, "builds": out_builds}
