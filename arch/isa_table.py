"""The MCP 2026 ISA v1 as data: word geometry, engines, dtype codes, enums, field meanings and the
instruction table (``ISA`` by mnemonic, ``OPCODES`` by number).

``mcpc.arch.isa`` holds the generic encoder/decoder driven by this table and re-exports every
public name here, so callers import from there.  Append only: opcodes are never reused; a table
edit that breaks an invariant (opcode numbering, word width, a field without a meaning, an enum too
wide for its bits) fails at import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .dtypes import DTYPES

INSTR_BYTES = 32
INSTR_BITS = INSTR_BYTES * 8
HEADER_BITS = 14  # opcode u8 | wait u3 | signal u3
ENGINES = ("LD", "EX", "ST")
LD, EX, ST = 0, 1, 2

# The dtype field's codes and element sizes come from the one dtype table (mcpc.arch.dtypes).
DTYPE_CODES: dict[str, int] = {d.name: d.code for d in DTYPES.values()}
DTYPE_NAMES: dict[int, str] = {v: k for k, v in DTYPE_CODES.items()}
DTYPE_BYTES: dict[str, float] = {d.name: d.elem_bytes if d.packed else d.bits // 8 for d in DTYPES.values()}

ENUMS: dict[str, tuple[str, ...]] = {
    "vbin": ("add", "sub", "mul", "div", "pow", "max", "min", "eq", "lt", "gt", "mod", "fmod"),
    # 16 functions fill the 4-bit field: a new unary function needs a wider field (a new ISA version)
    "vun": (
        "copy",
        "neg",
        "exp",
        "tanh",
        "erf",
        "sqrt",
        "recip",
        "relu",
        "sigmoid",
        "gelu",
        "abs",
        "rsqrt",
        "sin",
        "cos",
        "log",
        "floor",
    ),
    "vred": ("sum", "max", "min"),
}
# Unary functions executed by the special-function unit (timed with ``vector.sfu_lanes``).
SFU_FUNCS = frozenset(
    {"exp", "tanh", "erf", "sqrt", "recip", "rsqrt", "sigmoid", "gelu", "sin", "cos", "log"}
)
# Fields holding byte addresses: printed in hex by the disassembler.
ADDRESS_FIELDS = frozenset({"dram", "sram", "sram_idx", "a", "b", "c", "dst", "src", "src0", "src1", "cond"})

# One meaning per field name across the ISA (the docs' field tables are generated from this).
FIELD_DOCS: dict[str, str] = {
    "reg": "scalar register r1..r15 (r0 reads as 0 and cannot be set)",
    "value": "signed value written to the register",
    "dram": "DRAM byte address (table base for gather)",
    "dram_reg": "scalar register whose value is added to `dram` (0 = none)",
    "sram": "SRAM byte address (destination for load/gather, source for store)",
    "sram_idx": "SRAM byte address of `count` i32 row indices",
    "rows": "number of rows",
    "count": "number of rows gathered (= number of indices)",
    "row_bytes": "bytes per row",
    "dram_stride": "bytes between consecutive rows in DRAM",
    "sram_stride": "bytes between consecutive rows in SRAM",
    "limit": "rows in the table; an index outside [0, limit) traps",
    "a": "SRAM byte address of A (m x k)",
    "b": "SRAM byte address of B (k x n, or n x k when trans_b)",
    "c": "SRAM byte address of C (m x n, always f32)",
    "m": "rows of A and C",
    "n": "columns of B and C",
    "k": "reduction length",
    "a_stride": "elements between rows of A",
    "b_stride": "elements between rows of B",
    "c_stride": "elements between rows of C",
    "in_dtype": "dtype of the inputs",
    "out_dtype": "dtype of the result",
    "dtype": "dtype of src and dst",
    "acc": "1: C += A·B, 0: C = A·B",
    "trans_b": "1: B is stored n x k (row j of B is column j of the product)",
    "func": "function (enum, see the list below the table)",
    "dst": "SRAM byte address of the result",
    "src": "SRAM byte address of the source",
    "src0": "SRAM byte address of the first operand",
    "src1": "SRAM byte address of the second operand",
    "cond": "SRAM byte address of the i1 condition (one byte per element)",
    "cols": "number of columns (elements per row)",
    "dst_stride": "elements between rows of dst",
    "src_stride": "elements between rows of src (0 repeats row 0)",
    "s0_stride": "elements between rows of src0 (0 repeats row 0)",
    "s1_stride": "elements between rows of src1 (0 repeats row 0)",
    "cond_stride": "elements between rows of cond (0 repeats row 0)",
    "src_bcast": "1: src holds one element per row, repeated along the row",
    "s0_bcast": "1: src0 holds one element per row, repeated along the row",
    "s1_bcast": "1: src1 holds one element per row, repeated along the row",
    "cond_bcast": "1: cond holds one element per row, repeated along the row",
    "imm": "float32 immediate used as the second operand",
    "rev": "1: compute imm OP src0 instead of src0 OP imm",
    "elem_bytes": "bytes per element (1, 2, 4 or 8)",
}


@dataclass(frozen=True)
class InstrSpec:
    """One row of the ISA table.  ``fields`` are ``(name, bits, kind)`` packed after the header.

    kind: ``u`` unsigned, ``s`` two's complement, ``f32`` IEEE float32 bits, ``dtype`` (4-bit code
    from DTYPE_CODES), ``enum:<table>`` (index into ENUMS[table]).
    """

    mnemonic: str
    opcode: int
    engine: int
    fields: tuple[tuple[str, int, str], ...]
    doc: str
    reserved: bool = False

    @property
    def field_names(self) -> tuple[str, ...]:
        return tuple(f[0] for f in self.fields)

    def defaults(self) -> dict[str, Any]:
        """The value of every field when not given: 0, 0.0, ``"f32"`` or the first enum name."""
        return {name: _default(kind) for name, _, kind in self.fields}


def _default(kind: str) -> Any:
    if kind == "f32":
        return 0.0
    if kind == "dtype":
        return "f32"
    if kind.startswith("enum:"):
        return ENUMS[kind[5:]][0]
    return 0


def _fields(text: str) -> tuple[tuple[str, int, str], ...]:
    """Parse ``"dram u40, func enum:vbin:4, in_dtype dtype, imm f32"`` into field triples."""
    out = []
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, kind = item.split()
        if kind == "dtype":
            out.append((name, 4, "dtype"))
        elif kind == "f32":
            out.append((name, 32, "f32"))
        elif kind.startswith("enum:"):
            _, table, bits = kind.split(":")
            out.append((name, int(bits), f"enum:{table}"))
        else:
            out.append((name, int(kind[1:]), kind[0]))
    return tuple(out)


_DMA = "dram u40, dram_reg u4, sram u32, rows u20, row_bytes u24, dram_stride u32, sram_stride u24"
_VBIN_HEAD = "func enum:vbin:4, in_dtype dtype, out_dtype dtype"
# (mnemonic, opcode, engine, fields, doc, reserved).  Append only: opcodes are never reused.
_TABLE: list[tuple[str, int, int, str, str, bool]] = [
    ("illegal", 0, EX, "", "Reserved so that an all-zero word traps instead of executing.", True),
    ("nop", 1, EX, "", "Does nothing for one cycle; carries wait/signal tokens.", False),
    ("halt", 2, EX, "", "Ends the entry point once every engine has drained its queue.", False),
    ("setr", 3, EX, "reg u4, value s32", "Sets scalar register `reg` (1..15) to `value`.", False),
    ("load", 4, LD, _DMA,
     "2-D strided DMA DRAM -> SRAM: `rows` rows of `row_bytes` bytes from `dram + r[dram_reg]`.",
     False),
    ("store", 5, ST, _DMA,
     "2-D strided DMA SRAM -> DRAM: `rows` rows of `row_bytes` bytes to `dram + r[dram_reg]`.",
     False),
    ("gather", 6, LD,
     "dram u40, sram_idx u32, count u20, row_bytes u24, dram_stride u32, sram u32, sram_stride u24, "
     "limit u24",
     "Indexed DMA: row i of dst = table row idx[i] (idx are i32 in SRAM at `sram_idx`).", False),
    ("matmul", 7, EX,
     "a u32, b u32, c u32, m u16, n u16, k u16, a_stride u20, b_stride u20, c_stride u20, "
     "in_dtype dtype, acc u1, trans_b u1",
     "C (f32, m x n) = [C +] A (m x k) · B (k x n); A and B are `in_dtype`.", False),
    ("vbin", 8, EX,
     f"{_VBIN_HEAD}, dst u32, src0 u32, src1 u32, rows u20, cols u20, dst_stride u20, "
     "s0_stride u20, s1_stride u20, s0_bcast u1, s1_bcast u1",
     "dst = func(src0, src1) elementwise over rows x cols; comparisons produce 0/1.", False),
    ("vbini", 9, EX,
     f"{_VBIN_HEAD}, dst u32, src0 u32, imm f32, rows u20, cols u20, dst_stride u20, s0_stride u20, "
     "s0_bcast u1, rev u1",
     "dst = func(src0, imm), or func(imm, src0) when `rev`.", False),
    ("vun", 10, EX,
     "func enum:vun:4, in_dtype dtype, out_dtype dtype, dst u32, src u32, rows u20, cols u20, "
     "dst_stride u20, src_stride u20, src_bcast u1",
     "dst = func(src) elementwise; `copy` with a dtype change is a cast.", False),
    ("vred", 11, EX,
     "func enum:vred:4, in_dtype dtype, out_dtype dtype, dst u32, src u32, rows u20, cols u20, "
     "src_stride u20",
     "Reduces each row of `cols` elements to one value; dst holds `rows` contiguous values.", False),
    ("vsel", 12, EX,
     "cond u32, src u32, dst u32, dtype dtype, rows u20, cols u20, cond_stride u20, src_stride u20, "
     "dst_stride u20, cond_bcast u1, src_bcast u1",
     "In-place select: dst = cond ? src : dst, cond is i1 (one byte per element).", False),
    ("transpose", 13, EX,
     "dst u32, src u32, rows u20, cols u20, elem_bytes u4, src_stride u20, dst_stride u20",
     "dst[c][r] = src[r][c] for a rows x cols source.", False),
    ("qmatmul", 14, EX, "", "Reserved: quantized MACs (int4/int8/fp8) scaled by a QParam group.", True),
    ("setq", 15, EX, "", "Reserved: sets a QParam register group (scale_a, scale_w, scale_o).", True),
    ("kvcomp", 16, EX, "", "Reserved: KV-cache compression (INT8 asymmetric, block-sparse top-k).", True),
    ("kvdecomp", 17, EX, "", "Reserved: KV-cache decompression.", True),
    ("entry", 18, EX, "", "Reserved: entry-point features (calls between entries).", True),
]  # fmt: skip

ISA: dict[str, InstrSpec] = {
    m: InstrSpec(m, op, eng, _fields(f), doc, res) for m, op, eng, f, doc, res in _TABLE
}
OPCODES: dict[int, InstrSpec] = {s.opcode: s for s in ISA.values()}


def _check_table() -> None:
    # Import-time guard: a table edit that breaks an invariant fails loudly, not at encode time.
    assert len(OPCODES) == len(ISA) and sorted(OPCODES) == list(range(len(OPCODES)))
    for spec in ISA.values():
        assert HEADER_BITS + sum(b for _, b, _ in spec.fields) <= INSTR_BITS, spec.mnemonic
        assert len(set(spec.field_names)) == len(spec.fields), spec.mnemonic
        for name, bits, kind in spec.fields:
            assert name in FIELD_DOCS, name
            if kind.startswith("enum:"):
                assert len(ENUMS[kind[5:]]) <= 1 << bits, name


_check_table()
