"""Weight bytes as the compile summary reports them: a weight shared by the functions of one module
(a decoder build's prefill and decode) counts once, as the constant pool stores it, and a weight
read through an un-folded Transpose counts as the weight it is."""

from mcpc.ir import parse_module
from mcpc.passes.weight_stats import weight_stats

W = "dense<[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]> : tensor<3x2xf32>"


def _func(name: str, rows: int, transposed: bool) -> str:
    if transposed:
        w = (
            f"%w = mcp.constant {{value = {W}}} : () -> tensor<3x2xf32>\n"
            "    %t = mcp.transpose %w {perm = [1, 0]} : (tensor<3x2xf32>) -> tensor<2x3xf32>"
        )
        b = "%t"
        shape = "2x3"
        k = 2
    else:
        w = f"%w = mcp.constant {{value = {W}}} : () -> tensor<3x2xf32>"
        b, shape, k = "%w", "3x2", 3
    n = shape.split("x")[1]
    return f"""  func @{name}(%x: tensor<{rows}x{k}xf32>) -> ("y": tensor<{rows}x{n}xf32>) {{
    {w}
    %y = mcp.matmul %x, {b} : (tensor<{rows}x{k}xf32>, tensor<{shape}xf32>) -> tensor<{rows}x{n}xf32>
    mcp.return %y : (tensor<{rows}x{n}xf32>) -> ()
  }}
"""


def test_a_weight_in_two_functions_counts_once():
    module = parse_module("module @m {\n" + _func("prefill", 4, False) + _func("decode", 1, False) + "}\n")
    assert weight_stats(module) == {"weights": 1, "params": 6, "bytes": 24, "bits_per_weight": 32.0}


def test_a_weight_read_through_a_transpose_counts():
    module = parse_module("module @m {\n" + _func("main", 4, True) + "}\n")
    assert weight_stats(module)["params"] == 6 and weight_stats(module)["bytes"] == 24
