"""The MCP 2026 simulator: runs a .mcpb and profiles it (docs/simulator.md).

Modules: ``api`` (load_program, run_program, random_inputs), ``loader`` (verify, decode once,
precompute), ``decode`` (fast table-driven decoder), ``machine`` (memories, typed views),
``execute`` (one handler per mnemonic), ``session`` (``Session``: runs keeping persistent buffers),
``timing`` (cycle costs, the event loop over the LD/EX/ST queues), ``profile`` (counters,
attribution, trace), ``summary`` (rich tables), ``cli`` (``sim run``), ``kv_manager`` (paged KV
blocks, prefix sharing, eviction), ``decoder`` (``DecoderSession``: the prefill/decode loop of a
decoder build), ``cli_decode`` (``sim generate``, ``sim eval-ppl``).
Importing this package is light; it never imports onnx or the compiler.
"""


def __getattr__(name: str):
    # ``mcpc.sim.Session`` without making ``import mcpc.sim`` load the simulator
    if name == "Session":
        from .session import Session

        return Session
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
