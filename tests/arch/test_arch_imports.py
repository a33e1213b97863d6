"""mcpc.arch is the contract shared by compiler and simulator: it must stay free of compiler/onnx imports."""

import subprocess
import sys

FORBIDDEN = ("onnx", "onnxruntime", "mcpc.ir", "mcpc.passes", "mcpc.backend")


def test_arch_modules_import_nothing_from_the_compiler():
    code = (
        "import sys\n"
        "import mcpc.arch, mcpc.arch.target, mcpc.arch.isa, mcpc.arch.asm, mcpc.arch.mcpb, mcpc.arch.dtypes\n"
        f"bad = [m for m in {FORBIDDEN!r} if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
