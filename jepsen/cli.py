"""``phalanx jepsen``: offline tools over recorded histories (for now: ``check``).

Owns:
    `add_jepsen_command(subparsers)`, which registers ``phalanx jepsen check`` on the
    top-level parser, and `run_check(args)`, its handler.

``phalanx jepsen check --workload register|bank|set [--app FILE.py:FACTORY] [--time-limit S]
[--step-limit N] [--no-stats] [--report DIR] FILE`` reads a JSON Lines history (see
`phalanx.jepsen.history`),
checks it with the workload's checker and the stats checker (`phalanx.jepsen.checker`;
with ``--app``, linearizability against your state machine: `phalanx.jepsen.app_model`),
prints a text verdict (or, with ``--json``, the JSON document) on stdout and, with
``--report``, writes a run store with plots and an HTML report (`phalanx.jepsen.store`,
`phalanx.jepsen.report`). Exits with:

    0  valid (``"valid": true``)
    1  invalid (``"valid": false``)
    2  usage error (argparse, before any history is read; an ``--app`` that will not load)
    3  the history could not be read or is malformed (message on stderr, nothing on stdout)
    4  unknown: a key's search budget ran out (``"valid": "unknown"``)

(2 means only "usage error" in every phalanx command: `phalanx.cli.errors`.)

Must not import: the simulator or consensus cores (checking a file needs neither).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final, TextIO

from phalanx.cli.errors import (
    EXIT_INDETERMINATE,
    EXIT_USAGE,
    describe_os_error,
    non_negative_float,
    positive_int,
)
from phalanx.jepsen.checker import WORKLOADS, RunResult, check_history
from phalanx.jepsen.history import History, HistoryError, read_history
from phalanx.jepsen.linearizability import DEFAULT_TIME_LIMIT, UNKNOWN

EXIT_VALID: Final = 0
EXIT_INVALID: Final = 1
EXIT_BAD_HISTORY: Final = 3
EXIT_UNKNOWN: Final = EXIT_INDETERMINATE

_DESCRIPTION = """\
Check a recorded history: register (linearizability), bank or set.

The history is JSON Lines, one event per line:
  {"index": 0, "time": 1500, "process": 3, "type": "invoke", "f": "write", "key": "x", "value": 7}
with type invoke|ok|fail|info; "time" is in NANOSECONDS (any origin, non-decreasing).
fail = certainly did not happen; info (or no completion) = may or may not have happened.
Events of process "nemesis" are ignored by the checkers.

register: f is read|write|cas, a cas value is [expected, new], null means absent. Each key
  is checked on its own (Wing & Gong search with Lowe's memoisation); for every key that is
  not valid, a counterexample: the longest linearizable prefix, the operation that could
  not be placed after it and the alternatives that were tried.
bank: f is init|transfer|read; a read's value is {"account": balance}; every ok read must
  sum to the total (from init, else the first read) with no negative balance.
set: f is add (value: an integer element) or read (value: the list of elements); against
  each key's final read: lost, unexpected and duplicated elements.
The stats checker (unless --no-stats) requires every kind of operation to succeed once.
The verdict is printed as a short text summary (one line per checker, then every
counterexample); --json prints the full JSON document instead ("valid" is true, false or
"unknown"; "checkers" holds each checker's document).

exit status: 0 valid, 1 invalid, 2 usage error, 3 unreadable or malformed history,
4 unknown (search budget exhausted), 70 internal error.
"""


def add_jepsen_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``phalanx jepsen`` (with subcommand ``check``) on `subparsers`."""
    jepsen = subparsers.add_parser(
        "jepsen",
        help="run fault-injection tests on real clusters; check recorded histories",
        description="Jepsen-style testing: `run` a workload against a fresh local cluster under "
        "a nemesis schedule, or `check` any recorded history.",
    )
    sub = jepsen.add_subparsers(dest="jepsen_command", metavar="SUBCOMMAND", required=True)
    # Imported here: the harness pulls in trio and the client, which `check` does not need
    # at import time of this module.
    from phalanx.jepsen.harness.cli import add_run_command

    add_run_command(sub)
    check_parser = sub.add_parser(
        "check",
        help="check a JSON Lines history; exit 0 valid, 1 invalid, 3 bad file, 4 unknown",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check_parser.add_argument("history", metavar="FILE", help="the JSON Lines history to check")
    check_parser.add_argument(
        "--workload",
        choices=WORKLOADS,
        default="register",
        help="the workload the history comes from (default: %(default)s)",
    )
    check_parser.add_argument(
        "--app", metavar="FILE.py:FACTORY", default=None,
        help="a history of your own state machine (`jepsen run --app`, `f` apply/query): "
        "checked for linearizability against it (its reference_model() when it has one) "
        "instead of --workload's checker",
    )
    check_parser.add_argument(
        "--time-limit",
        type=non_negative_float,
        default=DEFAULT_TIME_LIMIT,
        metavar="SECONDS",
        help="search time per key before it is reported unknown (default: %(default)s; "
        "0 disables the limit)",
    )
    check_parser.add_argument(
        "--step-limit",
        type=positive_int,
        default=None,
        metavar="N",
        help="search steps per key before it is reported unknown (deterministic; default: none)",
    )
    check_parser.add_argument(
        "--json", action="store_true",
        help="print the full verdict as JSON instead of the text summary",
    )
    check_parser.add_argument(
        "--compact", action="store_true",
        help="with --json (implied): the JSON on one line instead of indented",
    )
    check_parser.add_argument(
        "--no-stats",
        dest="stats",
        action="store_false",
        help="skip the stats checker (every operation kind must succeed at least once)",
    )
    check_parser.add_argument(
        "--report",
        metavar="DIR",
        default=None,
        help="also write a run store under DIR/check-<workload>/<timestamp>/ with the history, "
        "results, latency.svg, rate.svg and index.html (DIR/latest points at it)",
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
    except OSError as exc:
        print(f"phalanx jepsen check: error: cannot read history {describe_os_error(exc)}",
              file=err)
        return EXIT_BAD_HISTORY
    except HistoryError as exc:
        print(f"phalanx jepsen check: error: cannot read history {args.history}: {exc}",
              file=err)
        return EXIT_BAD_HISTORY
    started = clock()
    try:
        if getattr(args, "app", None):
            result = _check_app(args, history)
        else:
            result = check_history(
                args.workload,
                history,
                stats=args.stats,
                time_limit=args.time_limit or None,
                step_limit=args.step_limit,
                clock=clock,
            )
    except _AppUnusable as exc:  # an app that will not load (AppConfigError: one line)
        print(f"phalanx jepsen check: error: {exc}", file=err)
        return EXIT_USAGE
    except HistoryError as exc:
        print(f"phalanx jepsen check: error: malformed history {args.history}: {exc}", file=err)
        return EXIT_BAD_HISTORY
    elapsed = clock() - started
    doc = result.to_json()
    ops = len(history.pairs)
    doc["seconds"] = round(elapsed, 6)
    doc["ops_per_second"] = round(ops / elapsed) if elapsed > 0 else None
    if args.report is not None:
        try:
            doc["report"] = str(_write_report(args, history, doc))
        except OSError as exc:
            print(f"phalanx jepsen check: cannot write the report: {exc}", file=err)
    if args.json or args.compact:
        print(json.dumps(doc, indent=None if args.compact else 2), file=out)
    else:
        for line in result.summary():
            print(line, file=out)
        print(f"{ops} operations checked in {elapsed:.3f} s"
              + (f"; report: {doc['report']}" if "report" in doc else ""), file=out)
    if result.valid is True:
        return EXIT_VALID
    if result.valid == UNKNOWN:
        return EXIT_UNKNOWN
    return EXIT_INVALID


class _AppUnusable(Exception):
    """``--app`` names a state machine that will not load (the message says why)."""


def _check_app(args: argparse.Namespace, history: History) -> RunResult:
    """``--app``: the history against the app's model (`phalanx.jepsen.app_model`)."""
    from phalanx.appspec.custom import absolute, machine_factory
    from phalanx.appspec.spec import AppConfigError
    from phalanx.jepsen.app_model import check_app_history, model_of

    try:
        machine = machine_factory(absolute(args.app))
    except AppConfigError as e:
        raise _AppUnusable(str(e)) from None
    return check_app_history(history, model_of(machine), time_limit=args.time_limit or None,
                             step_limit=args.step_limit, stats=args.stats)


def _write_report(args: argparse.Namespace, history: History, doc: dict[str, object]) -> Path:
    """Write a run store for a checked file and render its report; returns index.html."""
    from phalanx.jepsen.report import render_report
    from phalanx.jepsen.store import create_run

    store = create_run(
        args.report,
        f"check-{args.workload}",
        config={"source": str(Path(args.history).resolve()), "workload": args.workload},
    )
    store.write_history(history)
    store.write_results(doc)
    return render_report(store.path)

