"""Shared builders for the serving tests: analytic step costs and workloads from dicts."""

from __future__ import annotations

from mcpc.serve import AnalyticCost, Simulator, generate, make_policy
from mcpc.serve.cost import AnalyticSpec
from mcpc.serve.policies import _File
from mcpc.serve.workload import WorkloadSpec

MINIMAL = """\
seed: 1
requests: 1000
arrival: {process: poisson, rate_per_s: 20}
prompt_len: {dist: uniform, min: 32, max: 512}
output_len: {dist: fixed, value: 64}
"""

COST = """\
kind: analytic
clock_mhz: 1000
max_batch: 16
max_seq: 1024
prefill_chunk: 64
kv_bytes_per_token: 1024
decode: {base: 2000000, per_seq: 20000, per_kv_token: 300}
prefill: {base: 1500000, per_token: 30000, per_attended: 20}
"""


def analytic(**over):
    """An AnalyticCost and its shape; ``over`` replaces keys of COST's spec (decode/prefill dicts too)."""
    import yaml

    data = yaml.safe_load(COST)
    data.update(over)
    spec = AnalyticSpec.model_validate(data)
    cost = AnalyticCost(spec.clock_mhz * 1e6, spec.decode, spec.prefill, spec.dram, spec.kv_bytes_per_token)
    return cost, spec.shape()


def workload(**over):
    data = {
        "seed": 3,
        "requests": 200,
        "arrival": {"process": "poisson", "rate_per_s": 20},
        "prompt_len": {"dist": "uniform", "min": 16, "max": 300},
        "output_len": {"dist": "uniform", "min": 1, "max": 40},
    }
    data.update(over)
    return generate(WorkloadSpec.model_validate(data))


def policy(shape, **spec):
    return make_policy(_File.model_validate({"spec": spec}).spec, shape)


def serve(requests, cost_shape, check=True, **policy_spec):
    cost, shape = cost_shape
    sim = Simulator(requests, cost, shape, policy(shape, **policy_spec), check=check)
    sim.run()
    return sim


def decoder_program(path, decoder: dict | None):
    """A .mcpb (one ``halt``) whose META carries ``decoder`` (or none): what ``sim serve`` reads of a
    decoder build, without compiling one."""
    from mcpc.arch.asm import parse_asm
    from mcpc.arch.isa import encode_program
    from mcpc.arch.mcpb import Program, write_mcpb
    from mcpc.arch.target import load_target

    meta = {"precision": "fp16"} | ({"decoder": decoder} if decoder is not None else {})
    program = Program.for_target(
        load_target("mcp2026-a100", []),
        encode_program(parse_asm("halt")),
        constants=b"",
        entries=[{"name": "decode", "start": 0, "count": 1}],
        io={"decode": {"inputs": [], "outputs": []}},
        memory_map={"dram_size": 64, "regions": [], "sram_peak_bytes": 0},
        debug=[{"ir_op": "mcp.halt", "onnx_node": "n0", "op_type": "Test"}],
        meta=meta,
    )
    write_mcpb(path, program)
    return path


DECODER_META = {
    "max_seq": 1024, "max_batch": 16, "block": 64, "kv_blocks": 256, "prefill_chunk": 64, "layers": 30,
    "kv_heads": 3, "q_heads": 9, "head_dim": 64, "kv_dtype": "f16", "vocab": 49152, "logits": "logits",
    "inputs": {"ids": "input_ids", "positions": "position_ids"}, "kv_quant": None,
}  # fmt: skip


def runnable_decoder(path, meta: dict):
    """A .mcpb that passes for a decoder build on the simulator: `prefill` and `decode` entries (each
    one ``halt``) taking the decoder inputs, producing logits, reading the ``kv_blocks`` register.
    Its steps cost a constant few cycles: enough to drive DecoderSession's timing-only calls."""
    import numpy as np

    from mcpc.arch.asm import parse_asm
    from mcpc.arch.isa import encode_program
    from mcpc.arch.mcpb import Program, write_mcpb
    from mcpc.arch.target import load_target

    B, C = meta["max_batch"], meta["prefill_chunk"]
    mb = -(-meta["max_seq"] // meta["block"])
    io, regions, cur = {}, [], 0
    for entry, S in (("prefill", C), ("decode", 1)):
        table = {"inputs": [], "outputs": []}
        shapes = {
            "input_ids": ("i64", (B, S)),
            "position_ids": ("i64", (B, S)),
            "kv_slot": ("i32", (B * S,)),
            "kv_gather": ("i32", (B * mb,)),
            "kv_start": ("i32", (B * S,)),
            "kv_len": ("i32", (B * S,)),
        }
        for kind, items in (("inputs", shapes), ("outputs", {"logits": ("f32", (B, S, meta["vocab"]))})):
            for name, (dtype, shape) in items.items():
                nbytes = int(np.prod(shape)) * (8 if dtype == "i64" else 4)
                table[kind].append(
                    {
                        "name": name,
                        "dtype": dtype,
                        "shape": list(shape),
                        "dram": cur,
                        "bytes": nbytes,
                        "onnx_dtype": 1,
                    }
                )
                regions.append({"name": f"{entry}.{name}", "kind": kind[:-1], "dram": cur, "bytes": nbytes})
                cur += -(-nbytes // 64) * 64
        io[entry] = table
    text = encode_program(parse_asm("halt\nhalt"))
    program = Program.for_target(
        load_target("mcp2026-a100", []),
        text,
        constants=b"",
        entries=[{"name": "prefill", "start": 0, "count": 1}, {"name": "decode", "start": 1, "count": 1}],
        io=io,
        memory_map={"dram_size": cur + 64, "regions": regions, "sram_peak_bytes": 0},
        debug=[{"ir_op": "mcp.halt", "onnx_node": f"n{i}", "op_type": "Test"} for i in range(2)],
        meta={"precision": "fp16", "decoder": meta},
        host_registers=[
            {"name": "kv_blocks", "reg": 1, "min": 0, "max": B * mb, "entries": ["prefill", "decode"]}
        ],
    )
    write_mcpb(path, program)
    return path
