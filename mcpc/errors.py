"""One error type per layer, each carrying the exit code the CLI turns it into.

Every message names what the user can act on: the file, the ONNX node, the IR op, the config key
or the instruction address.  The CLI catches ``McpcError`` once and prints ``message`` without a
traceback; anything else is an internal error (exit 70).

Exit codes (documented in the README, ``docs/cli.md`` and ``mcpc --help``):
    0 ok, 1 check failed, 2 usage, 3 bad input, 4 unsupported, 5 simulator trap,
    6 does not fit the target, 7 numeric fault, 70 internal (our bugs only).
"""

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2
EXIT_BAD_INPUT = 3
EXIT_UNSUPPORTED = 4
EXIT_SIM_TRAP = 5
EXIT_DOES_NOT_FIT = 6
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


class DoesNotFit(PassError):
    """The model, as bound, needs more of a target resource (DRAM, SRAM, an instruction field's
    range) than the target has: the user's choice of target or dims, not our bug (exit 6).

    The message says what did not fit, by how much, and what to change (a ``--set`` key, a bigger
    target, smaller ``--dim``/``--shape`` bindings).  A subclass of PassError so a lowering that
    tries several SRAM regions still catches it; ``does_not_fit`` builds the usual message.
    """

    exit_code = EXIT_DOES_NOT_FIT


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


def _size(n: int) -> str:
    """``n`` bytes as the exact count plus a binary-prefixed figure (``1048576 bytes (1 MiB)``)."""
    value, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if value < 1024 or unit == "EiB":
            break
        value /= 1024
    return f"{n} bytes" if unit == "B" else f"{n} bytes ({value:.4g} {unit})"


def does_not_fit(
    what: str, need: int, have: int, resource: str, key: str, target: str = "the target"
) -> DoesNotFit:
    """A ``DoesNotFit`` for ``what`` needing ``need`` bytes of ``resource`` where ``target`` has
    ``have``: by how much, and the three ways out (``--set key=...``, a bigger target, smaller dims).
    Past what the instruction set addresses (no target can have more) only smaller dims help."""
    from mcpc.arch.target import DRAM_ADDRESS_BYTES, SRAM_ADDRESS_BYTES

    limit = {"dram.size_bytes": DRAM_ADDRESS_BYTES, "sram.size_bytes": SRAM_ADDRESS_BYTES}.get(key)
    text = (
        f"does not fit the target: {what} needs {_size(need)} of {resource}, {target} has {_size(have)} "
        f"({_size(need - have)} short)."
    )
    if limit is not None and need > limit:
        return DoesNotFit(
            f"{text} That is more {resource} than the instruction set addresses ({_size(limit)}), so "
            "no target can hold it: bind smaller dims (--dim NAME=N, --shape INPUT=AxB)."
        )
    return DoesNotFit(
        f"{text} To fit, raise it with --set {key}=N (N at least {need}), choose a target with more "
        f"{resource} (mcpc targets), or bind smaller dims (--dim NAME=N, --shape INPUT=AxB)."
    )
