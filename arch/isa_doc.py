"""docs/isa.md's instruction reference, generated from the ISA specs (``mcpc.arch.isa_table``).

Everything between ``<!-- generated:instructions -->`` and ``<!-- /generated -->`` in docs/isa.md
is ``render_instructions()``: one section per instruction with its opcode, engine, field table,
enum codes, semantics, run-time extent, and where its functional handler, cost, accesses and
IR-interpreter twin live.  ``tests/arch/test_arch_isa_docs.py`` fails when the committed doc
differs; regenerate with ``python -m mcpc.arch.isa_doc --write`` (run from the repository root).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from .isa_table import ENGINES, ENUMS, FIELD_DOCS, HEADER_BITS, INSTR_BITS, ISA, InstrSpec

BEGIN, END = "<!-- generated:instructions -->\n", "<!-- /generated -->"
_BLOCK = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)


def render_spec(spec: InstrSpec) -> str:
    """The section of one instruction."""
    lines = [
        f"### {spec.mnemonic}",
        "",
        f"Opcode {spec.opcode}, engine {ENGINES[spec.engine]}. {spec.doc}",
        "",
    ]
    if spec.reserved:
        lines += ["Reserved: `encode` refuses it, `decode` reports it.", ""]
        return "\n".join([*lines, spec.semantics, ""] if spec.semantics else lines)
    lines += ["| bits | field | kind | meaning |", "|---|---|---|---|"]
    lines.append("| 0..7 | opcode | u8 | |")
    lines.append("| 8..10 | wait | u3 | engine mask of tokens to pop before issue |")
    lines.append("| 11..13 | signal | u3 | engine mask of tokens to push on completion |")
    pos, enums = HEADER_BITS, []
    for name, bits, kind in spec.fields:
        shown = f"{kind}{bits}" if kind in ("u", "s") else f"{kind} ({bits} bits)"
        lines.append(f"| {pos}..{pos + bits - 1} | {name} | {shown} | {FIELD_DOCS[name]} |")
        pos += bits
        if kind.startswith("enum:"):
            codes = ", ".join(f"{i} `{n}`" for i, n in enumerate(ENUMS[kind[5:]]))
            enums.append(f"`{name}` values: {codes}")
    lines += [f"| {pos}..{INSTR_BITS - 1} | — | zero | reserved, must be 0 |", ""]
    for text in enums:
        lines += [text, ""]
    if spec.semantics:
        lines += [spec.semantics, ""]
    if spec.extent:
        count, reg = spec.extent
        lines += [f"Run-time extent: `{count}` is the capacity; when `{reg}` ≠ 0 the count is r[{reg}] "
                  f"clamped to [0, {count}], and the cycles are those of that count.", ""]  # fmt: skip
    where = [
        f"handler `sim/execute.py` `{spec.execute}`",
        f"cost `sim/timing.py` `{spec.cost}`",
        f"accesses `arch/isa_table.py` `{spec.access.__name__}`",
    ]
    if spec.twin:
        where.append(f"interpreter twin {spec.twin}")
    lines += ["Defined by: " + "; ".join(where) + ".", ""]
    return "\n".join(lines)


def render_instructions() -> str:
    """Every live instruction by opcode, then the reserved opcodes."""
    live = [s for s in sorted(ISA.values(), key=lambda s: s.opcode) if not s.reserved]
    reserved = [s for s in sorted(ISA.values(), key=lambda s: s.opcode) if s.reserved]
    parts = [render_spec(s) for s in live]
    parts.append(
        "## Reserved opcodes\n\nThese numbers are taken so that later versions can add the "
        "instructions without renumbering.\n"
    )
    parts += [render_spec(s) for s in reserved]
    return "\n".join(parts)


QBEGIN, QEND = "<!-- generated:quantized-costs -->\n", "<!-- /generated:quantized-costs -->"
_QBLOCK = re.compile(re.escape(QBEGIN) + r".*?" + re.escape(QEND), re.S)
TARGET_NAMES = ("mcp2026-a100", "mcp2026-a10", "mcp2026-edge")


def render_quantized_costs() -> str:
    """The cost of one tile of each quantized matmul against the fp16 ``matmul``, on each shipped
    target: a decode-shaped tile (1 x 512 x 512: weight streaming) and a prefill-shaped one (128 x
    512 x 512), K = 512 in groups of 32.  Busy and latency cycles from the simulator's cost functions;
    B bytes are what the array ingests; DRAM bytes are what the kernel's loads of that tile bring
    (weights or codes, scales; the A tile and C are the same for all and left out)."""
    from mcpc.arch.isa import Instr  # lazy: the doc generator stays importable without the simulator
    from mcpc.arch.target import load_target
    from mcpc.sim.timing import instr_cost

    k = n = 512
    variants = [  # (mnemonic, extra fields, B bytes, DRAM bytes of B + its scales)
        ("matmul", {"in_dtype": "f16"}, k * n * 2, k * n * 2),
        ("matmul_w4a16", {"in_dtype": "f16", "w_dtype": "i4", "s_dtype": "f16"}, k * n // 2,
         k * n // 2 + (k // 32) * n * 2),
        ("matmul_w4a16", {"in_dtype": "f16", "w_dtype": "i8", "s_dtype": "f16"}, k * n, k * n + n * 2),
        ("matmul_i8", {"in_dtype": "f16", "q_dtype": "i8", "w_dtype": "i8"}, k * n, k * n + n * 4),
        ("vmmul.q4f8", {"in_dtype": "f16", "q_dtype": "i4", "w_dtype": "f8e4m3fn"}, k * n, k * n + n * 4),
    ]  # fmt: skip
    lines = [
        "| target | instruction (weights) | m | busy cycles | + latency | B bytes ingested "
        "| DRAM bytes (B + scales) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in TARGET_NAMES:
        t = load_target(name)
        for m in (1, 128):
            for mnem, extra, b_bytes, dram in variants:
                f = {
                    "a": 0,
                    "b": 0,
                    "c": 0,
                    "m": m,
                    "n": n,
                    "k": k,
                    "a_stride": k,
                    "b_stride": n,
                    "c_stride": n,
                }
                c = instr_cost(Instr(mnem, {**f, **extra}), t)
                w = extra.get("w_dtype", extra["in_dtype"])
                lines.append(
                    f"| {name} | `{mnem}` ({w}) | {m} | {c.busy:,} | {c.tail} | {b_bytes:,} | {dram:,} |"
                )
    return "\n".join(lines) + "\n"


def regenerate(text: str) -> str:
    """``text`` (docs/isa.md) with its generated blocks replaced by the current specs and costs."""
    if not _BLOCK.search(text):
        raise ValueError(f"docs/isa.md has no {BEGIN.strip()} ... {END} block")
    text = _BLOCK.sub(lambda m: BEGIN + render_instructions() + END, text)
    if _QBLOCK.search(text):
        text = _QBLOCK.sub(lambda m: QBEGIN + render_quantized_costs() + QEND, text)
    return text


def main(argv: list[str]) -> int:
    doc = Path("docs") / "isa.md"
    new = regenerate(doc.read_text(encoding="utf-8"))
    if "--write" in argv:
        doc.write_text(new, encoding="utf-8")
        return 0
    sys.stdout.write(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
