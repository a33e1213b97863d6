"""The MCP 2026 backend: lowering IR ops to ISA v2 instructions, memory planning, scheduling, .mcpb.

``compile_to_program(module, target, options)`` is the entry point; ``compile_report(program)``
summarises a compiled program for ``--report-json``.  See docs/backend.md.
"""

from mcpc.backend.compile import BackendOptions, compile_report, compile_to_program

__all__ = ["BackendOptions", "compile_report", "compile_to_program"]
