"""mcpc — compiler toolchain and instruction-set simulator for the MCP 2026 NPU.

The package is deliberately light to import: ``import mcpc.sim`` must not pull in onnx or the
compiler, so the Python API below is resolved lazily.

Python API::

    import mcpc
    module = mcpc.load_model("model.onnx", dims={"seq": 128})   # ONNX -> MCP IR module
    result = mcpc.compile("model.onnx", target="mcp2026-a100", qat_config="fp16.yaml")
"""

__version__ = "0.1.0"

__all__ = ["__version__", "compile", "load_model"]


def __getattr__(name):
    if name in ("compile", "load_model"):
        from mcpc import driver

        return getattr(driver, name)
    raise AttributeError(f"module 'mcpc' has no attribute {name!r}")
