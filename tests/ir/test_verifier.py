"""The verifier rejects hand-broken modules with a message naming the op (and its ONNX node)."""

import pytest

from mcpc.errors import ParseError, VerifyError
from mcpc.ir import Function, Module, TensorType, parse_module
from mcpc.ir.dtypes import F16, F32, I32
from mcpc.ir.ops import AddOp, ExpOp, MatMulOp, ReduceSumOp, ReturnOp


def one_op(args: str, op: str, sig: str, result: str) -> str:
    """A module whose main function applies one op line to its arguments and returns it."""
    return (
        f'module @m {{\n  func @main({args}) -> ("y": {result}) {{\n'
        f'    %0 = {op} : {sig} -> {result} loc("node_7")\n'
        f"    mcp.return %0 : ({result}) -> ()\n  }}\n}}\n"
    )


X = "%x: tensor<2x3xf32>"
SIG = "(tensor<2x3xf32>)"
# (args, op text, operand types, declared result type, words the message must contain)
BROKEN = [
    (
        X + ", %b: tensor<3xf32>",
        "mcp.add %x, %b",
        "(tensor<2x3xf32>, tensor<3xf32>)",
        "tensor<2x4xf32>",
        "decl",
    ),
    (
        X + ", %b: tensor<3xf16>",
        "mcp.add %x, %b",
        "(tensor<2x3xf32>, tensor<3xf16>)",
        "tensor<2x3xf32>",
        "dif",
    ),
    (X, "mcp.add %x", SIG, "tensor<2x3xf32>", "expects 2 operands, has 1"),
    (X, "mcp.softmax %x {axis = 1.5}", SIG, "tensor<2x3xf32>", "attribute 'axis' must be int"),
    (X, "mcp.softmax %x {axis = 2}", SIG, "tensor<2x3xf32>", "axis 2 out of range for rank 2"),
    (X, "mcp.softmax %x {dim = 1}", SIG, "tensor<2x3xf32>", "unknown attribute 'dim'"),
    (X, "mcp.reshape %x", SIG, "tensor<6xf32>", "missing required attribute 'shape'"),
    (X, "mcp.reshape %x {shape = [4, 2]}", SIG, "tensor<4x2xf32>", "cannot reshape"),
    (X, "mcp.reshape %x {shape = [-1]}", SIG, "tensor<6xf32>", "negative dim"),
    (X, "mcp.transpose %x {perm = [0, 0]}", SIG, "tensor<2x2xf32>", "not a permutation"),
    (
        X,
        "mcp.slice %x {starts = [0, 0], ends = [2, 4], steps = [1, 1]}",
        SIG,
        "tensor<2x4xf32>",
        "normalised",
    ),
    (X, "mcp.slice %x {starts = [0], ends = [2], steps = [1]}", SIG, "tensor<2xf32>", "one entry per dim"),
    (X, "mcp.slice %x {starts = [0, 0], ends = [2, 3], steps = [1, 0]}", SIG, "tensor<2x3xf32>", "step must"),
    (X, "mcp.reduce_sum %x {axes = [1, -1]}", SIG, "tensor<2x1xf32>", "repeated axis"),
    (X, "mcp.reduce_sum %x {axes = []}", SIG, "tensor<2x3xf32>", "must not be empty"),
    (X, "mcp.cast %x {to = 3}", SIG, "tensor<2x3xf32>", "attribute 'to' must be dtype"),
    (X, "mcp.broadcast %x {shape = [4, 3]}", SIG, "tensor<4x3xf32>", "do not broadcast"),
    (
        X + ", %w: tensor<4x5xf32>",
        "mcp.matmul %x, %w",
        "(tensor<2x3xf32>, tensor<4x5xf32>)",
        "tensor<2x5xf32>",
        "contracted dims differ",
    ),
    (
        X + ", %w: tensor<3xf32>",
        "mcp.matmul %x, %w",
        "(tensor<2x3xf32>, tensor<3xf32>)",
        "tensor<2xf32>",
        "rank >= 2",
    ),
    (
        X + ", %w: tensor<3x5xf32>",
        "mcp.matmul %x, %w {tile = [2, 2]}",
        "(tensor<2x3xf32>, tensor<3x5xf32>)",
        "tensor<2x5xf32>",
        "tile must be [] or [tm, tn, tk]",
    ),
    (
        X + ", %w: tensor<3x5xf32>",
        "mcp.matmul %x, %w {out = i32}",
        "(tensor<2x3xf32>, tensor<3x5xf32>)",
        "tensor<2x5xi32>",
        "must be a float type",
    ),
    (
        X + ", %s: tensor<2x3xf32>, %b: tensor<3xf32>",
        "mcp.layer_norm %x, %s, %b",
        "(tensor<2x3xf32>, tensor<2x3xf32>, tensor<3xf32>)",
        "tensor<2x3xf32>",
        "scale must be tensor<3xf32>",
    ),
    (
        X + ", %i: tensor<2xf32>",
        "mcp.gather %x, %i",
        "(tensor<2x3xf32>, tensor<2xf32>)",
        "tensor<2x3xf32>",
        "indices must be i32 or i64",
    ),
    (
        X + ", %z: tensor<3x3xf16>",
        "mcp.concat %x, %z {axis = 0}",
        "(tensor<2x3xf32>, tensor<3x3xf16>)",
        "tensor<5x3xf32>",
        "operand #1",
    ),
    ("%x: tensor<2x3xi32>", "mcp.exp %x", "(tensor<2x3xi32>)", "tensor<2x3xi32>", "must be a float tensor"),
    ("%x: tensor<2x3xi1>", "mcp.add %x, %x", "(tensor<2x3xi1>, tensor<2x3xi1>)", "tensor<2x3xi1>", "i1"),
]


@pytest.mark.parametrize("args, op, sig, result, words", BROKEN, ids=[b[4] for b in BROKEN])
def test_broken_op_is_rejected_naming_the_op(args, op, sig, result, words):
    text = one_op(args, op, sig, result)
    module = parse_module(text, verify=False)  # well-formed text, invalid IR
    with pytest.raises(VerifyError) as info:
        module.verify()
    msg = str(info.value)
    opname = op.split()[0]
    assert msg.startswith(f"func @main: {opname} (ONNX node 'node_7'): ") or msg.startswith(f"{opname} "), msg
    assert opname in msg and "node_7" in msg and words in msg, msg
    # parse_module verifies by default
    with pytest.raises(VerifyError):
        parse_module(text)


def _func(*types):
    module = Module("m")
    func = module.add_function(Function("main", list(types), [f"a{i}" for i in range(len(types))]))
    return module, func


def test_operand_used_before_definition():
    module, func = _func(TensorType((2,), F32))
    (x,) = func.args
    first = ExpOp([x], loc="Exp_0")
    second = AddOp([first.result, x], loc="Add_1")
    func.ops = [second, first, ReturnOp([second.result])]
    func.result_names = ["y"]
    with pytest.raises(VerifyError, match=r"mcp.add \(ONNX node 'Add_1'\): operand #0 is used before"):
        module.verify()


def test_use_before_definition_in_text_is_a_parse_error():
    text = one_op("%x: tensor<2xf32>", "mcp.exp %0", "(tensor<2xf32>)", "tensor<2xf32>")
    with pytest.raises(ParseError, match="undefined value %0"):
        parse_module(text)


def test_value_of_another_function():
    module, func = _func(TensorType((2,), F32))
    other = module.add_function(Function("other", [TensorType((2,), F32)], ["z"]))
    op = func.append(ExpOp([other.args[0]]))
    func.append(ReturnOp([op.result]))
    func.result_names = ["y"]
    other.append(ReturnOp([]))
    with pytest.raises(VerifyError, match=r"func @main: mcp.exp: operand #0 is used before it is defined"):
        module.verify()


def test_missing_return():
    module, func = _func(TensorType((2,), F32))
    func.append(ExpOp([func.args[0]]))
    with pytest.raises(VerifyError, match="func @main: does not end with mcp.return"):
        module.verify()


def test_return_in_the_middle():
    module, func = _func(TensorType((2,), F32))
    func.append(ReturnOp([func.args[0]]))
    func.append(ReturnOp([func.args[0]]))
    func.result_names = ["y"]
    with pytest.raises(VerifyError, match="mcp.return is a terminator in the middle"):
        module.verify()


def test_result_names_count():
    module, func = _func(TensorType((2,), F32))
    func.append(ReturnOp([func.args[0]]))
    with pytest.raises(VerifyError, match="1 returned values but 0 result names"):
        module.verify()


def test_bad_attribute_kind_set_by_a_pass():
    module, func = _func(TensorType((4, 8), F16), TensorType((8, 2), F16))
    mm = func.append(MatMulOp(func.args, loc="MatMul_3"))
    func.append(ReturnOp([mm.result]))
    func.result_names = ["y"]
    module.verify()
    mm.attrs["tile"] = "4x4x4"
    with pytest.raises(VerifyError, match=r"mcp.matmul \(ONNX node 'MatMul_3'\): attribute 'tile' must be"):
        module.verify()
    mm.attrs["tile"] = [4, 2, -1]
    with pytest.raises(VerifyError, match="non-negative"):
        module.verify()


def test_constant_with_wrong_declared_type():
    text = (
        'module @m {\n  func @main() -> ("y": tensor<2xi32>) {\n'
        "    %0 = mcp.constant {value = dense<[1.0, 2.0]> : tensor<2xf32>} : () -> tensor<2xi32>\n"
        "    mcp.return %0 : (tensor<2xi32>) -> ()\n  }\n}\n"
    )
    with pytest.raises(VerifyError, match=r"mcp.constant: declared result types \(tensor<2xi32>\) differ"):
        parse_module(text)


def test_builders_raise_value_error_on_invalid_operands():
    module, func = _func(TensorType((4, 8), I32), TensorType((8, 2), I32))
    with pytest.raises(ValueError, match="must be a float tensor"):
        MatMulOp(func.args)
    with pytest.raises(ValueError, match="repeated"):
        ReduceSumOp([func.args[0]], {"axes": [0, 0]})


def test_valid_module_passes():
    args = X + ", %w: tensor<3x5xf32>"
    text = one_op(args, "mcp.matmul %x, %w", "(tensor<2x3xf32>, tensor<3x5xf32>)", "tensor<2x5xf32>")
    module = parse_module(text)
    module.verify()
    assert module.main.ops[0].attrs == {"out": F32, "trans_b": False, "tile": []}
