"""Parse errors carry file:line:col, the offending line and a caret under the column."""

import re
from pathlib import Path

import pytest

from mcpc.errors import InputError, ParseError
from mcpc.ir import parse_module, print_module
from mcpc.ir.parser import parse_attr, parse_type

GOOD = """\
module @m {
  func @main(%x: tensor<2x3xf32>, %w: tensor<3x4xf32>) -> ("y": tensor<2x4xf32>) {
    %0 = mcp.matmul %x, %w {out = f32, tile = [], trans_b = false}
        : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32>
    %1 = mcp.softmax %0 {axis = -1} : (tensor<2x4xf32>) -> tensor<2x4xf32>
    mcp.return %1 : (tensor<2x4xf32>) -> ()
  }
}
"""


def _break(old: str, new: str) -> str:
    assert old in GOOD
    return GOOD.replace(old, new, 1)


# (broken text, the text the caret must point at, words of the message)
CASES = [
    (_break("mcp.softmax", "mcp.softmux"), "mcp.softmux", "unknown op 'mcp.softmux'"),
    (_break("mcp.softmax %0", "mcp.softmax %7"), "%7", "undefined value %7"),
    (_break("tensor<2x3xf32>,", "tensor<2x3xf33>,"), "f33>,", "unknown dtype 'f33'"),
    (_break("%1 = mcp.softmax", "%1 mcp.softmax"), "mcp.softmax %0", "expected '='"),
    (_break('("y"', '("y'), '"y', "expected a string"),
    (_break("{axis = -1}", "{axis = -1, axis = 0}"), "axis = 0", "duplicate key 'axis'"),
    (_break("{axis = -1}", "{axis = @}"), "@}", "expected an identifier"),
    (_break("tile = []", "tile = [1 2]"), "2]", "expected ']'"),
    (GOOD + "garbage\n", "garbage", "unexpected text after the module"),
    (_break("%1 = mcp.softmax", "%0 = mcp.softmax"), "%0 = mcp.softmax", "defined twice"),
    (_break("-> tensor<2x4xf32>\n    mcp.return", "-> tensor<2x4>\n    mcp.return"), "4>", "dtype '4'"),
]


@pytest.mark.parametrize("text, at, words", CASES, ids=[c[2] for c in CASES])
def test_parse_error_location(text, at, words):
    with pytest.raises(ParseError) as info:
        parse_module(text, filename="model.mcpir")
    msg = str(info.value)
    head, line, caret = msg.split("\n")
    m = re.match(r"model\.mcpir:(\d+):(\d+): (.*)", head)
    assert m, msg
    line_no, col = int(m.group(1)), int(m.group(2))
    assert words in m.group(3)
    src_line = text.splitlines()[line_no - 1]
    assert line.strip() == src_line.strip()
    # the caret sits under column `col` of the echoed line, and there is the expected token
    assert caret.index("^") - 2 == col - 1 and line[2:] == src_line
    assert src_line[col - 1 :].startswith(at), (src_line[col - 1 :], at)


def test_parse_error_is_an_input_error_with_exit_code():
    with pytest.raises(InputError) as info:
        parse_module("module @m {", filename="x.ir")
    assert info.value.exit_code == 3 and "x.ir:1:12" in str(info.value)


def test_error_on_later_line_counts_lines():
    text = "// comment\n\n" + _break("mcp.return %1", "mcp.return %9")
    with pytest.raises(ParseError, match=r"<string>:8:16: use of undefined value %9"):
        parse_module(text)


def test_dense_payload_errors():
    with pytest.raises(ParseError, match="needs 8"):
        parse_attr('dense<"0x0000"> : tensor<2xf32>')
    with pytest.raises(ParseError, match="must list 3 elements"):
        parse_attr("dense<[1, 2]> : tensor<3xi32>")
    with pytest.raises(ParseError, match="not valid hex"):
        parse_attr('dense<"0xZZ"> : tensor<1xi8>')


def test_result_type_mismatch_with_signature():
    text = _break('("y": tensor<2x4xf32>)', '("y": tensor<4x2xf32>)')
    with pytest.raises(ParseError, match="result 'y' declared tensor<4x2xf32>"):
        parse_module(text)


def test_operand_type_mismatch_with_signature():
    text = _break("{axis = -1} : (tensor<2x4xf32>)", "{axis = -1} : (tensor<2x4xf16>)")
    want = "operand #0 has type tensor<2x4xf32>, signature says tensor<2x4xf16>"
    with pytest.raises(ParseError, match=want):
        parse_module(text)


def test_parse_type_and_attr_helpers():
    assert str(parse_type("tensor<1x128xbf16>")) == "tensor<1x128xbf16>"
    assert str(parse_type("tensor<i1>")) == "tensor<i1>"
    assert parse_attr('[1, -2.5, true, "s", {a = f8e4m3fn}]')[4]["a"].name == "f8e4m3fn"


def test_caret_points_at_second_result_declaration():
    text = GOOD.replace('("y": tensor<2x4xf32>)', '("y": tensor<2x4xf32>, "z": tensor<1xf32>)')
    text = text.replace("%1 : (tensor<2x4xf32>)", "%1, %x : (tensor<2x4xf32>, tensor<2x3xf32>)")
    with pytest.raises(ParseError) as info:
        parse_module(text)
    head, line, caret = str(info.value).split("\n")
    assert "result 'z' declared tensor<1xf32>" in head
    assert line[caret.index("^") :].startswith('"z"')


def test_docs_example_parses_and_round_trips():
    doc = (Path(__file__).parents[2] / "docs" / "ir.md").read_text()
    example = doc.split("```\n", 2)[1]
    assert example.startswith("module @encoder")
    assert print_module(parse_module(example, filename="docs/ir.md")) == example
