"""`phalanx kv` and `phalanx status`: the operator's view of a running cluster.

Owns: the argparse wiring and output of both commands (`add_kv_command`,
`add_status_command`), `query_status` (every node's `StatusReply`, concurrently) and
`run_kv` (one KV command through the client library).

Exit status of `phalanx kv` (for scripts):

    0  success (`get` printed the value)
    1  a negative answer: `get`/`delete`/`version` of an absent key, a `cas` whose comparison
       failed
    2  usage error: bad arguments (a non-UTF-8 KEY, a timeout that is not a finite number
       > 0), no cluster at DIR, a missing or invalid cluster.toml or client credential file
    3  the cluster refused the command: it certainly had no effect (a leaderless
       transaction that f+1 nodes report aborted prints ``aborted: <reason>``)
    4  no answer in time: the command MAY OR MAY NOT have taken effect
    5  the cluster answered that its storage is unavailable (`StorageUnavailable`)
    6  the cluster refused this client the command (`Forbidden`): no effect

(the table shared by every subcommand: `phalanx.cli.errors`). `phalanx status` exits 0 when
every node answered, 1 when some did not (their rows say ``unreachable``), 2 on usage errors.
Every error is one line on stderr.

Start-up: this module's top level is what building the parser needs (argparse, the KV
command types, `phalanx.cli.errors`); trio, the client, the PKI and the cluster files are
imported by the functions that use them, so `phalanx kv --help` or a usage error costs no
client import (`tests/test_packaging.py` holds this).

Must not import: the runtime (`phalanx.runtime.node`), consensus cores, storage. Talks to nodes only
through `phalanx.client.async_client`. Keys are UTF-8 text; values are bytes: arguments are encoded
with
the file-system encoding (so any byte survives) and values are written raw to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from phalanx.apps.kv_types import (
    MAX_SCAN_LIMIT,
    Add,
    CasResult,
    CompareAndSet,
    Concat,
    Delete,
    Deleted,
    Done,
    Get,
    GetVersion,
    KvCommand,
    KvError,
    KvResult,
    Mul,
    Put,
    SAdd,
    Scan,
    ScanResult,
    SRem,
    Value,
    VersionResult,
)
from phalanx.cli.cluster_arg import (
    CLUSTER_ENV,
    add_cluster_option,
    open_cluster_arg,
)
from phalanx.cli.errors import (
    EXIT_FORBIDDEN,
    EXIT_INDETERMINATE,
    EXIT_REFUSED,
    EXIT_STORAGE_UNAVAILABLE,
    int_between,
    print_error,
    utf8_text,
)

if TYPE_CHECKING:  # the handlers import these: building the parser must stay cheap
    from phalanx.net.client_protocol import StatusReply
    from phalanx.ops.node_config import ClusterConfig
    from phalanx.ops.signing_keys import TransactionSigner

EXIT_OK: Final = 0
EXIT_NEGATIVE: Final = 1
EXIT_USAGE: Final = 2
EXIT_REJECTED: Final = EXIT_REFUSED
EXIT_UNKNOWN: Final = EXIT_INDETERMINATE


_KV_EPILOG = f"""\
examples:
  phalanx kv --cluster ./demo-cluster put greeting hello
  phalanx kv --cluster ./demo-cluster get greeting          # prints: hello
  phalanx kv --cluster ./demo-cluster cas greeting hello bonjour
  phalanx kv --cluster ./demo-cluster cas --if-absent counter 1
  phalanx kv --cluster ./demo-cluster scan gr               # prints: greeting<TAB>bonjour
  phalanx kv --cluster ./demo-cluster delete greeting
  phalanx kv --cluster ./demo-cluster add visits 5          # visits holds "5"
  phalanx kv --cluster ./demo-cluster sadd tags red         # then: smembers tags
  phalanx kv --cluster ./demo-cluster version greeting      # SHA-512 of the value, in hex

add/mul work on decimal 64-bit integers (absent: 0; wrapping on overflow), sadd/srem on
sets (absent: empty), concat on any value. Updates of one kind commute (add with add,
sadd with sadd, ...): the leaderless protocol may apply them in any order.

--cluster defaults to ${CLUSTER_ENV}. Reads are linearizable unless --stale.
--as NAME uses DIR/clients/NAME.pem instead of the cluster's default client certificate
(e.g. --as reader: read-only; see `phalanx cert issue-client`).

leaderless clusters (`cluster init --protocol leaderless`): every write is a transaction
signed with the cluster's client signing key (DIR/clients/client.signing.key; another with
--client-name NAME or --client-key PATH, made by `phalanx cluster client-key DIR NAME`),
sent to every node and decided by f+1 matching answers. A key's version is SHA-512 of its
value (`version KEY`; absent: empty). put, delete, cas and concat, and linearizable reads,
must name the version of their key (a requirement): by default the version f+1 nodes
report is read first; --require KEY=HEX (repeatable; KEY= for absent) gives it instead.
The transaction commits only where the versions still match, else it is aborted: it
prints "aborted: <reason>" and exits 3 (no effect; --retry-aborted reads the versions
again and retries until --timeout). add, mul, sadd and srem need no version (updates of
one kind commute). --stale reads ask one node (possibly behind); scan needs --stale.

exit status:
  0  success
  1  absent key / cas comparison failed
  2  usage error: bad arguments, no cluster at DIR, a missing or invalid config or
     credential file (nothing was sent)
  3  refused by the cluster (no effect)
  4  timed out: the command may or may not have taken effect
  5  the cluster's storage is unavailable (disk full or failing)
  6  forbidden: this client's certificate may not run the command (no effect)
  70 internal error (a bug; PHALANX_DEBUG=1 shows the traceback)
KEY and PREFIX must be UTF-8 text; VALUE may be any bytes.
"""

_STATUS_EPILOG = f"""\
examples:
  phalanx status --cluster ./demo-cluster
  phalanx status --cluster ./demo-cluster --json | jq '.[] | select(.role=="leader")'

--json prints a list with one object per node: node, role, term, leader, commit_index,
applied_index, last_checkpoint, peers, connected_peers, dropped_messages, protocol,
client_auth (role "unreachable" and an "error" for a node that did not answer). A node
running with [client] auth = "none" (no client authentication) is named in a WARNING on
stderr. --cluster defaults to ${CLUSTER_ENV}. Exit status 0 if every node answered, else 1;
2 on a usage error (bad arguments, no cluster at DIR, a missing or invalid config or
credential file).
"""


def add_kv_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``phalanx kv put|get|delete|cas|scan|add|mul|sadd|srem|concat|version|
    smembers`` on `subparsers`."""
    kv = subparsers.add_parser(
        "kv", help="read and write keys of a running cluster",
        description="Run one key-value command against a running cluster.",
        epilog=_KV_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_cluster_option(kv)
    kv.add_argument("--client-key", metavar="PATH", default=None,
                    help="leaderless: sign with this client signing key file")
    kv.add_argument("--client-name", dest="client_name_key", metavar="NAME", default=None,
                    help="leaderless: sign with DIR/clients/NAME.signing.key")
    kv.add_argument("--require", metavar="KEY=VERSION", action="append", default=None,
                    type=_requirement,
                    help="leaderless: commit only where KEY's version (hex; empty: absent) "
                    "is VERSION (repeatable; default: read it first)")
    kv.add_argument("--retry-aborted", action="store_true",
                    help="leaderless: after an abort, read the versions again and retry")
    sub = kv.add_subparsers(dest="kv_command", metavar="COMMAND", required=True)
    put = sub.add_parser("put", help="set KEY to VALUE")
    key = utf8_text("KEY")
    put.add_argument("key", metavar="KEY", type=key)
    put.add_argument("value", metavar="VALUE")
    get = sub.add_parser("get", help="print the value of KEY (exit 1 if absent)")
    get.add_argument("key", metavar="KEY", type=key)
    get.add_argument("--stale", action="store_true",
                     help="read from one node's applied state, possibly behind (faster)")
    delete = sub.add_parser("delete", help="remove KEY (exit 1 if it was absent)")
    delete.add_argument("key", metavar="KEY", type=key)
    cas = sub.add_parser(
        "cas", help="set KEY to NEW iff it holds OLD (exit 1 if not)",
        description="Compare and set: KEY OLD NEW, or --if-absent KEY NEW.",
    )
    cas.add_argument("--if-absent", action="store_true",
                     help="succeed only if KEY is absent (then give KEY NEW)")
    cas.add_argument("key", metavar="KEY", type=key)
    cas.add_argument("values", metavar="OLD NEW", nargs="+")
    scan = sub.add_parser("scan", help="print KEY<TAB>VALUE lines for keys starting with PREFIX")
    scan.add_argument("prefix", metavar="PREFIX", nargs="?", default="",
                      type=utf8_text("PREFIX"))
    scan.add_argument("--limit", type=int_between(1, MAX_SCAN_LIMIT), default=1000,
                      help=f"at most this many, 1..{MAX_SCAN_LIMIT} (default: 1000)")
    parsers = [put, get, delete, cas, scan]
    for name, operand, text in _UPDATES:
        update = sub.add_parser(name, help=text)
        update.add_argument("key", metavar="KEY", type=key)
        if operand == "N":
            update.add_argument("operand", metavar=operand, type=_int64)
        else:
            update.add_argument("operand", metavar=operand)
        parsers.append(update)
    for name, text in (("version", "print KEY's version: SHA-512 of its value, in hex "
                                   "(exit 1 if absent)"),
                       ("smembers", "print the members of the set at KEY, one a line")):
        read = sub.add_parser(name, help=text)
        read.add_argument("key", metavar="KEY", type=key)
        read.add_argument("--stale", action="store_true",
                          help="read from one node's applied state, possibly behind (faster)")
        parsers.append(read)
    for p in parsers:
        p.set_defaults(handler=_kv_main)


_UPDATES = (
    ("add", "N", "add the integer N to the integer at KEY"),
    ("mul", "N", "multiply the integer at KEY by the integer N"),
    ("sadd", "MEMBER", "add MEMBER to the set at KEY"),
    ("srem", "MEMBER", "remove MEMBER from the set at KEY"),
    ("concat", "SUFFIX", "append SUFFIX to the value at KEY"),
)
_INT64 = range(-(2**63), 2**63)


def _requirement(text: str) -> tuple[str, bytes]:
    """An argparse type: ``KEY=HEX`` (a version; ``KEY=`` for an absent key)."""
    key, sep, version = text.rpartition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VERSION (hex), got {text!r}")
    try:
        return key, bytes.fromhex(version)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: the version is not hex") from None


def _int64(text: str) -> int:
    """An argparse type: a signed 64-bit integer in decimal."""
    try:
        n = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a decimal integer: {text!r}") from None
    if n not in _INT64:
        raise argparse.ArgumentTypeError(f"{text} is outside the signed 64-bit range")
    return n


STATUS_TIMEOUT = 1.5


def add_status_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``phalanx status`` on `subparsers`."""
    status = subparsers.add_parser(
        "status", help="show every node's role, term, commit and applied index",
        description="Ask every node of a cluster for its status.",
        epilog=_STATUS_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_cluster_option(status)
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")
    # A status probe should not hang on a dead node for the full operation timeout.
    status.set_defaults(handler=_status_main, timeout=STATUS_TIMEOUT)


# --------------------------------------------------------------------------------------------
# kv


def _bytes(text: str) -> bytes:
    return os.fsencode(text)


def build_command(args: argparse.Namespace) -> tuple[KvCommand, bool]:
    """The KV command `args` asks for and whether it is read-only.

    Raises:
        ValueError: the arguments do not make a command (message for the operator).
    """
    match args.kv_command:
        case "put":
            return Put(key=args.key, value=_bytes(args.value)), False
        case "get":
            return Get(key=args.key), True
        case "delete":
            return Delete(key=args.key), False
        case "cas":
            values: list[str] = args.values
            if args.if_absent:
                if len(values) != 1:
                    raise ValueError("cas --if-absent takes KEY NEW")
                return CompareAndSet(key=args.key, expected=None, new=_bytes(values[0])), False
            if len(values) != 2:
                raise ValueError("cas takes KEY OLD NEW (or --if-absent KEY NEW)")
            return CompareAndSet(
                key=args.key, expected=_bytes(values[0]), new=_bytes(values[1])
            ), False
        case "scan":
            if args.limit < 1:
                raise ValueError("--limit must be >= 1")
            return Scan(prefix=args.prefix, limit=args.limit), True
        case "add":
            return Add(key=args.key, amount=args.operand), False
        case "mul":
            return Mul(key=args.key, factor=args.operand), False
        case "sadd":
            return SAdd(key=args.key, member=_bytes(args.operand)), False
        case "srem":
            return SRem(key=args.key, member=_bytes(args.operand)), False
        case "concat":
            return Concat(key=args.key, suffix=_bytes(args.operand)), False
        case "version":
            return GetVersion(key=args.key), True
        case "smembers":
            return Get(key=args.key), True  # printed as a set: `_print_result(as_set=True)`
    raise ValueError(f"unknown kv command {args.kv_command!r}")


async def run_kv(
    cluster: ClusterConfig,
    command: KvCommand,
    *,
    read_only: bool,
    stale: bool,
    client_timeout: float,
    signer: TransactionSigner | None = None,
    requirements: dict[str, bytes] | None = None,
    retry_aborted: bool = False,
) -> KvResult:
    """Send one KV command and return its decoded result (errors: see `phalanx.client.async_client`;
    `client_timeout` is the client's deadline for the operation). Leaderless clusters: signed
    with `signer` (default: the cluster's key), with `requirements` or the versions f+1 nodes
    report (`phalanx.client.kv.KvHelpers.call_versioned`)."""
    from phalanx.apps import kv_wire
    from phalanx.client.async_client import ClientError, ClientOptions, open_client
    from phalanx.client.kv import required_keys
    from phalanx.net.client_protocol import ReadConsistency

    consistency = ReadConsistency.STALE if stale else ReadConsistency.LINEARIZABLE
    failure: ClientError | ValueError | None = None
    raw = b""
    options: ClientOptions = {"timeout": client_timeout}
    if signer is not None:
        options["signer"] = signer
    async with open_client(cluster, **options) as client:
        encoded = kv_wire.encode_command(command)
        try:
            if client.signs_transactions and not stale and isinstance(
                    command, Add | Mul | SAdd | SRem):
                # a commuting update requires its key's BASE version (docs/KV_STORAGE.md)
                await client.update(command, requirements=requirements,
                                    retry_aborted=retry_aborted)
                raw = kv_wire.encode_result(Done())
            elif client.signs_transactions and not stale:
                raw = await client.call_versioned(
                    encoded, required_keys(command), read_only=read_only,
                    requirements=requirements, retry_aborted=retry_aborted)
            elif requirements:
                raise ValueError(f"--require is for leaderless clusters, not {cluster.protocol}")
            else:
                raw = await client.call(encoded, read_only=read_only, consistency=consistency)
        except (ClientError, ValueError) as e:  # raised here, not wrapped in an ExceptionGroup
            failure = e
    if failure is not None:
        raise failure
    return kv_wire.decode_result(raw)


def _show(value: bytes | None) -> str:
    return "(absent)" if value is None else os.fsdecode(value)


def _print_result(command: KvCommand, result: KvResult, *, as_set: bool = False) -> int:
    """Print `result` as `phalanx kv` does and return the exit status (`as_set`: the
    `Value` of a get is a set, printed one member a line)."""
    out = sys.stdout.buffer
    if as_set and isinstance(result, Value):
        from phalanx.apps.kv_ops import decode_set

        members = decode_set(result.value)
        if members is None:
            print(f"phalanx kv: refused: the value of {getattr(command, 'key', '')!r} is not a "
                  "set", file=sys.stderr)
            return EXIT_REJECTED
        out.write(b"".join(m + b"\n" for m in members))
        out.flush()
        return EXIT_OK
    match result:
        case KvError():
            print(f"phalanx kv: refused: {result.message}", file=sys.stderr)
            return EXIT_REJECTED
        case Done():
            return EXIT_OK
        case Value(value=None):
            print(f"phalanx kv: not found: {getattr(command, 'key', '')}", file=sys.stderr)
            return EXIT_NEGATIVE
        case Value(value=bytes() as value):
            out.write(value + b"\n")
            out.flush()
            return EXIT_OK
        case Deleted(existed=existed):
            if not existed:
                print(f"phalanx kv: not found: {getattr(command, 'key', '')}", file=sys.stderr)
            return EXIT_OK if existed else EXIT_NEGATIVE
        case CasResult(succeeded=succeeded, current=current):
            if not succeeded:
                print(f"phalanx kv: cas failed: current value is {_show(current)}",
                      file=sys.stderr)
            return EXIT_OK if succeeded else EXIT_NEGATIVE
        case ScanResult(items=items, more=more):
            for key, value in items:
                out.write(os.fsencode(key) + b"\t" + value + b"\n")
            out.flush()
            if more:
                print("phalanx kv: more keys match; raise --limit to see them", file=sys.stderr)
            return EXIT_OK
        case VersionResult(version=b""):
            print(f"phalanx kv: not found: {getattr(command, 'key', '')}", file=sys.stderr)
            return EXIT_NEGATIVE
        case VersionResult(version=version):
            print(version.hex())
            return EXIT_OK
    raise TypeError(f"unexpected result {result!r}")


def _signer(args: argparse.Namespace, cluster: ClusterConfig) -> TransactionSigner | None:
    """The signing key --client-key / --client-name pick, or None (the cluster's default).
    Raises ValueError (one line) when the protocol does not sign or the key will not load."""
    path_text: str | None = getattr(args, "client_key", None)
    name: str | None = getattr(args, "client_name_key", None)
    if path_text is None and name is None:
        return None
    if path_text is not None and name is not None:
        raise ValueError("give --client-key or --client-name, not both")
    from pathlib import Path

    from phalanx.ops.signing_keys import SigningKeyError, TransactionSigner, client_key_path
    from phalanx.protocols import CallStrategy
    from phalanx.protocols import get as protocol_spec

    if protocol_spec(cluster.protocol).call_strategy is not CallStrategy.ENDORSEMENT:
        raise ValueError(f"protocol {cluster.protocol} does not use client signing keys")
    path = Path(path_text) if path_text is not None else client_key_path(
        cluster.directory, name or "")
    try:
        return TransactionSigner.from_file(path, name)
    except SigningKeyError as e:
        raise ValueError(str(e)) from None


def _kv_main(args: argparse.Namespace) -> int:
    cluster = open_cluster_arg(args, "phalanx kv")
    if cluster is None:
        return EXIT_USAGE
    from phalanx.appspec import get as get_app
    from phalanx.client.kv import KvHelpers

    app = get_app(cluster.app)
    if app.client is None or app.client.load() is not KvHelpers:
        print_error("phalanx kv", f"{args.cluster} runs the {cluster.app} app, not a KV store "
                    f"(see `phalanx {cluster.app} --help`)")
        return EXIT_USAGE
    try:
        command, read_only = build_command(args)
    except ValueError as e:
        print_error("phalanx kv", str(e))
        return EXIT_USAGE
    try:
        signer = _signer(args, cluster)
    except ValueError as e:
        print_error("phalanx kv", str(e))
        return EXIT_USAGE
    import trio  # after the usage checks: a usage error costs no client import

    from phalanx.client.async_client import ClientError, ClientTimeout, RequestRejected
    from phalanx.client.errors import Forbidden, StorageUnavailable, TransactionAborted

    stale = bool(getattr(args, "stale", False))
    requirements = dict(args.require) if args.require else None
    try:
        result = trio.run(lambda: run_kv(
            cluster, command, read_only=read_only, stale=stale, client_timeout=args.timeout,
            signer=signer, requirements=requirements, retry_aborted=args.retry_aborted))
    except ValueError as e:  # --require on a cluster without versions, a leaderless scan
        print_error("phalanx kv", str(e))
        return EXIT_USAGE
    except StorageUnavailable as e:
        print(f"phalanx kv: storage unavailable, the command may or may not have taken "
              f"effect: {e}", file=sys.stderr)
        return EXIT_STORAGE_UNAVAILABLE
    except ClientTimeout as e:
        print(f"phalanx kv: timed out, the command may or may not have taken effect: {e}",
              file=sys.stderr)
        return EXIT_UNKNOWN
    except Forbidden as e:
        print(f"phalanx kv: forbidden: {e}", file=sys.stderr)
        return EXIT_FORBIDDEN
    except TransactionAborted as e:
        # (a node's reason may itself begin with "aborted: ")
        print(f"aborted: {e.reason.removeprefix('aborted: ')}", file=sys.stderr)
        return EXIT_REJECTED
    except RequestRejected as e:
        print(f"phalanx kv: refused: {e}", file=sys.stderr)
        return EXIT_REJECTED
    except ClientError as e:
        print(f"phalanx kv: {e}; the command may or may not have taken effect",
              file=sys.stderr)
        return EXIT_UNKNOWN
    return _print_result(command, result, as_set=args.kv_command == "smembers")


# --------------------------------------------------------------------------------------------
# status


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeStatus:
    """One row of `phalanx status`: a node's reply, or why there is none."""

    node: str
    reply: StatusReply | None
    error: str | None = None

    def to_json(self) -> dict[str, object]:
        r = self.reply
        if r is None:
            return {"node": self.node, "role": "unreachable", "term": None, "leader": None,
                    "commit_index": None, "applied_index": None, "last_checkpoint": None,
                    "peers": [], "connected_peers": [], "error": self.error}
        return {
            "node": self.node, "role": r.role, "term": r.term, "leader": r.leader,
            "commit_index": r.commit_index, "applied_index": r.applied_index,
            "last_checkpoint": r.last_checkpoint, "peers": list(r.peers),
            "connected_peers": list(r.connected_peers), "dropped_messages": r.dropped_messages,
            "protocol": r.protocol, "client_auth": r.client_auth,
        }


async def query_status(cluster: ClusterConfig, *, client_timeout: float) -> list[NodeStatus]:
    """Every node's status, asked concurrently, in cluster order (`client_timeout`: how long
    each node gets to answer)."""
    import trio

    from phalanx.client.async_client import ClientError, ClientTimeout, open_client

    rows: dict[str, NodeStatus] = {}
    async with open_client(cluster, timeout=client_timeout) as client:

        async def ask(node: str) -> None:
            try:
                rows[node] = NodeStatus(node=node, reply=await client.status(node))
            except ClientTimeout as e:
                why = f" ({e.last_error})" if e.last_error else ""
                rows[node] = NodeStatus(
                    node=node, reply=None, error=f"no answer within {client_timeout:g}s{why}"
                )
            except ClientError as e:
                rows[node] = NodeStatus(node=node, reply=None, error=str(e) or type(e).__name__)

        async with trio.open_nursery() as nursery:
            for n in cluster.nodes:
                nursery.start_soon(ask, n.id)
    return [rows[n.id] for n in cluster.nodes]


def format_status_table(rows: Sequence[NodeStatus]) -> str:
    """A fixed-width table, one line per node (what `phalanx status` prints)."""
    header = ("NODE", "ROLE", "TERM", "LEADER", "COMMIT", "APPLIED", "CHECKPOINT", "PEERS")
    lines: list[tuple[str, ...]] = [header]
    for row in rows:
        r = row.reply
        if r is None:
            lines.append((row.node, "unreachable", "-", "-", "-", "-", "-", row.error or ""))
            continue
        connected = set(r.connected_peers)
        peers = " ".join(p if p in connected else f"{p}(down)" for p in r.peers)
        lines.append((r.node, r.role, str(r.term), r.leader or "-", str(r.commit_index),
                      str(r.applied_index), str(r.last_checkpoint), peers))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=False)) + "  " + line[-1]
        for line in lines
    ).rstrip() + "\n"


def _status_main(args: argparse.Namespace) -> int:
    cluster = open_cluster_arg(args, "phalanx status")
    if cluster is None:
        return EXIT_USAGE
    import trio

    rows = trio.run(lambda: query_status(cluster, client_timeout=args.timeout))
    insecure = [r.node for r in rows if r.reply is not None and r.reply.client_auth == "none"]
    if insecure:
        print(f"WARNING: INSECURE: {', '.join(insecure)} run with [client] auth = \"none\": "
              "their client ports accept anyone, with full read and write access",
              file=sys.stderr)
    if args.json:
        print(json.dumps([r.to_json() for r in rows], indent=2))
    else:
        sys.stdout.write(format_status_table(rows))
    return 0 if all(r.reply is not None for r in rows) else 1
