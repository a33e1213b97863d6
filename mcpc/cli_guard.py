"""How every mcpc command reports errors: one catch, ``_guard``, and the command classes that use it.

An ``McpcError`` becomes ``error: <message>`` on stderr and its exit code; click usage errors exit 2;
anything else is an internal error (exit 70, traceback only with ``MCPC_DEBUG=1``).  Every command
is a ``GuardedCommand`` (groups a ``GuardedGroup``), so the same codes come out of the console
scripts and of ``CliRunner``.  ``mcpc.cli`` re-exports these names.
"""

from __future__ import annotations

import os
import traceback

import click

from mcpc.errors import EXIT_INTERNAL, McpcError

EXIT_CODES_EPILOG = """\b
Exit codes:
  0   ok
  1   check failed (outputs outside tolerance)
  2   usage error
  3   bad input (ONNX, IR, config, target, .mcpb, missing file)
  4   unsupported op or dtype
  5   simulator trap
  6   does not fit the target (DRAM, SRAM: --set, a bigger target, smaller dims)
  7   numeric fault (NaN or overflow in the simulated program)
  70  internal error (please report; MCPC_DEBUG=1 shows the traceback)
"""


def _stderr_console():
    from rich.console import Console

    # soft_wrap: never break a message (file paths, key paths) at the terminal width
    return Console(stderr=True, soft_wrap=True, highlight=False)


def _stdout_console():
    from rich.console import Console

    return Console(soft_wrap=True, highlight=False)


def _print_error(prefix: str, message: str) -> None:
    from rich.text import Text

    _stderr_console().print(Text.assemble((prefix, "bold red"), message))


def _guard(invoke, ctx: click.Context):
    """Run a command, turning exceptions into a message on stderr and the documented exit code."""
    try:
        return invoke(ctx)
    except (click.exceptions.Exit, click.ClickException, click.Abort):
        raise  # click reports these itself (usage errors exit 2)
    except McpcError as err:
        if os.environ.get("MCPC_DEBUG"):
            traceback.print_exc()
        if err.exit_code == EXIT_INTERNAL:  # VerifyError after a pass, PassError, EncodeError: our bug
            _print_error("internal error: ", f"{err.message}\nThis is a bug in mcpc: please report it.")
        else:
            _print_error("error: ", err.message)
        raise click.exceptions.Exit(err.exit_code) from None
    except Exception as err:
        if os.environ.get("MCPC_DEBUG"):
            traceback.print_exc()
        notes = "".join(f" ({note})" for note in getattr(err, "__notes__", ()))
        _print_error(
            "internal error: ",
            f"{type(err).__name__}: {err}{notes}\nThis is a bug in mcpc: please report it "
            "with the output of the same command run with MCPC_DEBUG=1.",
        )
        raise click.exceptions.Exit(EXIT_INTERNAL) from None


class GuardedCommand(click.Command):
    """A click command whose errors go through ``_guard``."""

    def invoke(self, ctx: click.Context):
        return _guard(super().invoke, ctx)


class GuardedGroup(click.Group):
    """A click group whose own callback and subcommands' errors go through ``_guard``."""

    command_class = GuardedCommand

    def invoke(self, ctx: click.Context):
        return _guard(super().invoke, ctx)


GuardedGroup.group_class = GuardedGroup
