"""Target descriptions: shipped files, derived numbers, overrides, validation messages."""

import json
import math

import pytest
import yaml

from mcpc.arch.target import Target, list_targets, load_target
from mcpc.errors import ConfigError

NAMES = ["mcp2026-a10", "mcp2026-a100", "mcp2026-edge"]


def test_shipped_targets_load_sorted():
    targets = list_targets()
    assert [t.name for t in targets] == NAMES
    for t in targets:
        assert t.modelled_on and t.description
        # the array cells are the f16 MAC rate: one f16 MAC per cell per cycle
        assert t.mac.array_rows * t.mac.array_cols == t.macs_per_cycle_for("f16")


@pytest.mark.parametrize(
    "name, peak_f16_tflops, bw",
    [("mcp2026-a100", 312, 1555), ("mcp2026-a10", 125, 600), ("mcp2026-edge", 10.24, 68)],
)
def test_rates_match_the_public_figures(name, peak_f16_tflops, bw):
    t = load_target(name)
    flops = 2 * t.macs_per_cycle_for("f16") * t.clock_mhz * 1e6
    assert flops == pytest.approx(peak_f16_tflops * 1e12, rel=0.01)
    assert t.dram.bandwidth_gbps == bw
    assert t.dram_bytes_per_cycle == pytest.approx(bw * 1e9 / (t.clock_mhz * 1e6))
    assert t.dram_latency_cycles == math.ceil(t.dram.latency_ns * t.clock_mhz / 1000)


def test_edge_has_the_smallest_sram():
    sizes = {t.name: t.sram.size_bytes for t in list_targets()}
    assert sizes["mcp2026-edge"] <= 4 << 20 < sizes["mcp2026-a10"] < sizes["mcp2026-a100"]


def test_name_with_yaml_suffix_and_path(tmp_path):
    a = load_target("mcp2026-a100")
    assert load_target("mcp2026-a100.yaml") == a
    data = yaml.safe_load(json.dumps(json.loads(a.canonical_json())))
    data["name"] = "custom"
    path = tmp_path / "custom.yaml"
    path.write_text(yaml.safe_dump(data))
    assert load_target(str(path)).name == "custom"


def test_canonical_json_and_digest_are_stable():
    a = load_target("mcp2026-edge")
    assert Target.from_canonical_json(a.canonical_json()) == a
    assert a.digest() == load_target("mcp2026-edge").digest()
    assert len(a.digest()) == 64 and '"schema":1' in a.canonical_json()
    assert load_target("mcp2026-edge", ["sram.size_bytes=4096"]).digest() != a.digest()


def test_overrides_list_and_dict():
    t = load_target("mcp2026-edge", ["sram.size_bytes=8388608", "mac.macs_per_cycle.i1=7"])
    assert t.sram.size_bytes == 8388608 and t.macs_per_cycle_for("i1") == 7
    t2 = load_target("mcp2026-edge", {"dram.bandwidth_gbps": "100.5"})
    assert t2.dram.bandwidth_gbps == 100.5


@pytest.mark.parametrize(
    "override, needle",
    [
        ("dram.bandwidth_gbps=0", "mcp2026-a100.yaml: dram.bandwidth_gbps: must be >= 0.1"),
        ("sram.sizebytes=1", "unknown override key 'sram.sizebytes' (valid keys: schema"),
        ("mac.macs_per_cycle.f9=1", "mac.macs_per_cycle: unknown dtype 'f9'"),
        ("clock_mhz=fast", "clock_mhz"),
        ("schema=2", "schema"),
        ("sram.size_bytes", "must look like key.path=value"),
    ],
)
def test_bad_overrides_name_the_key(override, needle):
    with pytest.raises(ConfigError) as err:
        load_target("mcp2026-a100", [override])
    assert needle in str(err.value)


def test_bad_file_names_file_and_key(tmp_path):
    data = json.loads(load_target("mcp2026-a10").canonical_json())
    data["vector"]["extra_thing"] = 1
    del data["vector"]["lanes"]["bf16"]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as err:
        load_target(str(path))
    msg = str(err.value)
    assert msg.startswith("bad.yaml: ") and "vector.extra_thing" in msg and "missing lanes for bf16" in msg
    with pytest.raises(ConfigError, match="unknown target 'mcp2026-h100'"):
        load_target("mcp2026-h100")


def test_rate_lookups():
    t = load_target("mcp2026-a100")
    assert t.vector_lanes_for("f32") == 6912
    assert t.vector_lanes_for("i8") == t.vector_lanes_for("i32")
    assert t.vector_lanes_for("i64") == t.vector_lanes_for("i32") // 2
    assert t.macs_per_cycle_for("i8") == 2 * t.macs_per_cycle_for("f16")
    with pytest.raises(ConfigError, match="no rate for dtype 'u4'.*supports"):
        t.macs_per_cycle_for("u4")


def test_target_is_frozen():
    t = load_target("mcp2026-a10")
    with pytest.raises(Exception):  # noqa: B017 - pydantic raises ValidationError on frozen assignment
        t.clock_mhz = 1.0
