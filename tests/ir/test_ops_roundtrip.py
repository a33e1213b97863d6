"""Print -> parse -> print is identical for every registered op, attribute kind, dtype and name."""

import math

import ml_dtypes
import numpy as np
import pytest

from mcpc.ir import OP_REGISTRY, Function, Module, TensorType, parse_module, print_module
from mcpc.ir.dtypes import BF16, DTYPES, F8E4M3FN, F16, F32, I1, I4, I32, I64, U8
from mcpc.ir.ops import ConstantOp, ReturnOp


def t(*shape, dtype=F32):
    return TensorType(shape, dtype)


_BINARY = ([t(2, 3), t(3)], {})
_UNARY = ([t(2, 3, dtype=F16)], {})
_REDUCE = ([t(2, 3, 4)], {"axes": [0, -1], "keepdims": False})

# op name -> (argument types, attributes) of one well-formed use of the op
SAMPLES = {
    "mcp.constant": ([], {"value": np.arange(6, dtype=np.float32).reshape(2, 3)}),
    "mcp.return": None,  # every sample ends in one; see test_return_of_argument
    **{f"mcp.{n}": _BINARY for n in ("add", "sub", "mul", "div", "pow", "max", "min", "mod", "fmod")},
    **{f"mcp.{n}": _BINARY for n in ("equal", "less", "greater")},
    **{f"mcp.{n}": _UNARY for n in ("neg", "abs", "exp", "tanh", "erf", "sqrt", "rsqrt", "reciprocal")},
    **{
        f"mcp.{n}": _UNARY for n in ("relu", "sigmoid", "gelu", "sin", "cos", "log", "floor", "round", "silu")
    },
    "mcp.cast": ([t(2, 3)], {"to": BF16}),
    "mcp.select": ([t(2, 3, dtype=I1), t(2, 3), t(1, 3)], {}),
    "mcp.matmul": (
        [t(2, 4, 8, dtype=F16), t(6, 8, dtype=F16)],
        {"trans_b": True, "tile": [2, 3, 4], "out": F32},
    ),
    "mcp.matmul_w4a16": (
        [t(2, 3, 64, dtype=F16), t(64, 6, dtype=I4), t(2, 6, dtype=F16), t(2, 6, dtype=I4)],
        {"group_size": 32, "tile": [2, 6, 32], "out": F32},
    ),
    "mcp.matmul_qa": (
        [t(2, 3, 64, dtype=F16), t(6, 64, dtype=I4), t(6), t(1, dtype=U8)],
        {"scale_a": 0.25, "trans_b": True, "tile": [2, 6, 32], "out": F32},
    ),
    "mcp.softmax": ([t(2, 5)], {"axis": 0}),
    "mcp.log_softmax": ([t(2, 5, dtype=F16)], {"axis": -1}),
    "mcp.layer_norm": ([t(2, 3, 4), t(3, 4), t(3, 4)], {"axis": 1, "epsilon": 1e-6}),
    "mcp.reduce_sum": _REDUCE,
    "mcp.reduce_mean": _REDUCE,
    "mcp.reduce_max": ([t(2, 3, 4, dtype=I32)], {"axes": [1], "keepdims": True}),
    "mcp.argmax": ([t(2, 3, 4, dtype=F16)], {"axes": [1], "keepdims": False}),
    "mcp.topk": ([t(2, 3, 4, dtype=F16)], {"axis": -2, "k": 2, "largest": False, "sorted": True}),
    "mcp.reshape": ([t(2, 3, 4)], {"shape": [6, 4]}),
    "mcp.transpose": ([t(2, 3, 4)], {"perm": [2, 0, 1]}),
    "mcp.concat": ([t(2, 3), t(2, 1), t(2, 0)], {"axis": -1}),
    "mcp.slice": ([t(5, 6)], {"starts": [4, 1], "ends": [-1, 6], "steps": [-2, 2]}),
    "mcp.gather": ([t(5, 6, dtype=F16), t(2, 3, dtype=I64)], {"axis": 1}),
    "mcp.broadcast": ([t(3, 1)], {"shape": [2, 1, 4]}),
    "mcp.quantize": ([t(4, 6, dtype=F16), t(4, 2), t(4, 2, dtype=I4)], {"axis": -1, "block_size": 3}),
    "mcp.dequantize": ([t(4, 6, dtype=U8), t(4, dtype=BF16), t(4, dtype=U8)], {"axis": 0, "out": F32}),
    "mcp.scalar": ([t(dtype=I32), t(dtype=I32)], {"func": "mul", "imm": 3}),
    # state ops need the module's declarations: tests/ir/test_state.py round-trips them
    "mcp.host_reg": None,
    "mcp.global_load": None,
    "mcp.global_store": None,
    "mcp.kv_store": None,  # round-tripped in tests/ir/test_paged_kv.py (they need a module's globals)
    "mcp.paged_attention": None,
}


def one_op_module(name: str) -> Module:
    arg_types, attrs = SAMPLES[name]
    module = Module("sample")
    func = module.add_function(Function("main", arg_types, [f"x{i}" for i in range(len(arg_types))]))
    op = func.append(OP_REGISTRY[name](func.args, attrs, loc="node_1"))
    func.append(ReturnOp(op.results))
    func.result_names = [f"y{i}" for i in range(len(op.results))]
    module.verify()
    return module


def roundtrip(module: Module) -> str:
    text = print_module(module)
    again = print_module(parse_module(text))
    assert again == text
    return text


def test_every_registered_op_has_a_sample():
    missing = sorted(set(OP_REGISTRY) - set(SAMPLES))
    assert not missing, f"ops without a round-trip sample: {missing}"


@pytest.mark.parametrize("name", sorted(n for n, s in SAMPLES.items() if s is not None))
def test_op_roundtrip(name):
    text = roundtrip(one_op_module(name))
    assert f"= {name} " in text


def test_return_of_argument():
    module = Module("m")
    func = module.add_function(Function("main", [t(2)], ["x"]))
    func.append(ReturnOp([func.args[0], func.args[0]]))
    func.result_names = ["a", "b"]
    text = roundtrip(module)
    assert "mcp.return %x, %x : (tensor<2xf32>, tensor<2xf32>) -> ()" in text


def test_matmul_default_out_is_operand_dtype():
    module = one_op_module("mcp.matmul")
    op = module.main.ops[0]
    default = OP_REGISTRY["mcp.matmul"](op.operands, {"trans_b": True})
    assert default.attrs == {"out": F16, "trans_b": True, "tile": []}
    assert default.result.type == t(2, 4, 6, dtype=F16)


def test_quantize_ops_print_their_qparams_and_defaults():
    q = roundtrip(one_op_module("mcp.quantize"))
    assert "{axis = -1, block_size = 3, saturate = true}" in q and "-> tensor<4x6xi4>" in q
    d = roundtrip(one_op_module("mcp.dequantize"))
    assert "{axis = 0, block_size = 0, out = f32}" in d and "-> tensor<4x6xf32>" in d
    # f8 per-tensor, saturate off, result dtype = the zero point's; dequantize defaults to the scale's
    module = Module("m")
    func = module.add_function(Function("main", [t(3, 5), t(), t(dtype=F8E4M3FN)], ["x", "s", "z"]))
    x, s, z = func.args
    qop = func.append(OP_REGISTRY["mcp.quantize"]([x, s, z], {"saturate": False}))
    dq = func.append(OP_REGISTRY["mcp.dequantize"]([qop.result, s, z]))
    func.append(ReturnOp([dq.result]))
    func.result_names = ["y"]
    text = roundtrip(module)
    assert "saturate = false" in text and "-> tensor<3x5xf8e4m3fn>" in text and "out = f32" in text


def test_list_defaults_are_not_shared_between_ops():
    op = one_op_module("mcp.matmul").main.ops[0]
    a = OP_REGISTRY["mcp.matmul"](op.operands, {"trans_b": True})
    b = OP_REGISTRY["mcp.matmul"](op.operands, {"trans_b": True})
    a.attrs["tile"].append(4)
    assert b.attrs["tile"] == []


def test_attributes_of_every_kind_quant_and_quoted_names():
    every_kind = {
        "int": -3,
        "float": 2.5e-08,
        "inf": math.inf,
        "ninf": -math.inf,
        "nan": math.nan,
        "negzero": -0.0,
        "bool": False,
        "str": 'a "quoted" \\ string\n',
        "ints": [1, -2, 3],
        "floats": [0.1, math.inf, 1e300],
        "dtype": BF16,
        "tensor": np.array([[1.5, -math.inf], [math.nan, 0.0]], dtype=np.float32),
        "dict": {"nested": {"k": [1, 2]}, "with space": "v"},
        "empty": [],
    }
    module = Module("model-v1.0")
    module.attrs = dict(every_kind)
    func = module.add_function(Function("main/x", [t(2, 3), t(3, dtype=F32)], ["input-ids", "0"]))
    func.attrs = {"precision": "fp16"}
    x, y = func.args
    add = func.append(OP_REGISTRY["mcp.add"]([x, y], loc='/blocks.0/Add "a"'))
    cmp = func.append(OP_REGISTRY["mcp.less"]([x, y]))
    func.append(ReturnOp([add.result, cmp.result]))
    func.result_names = ["out put", 'q"uote']
    text = roundtrip(module)
    assert '@"model-v1.0"' in text and '%"input-ids"' in text and '%"0"' in text
    parsed = parse_module(text)
    assert math.isnan(parsed.attrs["nan"]) and parsed.attrs["inf"] == math.inf
    assert math.copysign(1.0, parsed.attrs["negzero"]) == -1.0
    assert parsed.attrs["str"] == every_kind["str"] and parsed.attrs["dtype"] is BF16
    np.testing.assert_array_equal(parsed.attrs["tensor"], every_kind["tensor"])
    pf = parsed.functions["main/x"]
    assert pf.arg_names == ["input-ids", "0"] and pf.result_names == ["out put", 'q"uote']
    assert pf.ops[0].loc == add.loc


def _values_of(dtype):
    """Eight (inline) and forty (hex) elements of ``dtype`` including its awkward values."""
    npd = dtype.np_dtype
    if dtype.name == "i1":
        small = np.array([True, False, True, True, False, False, True, False])
    elif dtype.is_float:
        special = [0.0, -0.0, 1.5, -2.0, 0.1]
        special += [np.nan, np.inf, -np.inf] if dtype.name != "f8e4m3fn" else [np.nan, 448.0, -448.0]
        small = np.array(special, dtype=np.float32).astype(npd)
    else:
        info = ml_dtypes.iinfo(npd) if dtype.bits == 4 else np.iinfo(npd)
        small = np.array([info.min, info.max, 0, 1, -1 if info.min < 0 else 2, 3, 4, 5]).astype(npd)
    return small, np.resize(small, 40).reshape(5, 8)


@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_dense_of_every_dtype(dtype):
    small, big = _values_of(dtype)
    module = Module("d")
    func = module.add_function(Function("main", [], []))
    ops = [func.append(ConstantOp([], {"value": v})) for v in (small, big, small[:0], small[:1].reshape(()))]
    func.append(ReturnOp([op.result for op in ops]))
    func.result_names = ["small", "big", "empty", "scalar"]
    text = roundtrip(module)
    assert 'dense<"0x' in text  # the 40-element tensor is printed as hex
    parsed = parse_module(text).main.ops
    for op, want in zip(parsed, (small, big), strict=False):
        got = op.attrs["value"]
        assert got.dtype == want.dtype and got.shape == want.shape
        # compare bit patterns so nan and -0.0 count
        assert got.tobytes() == want.tobytes()


def test_sub_byte_hex_is_packed_low_nibble_first():
    w = np.array([1, -2, 7, -8, 0, 3, 5, -1, 2], dtype=I4.np_dtype)  # 9 elements: 5 bytes
    module = Module("d")
    func = module.add_function(Function("main", [], []))
    c = func.append(ConstantOp([], {"value": w}))
    func.append(ReturnOp([c.result]))
    func.result_names = ["w"]
    text = roundtrip(module)
    assert 'dense<"0xE18730F502"> : tensor<9xi4>' in text
    assert np.array_equal(parse_module(text).main.ops[0].attrs["value"], w)
    with pytest.raises(Exception, match="dense payload has 9 bytes, tensor<9xi4> needs 5"):
        parse_module(text.replace("0xE18730F502", "0x" + "01" * 9))
