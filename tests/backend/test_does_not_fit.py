"""Resource limits are the user's (exit 6, DoesNotFit), never our bug (exit 70): what did not fit, by
how much, and the --set key; the size the message asks for is enough."""

from __future__ import annotations

import re

import pytest
from test_lower_vector import compile_check, single_op
from test_matmul import matmul_module

from mcpc.arch.target import load_target
from mcpc.backend import compile_to_program
from mcpc.errors import EXIT_DOES_NOT_FIT, DoesNotFit, PassError
from mcpc.ir import ops
from mcpc.passes import PassContext, load_all_passes
from mcpc.passes.tile_matmul import TileMatmulPass, choose_tile


def _asked(err: DoesNotFit, key: str) -> int:
    """The size the message tells the user to set ``key`` to."""
    found = re.search(rf"--set {re.escape(key)}=N \(N at least (\d+)\)", err.message)
    assert found, err.message
    return int(found.group(1))


def _one_paragraph(err: DoesNotFit) -> None:
    assert err.exit_code == EXIT_DOES_NOT_FIT == 6
    assert "\n" not in err.message and err.message.count("does not fit the target") == 1
    assert "bigger" in err.message or "choose a target" in err.message
    assert "--dim" in err.message


@pytest.mark.parametrize(
    "op_cls, shapes, attrs",
    [
        (ops.SoftmaxOp, [((2, 4096), "f32")], {"axis": -1}),
        (
            ops.LayerNormOp,
            [((4, 1024), "f32"), ((1024,), "f32"), ((1024,), "f32")],
            {"axis": -1, "epsilon": 1e-5},
        ),
        (ops.AddOp, [((3, 5), "f32"), ((3, 5), "f32")], None),
    ],
)
def test_sram_too_small_says_how_much_and_the_asked_size_is_enough(op_cls, shapes, attrs):
    module = single_op(op_cls, shapes, attrs)
    with pytest.raises(DoesNotFit) as e:
        compile_to_program(module, load_target("mcp2026-edge", ["sram.size_bytes=256"]))
    _one_paragraph(e.value)
    assert "of SRAM, target mcp2026-edge has 256 bytes" in e.value.message
    assert op_cls.name in e.value.message
    need = _asked(e.value, "sram.size_bytes")
    assert need > 256
    compile_check(single_op(op_cls, shapes, attrs), overrides=[f"sram.size_bytes={need}"])


def test_dram_too_small_is_does_not_fit():
    module = single_op(ops.AddOp, [((64, 64), "f32"), ((64, 64), "f32")])
    with pytest.raises(DoesNotFit) as e:
        compile_to_program(module, load_target("mcp2026-edge", ["dram.size_bytes=4096"]))
    _one_paragraph(e.value)
    assert "of DRAM, target mcp2026-edge has 4096 bytes" in e.value.message
    need = _asked(e.value, "dram.size_bytes")
    assert need == 3 * 64 * 64 * 4  # two inputs and the output
    compile_check(
        single_op(ops.AddOp, [((64, 64), "f32"), ((64, 64), "f32")]), overrides=[f"dram.size_bytes={need}"]
    )


def test_tile_matmul_names_the_op_and_the_smallest_tile():
    load_all_passes()
    target = load_target("mcp2026-edge", ["sram.size_bytes=128"])
    with pytest.raises(DoesNotFit) as e:
        TileMatmulPass().apply(matmul_module((8, 16), (16, 8)), PassContext(target=target))
    _one_paragraph(e.value)
    assert e.value.message.startswith("mcp.matmul (ONNX node 'mm'): does not fit the target: tile-matmul")
    need = _asked(e.value, "sram.size_bytes")
    assert choose_tile(1, 8, 8, 16, "f32", "f32", load_target("mcp2026-edge", [f"sram.size_bytes={need}"]))


def test_untiled_matmul_stays_a_pass_error():
    # no tile-matmul in the pipeline: a pipeline mistake, not a target too small
    with pytest.raises(PassError) as e:
        compile_to_program(matmul_module((1024, 1024), (1024, 1024)), load_target("mcp2026-edge"))
    assert not isinstance(e.value, DoesNotFit)


def test_past_the_isa_address_space_only_smaller_dims_help():
    from mcpc.arch.target import DRAM_ADDRESS_BYTES
    from mcpc.errors import ConfigError, does_not_fit

    err = does_not_fit("x", DRAM_ADDRESS_BYTES + 1, 1 << 30, "DRAM", "dram.size_bytes")
    assert "no target can hold it" in err.message and "--set" not in err.message
    with pytest.raises(ConfigError, match="dram.size_bytes"):
        load_target("mcp2026-a100", [f"dram.size_bytes={DRAM_ADDRESS_BYTES + 1}"])
