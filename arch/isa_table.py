"""The MCP 2026 ISA v2 as data: word geometry, engines, dtype codes, enums, field meanings and one
``InstrSpec`` per instruction (``ISA`` by mnemonic, ``OPCODES`` by number).

A spec is the single definition of an instruction: its fields and widths (hence the encoding),
engine, documentation (``doc`` and ``semantics``, from which docs/isa.md is generated), what it
reads and writes (``access``, used by the hazard checker and the scheduler), its IR-interpreter
twin, and the names of its functional compiler in ``mcpc.sim.execute`` (``execute``) and of its
cost function in ``mcpc.sim.timing`` (``cost``).  The simulator resolves those names when it is
imported and refuses to start if a live spec lacks either, so adding an instruction is one spec
here plus its handler, its cost and its tests.

``mcpc.arch.isa`` holds the generic encoder/decoder driven by this table and re-exports every
public name here, so callers import from there.  Append only: opcodes are never reused; a table
edit that breaks an invariant (opcode numbering, word width, a field without a meaning, an enum too
wide for its bits) fails at import.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .dtypes import DTYPES

ISA_VERSION = 2
INSTR_BYTES = 32
INSTR_BITS = INSTR_BYTES * 8
HEADER_BITS = 14  # opcode u8 | wait u3 | signal u3
DTYPE_BITS = 6  # width of every dtype field (room for 64 codes)
ENUM_BITS = 8  # width of every function field (room for 256 functions)
N_REGS = 16
ENGINES = ("LD", "EX", "ST")
LD, EX, ST = 0, 1, 2

# The dtype field's codes and element sizes come from the one dtype table (mcpc.arch.dtypes).
DTYPE_CODES: dict[str, int] = {d.name: d.code for d in DTYPES.values()}
DTYPE_NAMES: dict[int, str] = {v: k for k, v in DTYPE_CODES.items()}
DTYPE_BYTES: dict[str, float] = {d.name: d.elem_bytes if d.packed else d.bits // 8 for d in DTYPES.values()}

# Function enums.  Append only: a code keeps its meaning across versions of the same field.
ENUMS: dict[str, tuple[str, ...]] = {
    "vbin": ("add", "sub", "mul", "div", "pow", "max", "min", "eq", "lt", "gt", "mod", "fmod"),
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
        "round",
        "silu",
    ),
    "vred": ("sum", "max", "min", "argmax"),
    "salu": ("add", "sub", "mul", "min", "max", "eq", "ne", "lt", "le", "gt", "ge"),
}
# Unary functions executed by the special-function unit (timed with ``vector.sfu_lanes``).
SFU_FUNCS = frozenset(
    {"exp", "tanh", "erf", "sqrt", "recip", "rsqrt", "sigmoid", "gelu", "sin", "cos", "log", "silu"}
)
# Fields holding byte addresses: printed in hex by the disassembler.
ADDRESS_FIELDS = frozenset(
    {
        "dram",
        "sram",
        "sram_idx",
        "a",
        "b",
        "c",
        "dst",
        "src",
        "src0",
        "src1",
        "cond",
        "idx",
        "zp_ptr",
        "scale_ptr",
        "kv",
        "win",
        "desc",
    }
)

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
    "rows_reg": "scalar register holding the run-time row count, clamped to [0, rows] (0 = `rows`)",
    "count_reg": "scalar register holding the run-time index count, clamped to [0, count] (0 = `count`)",
    "m_reg": "scalar register holding the run-time row count of A and C, clamped to [0, m] (0 = `m`)",
    "rd": "destination scalar register r1..r15",
    "rs1": "first source register (r0 reads 0)",
    "rs2": "second source register, added to `simm` (r0 reads 0)",
    "simm": "signed 32-bit immediate added to r[rs2]",
    "idx": "SRAM byte address of the i32 indices (rows x k)",
    "idx_stride": "elements between rows of idx",
    "topk_k": "number of elements kept per row (k <= cols)",
    "largest": "1: the k largest, descending; 0: the k smallest, ascending",
    "scale_a": "activation scale (f32)",
    "scale_w": "weight scale (f32), used when `scale_ptr` is 0",
    "scale_o": "output scale (f32)",
    "zp_ptr": "SRAM byte address of the zero points (0 = none)",
    "scale_ptr": "SRAM byte address of the per-group weight scales (0 = none)",
    "group_size": "elements of K sharing one scale (0 = one scale per tensor)",
    "w_dtype": "dtype of the weight codes (i4/u4 packed two per byte, i8, u8)",
    "s_dtype": "dtype of the weight scales (f16, bf16 or f32)",
    "q_dtype": "dtype A is quantized to on the fly (i4 for vmmul.q4f8; i8 or u8 for matmul_i8)",
    "kv_dtype": "dtype of K and V",
    "kv": "SRAM byte address of K (kv_rows x head_dim); V follows at kv + kv_rows·head_dim·size(kv_dtype)",
    "win": "SRAM byte address of the window table: E i32 starts, then E i32 lengths (E = rows / share)",
    "kv_rows": "rows of K and of V in SRAM (the capacity)",
    "kv_reg": "scalar register holding the K/V rows in use, clamped to [0, kv_rows] (0 = `kv_rows`)",
    "head_dim": "elements per row of Q, K, V and the result",
    "share": "row groups sharing the window table: row i uses entry i mod (rows / share) (0 = 1)",
    "scale": "float32 factor applied to the scores q·k",
    "heat": "1: also write the attention heat, a kv_rows x share f32 table at dst + the result's bytes "
    "rounded up to 4 (`vattn`)",
    "desc": "DRAM byte address of a descriptor table: 16 bytes per block (address, bytes, tag)",
    "block": "KV block id (< `limit`): the block's row in the table and its descriptor",
    "lo": "first token of the block written since its last `kvcomp` (0: a new block)",
    "heads": "KV heads of the layer (one stored block each)",
    "quant": "1: INT8_Asymmetric with the error check (FP16_Retain when it fails), 0: `kv_dtype` kept",
    "full": "1: the block is full: apply the policy and store it compressed; 0: a block being filled",
    "policy": "KV sparsity policy of a full block: 0 none, 1 topk_magnitude, 2 topk_entropy, 3 heavy_hitter",
    "tokens": "tokens the block holds after the call (1..64)",
    "tol": "tolerance of the INT8 error check in millionths: max|dequant(quant(x)) − x| / max|x| < tol / 10⁶",
    "ratio": "fraction of each tile's values dropped in millionths (`topk_magnitude`: ratio / 10⁶ < 1)",
}


Access = tuple[str, int, int, float, float, float, bool, int]
"""One memory access of an instruction: ``(memory, base, rows, cols, row_stride, elem_size,
is_write, offset_reg)``.  ``memory`` is ``"sram"``, ``"dram"``, ``"reg"`` (base = register number)
or ``"qparam"`` (the QParam group); strides and sizes are in bytes; ``offset_reg`` is the scalar
register added to ``base`` at run time (0 = none).  Row counts are the encoded maxima: a run-time
extent only shrinks an access."""


@dataclass(frozen=True)
class InstrSpec:
    """The definition of one instruction.  ``fields`` are ``(name, bits, kind)`` packed after the header.

    kind: ``u`` unsigned, ``s`` two's complement, ``f32`` IEEE float32 bits, ``dtype`` (code from
    DTYPE_CODES), ``enum:<table>`` (index into ENUMS[table]).

    ``execute`` names the function of ``mcpc.sim.execute`` that compiles a decoded instruction into
    its functional handler; ``cost`` the function of ``mcpc.sim.timing`` giving its cycles and
    traffic; ``access(fields)`` lists its memory and register accesses (``Access``); ``twin`` names
    the kernel of ``mcpc.arch.numerics`` and the IR ops the interpreter runs with it; ``extent`` is
    ``(count field, register field)`` when a register can set the count at run time; ``nonzero``
    fields must not be 0 (``setr r0``); ``data_cost`` marks an instruction whose cost depends on
    the values it reads (costed at execution, its handler's last argument holding the cost of its
    last execution); ``semantics`` is the reference text of docs/isa.md.
    """

    mnemonic: str
    opcode: int
    engine: int
    fields: tuple[tuple[str, int, str], ...]
    doc: str
    reserved: bool = False
    execute: str = ""
    cost: str = ""
    access: Callable[[Mapping[str, Any]], list[Access]] | None = None
    twin: str = ""
    extent: tuple[str, str] | None = None
    nonzero: tuple[str, ...] = ()
    data_cost: bool = False
    semantics: str = ""

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
    """Parse ``"dram u40, func enum:vbin, in_dtype dtype, imm f32"`` into field triples."""
    out = []
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, kind = item.split()
        if kind == "dtype":
            out.append((name, DTYPE_BITS, "dtype"))
        elif kind == "f32":
            out.append((name, 32, "f32"))
        elif kind.startswith("enum:"):
            out.append((name, ENUM_BITS, kind))
        else:
            out.append((name, int(kind[1:]), kind[0]))
    return tuple(out)


# -- accesses (what each instruction reads and writes) ---------------------------------------------
def _size(dtype: str) -> float:
    return DTYPE_BYTES[dtype]


def _sram(base: int, rows: int, cols: float, stride: float, size: float, write: bool = False) -> Access:
    """A typed SRAM operand with strides in elements (``size`` bytes each)."""
    return ("sram", base, rows, cols * size, stride * size, 1, write, 0)


def _regs(f: Mapping[str, Any], *names: str) -> list[Access]:
    """Register reads of the register fields ``names`` that are set (r0 reads as a constant)."""
    return [("reg", f[n], 1, 1, 0, 1, False, 0) for n in names if f.get(n)]


def _access_none(f: Mapping[str, Any]) -> list[Access]:
    return []


def _access_setr(f: Mapping[str, Any]) -> list[Access]:
    return [("reg", f["reg"], 1, 1, 0, 1, True, 0)]


def _access_salu(f: Mapping[str, Any]) -> list[Access]:
    return [*_regs(f, "rs1", "rs2"), ("reg", f["rd"], 1, 1, 0, 1, True, 0)]


def _access_setq(f: Mapping[str, Any]) -> list[Access]:
    return [("qparam", 0, 1, 1, 0, 1, True, 0)]


def _access_load(f: Mapping[str, Any]) -> list[Access]:
    return _access_dma(f, False)


def _access_store(f: Mapping[str, Any]) -> list[Access]:
    return _access_dma(f, True)


def _access_dma(f: Mapping[str, Any], store: bool) -> list[Access]:
    rows = f["rows"]
    sram = ("sram", f["sram"], rows, f["row_bytes"], f["sram_stride"], 1, not store, 0)
    dram = ("dram", f["dram"], rows, f["row_bytes"], f["dram_stride"], 1, store, f["dram_reg"])
    return [*_regs(f, "dram_reg", "rows_reg"), sram, dram]


def _access_gather(f: Mapping[str, Any]) -> list[Access]:
    table = ("dram", f["dram"], max(f["limit"], 1), f["row_bytes"], f["dram_stride"], 1, False, f["dram_reg"])
    idx = _sram(f["sram_idx"], 1, f["count"], 0, 4)
    dst = ("sram", f["sram"], f["count"], f["row_bytes"], f["sram_stride"], 1, True, 0)
    return [*_regs(f, "dram_reg", "count_reg"), idx, table, dst]


def _access_scatter(f: Mapping[str, Any]) -> list[Access]:
    table = ("dram", f["dram"], max(f["limit"], 1), f["row_bytes"], f["dram_stride"], 1, True, f["dram_reg"])
    idx = _sram(f["sram_idx"], 1, f["count"], 0, 4)
    src = ("sram", f["sram"], f["count"], f["row_bytes"], f["sram_stride"], 1, False, 0)
    return [*_regs(f, "dram_reg", "count_reg"), idx, src, table]


def vattn_heat_offset(rows: int, head_dim: int, in_dtype: str) -> int:
    """Byte offset from ``dst`` of a ``vattn``'s heat table (the result's bytes rounded up to 4)."""
    return -(-int(rows * head_dim * _size(in_dtype)) // 4) * 4


def _access_kvdecomp(f: Mapping[str, Any]) -> list[Access]:
    # the plain table and the descriptor table: rows the indices (data) pick; the pool bytes a
    # descriptor names are data too, and only the host writes them (between calls)
    plain = ("dram", f["dram"], max(f["limit"], 1), f["row_bytes"], f["row_bytes"], 1, False, 0)
    desc = ("dram", f["desc"], max(f["limit"], 1), 16, 16, 1, False, 0)
    idx = _sram(f["sram_idx"], 1, f["count"], 0, 4)
    dst = ("sram", f["sram"], f["count"], f["row_bytes"], f["row_bytes"], 1, True, 0)
    return [*_regs(f, "count_reg"), idx, desc, plain, dst]


def _access_kvcomp(f: Mapping[str, Any]) -> list[Access]:
    # the plain table (one block row of each head, read and rounded in place) and the descriptor
    # column of each head (read and written); the pool slots a descriptor names are data
    limit, heads, rb = max(f["limit"], 1), max(f["heads"], 1), f["row_bytes"]
    plain = ("dram", f["dram"], heads * limit, rb, rb, 1, False, 0)
    desc = ("dram", f["desc"], heads * limit, 16, 16, 1, False, 0)
    return [plain, desc, plain[:6] + (True, 0), desc[:6] + (True, 0)]


def _access_vattn(f: Mapping[str, Any]) -> list[Access]:
    rows, d, n = f["rows"], f["head_dim"], f["kv_rows"]
    sq, skv = _size(f["in_dtype"]), _size(f["kv_dtype"])
    share = max(f["share"], 1)
    entries = rows // share
    out = [
        *_regs(f, "kv_reg"),
        _sram(f["src"], rows, d, d, sq),
        _sram(f["kv"], 2 * n, d, d, skv),  # K, then V right after it
        _sram(f["win"], 1, 2 * entries, 0, 4),
        _sram(f["dst"], rows, d, d, sq, True),
    ]
    if f.get("heat"):
        out.append(_sram(f["dst"] + vattn_heat_offset(rows, d, f["in_dtype"]), n, share, share, 4, True))
    return out


def _access_matmul(f: Mapping[str, Any]) -> list[Access]:
    s = _size(f["in_dtype"])
    bk, bn = (f["n"], f["k"]) if f["trans_b"] else (f["k"], f["n"])
    out = [*_regs(f, "m_reg"), _sram(f["a"], f["m"], f["k"], f["a_stride"], s)]
    out.append(_sram(f["b"], bk, bn, f["b_stride"], s))
    if f["acc"]:
        out.append(_sram(f["c"], f["m"], f["n"], f["c_stride"], 4))
    return [*out, _sram(f["c"], f["m"], f["n"], f["c_stride"], 4, True)]


_QA_FIELDS = (
    "a u32, b u32, c u32, m u16, n u16, k u16, a_stride u20, b_stride u20, c_stride u20, in_dtype dtype, "
    "q_dtype dtype, w_dtype dtype, acc u1, trans_b u1, m_reg u4"
)
_QA_SEMANTICS = (
    "A (m x k, `in_dtype` f16/bf16/f32) is quantized on the fly to `q_dtype` with the QParam group's "
    "`scale_a` and zero point (`numerics.quantize`; the one `q_dtype` code at `zp_ptr`, 0 when `zp_ptr` "
    "= 0); B holds the weight codes (k x n, n x k when `trans_b`, `w_dtype`, zero point 0). The tile "
    "product P[i][j] = Σ_p (qa[i][p] − za) · B[p][j] is exact (every such sum below 2^20 terms is an "
    "f64), rounded once to f32 and multiplied in f32 by the column's fused scale s_j / `scale_o`, s_j "
    "the f32 at `scale_ptr + 4j` (or `scale_w` when `scale_ptr` = 0): the compiler's scale fusion "
    "folds scale_a × scale_w (÷ scale_o) into s_j. C (f32) = [C +] that (`numerics.matmul_qa_tile`). "
    "Costed at the slower MAC rate of `q_dtype` and `w_dtype`; the array ingests the codes' bytes."
)


def _access_quantized_matmul(f: Mapping[str, Any]) -> list[Access]:
    # the scales and zero points (matmul_w4a16's tiles; the activation zero point and per-column
    # scales of vmmul.q4f8 / matmul_i8) are read through the QParam pointers (known at run time)
    sa, sw = _size(f["in_dtype"]), _size(f["w_dtype"])
    bk, bn = (f["n"], f["k"]) if f["trans_b"] else (f["k"], f["n"])
    out = [*_regs(f, "m_reg"), ("qparam", 0, 1, 1, 0, 1, False, 0)]
    out += [_sram(f["a"], f["m"], f["k"], f["a_stride"], sa), _sram(f["b"], bk, bn, f["b_stride"], sw)]
    if f["acc"]:
        out.append(_sram(f["c"], f["m"], f["n"], f["c_stride"], 4))
    return [*out, _sram(f["c"], f["m"], f["n"], f["c_stride"], 4, True)]


def _access_vdequant(f: Mapping[str, Any]) -> list[Access]:
    # scales and zero points are read through the QParam pointers (known at run time)
    rows, cols = f["rows"], f["cols"]
    src = _sram(f["src"], rows, cols, f["src_stride"], _size(f["in_dtype"]))
    dst = _sram(f["dst"], rows, cols, f["dst_stride"], _size(f["out_dtype"]), True)
    return [*_regs(f, "rows_reg"), ("qparam", 0, 1, 1, 0, 1, False, 0), src, dst]


def _access_elementwise(f: Mapping[str, Any], srcs: tuple[tuple[str, str, str], ...]) -> list[Access]:
    rows, cols = f["rows"], f["cols"]
    si, so = _size(f["in_dtype"]), _size(f["out_dtype"])
    out = [_sram(f[a], rows, 1 if f[bc] else cols, f[st], si) for a, st, bc in srcs]
    return [*_regs(f, "rows_reg"), *out, _sram(f["dst"], rows, cols, f["dst_stride"], so, True)]


def _access_vbin(f: Mapping[str, Any]) -> list[Access]:
    return _access_elementwise(f, (("src0", "s0_stride", "s0_bcast"), ("src1", "s1_stride", "s1_bcast")))


def _access_vbini(f: Mapping[str, Any]) -> list[Access]:
    return _access_elementwise(f, (("src0", "s0_stride", "s0_bcast"),))


def _access_vun(f: Mapping[str, Any]) -> list[Access]:
    return _access_elementwise(f, (("src", "src_stride", "src_bcast"),))


def _access_vred(f: Mapping[str, Any]) -> list[Access]:
    rows, si, so = f["rows"], _size(f["in_dtype"]), _size(f["out_dtype"])
    src = _sram(f["src"], rows, f["cols"], f["src_stride"], si)
    return [*_regs(f, "rows_reg"), src, _sram(f["dst"], 1, rows, 0, so, True)]


def _access_vtopk(f: Mapping[str, Any]) -> list[Access]:
    rows, k, s = f["rows"], f["topk_k"], _size(f["dtype"])
    src = _sram(f["src"], rows, f["cols"], f["src_stride"], s)
    vals = _sram(f["dst"], rows, k, f["dst_stride"], s, True)
    return [*_regs(f, "rows_reg"), src, vals, _sram(f["idx"], rows, k, f["idx_stride"], 4, True)]


def _access_vsel(f: Mapping[str, Any]) -> list[Access]:
    rows, cols, s = f["rows"], f["cols"], _size(f["dtype"])
    return [
        *_regs(f, "rows_reg"),
        _sram(f["cond"], rows, 1 if f["cond_bcast"] else cols, f["cond_stride"], 1),
        _sram(f["src"], rows, 1 if f["src_bcast"] else cols, f["src_stride"], s),
        _sram(f["dst"], rows, cols, f["dst_stride"], s),
        _sram(f["dst"], rows, cols, f["dst_stride"], s, True),
    ]


def _access_transpose(f: Mapping[str, Any]) -> list[Access]:
    s = f["elem_bytes"]
    src = _sram(f["src"], f["rows"], f["cols"], f["src_stride"], s)
    return [src, _sram(f["dst"], f["cols"], f["rows"], f["dst_stride"], s, True)]


# -- the specs -------------------------------------------------------------------------------------
_DMA = (
    "dram u40, dram_reg u4, sram u32, rows u20, row_bytes u24, dram_stride u32, sram_stride u24, rows_reg u4"
)
_VBIN_HEAD = "func enum:vbin, in_dtype dtype, out_dtype dtype"
_VECTOR = {"execute": "", "cost": "vector_cost", "extent": ("rows", "rows_reg")}


def _spec(mnemonic: str, opcode: int, engine: int, fields: str, doc: str, **kw: Any) -> InstrSpec:
    return InstrSpec(mnemonic, opcode, engine, _fields(fields), doc, **kw)


def _reserved(mnemonic: str, opcode: int, doc: str, semantics: str = "") -> InstrSpec:
    return InstrSpec(mnemonic, opcode, EX, (), doc, reserved=True, semantics=semantics)


# Append only: opcodes are never reused.
_SPECS: list[InstrSpec] = [
    _reserved("illegal", 0, "Reserved so that an all-zero word traps instead of executing."),
    _spec("nop", 1, EX, "", "Does nothing for one cycle; carries wait/signal tokens.",
          execute="compile_nop", cost="scalar_cost", access=_access_none),
    _spec("halt", 2, EX, "", "Ends the entry point once every engine has drained its queue.",
          execute="compile_nop", cost="scalar_cost", access=_access_none,
          semantics="The entry point ends when `halt` completes and every queue is empty."),
    _spec("setr", 3, EX, "reg u4, value s32", "Sets scalar register `reg` (1..15) to `value`.",
          execute="compile_setr", cost="scalar_cost", access=_access_setr, nonzero=("reg",),
          semantics="`setr` with reg=0 is rejected by the encoder and the decoder."),
    _spec("load", 4, LD, _DMA,
          "2-D strided DMA DRAM -> SRAM: `rows` rows of `row_bytes` bytes from `dram + r[dram_reg]`.",
          execute="compile_dma", cost="dma_cost", access=_access_load,
          extent=("rows", "rows_reg"),
          semantics="For r in 0..R-1 (R = `rows`, or the run-time extent): `SRAM[sram + r·sram_stride : "
          "+row_bytes] = DRAM[dram + r[dram_reg] + r·dram_stride : +row_bytes]`. Any byte outside SRAM "
          "or DRAM traps."),
    _spec("store", 5, ST, _DMA,
          "2-D strided DMA SRAM -> DRAM: `rows` rows of `row_bytes` bytes to `dram + r[dram_reg]`.",
          execute="compile_dma", cost="dma_cost", access=_access_store,
          extent=("rows", "rows_reg"),
          semantics="For r in 0..R-1: `DRAM[dram + r[dram_reg] + r·dram_stride : +row_bytes] = "
          "SRAM[sram + r·sram_stride : +row_bytes]`."),
    _spec("gather", 6, LD,
          "dram u40, sram_idx u32, count u20, row_bytes u24, dram_stride u32, sram u32, sram_stride u24, "
          "limit u24, dram_reg u4, count_reg u4",
          "Indexed DMA: row i of dst = table row idx[i] (idx are i32 in SRAM at `sram_idx`).",
          execute="compile_dma", cost="dma_cost", access=_access_gather, extent=("count", "count_reg"),
          semantics="For i in 0..C-1 (C = `count`, or the run-time extent): idx = the i32 at "
          "`SRAM[sram_idx + 4i]`; idx outside [0, limit) traps; `SRAM[sram + i·sram_stride : +row_bytes] = "
          "DRAM[dram + r[dram_reg] + idx·dram_stride : +row_bytes]`. Used for embedding look-ups now and "
          "paged KV-cache block tables later (`dram_reg` selects the table at run time)."),
    _spec("matmul", 7, EX,
          "a u32, b u32, c u32, m u16, n u16, k u16, a_stride u20, b_stride u20, c_stride u20, "
          "in_dtype dtype, acc u1, trans_b u1, m_reg u4",
          "C (f32, m x n) = [C +] A (m x k) · B (k x n); A and B are `in_dtype`.",
          execute="compile_matmul", cost="matmul_cost", access=_access_matmul, extent=("m", "m_reg"),
          twin="numerics.matmul_tile (mcp.matmul, via numerics.matmul_2d)",
          semantics="A[i][p] is at `a + (i·a_stride + p)·size(in_dtype)`; B[p][j] at `b + (p·b_stride + "
          "j)·size`, or B[p][j] at `b + (j·b_stride + p)·size` when `trans_b`; C[i][j] (f32) at `c + "
          "(i·c_stride + j)·4`. C = A·B computed in f32 (`numerics.matmul_tile`), then C += that "
          "product when `acc` = 1, C = it when `acc` = 0."),
    _spec("vbin", 8, EX,
          f"{_VBIN_HEAD}, dst u32, src0 u32, src1 u32, rows u20, cols u20, dst_stride u20, "
          "s0_stride u20, s1_stride u20, s0_bcast u1, s1_bcast u1, rows_reg u4",
          "dst = func(src0, src1) elementwise over rows x cols; comparisons produce 0/1.",
          **{**_VECTOR, "execute": "compile_vbin"}, access=_access_vbin,
          twin="numerics.binary (mcp.add, mcp.sub, mcp.mul, mcp.div, mcp.pow, mcp.max, mcp.min, "
          "mcp.eq, mcp.lt, mcp.gt, mcp.mod, mcp.fmod)",
          semantics="dst[r][c] = func(src0[r][c], src1[r][c]) computed in the compute dtype of "
          "`in_dtype` and stored as `out_dtype`; `eq lt gt` produce 0/1 (use out_dtype `i1`). src0 and "
          "src1 share `in_dtype`. `mod` is the remainder with the divisor's sign (Python `%`), `fmod` "
          "with the dividend's (C `fmod`); exact on integers, where a zero divisor gives 0 "
          "(`numerics.binary`)."),
    _spec("vbini", 9, EX,
          f"{_VBIN_HEAD}, dst u32, src0 u32, imm f32, rows u20, cols u20, dst_stride u20, s0_stride u20, "
          "s0_bcast u1, rev u1, rows_reg u4",
          "dst = func(src0, imm), or func(imm, src0) when `rev`.",
          **{**_VECTOR, "execute": "compile_vbini"}, access=_access_vbini,
          twin="numerics.binary (the IR ops of vbin with a scalar constant operand)",
          semantics="dst[r][c] = func(src0[r][c], imm), or func(imm, src0[r][c]) when `rev` = 1 (for "
          "`sub div pow`). The immediate is converted to `in_dtype` once, as a constant tensor is."),
    _spec("vun", 10, EX,
          "func enum:vun, in_dtype dtype, out_dtype dtype, dst u32, src u32, rows u20, cols u20, "
          "dst_stride u20, src_stride u20, src_bcast u1, rows_reg u4",
          "dst = func(src) elementwise; `copy` with a dtype change is a cast.",
          **{**_VECTOR, "execute": "compile_vun"}, access=_access_vun,
          twin="numerics.unary / numerics.cast (every ops.UnaryOp, e.g. mcp.exp, mcp.round, mcp.silu; "
          "mcp.cast)",
          semantics="dst[r][c] = func(src[r][c]); `copy` with in_dtype ≠ out_dtype is a cast "
          "(`numerics.cast`). `exp tanh erf sqrt recip rsqrt sigmoid gelu sin cos log silu` are "
          "evaluated in f64 and rounded to f32, on the SFU lanes (`SFU_FUNCS`); `silu` is x·sigmoid(x). "
          "`floor` and `round` (half to even: 0.5 → 0, 1.5 → 2, −2.5 → −2) are exact (keep −0.0, ±inf, "
          "NaN) on the ALU lanes; ceil is `neg floor neg`."),
    _spec("vred", 11, EX,
          "func enum:vred, in_dtype dtype, out_dtype dtype, dst u32, src u32, rows u20, cols u20, "
          "src_stride u20, rows_reg u4",
          "Reduces each row of `cols` elements to one value; dst holds `rows` contiguous values.",
          **{**_VECTOR, "execute": "compile_vred"}, access=_access_vred,
          twin="numerics.row_reduce (mcp.reduce_sum, mcp.reduce_mean, mcp.reduce_max, mcp.argmax, "
          "softmax steps)",
          semantics="dst[r] = func over c of src[r][c]; dst holds `rows` contiguous values of "
          "`out_dtype`. `argmax` gives the index of the first maximum (a NaN counts as the maximum, as "
          "numpy's argmax), stored as `out_dtype` (use `i32`)."),
    _spec("vsel", 12, EX,
          "cond u32, src u32, dst u32, dtype dtype, rows u20, cols u20, cond_stride u20, src_stride u20, "
          "dst_stride u20, cond_bcast u1, src_bcast u1, rows_reg u4",
          "In-place select: dst = cond ? src : dst, cond is i1 (one byte per element).",
          execute="compile_vsel", cost="vector_cost", access=_access_vsel, extent=("rows", "rows_reg"),
          twin="numerics.select (mcp.select)",
          semantics="dst[r][c] = cond[r][c] ? src[r][c] : dst[r][c]; cond is i1 (one byte per element)."),
    _spec("transpose", 13, EX,
          "dst u32, src u32, rows u20, cols u20, elem_bytes u4, src_stride u20, dst_stride u20",
          "dst[c][r] = src[r][c] for a rows x cols source.",
          execute="compile_transpose", cost="vector_cost", access=_access_transpose,
          semantics="dst[c][r] = src[r][c] for r < rows, c < cols; elements are moved as raw "
          "`elem_bytes`-byte values."),
    _spec("matmul_w4a16", 14, EX,
          "a u32, b u32, c u32, m u16, n u16, k u16, a_stride u20, b_stride u20, c_stride u20, "
          "in_dtype dtype, w_dtype dtype, s_dtype dtype, acc u1, trans_b u1, m_reg u4",
          "C (f32) = [C +] A · dequantize(B): B holds weight codes, scaled per group of K by the "
          "QParam group's scales and zero points.",
          execute="compile_matmul_w4a16", cost="matmul_w4a16_cost", access=_access_quantized_matmul,
          extent=("m", "m_reg"),
          twin="numerics.matmul_wq_tile (mcp.matmul_w4a16, via numerics.matmul_2d)",
          semantics="A (m x k, `in_dtype`: f16, bf16 or f32) as for `matmul`; B holds the codes (k x n, "
          "or n x k when `trans_b`) of `w_dtype` (i4/u4 packed two per byte, low nibble first as ONNX "
          "packs int4, or i8/u8), row stride `b_stride` elements. The QParam group set by `setq` gives "
          "G = `group_size` (0: one group spanning K), the scales at `scale_ptr` (`s_dtype`) and the "
          "zero points at `zp_ptr` (`w_dtype`; `zp_ptr` = 0: none), each a dense row-major tile of "
          "ceil(k/G) x n entries (n x ceil(k/G) when `trans_b`), a packed row starting on a byte. The "
          "weight W[p][j] = (B[p][j] − zp) · scale of its group, in f32, rounded once to `in_dtype` "
          "(`numerics.dequantize_weight`); then C = A·W as `matmul` (`numerics.matmul_wq_tile`). The "
          "codes are what cross the DMA and enter the array (ingestion counts their packed bytes plus "
          "the scales and zero points). A scale or zero-point tile outside SRAM traps."),
    _spec("setq", 15, EX,
          "scale_a f32, scale_w f32, scale_o f32, zp_ptr u32, scale_ptr u32, group_size u16",
          "Sets the QParam register group read by the quantized matmuls.",
          execute="compile_setq", cost="scalar_cost", access=_access_setq,
          semantics="Sets all six QParam registers at once (a later `setq` replaces the whole group). "
          "`matmul_w4a16` reads `scale_ptr`, `zp_ptr` and `group_size`. The pointers are stored, not "
          "dereferenced, so `setq` touches no memory: the instruction that reads through them does."),
    _spec("kvcomp", 16, ST,
          "dram u40, desc u40, row_bytes u24, limit u24, block u16, lo u7, tokens u7, heads u7, "
          "kv_dtype dtype, quant u1, full u1, policy u2, tol u24, ratio u20",
          "Compresses one layer's K or V of one KV block, every KV head, into the pool slots its "
          "descriptors name: INT8_Asymmetric with the error check, the sparsity policy, the tile "
          "formats and the CRC-8 (the mirror of `kvdecomp`).",
          execute="compile_kvcomp", cost="kvcomp_cost", access=_access_kvcomp, data_cost=True,
          twin="mcpc.kv.encode_heads with mcpc.kv.value_mask (what mcpc.kv.store_kv_block stores; "
          "issued by the host runtime after each call, one per layer and K|V of every block the call "
          "wrote: docs/kv-cache.md)",
          semantics="D = `row_bytes` / (64 · size(`kv_dtype`)) values a row (a block row holds the 64 "
          "tokens of one head). `block` ≥ `limit` traps. For each head h < `heads`: the descriptor at "
          "`DRAM[desc + 16·(h·limit + block) : +16]` (four u32, as `kvdecomp` reads them) must be "
          "plain (kind 0, else it traps naming the block, layer, K|V and head); its address is the "
          "head's pool slot (`mcpc.kv.pool`: `max_block_bytes(64, D, size)` bytes), which holds the "
          "block's unrounded rows while it fills (`kv_dtype`, row-major, rows 0..`lo`−1). The new "
          "rows `lo`..`tokens`−1 are read from the plain table at `dram + (h·limit + block)·row_bytes` "
          "(where `scatter` wrote them; `lo` ≥ `tokens` or `tokens` outside 1..64 traps), so x = the "
          "head's `tokens` unrounded rows. The keep mask (`mcpc.kv.value_mask`): all values when "
          "`full` = 0 or `policy` = `none`; `topk_magnitude`: per 64-column tile the "
          "keep_count(`ratio` / 10⁶) largest |x|; `topk_entropy`: the head's budget (descriptor word 2, "
          "from the host's entropy split `mcpc.kv.host_keep`) split over its tiles by size, top-k "
          "per tile; `heavy_hitter`: the tokens whose bit is set in the u64 at slot + 64·D·size "
          "(bit r = row r, the host's H2O choice from the attention heat), whole rows. Then "
          "`mcpc.kv.encode_heads`(x, mask, int8 if `quant` else `kv_dtype`, `tol` / 10⁶) gives the stored "
          "block (docs/kv-cache.md: INT8_Asymmetric per row, FP16_Retain when max|dequant − x| / "
          "max|x| ≥ `tol` / 10⁶, dense / bitmap / coordinate tiles, CRC-8 last) and the rows it reads back "
          "(`load_kv_block`), which replace rows of the plain table: rows `lo`..`tokens`−1, and rows "
          "0..`lo`−1 too when `full` = 1 or the stored kind differs from the one the descriptor "
          "records. `full` = 0 (a block being filled): the new unrounded rows are appended to the "
          "slot, and descriptor word 2 = the stored bytes' count | (kind code + 1) << 24 (kind 0 "
          "plain: `kvdecomp` still copies the block from the table). `full` = 1: the stored bytes "
          "replace the slot's contents and the descriptor becomes (slot, count, kind 1 compressed, "
          "its tag's K|V, head and layer). Everything is read before anything is written. Costed at "
          "execution: the DRAM channel streams the bytes read (16 per descriptor, the slot's rows, "
          "the new rows, 8 per token mask) and written (16 per descriptor, the new unrounded rows or "
          "the stored bytes, the rows written back); the vector engine makes f32 passes over the "
          "tokens · D values: 4 for INT8 (range, quantize, dequantize, error), 3 for a magnitude top-k "
          "(a two-pass radix select and the mask), 1 to pack the tiles; the CRC-8 is computed on the "
          "write stream (docs/timing.md). A timing-only run charges the stored sizes "
          "`nominal_block_bytes` gives."),
    _spec("kvdecomp", 17, LD,
          "dram u40, desc u40, sram_idx u32, sram u32, count u20, row_bytes u24, limit u24, head_dim u16, "
          "kv_dtype dtype, count_reg u4",
          "Gathers KV blocks by their descriptors: a compressed block is read from its stored bytes "
          "(CRC-8 checked) and decoded, a plain one copied from the table at `dram`.",
          execute="compile_kvdecomp", cost="kvdecomp_cost", access=_access_kvdecomp, data_cost=True,
          twin="mcpc.kv.load_kv_block (the K/V blocks mcp.paged_attention reads in a build that stores "
          "its cache compressed; one kvdecomp per KV head for K and one for V)",
          semantics="For i in 0..C-1 (C = `count`, or r[count_reg] clamped to [0, count] when "
          "`count_reg` ≠ 0): idx = the i32 at `SRAM[sram_idx + 4i]`; idx outside [0, limit) traps; the "
          "descriptor at `DRAM[desc + 16·idx : +16]` is four u32: address (low, high), nbytes, tag "
          "(kind in bits 0–7, K/V bit 8, KV head bits 9–15, layer bits 16–31: `mcpc.kv.pool`). Kind 0 "
          "(plain): `SRAM[sram + i·row_bytes : +row_bytes] = DRAM[dram + idx·row_bytes : +row_bytes]`, "
          "as `gather`. Kind 1 (compressed): the `nbytes` bytes at `address` are one stored block "
          "(docs/kv-cache.md); its CRC-8 is checked first (a mismatch, or bytes that do not parse, "
          "traps naming the block id, layer, K|V and head, and nothing of the block is written), then "
          "its rows (`mcpc.kv.load_kv_block` to `kv_dtype`: INT8_Asymmetric dequantized, dropped "
          "values 0) fill the row, zeros after its last token; a block whose width is not `head_dim` or "
          "whose rows exceed `row_bytes` traps. Another kind traps. Costed at execution from the "
          "descriptors read: the DRAM channel streams 16 bytes per descriptor plus each block's bytes "
          "(nbytes, or `row_bytes` for a plain block), then the decoder writes the decoded elements at "
          "the vector engine's `kv_dtype` rate (docs/timing.md)."),
    _reserved("entry", 18, "Reserved: entry-point features (calls between entries)."),
    _spec("salu", 19, EX, "func enum:salu, rd u4, rs1 u4, rs2 u4, simm s32",
          "Scalar ALU: r[rd] = func(r[rs1], r[rs2] + simm), 32-bit wrapping.",
          execute="compile_salu", cost="scalar_cost", access=_access_salu, nonzero=("rd",),
          twin="numerics.scalar_alu",
          semantics="The second operand is `r[rs2] + simm`, so `rs2 = 0` gives an immediate and `simm = 0` "
          "a register. `add sub mul` wrap to s32; `min max` are signed; the comparisons `eq ne lt le gt "
          "ge` (signed) write 1 or 0. `rd = 0` is rejected like `setr r0`. With `rows_reg`, `m_reg` and "
          "`count_reg` this is how a program's work follows a length known only at run time."),
    _spec("vtopk", 20, EX,
          "dtype dtype, dst u32, idx u32, src u32, rows u20, cols u20, topk_k u16, src_stride u20, "
          "dst_stride u20, idx_stride u20, largest u1, rows_reg u4",
          "Top-k of each row: the k values (dtype) and their i32 indices.",
          execute="compile_vtopk", cost="vector_cost", access=_access_vtopk, extent=("rows", "rows_reg"),
          twin="numerics.topk",
          semantics="For each row r, the `topk_k` largest (`largest` = 1, descending) or smallest "
          "(ascending) elements of src[r][0..cols) go to dst[r][0..k) and their column indices (i32) to "
          "idx[r][0..k), as ONNX TopK (sorted=1): equal values keep ascending index order; NaN counts "
          "as larger than +inf. `topk_k` > `cols` traps. A separate instruction rather than a `vred` "
          "function because it writes two operands of k values per row."),
    _spec("vdequant", 21, EX,
          "in_dtype dtype, out_dtype dtype, s_dtype dtype, dst u32, src u32, rows u20, cols u20, "
          "dst_stride u20, src_stride u20, rows_reg u4",
          "Dequantizes rows of codes: dst = (src − zero point) · scale, one scale per group of columns.",
          execute="compile_vdequant", cost="vector_cost", access=_access_vdequant,
          extent=("rows", "rows_reg"), twin="numerics.dequantize_weight (mcp.dequantize blocked along "
          "its last axis, e.g. the gathered rows of a quantized embedding table)",
          semantics="src holds codes of `in_dtype` (i4/u4 packed two per byte, i8, u8); the QParam group "
          "gives G = `group_size` (0: one group per row), the scales at `scale_ptr` (`s_dtype`) and the "
          "zero points at `zp_ptr` (`in_dtype`; 0: none), each a dense row-major tile of rows x "
          "ceil(cols/G) entries (a packed row starting on a byte). dst[r][c] = (src[r][c] − zp[r][c/G]) · "
          "scale[r][c/G] in f32, rounded once to `out_dtype` (`numerics.dequantize_weight`, as "
          "`mcp.dequantize`). For dequantized data that feeds no matmul: a gathered embedding row."),
    _spec("vmmul.q4f8", 22, EX, _QA_FIELDS,
          "C (f32) = [C +] int4(A) · B (fp8 e4m3fn codes), scaled by the fused QParam scale.",
          execute="compile_qa", cost="qa_cost", access=_access_quantized_matmul, extent=("m", "m_reg"),
          twin="numerics.matmul_qa_tile (mcp.matmul_qa with i4 activations and f8e4m3fn codes)",
          semantics=_QA_SEMANTICS + " vmmul.q4f8 requires `q_dtype` i4 and `w_dtype` f8e4m3fn (its "
          "codes are e4m3fn values, saturated to ±448 when the compiler quantizes them)."),
    _spec("matmul_i8", 23, EX, _QA_FIELDS,
          "C (f32) = [C +] int8(A) · B (int8 or int4 codes), int32-exact, scaled by the fused QParam scale.",
          execute="compile_qa", cost="qa_cost", access=_access_quantized_matmul, extent=("m", "m_reg"),
          twin="numerics.matmul_qa_tile (mcp.matmul_qa with i8/u8 activations and i8/i4 codes)",
          semantics=_QA_SEMANTICS + " matmul_i8 requires `q_dtype` i8 or u8 and `w_dtype` i8 or i4 "
          "(packed): the int8 layers and imported int8 QDQ models (ONNX Runtime quantize_static)."),
    _spec("scatter", 24, ST,
          "dram u40, sram_idx u32, count u20, row_bytes u24, dram_stride u32, sram u32, sram_stride u24, "
          "limit u24, dram_reg u4, count_reg u4",
          "Indexed DMA out, the mirror of `gather`: SRAM row i goes to table row idx[i] (idx i32 in SRAM).",
          execute="compile_dma", cost="dma_cost", access=_access_scatter, extent=("count", "count_reg"),
          twin="the row writes of mcp.kv_store (one scatter per KV head)",
          semantics="For i in 0..C-1 in order (C = `count`, or the run-time extent): idx = the i32 at "
          "`SRAM[sram_idx + 4i]`; any idx outside [0, limit) traps before a byte is written; "
          "`DRAM[dram + r[dram_reg] + idx·dram_stride : +row_bytes] = SRAM[sram + i·sram_stride : "
          "+row_bytes]` (a repeated index keeps the last row). Writes new K/V rows to the slots a host "
          "KV manager chose in a paged cache; the hazard checker counts it as writing its whole table "
          "(the persistent buffer holding it)."),
    _spec("vattn", 25, EX,
          "in_dtype dtype, kv_dtype dtype, dst u32, src u32, kv u32, win u32, rows u20, head_dim u16, "
          "kv_rows u20, share u8, kv_reg u4, scale f32, heat u1",
          "Attention of query rows over K/V in SRAM, each row over its own window read from SRAM.",
          execute="compile_vattn", cost="vattn_cost", access=_access_vattn, data_cost=True,
          twin="numerics.attention_rows (mcp.paged_attention, one vattn per KV head)",
          semantics="Q (rows x head_dim, `in_dtype`) at `src`; K (kv_rows x head_dim, `kv_dtype`) at "
          "`kv`, V right after it; the window table at `win` holds E = rows / `share` i32 starts, then E "
          "i32 lengths, and query row i attends K/V rows [start, start + len) of entry i mod E (so the "
          "query heads sharing one KV head share one table). With N = the K/V rows in use (r[kv_reg] "
          "clamped to [0, kv_rows], or `kv_rows` when `kv_reg` = 0), a window with start < 0, len < 0 "
          "or start + len > N traps (rows past N hold no data of this call). dst (rows x head_dim, "
          "`in_dtype`) = `numerics.attention_rows`(Q, K, V, starts, lens, `scale`): per row s = q·Kᵀ "
          "(f32), s ·= scale, e = exp(s − max s), p = e / Σe, o = p·V (f32), rounded once; len 0 gives "
          "zeros. A fused instruction because the softmax runs along the context axis, whose length "
          "is known only at run time and differs per row: a run-time row count (`rows_reg`, `m_reg`) "
          "shrinks the rows of an operation, but a reduction over a run-time number of columns (the "
          "max and the sum of the softmax, the K dimension of p·V) has no such field, and padding the "
          "scores to the reservation would charge the work of `--max-seq` on every step. The cost is "
          "computed at execution from the lengths read (as a run-time extent's): per window entry the "
          "array work of a share x len x head_dim and a share x head_dim x len product (K and V "
          "ingested once for the rows sharing them), plus exp of share·Σlen scores on the SFU lanes and "
          "four f32 vector passes over them (scale, max, subtract, sum and divide). With `heat` = 1 it "
          "also writes the attention heat, for the attention-driven KV policies and the dynamic window: "
          "a kv_rows x share f32 table at dst + (rows·head_dim·size(in_dtype) rounded up to 4), whose "
          "rows j < N are first zeroed and then, row after row, accumulate each query row's p at the "
          "K/V rows of its window (column g = the g-th group of E rows, i.e. one query head): "
          "heat[j, g] = Σ over the rows of group g of the probability they give K/V row j (the "
          "`heat` argument of `numerics.attention_rows`); rows past N are not written. It costs two "
          "more f32 vector passes, over the share x N table (zeroing) and over the share·Σlen "
          "probabilities (accumulating)."),
]  # fmt: skip

ISA: dict[str, InstrSpec] = {s.mnemonic: s for s in _SPECS}
OPCODES: dict[int, InstrSpec] = {s.opcode: s for s in ISA.values()}
LIVE = tuple(m for m, s in ISA.items() if not s.reserved)


def resolve(kind: str, namespace: Mapping[str, Any]) -> dict[str, Callable]:
    """Map every live mnemonic to the function its spec names in ``namespace`` (``kind`` is
    ``"execute"`` or ``"cost"``).  Raises RuntimeError naming the instruction when one is missing,
    so a spec without a handler or a cost fails when the simulator is imported."""
    out, missing = {}, []
    for m in LIVE:
        name = getattr(ISA[m], kind)
        fn = namespace.get(name) if name else None
        if not callable(fn):
            missing.append(f"{m} ({kind}={name!r})")
        out[m] = fn
    if missing:
        raise RuntimeError(f"ISA specs without a {kind} function: {', '.join(missing)}")
    return out


def _check_table() -> None:
    # Import-time guard: a table edit that breaks an invariant fails loudly, not at encode time.
    assert len(OPCODES) == len(ISA) and sorted(OPCODES) == list(range(len(OPCODES)))
    assert max(DTYPE_CODES.values()) < 1 << DTYPE_BITS
    kinds: dict[str, tuple[int, str]] = {}
    for spec in ISA.values():
        for name, bits, kind in spec.fields:  # one meaning per field name: one width and kind
            base = kind.split(":")[0]
            assert kinds.setdefault(name, (bits, base)) == (bits, base), (spec.mnemonic, name)
    for spec in ISA.values():
        assert HEADER_BITS + sum(b for _, b, _ in spec.fields) <= INSTR_BITS, spec.mnemonic
        assert len(set(spec.field_names)) == len(spec.fields), spec.mnemonic
        assert spec.reserved or (spec.execute and spec.cost and spec.access), spec.mnemonic
        for name in (*spec.nonzero, *(spec.extent or ())):
            assert name in spec.field_names, (spec.mnemonic, name)
        for name, bits, kind in spec.fields:
            assert name in FIELD_DOCS, name
            if kind.startswith("enum:"):
                assert len(ENUMS[kind[5:]]) <= 1 << bits, name


_check_table()
