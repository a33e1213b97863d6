"""The MCP IR: dtypes, tensor types, ops, modules, text format, interpreter, ONNX import.

Importing this package registers every op class (so the parser knows them).
"""

from mcpc.ir import ops  # noqa: F401  (registers all op classes)
from mcpc.ir.core import OP_REGISTRY, Attr, Function, Module, Operation, Value
from mcpc.ir.dtypes import DTYPES, DType, dtype_from_name, dtype_from_numpy
from mcpc.ir.parser import parse_module
from mcpc.ir.printer import print_module
from mcpc.ir.types import TensorType

__all__ = [
    "OP_REGISTRY",
    "Attr",
    "DTYPES",
    "DType",
    "Function",
    "Module",
    "Operation",
    "TensorType",
    "Value",
    "dtype_from_name",
    "dtype_from_numpy",
    "parse_module",
    "print_module",
]
