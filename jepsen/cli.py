"""``phalanx jepsen``: offline tools over recorded histories (for now: ``check``).

Owns:
    `add_jepsen_command(subparsers)`, which registers ``phalanx jepsen check`` on the
    top-level parser, and `run_check(args)`, its handler.

``phalanx jepsen check --workload register [--time-limit S] [--step-limit N] FILE`` reads a
JSON Lines history (see `phalanx.jepsen.history`), checks it, prints a JSON verdict on stdout
and exits with:

    0  linearizable (``"valid": true``)
    1  not linearizable (``"valid": false``)
    2  unknown: a key's search budget ran out (``"valid": "unknown"``)
    3  the history could not be read or is malformed (message on stderr, nothing on stdout)

(argparse itself exits 2 on a usage error, before any history is read.)

Must not import: the simulator or consensus cores (checking a file needs neither).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Final, TextIO

from phalanx.jepsen.history import HistoryError, read_history
from phalanx.jepsen.linearizability import DEFAULT_TIME_LIMIT, UNKNOWN, check
from phalanx.jepsen.models import MODELS

EXIT_VALID: Final = 0
EXIT_INVALID: Final = 1
EXIT_UNKNOWN: Final = 2
EXIT_BAD_HISTORY: Final = 3

_DESCRIPTION = """\
Check a recorded history for linearizability.

The history is JSON Lines, one event per line:
  {"index": 0, "time": 1500, "process": 3, "type": "invoke", "f": "write", "key": "x", "value": 7}
with type invoke|ok|fail|info. For the register workload f is read|write|cas, a cas value is
[expected, new], and null means absent. fail = certainly did not happen; info (or no
completion) = may or may not have happened. Events of process "nemesis" are ignored.

Each key is checked on its own (Wing & Gong search with Lowe's memoisation). The verdict is
printed as JSON on stdout: "valid" is true, false or "unknown"; for every key that is not
valid, a counterexample: the longest linearizable prefix, the operation that could not be
placed after it and the alternatives that were tried.

exit status: 0 valid, 1 invalid, 2 unknown (search budget exhausted), 3 unreadable or
malformed history.
"""


def add_jepsen_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``phalanx jepsen`` (with subcommand ``check``) on `subparsers`."""
    jepsen = subparsers.add_parser(
        "jepsen",
        help="check recorded client histories (linearizability)",
        description="Jepsen-style tools over recorded histories.",
    )
    sub = jepsen.add_subparsers(dest="jepsen_command", metavar="SUBCOMMAND", required=True)
    check_parser = sub.add_parser(
        "check",
        help="check a JSON Lines history; exit 0 valid, 1 invalid, 2 unknown, 3 bad file",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check_parser.add_argument("history", metavar="FILE", help="the JSON Lines history to check")
    check_parser.add_argument(
        "--workload",
        choices=sorted(MODELS),
        default="register",
        help="the sequential model to check against (default: %(default)s)",
    )
    check_parser.add_argument(
        "--time-limit",
        type=_non_negative_float,
        default=DEFAULT_TIME_LIMIT,
        metavar="SECONDS",
        help="search time per key before it is reported unknown (default: %(default)s; "
        "0 disables the limit)",
    )
    check_parser.add_argument(
        "--step-limit",
        type=_positive_int,
        default=None,
        metavar="N",
        help="search steps per key before it is reported unknown (deterministic; default: none)",
    )
    check_parser.add_argument(
        "--compact", action="store_true", help="print the verdict on one line instead of indented"
    )
    check_parser.set_defaults(handler=run_check)


def run_check(
    args: argparse.Namespace,
    *,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """The ``phalanx jepsen check`` handler; returns the exit status (see module docstring)."""
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    try:
        history = read_history(args.history)
    except (OSError, HistoryError) as exc:
        print(f"phalanx jepsen check: cannot read history {args.history}: {exc}", file=err)
        return EXIT_BAD_HISTORY
    model = MODELS[args.workload]()
    started = clock()
    try:
        result = check(
            history,
            model,
            time_limit=args.time_limit or None,
            step_limit=args.step_limit,
            clock=clock,
        )
    except HistoryError as exc:
        print(f"phalanx jepsen check: malformed history {args.history}: {exc}", file=err)
        return EXIT_BAD_HISTORY
    elapsed = clock() - started
    doc = result.to_json()
    doc["seconds"] = round(elapsed, 6)
    doc["ops_per_second"] = round(result.ops / elapsed) if elapsed > 0 else None
    print(json.dumps(doc, indent=None if args.compact else 2), file=out)
    if result.valid is True:
        return EXIT_VALID
    if result.valid == UNKNOWN:
        return EXIT_UNKNOWN
    return EXIT_INVALID


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0:  # also rejects NaN
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value
