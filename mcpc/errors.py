"""One error type per layer, each carrying the exit code the CLI turns it into.

Every message names what the user can act on: the file, the ONNX node, the IR op, the config key
or the instruction address.  The CLI catches ``McpcError`` once and prints ``message`` without a
traceback; anything else is an internal error (exit 70).

Exit codes (documented in the README and ``mcpc --help``):
    0 ok, 1 check failed, 2 usage, 3 bad input, 4 unsupported, 5 simulator trap,
    7 numeric fault, 70 internal.
"""

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2
EXIT_BAD_INPUT = 3
EXIT_UNSUPPORTED = 4
EXIT_SIM_TRAP = 5
EXIT_NUMERIC = 7
EXIT_INTERNAL = 70


class McpcError(Exception):
    """Base of all errors the toolchain reports to a user."""

    exit_code = EXIT_INTERNAL

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class UsageError(McpcError):
    """The command line itself is wrong (bad option value, conflicting options)."""

    exit_code = EXIT_USAGE


class InputError(McpcError):
    """A user-supplied file or value is malformed: ONNX, IR text, YAML config, .mcpb, inputs."""

    exit_code = EXIT_BAD_INPUT


class ParseError(InputError):
    """IR text does not parse; the message carries ``file:line:col`` and a caret line."""


class ConfigError(InputError):
    """A QAT config or target description fails validation; names the file and key path."""


class UnsupportedError(McpcError):
    """The input is valid but uses something the toolchain does not implement (an ONNX op, a dtype)."""

    exit_code = EXIT_UNSUPPORTED


class InternalError(McpcError):
    """A bug in the toolchain itself (an invariant of ours broke); exit 70, "please report"."""


class VerifyError(McpcError):
    """The IR violates an op's invariants; names the op.  Internal when raised after a pass."""


class PassError(McpcError):
    """A pass could not transform the module; names the pass and the op."""


class EncodeError(McpcError):
    """An instruction field does not fit its encoding; names the instruction and field."""


class SimTrap(McpcError):
    """The simulated NPU trapped: names the instruction address, mnemonic and ONNX node."""

    exit_code = EXIT_SIM_TRAP


class NumericFault(McpcError):
    """The simulated program produced NaN or overflowed (finite operands, infinite result) where the
    user asked for strictness; names the instruction and ONNX node where it first appeared."""

    exit_code = EXIT_NUMERIC


class CheckFailed(McpcError):
    """``mcpc check`` found outputs outside tolerance."""

    exit_code = EXIT_CHECK_FAILED
