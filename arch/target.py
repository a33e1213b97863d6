"""Target descriptions: one YAML per NPU configuration, read by the compiler and the simulator alike.

A target fixes every number the timing model uses (clock, MAC rates per dtype, vector lanes, SRAM
and DRAM sizes, DRAM bandwidth and latency).  Shipped targets live in ``targets/*.yaml`` next to
this module; any other YAML file with the same schema can be passed by path.  The canonical JSON of
a target (sorted keys, no whitespace) is embedded in every ``.mcpb`` and its sha256 is recorded in
the header, so a binary always carries the exact machine it was compiled for.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from mcpc.arch.dtypes import DTYPE_NAMES
from mcpc.errors import ConfigError, InputError

# Vector lanes for a dtype the YAML does not list: (listed dtype to borrow from, factor).  Narrow
# integers and bools run on the integer ALU one element per lane; i64 takes two i32 lanes; fp8 is
# widened to f16 on the fly.
_LANE_FALLBACK = {
    "i8": ("i32", 1.0),
    "u8": ("i32", 1.0),
    "i4": ("i32", 1.0),
    "u4": ("i32", 1.0),
    "i1": ("i32", 1.0),
    "i64": ("i32", 0.5),
    "f8e4m3fn": ("f16", 1.0),
}
_REQUIRED_LANES = ("f32", "f16", "bf16", "i32")
# What the instruction set can address (isa_table: DMA `dram u40`, SRAM operands u32): a target with
# more would compile programs whose addresses do not encode.
DRAM_ADDRESS_BYTES = 1 << 40
SRAM_ADDRESS_BYTES = 1 << 32
# Physical plausibility bounds (far outside any real part): they keep every cycle count of a
# program well inside 64 bits, so a hostile or mistyped target is refused here, not by an
# overflow in the simulator's counters.  The matmul m/n fields are 16-bit: so is the array.
MAX_ARRAY_DIM = 1 << 16
MAX_LATENCY_CYCLES = 1 << 24


def _check_dtype_rates(value: dict[str, int]) -> dict[str, int]:
    for dtype, rate in value.items():
        if dtype not in DTYPE_NAMES:
            raise ValueError(f"unknown dtype {dtype!r} (valid: {', '.join(DTYPE_NAMES)})")
        if rate <= 0:
            raise ValueError(f"{dtype}: must be > 0")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


class MacSpec(_Strict):
    """The matrix engine: a systolic array of ``array_rows`` x ``array_cols`` MAC cells.

    ``pipeline_latency`` is the array's fill and drain (paid once per dependency, not per
    instruction: the engine is pipelined); ``weight_bytes_per_cycle`` the bandwidth at which the
    engine ingests its B (weight) operand from SRAM; a matmul of at most ``stream_max_rows`` rows
    takes the weight-streaming path, whose latency is ``stream_latency`` (docs/timing.md).
    """

    array_rows: int = Field(gt=0, le=MAX_ARRAY_DIM)
    array_cols: int = Field(gt=0, le=MAX_ARRAY_DIM)
    macs_per_cycle: dict[str, int]
    pipeline_latency: int = Field(ge=0, le=MAX_LATENCY_CYCLES)
    weight_bytes_per_cycle: float = Field(ge=1 / 64, le=1 << 30)
    stream_max_rows: int = Field(ge=0, le=MAX_ARRAY_DIM)
    stream_latency: int = Field(ge=0, le=MAX_LATENCY_CYCLES)

    _v = field_validator("macs_per_cycle")(_check_dtype_rates)


class VectorSpec(_Strict):
    """The vector ALU: elements per cycle per dtype, special-function lanes, issue latency."""

    lanes: dict[str, int]
    sfu_lanes: int = Field(gt=0)
    latency: int = Field(ge=0, le=MAX_LATENCY_CYCLES)

    @field_validator("lanes")
    @classmethod
    def _lanes(cls, value: dict[str, int]) -> dict[str, int]:
        _check_dtype_rates(value)
        missing = [d for d in _REQUIRED_LANES if d not in value]
        if missing:
            raise ValueError(f"missing lanes for {', '.join(missing)}")
        return value


class SramSpec(_Strict):
    """The on-chip scratchpad shared by all operands."""

    size_bytes: int = Field(gt=0, le=SRAM_ADDRESS_BYTES)
    bank_bytes: int = Field(gt=0)


class DramSpec(_Strict):
    """Off-chip memory: one channel shared by the load and store engines."""

    size_bytes: int = Field(gt=0, le=DRAM_ADDRESS_BYTES)
    bandwidth_gbps: float = Field(ge=0.1, le=1e6)  # 100 MB/s to 1 PB/s
    latency_ns: float = Field(ge=0, le=1e6)  # up to 1 ms


class Target(_Strict):
    """A validated, immutable NPU description (schema 1).

    Guarantees: every rate and size is positive; dtype keys are names from ``DTYPE_NAMES``;
    ``canonical_json`` is a pure function of the field values, so equal targets have equal digests.
    """

    schema_: Literal[1] = Field(alias="schema")
    name: str = Field(min_length=1)
    description: str = ""
    modelled_on: str = ""
    clock_mhz: float = Field(ge=1, le=10_000)  # 1 MHz to 10 GHz
    mac: MacSpec
    vector: VectorSpec
    sram: SramSpec
    dram: DramSpec

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @property
    def dram_bytes_per_cycle(self) -> float:
        """DRAM bytes transferred per NPU clock cycle (bandwidth / clock)."""
        return self.dram.bandwidth_gbps * 1e9 / (self.clock_mhz * 1e6)

    @property
    def dram_latency_cycles(self) -> int:
        """DRAM access latency in whole NPU cycles (rounded up)."""
        return math.ceil(self.dram.latency_ns * self.clock_mhz / 1000.0 - 1e-9)

    def macs_per_cycle_for(self, dtype: str) -> int:
        """Peak MACs per cycle of the matrix engine for ``dtype``.

        Raises ConfigError naming the target and the dtypes it does support when it has no rate.
        """
        rate = self.mac.macs_per_cycle.get(dtype)
        if rate is None:
            raise ConfigError(
                f"target {self.name}: mac.macs_per_cycle has no rate for dtype {dtype!r} "
                f"(this target supports: {', '.join(sorted(self.mac.macs_per_cycle))})"
            )
        return rate

    def vector_lanes_for(self, dtype: str) -> int:
        """Vector elements per cycle for ``dtype``: the listed rate, else a documented fallback."""
        lanes = self.vector.lanes.get(dtype)
        if lanes is not None:
            return lanes
        if dtype in _LANE_FALLBACK:
            base, factor = _LANE_FALLBACK[dtype]
            if base in self.vector.lanes:
                return max(1, int(self.vector.lanes[base] * factor))
        raise ConfigError(
            f"target {self.name}: vector.lanes has no rate for dtype {dtype!r} "
            f"(listed: {', '.join(sorted(self.vector.lanes))})"
        )

    def canonical_json(self) -> str:
        """Sorted-key, whitespace-free JSON of every field; stable across runs and platforms."""
        return json.dumps(self.model_dump(mode="json", by_alias=True), sort_keys=True, separators=(",", ":"))

    def digest(self) -> str:
        """sha256 hex digest of ``canonical_json()``."""
        return hashlib.sha256(self.canonical_json().encode("utf-8")).hexdigest()

    @classmethod
    def from_canonical_json(cls, text: str, source: str = "embedded target") -> Target:
        """Rebuild a target from ``canonical_json()`` output; ConfigError naming ``source`` if invalid."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{source}: not valid JSON: {exc}") from None
        return _validate(data, source)


def _format_errors(source: str, exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"]) or "<root>"
        msg = err["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        if err["type"] == "greater_than":
            msg = f"must be > {err['ctx']['gt']:g}"
        elif err["type"] == "greater_than_equal":
            msg = f"must be >= {err['ctx']['ge']:g}"
        parts.append(f"{path}: {msg}")
    return f"{source}: " + "; ".join(parts)


def _validate(data: Any, source: str) -> Target:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return Target.model_validate(dict(data))
    except ValidationError as exc:
        raise ConfigError(_format_errors(source, exc)) from None


def _shipped_dir():
    return resources.files("mcpc.arch").joinpath("targets")


def _shipped_names() -> list[str]:
    return sorted(p.name[: -len(".yaml")] for p in _shipped_dir().iterdir() if p.name.endswith(".yaml"))


def _valid_keys(model: type[BaseModel] = Target, prefix: str = "") -> list[str]:
    """Every dotted key path an override may set (dict-valued fields accept any dtype name)."""
    keys = []
    for fname, finfo in model.model_fields.items():
        name = finfo.alias or fname
        ann = finfo.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys += _valid_keys(ann, f"{prefix}{name}.")
        elif fname in ("macs_per_cycle", "lanes"):
            keys.append(f"{prefix}{name}.<dtype>")
        else:
            keys.append(f"{prefix}{name}")
    return keys


def _apply_override(data: dict, key: str, raw: Any, source: str) -> None:
    parts = key.split(".")
    valid = _valid_keys()
    pattern = ".".join(parts[:-1] + ["<dtype>"])
    if key not in valid and pattern not in valid:
        raise ConfigError(f"{source}: unknown override key {key!r} (valid keys: {', '.join(valid)})")
    value = yaml.safe_load(raw) if isinstance(raw, str) else raw
    node = data
    for p in parts[:-1]:
        child = node.get(p)
        if not isinstance(child, dict):
            child = {}
            node[p] = child
        node = child
    node[parts[-1]] = value


def _normalise_overrides(overrides: Mapping[str, Any] | Iterable[str], source: str) -> list[tuple[str, Any]]:
    if isinstance(overrides, Mapping):
        return [(str(k).strip(), v) for k, v in overrides.items()]
    pairs = []
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"{source}: override {item!r} must look like key.path=value")
        k, v = item.split("=", 1)
        pairs.append((k.strip(), v.strip()))
    return pairs


def load_target(name_or_path: str, overrides: Mapping[str, Any] | Iterable[str] = ()) -> Target:
    """Load a shipped target by name (``mcp2026-a100``, ``.yaml`` optional) or a YAML file by path.

    An existing path wins over a shipped name.  ``overrides`` (``"sram.size_bytes=8388608"`` or a
    dict) are applied to the raw YAML before validation; values are parsed as YAML scalars.
    Raises ConfigError (unknown name, bad key, invalid value) naming the file and key path.
    """
    path = Path(name_or_path)
    if path.is_file():
        source, text = path.name, _read(path)
    else:
        stem = name_or_path[:-5] if name_or_path.endswith(".yaml") else name_or_path
        if stem not in _shipped_names():
            raise ConfigError(
                f"unknown target {name_or_path!r}: not a file and not a shipped target "
                f"(shipped: {', '.join(_shipped_names())})"
            )
        source = f"{stem}.yaml"
        text = _shipped_dir().joinpath(source).read_text(encoding="utf-8")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level")
    for key, value in _normalise_overrides(overrides, source):
        _apply_override(data, key, value, source)
    return _validate(data, source)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read target file: {exc}") from None


def list_targets() -> list[Target]:
    """All shipped targets, sorted by name."""
    return sorted((load_target(n) for n in _shipped_names()), key=lambda t: t.name)
