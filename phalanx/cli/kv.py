"""`phalanx kv`: one key-value command against a running cluster (`phalanx status` is
`phalanx.cli.status`'s).

Owns: the command's argparse wiring (`add_kv_command`), `build_command` (arguments to a KV
command) and `run_kv` (one KV command through the client library); printing the result is
`phalanx.cli.kv_output`'s.

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
    7  every node refused the connection (`ClusterUnreachable`): nothing was sent, no effect

(the table shared by every subcommand: `phalanx.cli.errors`). Every error is one line on
stderr.

Start-up: this module's top level is what building the parser needs (argparse, the KV
command types, `phalanx.cli.errors`); trio, the client, the PKI and the cluster files are
imported by the functions that use them, so `phalanx kv --help` or a usage error costs no
client import (`tests/test_packaging.py` holds this).

Must not import: the runtime (`phalanx.runtime.node`), consensus cores, storage. Talks to nodes
through the blocking one-shot client `phalanx.client.quick` (Raft, PBFT: no trio on the path,
for start-up time) or `phalanx.client.async_client` (signed transactions, `delete --prefix`).
Keys are UTF-8 text; values are bytes: arguments are encoded with the file-system encoding
(so any byte survives) and values are written raw to stdout.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Final

from phalanx.apps.kv_types import (
    MAX_SCAN_LIMIT,
    MAX_TXN_OPS,
    Add,
    Compare,
    CompareAndSet,
    Concat,
    Delete,
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
    Txn,
    TxnResult,
)
from phalanx.cli.cluster_arg import (
    CLUSTER_ENV,
    add_cluster_option,
    open_cluster_arg,
)
from phalanx.cli.errors import (
    EXIT_INDETERMINATE,
    EXIT_REFUSED,
    EXIT_STORAGE_UNAVAILABLE,
    client_error_exit,
    int_between,
    print_error,
    utf8_text,
)
from phalanx.cli.kv_signer import signer_from_args
from phalanx.cli.value_args import ValueArgs

if TYPE_CHECKING:  # the handlers import these: building the parser must stay cheap
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
  phalanx kv get greeting --cluster ./demo-cluster -o json  # options go before or after
  phalanx kv --cluster ./demo-cluster put photo @me.jpg     # the value from a file
  printf 'x\ty' | phalanx kv --cluster ./demo-cluster put tabbed -   # ... or from stdin
  phalanx kv --cluster ./demo-cluster get photo --raw > copy.jpg      # bytes, no newline
  phalanx kv --cluster ./demo-cluster scan gr --keys-only
  phalanx kv --cluster ./demo-cluster delete --prefix gr    # prints: deleted N
  phalanx kv --cluster ./demo-cluster txn --if-absent lock --put lock me --put owner me
  phalanx kv --cluster ./demo-cluster txn --if lock=me --delete lock --else-put seen x

Values (put VALUE, cas OLD NEW, txn VALUEs, concat, sadd, srem): "-" reads stdin, @PATH
a file, @@TEXT is the literal @TEXT. Output (-o text, the default): get writes the value
and a newline (--raw: the bytes alone); scan writes KEY<TAB>VALUE lines with backslash,
tab, newline and CR escaped (\\\\, \\t, \\n, \\r), so a line is always one pair. -o json:
one JSON object per line (scan: one per key); bytes that are UTF-8 are
{{"value": TEXT, "encoding": "utf-8"}}, others {{"value": BASE64, "encoding": "base64"}}.

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
  7  connection refused by every node (the cluster is not running?): no effect, at once
  70 internal error (a bug; PHALANX_DEBUG=1 shows the traceback)
KEY and PREFIX must be UTF-8 text; VALUE may be any bytes.
"""



def add_kv_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``phalanx kv put|get|delete|cas|scan|add|mul|sadd|srem|concat|version|
    smembers`` on `subparsers`."""
    kv = subparsers.add_parser(
        "kv", help="read and write keys of a running cluster",
        description="Run one key-value command against a running cluster.",
        epilog=_KV_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_shared_options(kv, suppress=False)
    # The same options after the subcommand (`kv get k --cluster DIR`): SUPPRESS defaults, so
    # a subcommand that is not given one does not overwrite the value given before it.
    shared = argparse.ArgumentParser(add_help=False)
    _add_shared_options(shared, suppress=True)
    sub = kv.add_subparsers(dest="kv_command", metavar="COMMAND", required=True)

    def command(name: str, text: str, **kw: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=text, parents=[shared], **kw)  # type: ignore[arg-type]

    key = utf8_text("KEY")
    put = command("put", "set KEY to VALUE (- reads it from stdin, @PATH from a file)")
    put.add_argument("key", metavar="KEY", type=key, help=_KEY_HELP)
    put.add_argument("value", metavar="VALUE", help=_VALUE_HELP)
    get = command("get", "print the value of KEY (exit 1 if absent)")
    get.add_argument("key", metavar="KEY", type=key, help=_KEY_HELP)
    get.add_argument("--stale", action="store_true",
                     help="read from one node's applied state, possibly behind (faster)")
    get.add_argument("--raw", action="store_true",
                     help="write the value's bytes alone, without the newline")
    delete = command("delete", "remove KEY (exit 1 if it was absent); --prefix: every key "
                     "starting with it")
    delete.add_argument("key", metavar="KEY", type=key,
                        help="the key (with --prefix: the prefix)")
    delete.add_argument("--prefix", action="store_true",
                        help="delete every key starting with KEY, in atomic batches of up to "
                        f"{MAX_TXN_OPS} (each guarded by the values it read); prints the count")
    cas = command("cas", "set KEY to NEW iff it holds OLD (exit 1 if not)",
                  description="Compare and set: KEY OLD NEW, or --if-absent KEY NEW.")
    cas.add_argument("--if-absent", action="store_true",
                     help="succeed only if KEY is absent (then give KEY NEW)")
    cas.add_argument("key", metavar="KEY", type=key, help=_KEY_HELP)
    cas.add_argument("values", metavar="OLD NEW", nargs="+",
                     help="the value expected, then the new one (- or @PATH as for put)")
    scan = command("scan", "print KEY<TAB>VALUE lines for keys starting with PREFIX")
    scan.add_argument("prefix", metavar="PREFIX", nargs="?", default="",
                      type=utf8_text("PREFIX"), help="keys starting with it (default: all)")
    scan.add_argument("--limit", type=int_between(1, MAX_SCAN_LIMIT), default=1000,
                      help=f"at most this many, 1..{MAX_SCAN_LIMIT} (default: 1000)")
    scan.add_argument("--keys-only", action="store_true", help="print the keys alone")
    txn = command(
        "txn", "atomically: if every --if holds, run the --put/--delete writes, else the "
        "--else-put/--else-delete ones",
        description="An etcd-style transaction, applied in one step. Exit 0 if the guards "
        "held, 1 if the else branch ran.",
    )
    txn.add_argument("--if", dest="guards", metavar="KEY=VALUE", action="append", default=[],
                     help="guard: KEY holds VALUE (KEY= for the empty value; repeatable)")
    txn.add_argument("--if-absent", dest="absent_guards", metavar="KEY", action="append",
                     default=[], type=key, help="guard: KEY is absent (repeatable)")
    for flag, branch in (("", "then"), ("else-", "else")):
        txn.add_argument(f"--{flag}put", dest=branch, nargs=2, metavar=("KEY", "VALUE"),
                         action=_TxnWriteAction, default=[],
                         help=f"in the {branch} branch: set KEY to VALUE (repeatable, in order)")
        txn.add_argument(f"--{flag}delete", dest=branch, nargs=1, metavar="KEY",
                         action=_TxnWriteAction, default=[],
                         help=f"in the {branch} branch: delete KEY (repeatable, in order)")
    parsers = [put, get, delete, cas, scan, txn]
    for name, operand, text in _UPDATES:
        update = command(name, text)
        update.add_argument("key", metavar="KEY", type=key, help=_KEY_HELP)
        if operand == "N":
            update.add_argument("operand", metavar=operand, type=_int64,
                                help="a decimal signed 64-bit integer")
        else:
            update.add_argument("operand", metavar=operand, help=_VALUE_HELP)
        parsers.append(update)
    for name, text in (("version", "print KEY's version: SHA-512 of its value, in hex "
                                   "(exit 1 if absent)"),
                       ("smembers", "print the members of the set at KEY, one a line")):
        read = command(name, text)
        read.add_argument("key", metavar="KEY", type=key, help=_KEY_HELP)
        read.add_argument("--stale", action="store_true",
                          help="read from one node's applied state, possibly behind (faster)")
        parsers.append(read)
    for p in parsers:
        p.set_defaults(handler=_kv_main)


def _add_shared_options(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    """The options every kv subcommand takes, before or after it."""
    default = argparse.SUPPRESS if suppress else None
    add_cluster_option(parser, suppress=suppress)
    parser.add_argument("-o", "--output", choices=("text", "json"),
                        default=argparse.SUPPRESS if suppress else "text",
                        help="text (default) or json: one JSON object per line, bytes as UTF-8 "
                        "text or base64")
    parser.add_argument("--client-key", metavar="PATH", default=default,
                        help="leaderless: sign with this client signing key file")
    parser.add_argument("--client-name", dest="client_name_key", metavar="NAME", default=default,
                        help="leaderless: sign with DIR/clients/NAME.signing.key")
    parser.add_argument("--require", metavar="KEY=VERSION", action="append", default=default,
                        type=_requirement,
                        help="leaderless: commit only where KEY's version (hex; empty: absent) "
                        "is VERSION (repeatable; default: read it first)")
    parser.add_argument("--retry-aborted", action="store_true",
                        default=argparse.SUPPRESS if suppress else False,
                        help="leaderless: after an abort, read the versions again and retry")


class _TxnWriteAction(argparse.Action):
    """Appends ``("put", KEY, VALUE)`` / ``("delete", KEY)`` to one list per branch, so the
    writes keep the order they were given in."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        items = list(values) if isinstance(values, list) else [values]
        kind = "delete" if option_string is not None and option_string.endswith("delete") \
            else "put"
        current = list(getattr(namespace, self.dest, None) or [])
        current.append((kind, *items))
        setattr(namespace, self.dest, current)


_KEY_HELP = "the key (UTF-8 text)"
_VALUE_HELP = "bytes: the text itself, - for stdin, @PATH for a file's bytes, @@TEXT for @TEXT"

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




# --------------------------------------------------------------------------------------------
# kv


def _bytes(text: str) -> bytes:
    return os.fsencode(text)


def _txn(args: argparse.Namespace, value: ValueArgs) -> Txn:
    compares: list[Compare] = []
    for guard in args.guards:
        k, sep, v = guard.partition("=")
        if not sep or not k:
            raise ValueError(f"--if takes KEY=VALUE, got {guard!r}")
        compares.append(Compare(key=k, expected=value(v)))
    compares.extend(Compare(key=k, expected=None) for k in args.absent_guards)

    def writes(items: list[tuple[str, ...]]) -> tuple[Put | Delete, ...]:
        return tuple(Put(key=w[1], value=value(w[2])) if w[0] == "put" else Delete(key=w[1])
                     for w in items)

    success, failure = writes(args.then), writes(getattr(args, "else"))
    if not (success or failure):
        raise ValueError("txn needs at least one write (--put, --delete, --else-put, "
                         "--else-delete)")
    return Txn(compares=tuple(compares), success=success, failure=failure)


def build_command(args: argparse.Namespace) -> tuple[KvCommand, bool]:
    """The KV command `args` asks for and whether it is read-only. Value arguments may come
    from stdin (``-``) or a file (``@PATH``): `ValueArgs`.

    Raises:
        ValueError: the arguments do not make a command (message for the operator).
    """
    value = ValueArgs()
    match args.kv_command:
        case "put":
            return Put(key=args.key, value=value(args.value)), False
        case "get":
            return Get(key=args.key), True
        case "delete":
            return Delete(key=args.key), False
        case "cas":
            values: list[str] = args.values
            if args.if_absent:
                if len(values) != 1:
                    raise ValueError("cas --if-absent takes KEY NEW")
                return CompareAndSet(key=args.key, expected=None, new=value(values[0])), False
            if len(values) != 2:
                raise ValueError("cas takes KEY OLD NEW (or --if-absent KEY NEW)")
            return CompareAndSet(
                key=args.key, expected=value(values[0]), new=value(values[1])
            ), False
        case "txn":
            return _txn(args, value), False
        case "scan":
            if args.limit < 1:
                raise ValueError("--limit must be >= 1")
            return Scan(prefix=args.prefix, limit=args.limit), True
        case "add":
            return Add(key=args.key, amount=args.operand), False
        case "mul":
            return Mul(key=args.key, factor=args.operand), False
        case "sadd":
            return SAdd(key=args.key, member=value(args.operand)), False
        case "srem":
            return SRem(key=args.key, member=value(args.operand)), False
        case "concat":
            return Concat(key=args.key, suffix=value(args.operand)), False
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
    # a command line tool: "connection refused by every node" at once, not after the timeout
    options: ClientOptions = {"timeout": client_timeout, "fail_fast": True}
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


KV_HELPERS: Final = "phalanx.client.kv:KvHelpers"
"""The KV app's client helpers (`phalanx.appspec.builtin.KV.client`): apps whose spec names
them are KV stores."""


def _call(cluster: ClusterConfig, command: KvCommand, *, read_only: bool, stale: bool,
          client_timeout: float, signer: TransactionSigner | None,
          requirements: dict[str, bytes] | None, retry_aborted: bool) -> KvResult:
    """One KV command: through the blocking one-shot client (`phalanx.client.quick`: no
    trio, no async client, for start-up time) where it can serve it, else `run_kv`."""
    from phalanx.client import quick

    if signer is None and not requirements and quick.supports(cluster):
        from phalanx.apps import kv_wire
        from phalanx.net.client_protocol import ReadConsistency

        raw = quick.quick_call(
            cluster, kv_wire.encode_command(command), read_only=read_only,
            consistency=ReadConsistency.STALE if stale else ReadConsistency.LINEARIZABLE,
            timeout=client_timeout)
        return kv_wire.decode_result(raw)
    import trio

    return trio.run(lambda: run_kv(
        cluster, command, read_only=read_only, stale=stale, client_timeout=client_timeout,
        signer=signer, requirements=requirements, retry_aborted=retry_aborted))


_PREFIX_ROUNDS: Final = 20


async def delete_prefix(cluster: ClusterConfig, prefix: str, *, client_timeout: float,
                        signer: TransactionSigner | None = None) -> int:
    """Delete every key starting with `prefix`; returns how many were deleted.

    In rounds: scan up to `MAX_TXN_OPS` keys, then one `Txn` that deletes them only if each
    still holds the value the scan saw (so a key written meanwhile is not deleted blind);
    each round is atomic, the whole is not. A round whose guards fail is retried, up to
    `_PREFIX_ROUNDS` failed rounds in all (then ValueError: the keys keep changing).
    """
    from phalanx.protocols import CallStrategy
    from phalanx.protocols import get as protocol_spec

    # Leaderless scans are stale reads (one node); the guards make the delete safe anyway.
    stale = protocol_spec(cluster.protocol).call_strategy is CallStrategy.ENDORSEMENT
    deleted = failed = 0
    while True:
        scan = await run_kv(cluster, Scan(prefix=prefix, limit=MAX_TXN_OPS), read_only=True,
                            stale=stale, client_timeout=client_timeout, signer=signer)
        if not isinstance(scan, ScanResult):
            raise ValueError(f"scan of {prefix!r} failed: {scan}")
        if not scan.items:
            return deleted
        txn = Txn(compares=tuple(Compare(key=k, expected=v) for k, v in scan.items),
                  success=tuple(Delete(key=k) for k, _ in scan.items))
        result = await run_kv(cluster, txn, read_only=False, stale=False,
                              client_timeout=client_timeout, signer=signer)
        if isinstance(result, TxnResult) and result.succeeded:
            deleted += len(scan.items)
            continue
        if isinstance(result, KvError):
            raise ValueError(f"delete --prefix refused: {result.message}")
        failed += 1
        if failed >= _PREFIX_ROUNDS:
            raise ValueError(f"keys under {prefix!r} kept changing during delete --prefix "
                             f"({deleted} deleted); run it again")


def _kv_main(args: argparse.Namespace) -> int:
    cluster = open_cluster_arg(args, "phalanx kv")
    if cluster is None:
        return EXIT_USAGE
    from phalanx.appspec import get as get_app

    app = get_app(cluster.app)  # (the helpers' reference, not loaded: no async client)
    if getattr(app.client, "target", None) != KV_HELPERS:
        print_error("phalanx kv", f"{args.cluster} runs the {cluster.app} app, not a KV store "
                    f"(see `phalanx {cluster.app} --help`)")
        return EXIT_USAGE
    try:
        command, read_only = build_command(args)
    except ValueError as e:
        print_error("phalanx kv", str(e))
        return EXIT_USAGE
    try:
        signer = signer_from_args(args, cluster)
    except ValueError as e:
        print_error("phalanx kv", str(e))
        return EXIT_USAGE
    from phalanx.client.errors import (
        ClientError,
        StorageUnavailable,
        TransactionAborted,
    )

    stale = bool(getattr(args, "stale", False))
    requirements = dict(args.require) if args.require else None
    try:
        if args.kv_command == "delete" and args.prefix:
            import trio

            deleted = trio.run(lambda: delete_prefix(
                cluster, args.key, client_timeout=args.timeout, signer=signer))
            if args.output == "json":
                import json

                print(json.dumps({"prefix": args.key, "deleted": deleted}))
            else:
                print(f"deleted {deleted}")
            return EXIT_OK if deleted else EXIT_NEGATIVE
        result = _call(cluster, command, read_only=read_only, stale=stale,
                       client_timeout=args.timeout, signer=signer, requirements=requirements,
                       retry_aborted=args.retry_aborted)
    except ValueError as e:  # --require on a cluster without versions, a leaderless scan
        print_error("phalanx kv", str(e))
        return EXIT_USAGE
    except StorageUnavailable as e:
        print(f"phalanx kv: storage unavailable, the command may or may not have taken "
              f"effect: {e}", file=sys.stderr)
        return EXIT_STORAGE_UNAVAILABLE
    except TransactionAborted as e:
        # (a node's reason may itself begin with "aborted: ")
        print(f"aborted: {e.reason.removeprefix('aborted: ')}", file=sys.stderr)
        return EXIT_REJECTED
    except ClientError as e:
        return client_error_exit("phalanx kv", e)
    from phalanx.cli.kv_output import print_result

    return print_result(command, result, fmt=args.output, as_set=args.kv_command == "smembers",
                        raw=bool(getattr(args, "raw", False)),
                        keys_only=bool(getattr(args, "keys_only", False)))
