"""How the `phalanx` command line fails: exit codes, one-line errors, checked option types.

Owns:
    * The exit-code table every subcommand follows (`EXIT_*`, `EXIT_CODES_HELP`).
    * `OperatorError`, the base of every error an operator can fix (`UsageError` here,
      `phalanx.ops.node_config.ConfigError`, `phalanx.ops.local_cluster.ClusterError`): the CLI
      prints it as ONE
      line on stderr and exits `EXIT_USAGE`.
    * `Parser`, the argparse parser class of the whole tree (subparsers inherit it): a usage
      error is one line, ``phalanx kv: error: ... (see 'phalanx kv --help')``, exit 2.
    * `run_handler`: runs a subcommand's handler and turns whatever escapes it into one line
      and an exit code (see below).
    * argparse ``type=`` checkers: finite positive numbers, bounded integers, ports, UTF-8
      text (a non-UTF-8 argument arrives surrogate-escaped from ``sys.argv``).

Invariants:
    * Exit 2 means only "usage or configuration error: nothing was done, fix the command or
      its files and rerun". No other outcome of any subcommand uses 2.
    * An operator's mistake never prints a traceback. An exception we did not expect is our
      bug: one line naming it and where it was raised, exit `EXIT_INTERNAL` (70), and the full
      traceback when ``PHALANX_DEBUG=1``.

Must import only the standard library (it is imported before any subcommand, on every run).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, NoReturn

if TYPE_CHECKING:
    from phalanx.client.errors import ClientError

EXIT_OK: Final = 0
EXIT_NEGATIVE: Final = 1
"""A negative answer (absent key, failed cas, invalid history) or a failed run."""
EXIT_USAGE: Final = 2
"""Bad arguments, a missing/invalid config or credential file, no cluster at DIR."""
EXIT_REFUSED: Final = 3
"""`phalanx kv`: the cluster refused the command; it certainly had no effect."""
EXIT_INDETERMINATE: Final = 4
"""No answer in time (`kv`), or an unknown verdict (`jepsen`): may or may not have happened."""
EXIT_STORAGE_UNAVAILABLE: Final = 5
"""`phalanx kv`: the cluster answered that its storage is unavailable (disk full or failing)."""
EXIT_FORBIDDEN: Final = 6
"""`phalanx kv`: the cluster refused this client's certificate the command (no effect)."""
EXIT_UNREACHABLE: Final = 7
"""`phalanx kv`: every node refused the connection (nothing listens): nothing was sent, no
effect. Reported at once, not after --timeout."""
EXIT_INTERNAL: Final = 70
"""An unexpected exception: a bug in phalanx (BSD sysexits' EX_SOFTWARE)."""
EXIT_BROKEN_PIPE: Final = 141
"""stdout was closed early (``phalanx kv scan | head``): 128 + SIGPIPE, like other tools."""
EXIT_INTERRUPTED: Final = 130
"""Ctrl-C (128 + SIGINT)."""

DEBUG_ENV: Final = "PHALANX_DEBUG"

EXIT_CODES_HELP: Final = f"""\
exit status (every phalanx command):
  0   success
  1   a negative answer or a failed run (kv: absent key, cas comparison failed;
      status: a node did not answer; jepsen: invalid history; node/cluster: a node failed)
  2   usage or configuration error: bad arguments, a missing or invalid config,
      certificate or key file, no cluster at DIR; nothing was done
  3   kv: refused by the cluster (no effect)
  4   kv: timed out, the command MAY OR MAY NOT have taken effect; jepsen: unknown verdict
  5   kv: the cluster's storage is unavailable (disk full or failing)
  6   kv: forbidden (this client's certificate may not run the command)
  7   kv: connection refused by every node (is the cluster running?): nothing was sent
  70  internal error (a bug: set {DEBUG_ENV}=1 for the traceback, please report it)
  130 interrupted (Ctrl-C)
"""


class OperatorError(Exception):
    """A mistake the operator can fix (arguments, files): one line on stderr, exit 2."""


class UsageError(OperatorError):
    """A subcommand's arguments do not make sense together (message says what to do)."""


def one_line(text: str) -> str:
    """`text` on a single line (a multi-line message would break the one-line promise)."""
    return " ".join(text.split("\n")).strip()



def client_error_exit(prog: str, e: ClientError) -> int:
    """Print the one-line message of a client call that failed with `e` and return its exit
    code: the mapping `phalanx kv` and `phalanx call` share (a caller handles its finer cases,
    such as an aborted transaction, before this)."""
    from phalanx.client.errors import (
        ClientTimeout,
        ClusterUnreachable,
        Forbidden,
        RequestRejected,
    )

    if isinstance(e, ClusterUnreachable):
        print(f"{prog}: {e}", file=sys.stderr)
        return EXIT_UNREACHABLE
    if isinstance(e, Forbidden):
        print(f"{prog}: forbidden: {e}", file=sys.stderr)
        return EXIT_FORBIDDEN
    if isinstance(e, RequestRejected):
        print(f"{prog}: refused: {e}", file=sys.stderr)
        return EXIT_REFUSED
    if isinstance(e, ClientTimeout):
        print(f"{prog}: timed out, the command may or may not have taken effect: {e}",
              file=sys.stderr)
        return EXIT_INDETERMINATE
    print(f"{prog}: {e}; the command may or may not have taken effect", file=sys.stderr)
    return EXIT_INDETERMINATE

def print_error(prog: str, message: str) -> None:
    """``PROG: error: MESSAGE`` as one line on stderr (undecodable bytes backslash-escaped)."""
    line = f"{prog}: error: {one_line(message)}\n"
    stream = sys.stderr
    try:
        stream.write(line)
    except UnicodeEncodeError:
        stream.write(line.encode("utf-8", "backslashreplace").decode("ascii", "replace"))
    stream.flush()


class Parser(argparse.ArgumentParser):
    """argparse with a one-line usage error (subparsers are made of the same class)."""

    def error(self, message: str) -> NoReturn:
        print_error(self.prog, f"{message} (see '{self.prog} --help')")
        self.exit(EXIT_USAGE)


def describe_os_error(e: OSError) -> str:
    """`e` as ``FILE: reason`` (an OSError's str is ``[Errno 2] No such ...: 'FILE'``)."""
    reason = e.strerror or str(e) or type(e).__name__
    if e.filename is not None:
        return f"{os.fsdecode(e.filename)}: {reason}"
    return reason


def run_handler(handler: Callable[[argparse.Namespace], int], args: argparse.Namespace,
                prog: str) -> int:
    """Run `handler(args)`; whatever escapes it becomes one line on stderr and an exit code.

    `OperatorError` -> 2; `OSError` (a file or directory the operator named) -> 2 with the
    file and the reason; Ctrl-C -> 130; a closed stdout -> 141; anything else is a bug ->
    one line with its type, message and origin, exit 70 (traceback with PHALANX_DEBUG=1).
    """
    try:
        return handler(args)
    except OperatorError as e:
        print_error(prog, str(e))
        return EXIT_USAGE
    except KeyboardInterrupt:
        print_error(prog, "interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except OSError as e:
        print_error(prog, describe_os_error(e))
        return EXIT_USAGE
    except Exception as e:
        return report_internal_error(prog, e)


def report_internal_error(prog: str, e: BaseException) -> int:
    """A bug: its summary on one line (and the traceback if PHALANX_DEBUG=1); exit 70."""
    import traceback  # (a bug's path only: start-up of every command skips it)

    if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
        traceback.print_exception(e)
    frames = traceback.extract_tb(e.__traceback__)
    where = f" at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames else ""
    hint = "" if os.environ.get(DEBUG_ENV, "") not in ("", "0") else \
        f"; rerun with {DEBUG_ENV}=1 for the traceback"
    print_error(prog, f"internal error (a bug in phalanx, please report it): "
                      f"{type(e).__name__}: {e}{where}{hint}")
    return EXIT_INTERNAL


def _silence_stdout() -> None:
    """After EPIPE: point stdout at /dev/null so the interpreter's final flush is quiet."""
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def tolerate_undecodable_output() -> None:
    """Let stdout print the surrogate-escaped bytes of a non-UTF-8 path or argument back as
    the same bytes, instead of raising UnicodeEncodeError (stderr already escapes them)."""
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None and getattr(sys.stdout, "errors", None) == "strict":
        with contextlib.suppress(ValueError, OSError):
            reconfigure(errors="surrogateescape")


# --------------------------------------------------------------------------------------------
# argparse type= checkers (ArgumentTypeError -> one-line usage error, exit 2)


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0 (seconds, rates): rejects nan, inf, 0 and negatives."""
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    """A finite number >= 0: rejects nan, inf and negatives."""
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def int_between(low: int, high: int | None = None) -> Callable[[str], int]:
    """A checker for an integer in [low, high] (no upper bound when `high` is None)."""

    def check(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low or (high is not None and value > high):
            bound = f">= {low}" if high is None else f"between {low} and {high}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return value

    check.__name__ = "integer"  # argparse names the type in its own messages
    return check


positive_int = int_between(1)
non_negative_int = int_between(0)
port = int_between(1, 65535)


def utf8_text(what: str) -> Callable[[str], str]:
    """A checker for text that must be valid UTF-8 (keys, names): a surrogate-escaped
    argument (bytes that are not UTF-8) is refused, saying which argument it was."""

    def check(text: str) -> str:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            shown = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            raise argparse.ArgumentTypeError(
                f"'{shown}' is not valid UTF-8 text (a {what} is UTF-8 text)") from None
        return text

    check.__name__ = what
    return check
