"""Pass registry, pipeline text (parse / build / format round trip) and the pass manager."""

from __future__ import annotations

import io
import sys
from dataclasses import dataclass
from typing import ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcpc.errors import McpcError, UsageError, VerifyError
from mcpc.passes import (
    PRESETS,
    REGISTRY,
    Pass,
    PassManager,
    PassRegistry,
    build_pipeline,
    format_pipeline,
    load_all_passes,
    parse_pipeline,
)

registry = PassRegistry()


@registry.register
@dataclass(frozen=True)
class TileLike(Pass):
    """Test pass with one option of every supported type."""

    name: ClassVar[str] = "tile-like"
    group_size: int = 32
    scale: float = 0.5
    double_buffer: bool = True
    dtype: str = "f16"
    tile: tuple[int, ...] = (64, 64)

    def apply(self, module, ctx):
        return module


@registry.register
@dataclass(frozen=True)
class Plain(Pass):
    """Test pass without options."""

    name: ClassVar[str] = "plain"

    def apply(self, module, ctx):
        return module


# -- parse_pipeline ------------------------------------------------------------------------


def test_parse_commas_inside_braces_do_not_split():
    assert parse_pipeline("a{k=v,k2=w},b") == [("a", {"k": "v", "k2": "w"}), ("b", {})]


def test_parse_tolerates_whitespace_and_empty_braces():
    assert parse_pipeline("  a { k = 1 , k2 = 2x3 } ,  b{} ") == [("a", {"k": "1", "k2": "2x3"}), ("b", {})]


def test_parse_empty_text_is_empty_pipeline():
    assert parse_pipeline("") == []
    assert parse_pipeline("   ") == []


@pytest.mark.parametrize(
    "text, column, fragment",
    [
        ("a{k=v", 6, "expected ',' or '}'"),
        ("a,,b", 3, "expected a pass name"),
        ("a{k}", 4, "expected '='"),
        ("a b", 3, "expected ',' between passes"),
        ("a,", 3, "expected a pass name"),
        ("a{k=1,k=2}", 7, "given twice"),
        ("a{=1}", 3, "expected an option name"),
    ],
)
def test_parse_errors_name_the_column(text, column, fragment):
    with pytest.raises(UsageError) as info:
        parse_pipeline(text)
    msg = info.value.message
    assert f"column {column}:" in msg and fragment in msg
    # the caret sits under the offending column
    lines = msg.splitlines()
    assert lines[-1].index("^") - 2 == column - 1 and lines[-2].strip() == text.strip()


# -- build_pipeline: option conversion and errors --------------------------------------------


def test_build_converts_option_types_and_accepts_both_spellings():
    text = "tile-like{group-size=0x10,scale=1e-3,double_buffer=false,dtype=bf16,tile=1x2x3}"
    (p,) = build_pipeline(text, registry)
    assert p == TileLike(group_size=16, scale=1e-3, double_buffer=False, dtype="bf16", tile=(1, 2, 3))


def test_build_defaults_and_empty_tuple():
    assert build_pipeline("tile-like{tile=}", registry) == [TileLike(tile=())]
    assert build_pipeline("plain,tile-like", registry) == [Plain(), TileLike()]


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("nope", "unknown pass 'nope'; registered passes: plain, tile-like"),
        ("tile-like{size=3}", "no option 'size'; valid options: double-buffer, dtype, group-size, scale, t"),
        ("plain{x=1}", "(it takes no options)"),
        ("tile-like{group-size=big}", "option 'group-size' expects an integer, got 'big'"),
        ("tile-like{scale=x}", "expects a number"),
        ("tile-like{double-buffer=maybe}", "expects a boolean"),
        ("tile-like{tile=1x}", "integers joined by 'x'"),
    ],
)
def test_build_errors_are_usage_errors_listing_valid_names(text, fragment):
    with pytest.raises(UsageError) as info:
        build_pipeline(text, registry)
    assert fragment in info.value.message
    assert info.value.exit_code == 2


def test_unknown_pass_error_names_its_column():
    with pytest.raises(UsageError, match=r"pipeline column 8\)"):
        build_pipeline("plain, nope", registry)


# -- format_pipeline round trip ----------------------------------------------------------------

_dtype_word = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_.", min_size=1, max_size=8)
_tile_like = st.builds(
    TileLike,
    group_size=st.integers(-(2**40), 2**40),
    scale=st.floats(allow_nan=False, allow_infinity=True),
    double_buffer=st.booleans(),
    dtype=_dtype_word,
    tile=st.lists(st.integers(0, 4096), max_size=4).map(tuple),
)


@given(st.lists(st.one_of(_tile_like, st.just(Plain())), max_size=5))
def test_format_parses_back_to_equal_passes(passes):
    text = format_pipeline(passes)
    assert build_pipeline(text, registry) == passes
    assert format_pipeline(build_pipeline(text, registry)) == text


def test_format_writes_every_option():
    assert format_pipeline([Plain(), TileLike()]) == (
        "plain,tile-like{group-size=32,scale=0.5,double-buffer=true,dtype=f16,tile=64x64}"
    )


def test_format_refuses_unrepresentable_string():
    with pytest.raises(ValueError, match="cannot be written"):
        format_pipeline([TileLike(dtype="a,b")])


# -- registration rules ----------------------------------------------------------------------


def test_register_rejects_malformed_pass_classes():
    reg = PassRegistry()

    @dataclass
    class NotFrozen(Pass):
        name: ClassVar[str] = "not-frozen"

    with pytest.raises(TypeError, match="frozen dataclass"):
        reg.register(NotFrozen)

    @dataclass(frozen=True)
    class BadName(Pass):
        name: ClassVar[str] = "Bad_Name"

    with pytest.raises(TypeError, match="kebab-case"):
        reg.register(BadName)

    @dataclass(frozen=True)
    class BadType(Pass):
        name: ClassVar[str] = "bad-type"
        weights: list = None

    with pytest.raises(TypeError, match="unsupported type"):
        reg.register(BadType)

    @dataclass(frozen=True)
    class NoDefault(Pass):
        name: ClassVar[str] = "no-default"
        bits: int

    with pytest.raises(TypeError, match="needs a default"):
        reg.register(NoDefault)


def test_presets_parse():
    for name, text in PRESETS.items():
        assert parse_pipeline(text), name


def test_presets_build_with_the_registered_passes():
    load_all_passes()
    for name, text in PRESETS.items():
        missing = [n for n, _ in parse_pipeline(text) if n not in REGISTRY]
        assert not missing, f"preset {name}: passes {missing} are not registered"
        assert format_pipeline(build_pipeline(text)) != ""


# -- PassManager on real IR --------------------------------------------------------------------

import mcpc.ir as ir  # noqa: E402


def _negate_module():
    from mcpc.ir.ops import NegOp, ReturnOp

    t = ir.TensorType((2, 3), ir.dtype_from_name("f32"))
    m = ir.Module("m")
    f = m.add_function(ir.Function("main", [t], ["x"]))
    neg = f.append(NegOp([f.args[0]]))
    f.append(ReturnOp([neg.result]))
    f.result_names = ["y"]
    return m


@dataclass(frozen=True)
class AddNeg(Pass):
    """Inserts ``mcp.neg`` ops before the return (keeps the module valid)."""

    name: ClassVar[str] = "add-neg"
    count: int = 1

    def apply(self, module, ctx):
        from mcpc.ir.ops import NegOp

        f = module.main
        ret = f.ops.pop()
        value = ret.operands[0]
        for _ in range(self.count):
            value = f.append(NegOp([value])).result
        ret.operands[0] = value
        f.ops.append(ret)
        return module


@dataclass(frozen=True)
class DropReturn(Pass):
    """Removes the terminator: leaves the module invalid."""

    name: ClassVar[str] = "drop-return"

    def apply(self, module, ctx):
        module.main.ops.pop()
        return module


@dataclass(frozen=True)
class Crash(Pass):
    name: ClassVar[str] = "crash"

    def apply(self, module, ctx):
        raise KeyError("boom")


ir_registry = PassRegistry()
for _cls in (AddNeg, DropReturn, Crash):
    ir_registry.register(_cls)


def test_manager_runs_in_order_times_and_prints():
    out = io.StringIO()
    passes = build_pipeline("add-neg{count=2},add-neg", ir_registry)
    pm = PassManager(passes, print_ir_after_all=out, time_passes=True)
    m = pm.run(_negate_module())
    assert sum(op.name == "mcp.neg" for op in m.walk()) == 4
    assert [t.pass_text for t in pm.timings] == ["add-neg{count=2}", "add-neg{count=1}"]
    assert all(t.seconds >= 0 and t.verify_seconds >= 0 for t in pm.timings)
    text = out.getvalue()
    assert text.index("IR after add-neg{count=2}") < text.index("IR after add-neg{count=1}")
    assert text.count("mcp.neg") == 3 + 4
    table = io.StringIO()
    pm.print_timings(table)
    assert "add-neg{count=2}" in table.getvalue() and "total" in table.getvalue()


def test_verify_error_after_pass_names_the_pass():
    pm = PassManager(build_pipeline("add-neg,drop-return", ir_registry))
    with pytest.raises(VerifyError, match=r"after pass drop-return"):
        pm.run(_negate_module())


def test_invalid_input_module_is_reported_before_any_pass():
    m = _negate_module()
    m.main.ops.pop()
    with pytest.raises(VerifyError, match="before any pass"):
        PassManager(build_pipeline("add-neg", ir_registry)).run(m)


def test_verify_each_false_skips_verification():
    m = PassManager(build_pipeline("drop-return", ir_registry), verify_each=False).run(_negate_module())
    assert not any(op.name == "mcp.return" for op in m.walk())


def test_unexpected_exception_keeps_type_and_names_the_pass():
    with pytest.raises(KeyError) as info:
        PassManager(build_pipeline("crash", ir_registry)).run(_negate_module())
    assert not isinstance(info.value, McpcError)
    if sys.version_info >= (3, 11):  # exception notes exist from 3.11 on
        assert "while running pass crash" in info.value.__notes__
