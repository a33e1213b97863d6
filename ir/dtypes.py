"""Element types of the MCP IR: the toolchain's one dtype table (``mcpc.arch.dtypes``), re-exported.

Names are the shared vocabulary of the toolchain: the same strings appear in IR text, the ISA,
``.mcpb`` tensor descriptors and target files.
"""

from mcpc.arch.dtypes import (  # noqa: F401
    BF16,
    DTYPES,
    F8E4M3FN,
    F16,
    F32,
    I1,
    I4,
    I8,
    I32,
    I64,
    QUANTIZED_DTYPES,
    U4,
    U8,
    DType,
    dtype_from_name,
    dtype_from_numpy,
)
