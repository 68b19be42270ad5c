"""`phalanx call`: send one raw command to any app of a running cluster and print its result.

Owns: the command's parser (`add_call_command`) and handler. It is the command line of
`phalanx.client.Client.call`: the app decides what the bytes mean (a custom state machine,
`cluster init --app FILE.py:FACTORY`, docs/STATE_MACHINES.md). Exit status as `phalanx kv`
(`phalanx.cli.errors`): 0 answered, 2 usage, 3 refused (no effect), 4 timed out (may or may
not have taken effect), 6 forbidden, 7 every node refused the connection (no effect).

Start-up: the top level imports argparse and light helpers only; trio and the client load in
the handler.
"""

from __future__ import annotations

import argparse
import base64
import sys

from phalanx.cli.cluster_arg import add_cluster_option, open_cluster_arg
from phalanx.cli.errors import (
    EXIT_OK,
    EXIT_USAGE,
    client_error_exit,
    print_error,
)
from phalanx.cli.value_args import ValueArgs

_EPILOG = """\
examples:
  phalanx cluster init ./tickets --app examples/tickets.py:TicketMachine
  phalanx call --cluster ./tickets take:bakery              # prints the app's reply: 1
  phalanx call --cluster ./tickets --read-only peek:bakery  # a linearizable query
  phalanx call --cluster ./tickets --read-only --stale peek:bakery   # one node, maybe behind
  printf 'take:x' | phalanx call --cluster ./tickets -      # the command from stdin
  phalanx call --cluster ./tickets @cmd.bin --raw > out.bin # from a file, the reply raw

COMMAND: "-" reads stdin, @PATH a file, @@TEXT the literal @TEXT. The reply is written as
its bytes and a newline (--raw: the bytes alone; -o json: {"result": TEXT, "encoding":
"utf-8"} or base64). A write is applied exactly once if this prints a reply, at most once if
it times out (exit 4).
"""


def add_call_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    call = subparsers.add_parser(
        "call", help="send one raw command to the app of a running cluster",
        description="Send one command (bytes the app defines) and print the app's reply.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_cluster_option(call)
    call.add_argument("command", metavar="COMMAND", help="the command's bytes (- or @PATH)")
    call.add_argument("--read-only", action="store_true",
                      help="a query (the app's `query`), not a command: changes nothing")
    call.add_argument("--stale", action="store_true",
                      help="with --read-only: one node answers from its applied state, "
                      "possibly behind (faster)")
    call.add_argument("--raw", action="store_true", help="write the reply's bytes alone")
    call.add_argument("-o", "--output", choices=("text", "json"), default="text",
                      help="text (default) or json")
    call.set_defaults(handler=_call_main)


def _call_main(args: argparse.Namespace) -> int:
    if args.stale and not args.read_only:
        print_error("phalanx call", "--stale needs --read-only (only queries can be stale)")
        return EXIT_USAGE
    try:
        command = ValueArgs()(args.command)
    except ValueError as e:
        print_error("phalanx call", str(e))
        return EXIT_USAGE
    cluster = open_cluster_arg(args, "phalanx call")
    if cluster is None:
        return EXIT_USAGE
    from phalanx.client import quick
    from phalanx.client.errors import (
        ClientError,
    )
    from phalanx.net.client_protocol import ReadConsistency

    consistency = ReadConsistency.STALE if args.stale else ReadConsistency.LINEARIZABLE

    def run() -> bytes:
        if quick.supports(cluster):  # the blocking one-shot client: no trio (start-up)
            return quick.quick_call(cluster, command, read_only=args.read_only,
                                    consistency=consistency, timeout=args.timeout)
        import trio

        from phalanx.client.async_client import open_client

        async def signed() -> bytes:
            async with open_client(cluster, timeout=args.timeout, fail_fast=True) as client:
                return await client.call(command, read_only=args.read_only,
                                         consistency=consistency)

        return trio.run(signed)

    try:
        reply = run()
    except ClientError as e:
        return client_error_exit("phalanx call", e)
    if args.output == "json":
        try:
            doc = {"result": reply.decode("utf-8"), "encoding": "utf-8"}
        except UnicodeDecodeError:
            doc = {"result": base64.b64encode(reply).decode("ascii"), "encoding": "base64"}
        import json

        print(json.dumps(doc))
    else:
        sys.stdout.buffer.write(reply if args.raw else reply + b"\n")
        sys.stdout.flush()
    return EXIT_OK
