"""Test-only assembler helper: build .mcpb Programs by hand (the backend does not exist yet).

``build(asm_or_instrs, inputs=..., outputs=..., constants=..., target=...)`` lays out DRAM as
[constants | inputs | outputs | scratch] and returns a ``mcpc.arch.mcpb.Program``; every
instruction gets a DBUG entry naming a fake ONNX node (``node_of`` maps instruction index to the
node name, default ``n<index>``).
"""

from __future__ import annotations

import numpy as np

from mcpc.arch.asm import parse_asm
from mcpc.arch.isa import Instr, encode_program
from mcpc.arch.mcpb import Program, read_mcpb, write_mcpb
from mcpc.arch.target import load_target
from mcpc.sim.api import from_program
from mcpc.sim.machine import nbytes as packed_nbytes


def _align(n: int, a: int = 64) -> int:
    return -(-n // a) * a


def build(
    code: str | list[Instr],
    inputs: dict[str, tuple[str, tuple[int, ...]]] | None = None,
    outputs: dict[str, tuple[str, tuple[int, ...]]] | None = None,
    constants: bytes = b"",
    target: str = "mcp2026-a100",
    overrides: tuple[str, ...] = (),
    scratch: int = 0,
    node_of=None,
    entries: list[dict] | None = None,
) -> tuple[Program, dict[str, int]]:
    """Program + a dict of the DRAM address of every input/output (and "const", "scratch")."""
    t = load_target(target, list(overrides))
    instrs = parse_asm(code) if isinstance(code, str) else list(code)
    addrs: dict[str, int] = {"const": 0}
    regions = []
    if constants:
        regions.append({"name": "weights", "kind": "const", "dram": 0, "bytes": len(constants)})
    cur = _align(len(constants))
    io = {"inputs": [], "outputs": []}
    for kind, table in (("input", inputs or {}), ("output", outputs or {})):
        for name, (dtype, shape) in table.items():
            nbytes = packed_nbytes(dtype, int(np.prod(shape, dtype=np.int64)))
            addrs[name] = cur
            io[f"{kind}s"].append(
                {
                    "name": name,
                    "dtype": dtype,
                    "shape": list(shape),
                    "dram": cur,
                    "bytes": nbytes,
                    "onnx_dtype": 1,
                }
            )
            regions.append({"name": name, "kind": kind, "dram": cur, "bytes": nbytes})
            cur = _align(cur + nbytes)
    addrs["scratch"] = cur
    if scratch:
        regions.append({"name": "scratch", "kind": "scratch", "dram": cur, "bytes": scratch})
    size = _align(cur + scratch + 64)
    node_of = node_of or (lambda i: f"n{i}")
    debug = [
        {"ir_op": f"mcp.{ins.op}", "onnx_node": node_of(i), "op_type": "Test"} for i, ins in enumerate(instrs)
    ]
    program = Program.for_target(
        t,
        encode_program(instrs),
        constants=constants,
        entries=entries or [{"name": "main", "start": 0, "count": len(instrs)}],
        io={"main": io},
        memory_map={"dram_size": size, "regions": regions, "sram_peak_bytes": 0},
        debug=debug,
        meta={"precision": "fp32"},
    )
    return program, addrs


def loaded(program: Program):
    return from_program(program, "<test>")


def roundtrip(program: Program, tmp_path) -> Program:
    path = tmp_path / "p.mcpb"
    write_mcpb(path, program)
    return read_mcpb(path)


# A small shared program: y = exp(x + x) as f16, through LD -> EX -> ST with tokens.
ADD = """
load dram={x} sram=0x0 rows=4 row_bytes=32 dram_stride=32 sram_stride=32 signal=EX
vbin func=add in_dtype=f32 out_dtype=f32 dst=0x100 src0=0x0 src1=0x0 rows=4 cols=8 dst_stride=8 s0_stride=8 s1_stride=8 wait=LD
vun func=exp in_dtype=f32 out_dtype=f16 dst=0x200 src=0x100 rows=4 cols=8 dst_stride=8 src_stride=8 signal=ST
store dram={y} sram=0x200 rows=4 row_bytes=16 dram_stride=16 sram_stride=16 wait=EX
halt
"""  # noqa: E501
IO = {"inputs": {"x": ("f32", (4, 8))}, "outputs": {"y": ("f16", (4, 8))}}


def add_program(**kw):
    _, addrs = build("halt", **IO)  # same layout: learn the binding addresses first
    return build(ADD.format(x=addrs["x"], y=addrs["y"]), **IO, **kw)[0]


def x_input():
    return {"x": np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)}
