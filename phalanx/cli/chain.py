"""`phalanx chain`: the blockchain app's command line over a running cluster.

Owns: the argparse wiring (`add_chain_command`), account resolution (a key NAME in
DIR/chain/keys or 64 hex digits), the output of every subcommand, and the mapping of
failures to the exit table of `phalanx.cli.errors` (one line on stderr each):

    0  success (verify: the proof verified; validate: the chain is valid)
    1  a negative answer: verify did not verify, validate found the chain invalid
    2  usage error: bad arguments, a malformed key or account, no cluster at DIR, a
       cluster that does not run the chain app (nothing was sent)
    3  refused by the chain (insufficient balance, stale nonce, ...): no effect
    4  timed out: the transaction may or may not have taken effect
    6  forbidden (this client's certificate may not write)

Start-up: the top level needs argparse and `phalanx.cli.errors` only; trio, the client and
the chain modules load in the handler (`phalanx chain --help` costs no client import).

Must not import: the runtime, consensus cores. Talks to nodes only through the client.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from phalanx.cli.cluster_arg import CLUSTER_ENV
from phalanx.cli.errors import (
    EXIT_FORBIDDEN,
    EXIT_INDETERMINATE,
    EXIT_NEGATIVE,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    int_between,
    positive_float,
    print_error,
)

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from phalanx.apps.chain.block import BlockHeader
    from phalanx.apps.chain.types import Genesis
    from phalanx.client.chain import ChainClient
    from phalanx.ops.node_config import ClusterConfig

PROG: Final = "phalanx chain"
MAX_AMOUNT: Final = (1 << 63) - 1

_EPILOG = f"""\
examples:
  phalanx cluster init ./ch --app chain --protocol pbft --nodes 4
  phalanx cluster up ./ch                            # runs until Ctrl-C; then, elsewhere:
  phalanx chain --cluster ./ch balance a1            # a1..a5 hold 1000000 at genesis
  phalanx chain --cluster ./ch keygen bob            # a new (empty) account key
  phalanx chain --cluster ./ch transfer --from a1 bob 250
  phalanx chain --cluster ./ch block 1               # header fields and transactions
  phalanx chain --cluster ./ch tail                  # follow new blocks (Ctrl-C stops)
  phalanx chain --cluster ./ch verify bob --replica n3
  phalanx chain --cluster ./ch export chain.bin      # blocks with their certificates
  phalanx chain --cluster ./ch validate chain.bin    # certificates checked too

ACCOUNT is a key name in DIR/chain/keys (its public key) or 64 hex digits (a raw Ed25519
public key). Transactions are signed with the --from key at the sender's next nonce
(read first; --nonce N to choose it). Reads are linearizable unless --stale.

verify asks ONE replica (--replica, default the first node) for the account's Merkle
proof and the block header of that height with its block certificate (signatures of a
quorum of the nodes' keys in cluster.toml: n - f under PBFT, a majority under Raft),
collected by the nodes' block-certifier service (`cluster init --app chain` enables it).
The header is trusted by the certificate; a bad certificate fails verify; only when the
replica has none yet does verify fall back to f+1 replicas reporting the header alike.
block N shows the certificate: its signers, the quorum and whether it verifies.
export puts in each block the certificate a node stored for it (only ones that verify;
a block no node certified stays bare); validate (no running cluster needed) checks each
carried certificate against the node keys and quorum of --cluster (a bad one: INVALID),
and reports how many blocks are certified.

exit status: 0 success; 1 verify/validate failed; 2 usage error (nothing sent);
3 refused by the chain, no effect; 4 timed out, may or may not have taken effect;
6 forbidden; 70 internal error. --cluster defaults to ${CLUSTER_ENV}.
"""


_TX_EPILOG = """\
prints "ok <tx id> in block <height>". A transfer is checked first against the sender's
balance and last nonce: one that would certainly be refused is not sent (exit 3).
exit status: 0 ordered and executed; 2 usage error (bad key, account or amount: nothing
sent); 3 refused (insufficient_balance, stale_nonce, not_minter...: no effect); 4 timed
out (may or may not have taken effect).
"""


class _UsageProblem(Exception):
    """A usage problem found after the cluster was opened (one line, exit 2)."""


def add_chain_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``phalanx chain`` and its subcommands on `subparsers`."""
    p = subparsers.add_parser(
        "chain", help="accounts, transfers, blocks and proofs of a chain cluster",
        description="Use the blockchain app of a running cluster (`cluster init --app "
                    "chain`): keys, transfers, balances, blocks, proofs, export/validate.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cluster", metavar="DIR", default=os.environ.get(CLUSTER_ENV),
                   help=f"the cluster directory (default: ${CLUSTER_ENV})")
    p.add_argument("--timeout", type=positive_float, default=5.0, metavar="SECONDS",
                   help="give up after this long (default: %(default)s)")
    sub = p.add_subparsers(dest="chain_command", metavar="SUBCOMMAND", required=True)
    keygen = sub.add_parser("keygen", help="create an account key DIR/chain/keys/NAME.key")
    keygen.add_argument("name", metavar="NAME", help="the account key's name")
    sub.add_parser("accounts", help="list the account keys and their public keys")
    for name, text in (("transfer", "send AMOUNT from the --from key's account to ACCOUNT"),
                       ("mint", "create AMOUNT for ACCOUNT (the genesis minter only)")):
        t = sub.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".",
                           epilog=_TX_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
        t.add_argument("--from", dest="sender", required=True, metavar="KEY",
                       help="the signing key: a name in DIR/chain/keys or a key file path")
        t.add_argument("to", metavar="ACCOUNT",
                       help="the recipient: a key name in DIR/chain/keys or 64 hex digits")
        t.add_argument("amount", type=int_between(1, MAX_AMOUNT), metavar="AMOUNT",
                       help=f"a whole number of tokens, 1..{MAX_AMOUNT}")
        t.add_argument("--nonce", type=int_between(1, (1 << 64) - 1), default=None,
                       help="the transaction's nonce (default: the sender's last + 1)")
    for name, text in (("balance", "an account's balance"), ("nonce", "its last nonce"),
                       ("proof", "its Merkle proof against the last block")):
        q = sub.add_parser(name, help=text)
        q.add_argument("account", metavar="ACCOUNT",
                       help="a key name (`chain keygen`) or the account's 64 hex digits")
        q.add_argument("--stale", action="store_true", help="ask one node (maybe behind)")
    head = sub.add_parser("head", help="the last block's height, hash and state root")
    head.add_argument("--stale", action="store_true", help="ask one node (maybe behind)")
    block = sub.add_parser("block", help="block N's header and transactions")
    block.add_argument("height", type=int_between(1), metavar="N",
                       help="the block height (1 = first)")
    tail = sub.add_parser("tail", help="print new blocks as they are committed")
    tail.add_argument("--from-height", type=int_between(1), default=None, metavar="H",
                      help="start at block H (default: the next block)")
    tail.add_argument("--count", type=int_between(1), default=None, metavar="K",
                      help="stop after K blocks (default: until Ctrl-C)")
    verify = sub.add_parser("verify", help="light client: verify an account's balance "
                                           "against one replica's proof")
    verify.add_argument("account", metavar="ACCOUNT",
                        help="a key name (`chain keygen`) or the account's 64 hex digits")
    verify.add_argument("--replica", metavar="NODE", default=None,
                        help="the (possibly Byzantine) replica to ask (default: first node)")
    export = sub.add_parser("export", help="write the chain (genesis + blocks) to FILE")
    export.add_argument("file", type=Path, metavar="FILE",
                        help="where to write it (each block with the certificate a node "
                             "stored for it, when one verifies)")
    text = ("check an exported chain: links, tx roots, re-execution, state roots, and the "
            "block certificates it carries (against the node keys and quorum of --cluster, "
            "which need not be running; without --cluster they are not checked)")
    validate = sub.add_parser("validate", help=text, description=text[0].upper() + text[1:]
                              + ". Exit 0 valid, 1 invalid (one line: the first bad block).")
    validate.add_argument("file", type=Path, metavar="FILE",
                          help="a file written by `phalanx chain export`")
    p.set_defaults(handler=_main)


def _open(args: argparse.Namespace) -> tuple[ClusterConfig, Genesis]:
    """The cluster at --cluster (running the chain app) and its genesis."""
    from phalanx.appspec import AppConfigError
    from phalanx.appspec import get as get_app
    from phalanx.appspec.chain_app import read_genesis
    from phalanx.ops.local_cluster import open_cluster
    from phalanx.ops.node_config import check_cluster_files

    if not args.cluster:
        raise _UsageProblem(f"no cluster given (use --cluster DIR or set ${CLUSTER_ENV})")
    cluster = open_cluster(args.cluster)
    check_cluster_files(cluster)
    from phalanx.client.chain import ChainClient

    spec = get_app(cluster.app)
    if spec.client is None or spec.client.load() is not ChainClient:
        raise _UsageProblem(f"{args.cluster} runs the {cluster.app} app, not a chain "
                            "(create one with `cluster init --app chain`)")
    try:
        return cluster, read_genesis(cluster.app_files["genesis"])
    except AppConfigError as e:
        raise _UsageProblem(str(e)) from None


def _account(cluster_dir: Path, text: str) -> bytes:
    """ACCOUNT: a key name in DIR/chain/keys, or 64 hex digits."""
    from phalanx.apps.chain.tx import public_key
    from phalanx.appspec.chain_app import KEY_NAME, account_key, key_path

    if len(text) == 64:
        try:
            return bytes.fromhex(text)
        except ValueError:
            pass
    if KEY_NAME.fullmatch(text) and key_path(cluster_dir, text).is_file():
        return public_key(account_key(key_path(cluster_dir, text)))
    raise _UsageProblem(f"account {text!r}: neither a key name in "
                        f"{cluster_dir / 'chain' / 'keys'} nor 64 hex digits")


def _signing_key(cluster_dir: Path, text: str) -> Ed25519PrivateKey:
    from phalanx.appspec.chain_app import KEY_NAME, account_key, key_path

    path = (key_path(cluster_dir, text) if KEY_NAME.fullmatch(text)
            and not Path(text).is_file() else Path(text))
    return account_key(path)


def _main(args: argparse.Namespace) -> int:
    from phalanx.appspec import AppConfigError
    from phalanx.cli.errors import OperatorError

    if args.chain_command == "validate":
        return _validate(args)
    try:
        cluster, genesis = _open(args)
        if args.chain_command == "keygen":
            return _keygen(cluster.directory, args.name)
        if args.chain_command == "accounts":
            return _accounts(cluster.directory)
        prepared = _prepare(args, cluster.directory)
    except (_UsageProblem, OperatorError, AppConfigError) as e:
        print_error(PROG, str(e))
        return EXIT_USAGE
    import trio

    from phalanx.client.chain import ChainCommandError
    from phalanx.client.errors import ClientError, ClientTimeout, Forbidden, RequestRejected

    try:
        return trio.run(_run, args, cluster, genesis, prepared)
    except ChainCommandError as e:
        print(f"{PROG}: refused: {e} (no effect)", file=sys.stderr)
        return EXIT_REFUSED
    except Forbidden as e:
        print(f"{PROG}: forbidden: {e}", file=sys.stderr)
        return EXIT_FORBIDDEN
    except RequestRejected as e:
        print(f"{PROG}: refused: {e}", file=sys.stderr)
        return EXIT_REFUSED
    except ClientTimeout as e:
        print(f"{PROG}: timed out, the command may or may not have taken effect: {e}",
              file=sys.stderr)
        return EXIT_INDETERMINATE
    except ClientError as e:
        print(f"{PROG}: {e}; the command may or may not have taken effect", file=sys.stderr)
        return EXIT_INDETERMINATE
    except OSError as e:
        print_error(PROG, f"{getattr(e, 'filename', '')}: {e.strerror or e}")
        return EXIT_USAGE


@dataclass(frozen=True, slots=True, kw_only=True)
class _Inputs:
    """A subcommand's arguments resolved before anything is sent."""

    account: bytes = b""
    to: bytes = b""
    key: Ed25519PrivateKey | None = None


def _prepare(args: argparse.Namespace, cluster_dir: Path) -> _Inputs:
    """Everything resolvable before sending (keys, accounts): a usage error sends nothing."""
    if args.chain_command == "export" and not args.file.parent.is_dir():
        raise _UsageProblem(f"{args.file.parent} is not a directory")
    account = getattr(args, "account", None)
    to = getattr(args, "to", None)
    return _Inputs(
        account=_account(cluster_dir, account) if account is not None else b"",
        to=_account(cluster_dir, to) if to is not None else b"",
        key=_signing_key(cluster_dir, args.sender) if to is not None else None)


def _keygen(cluster_dir: Path, name: str) -> int:
    from phalanx.appspec.chain_app import key_path, new_key

    path = key_path(cluster_dir, name)
    account = new_key(path)
    print(f"{name} {account.hex()} ({path})")
    return EXIT_OK


def _accounts(cluster_dir: Path) -> int:
    from phalanx.appspec.chain_app import key_names

    for name in key_names(cluster_dir):
        print(f"{name} {_account(cluster_dir, name).hex()}")
    return EXIT_OK


def _describe(header: BlockHeader, txs: tuple[bytes, ...] = ()) -> list[str]:
    from phalanx.apps.chain.block import block_hash
    from phalanx.apps.chain.tx import decode_tx
    from phalanx.apps.chain.types import ChainError

    lines = [f"block {header.height} {block_hash(header).hex()}",
             f"  prev_hash  {header.prev_hash.hex()}", f"  tx_root    {header.tx_root.hex()}",
             f"  state_root {header.state_root.hex()}",
             f"  timestamp  {header.timestamp}  proposer {header.proposer or '-'}",
             f"  txs        {len(txs)}"]
    for raw in txs:
        tx = decode_tx(raw)
        if isinstance(tx, ChainError):
            lines.append(f"    (undecodable: {tx})")
            continue
        shown = " ".join(a.hex()[:16] if isinstance(a, bytes) else str(a) for a in tx.args)
        lines.append(f"    {tx.tx_id.hex()[:16]} {tx.sender.hex()[:16]} nonce {tx.nonce} "
                     f"{tx.method} {shown}")
    return lines


async def _run(args: argparse.Namespace, cluster: ClusterConfig, genesis: Genesis,
               prepared: _Inputs) -> int:
    from phalanx.apps.chain.block import chain_id
    from phalanx.client.async_client import open_client
    from phalanx.client.chain import ChainClient

    command = args.chain_command
    if command == "verify":
        return await _verify(args, cluster, genesis, prepared)
    from phalanx.client.errors import ClientError

    failure: ClientError | OSError | None = None
    code = EXIT_OK
    async with open_client(cluster, timeout=args.timeout) as client:
        try:
            chain = ChainClient(client, chain_id(genesis))
            code = await _call(args, cluster, genesis, chain, prepared)
        except (ClientError, OSError) as e:  # raised here, not in the client's ExceptionGroup
            failure = e
    if failure is not None:
        raise failure
    return code


async def _call(args: argparse.Namespace, cluster: ClusterConfig, genesis: Genesis,
                chain: ChainClient, prepared: _Inputs) -> int:

    command, stale = args.chain_command, bool(getattr(args, "stale", False))
    account, to, key = prepared.account, prepared.to, prepared.key
    if command in ("transfer", "mint"):
        assert key is not None  # `_prepare` resolved it
        if command == "transfer":  # refused before sending when it certainly would be
            done = await chain.transfer(key, to, args.amount, nonce=args.nonce, precheck=True)
        else:
            done = await chain.mint(key, to, args.amount, nonce=args.nonce)
        print(f"ok {done.tx_id.hex()} in block {done.height}")
    elif command in ("balance", "nonce"):
        read = chain.balance if command == "balance" else chain.nonce
        print(await read(account, stale=stale))
    elif command == "proof":
        reply = await chain.proof(account, stale=stale)
        print(f"height {reply.height} block {reply.block_hash.hex()}\n"
              f"state_root {reply.state_root.hex()}\n"
              f"value {reply.value.hex() if reply.value is not None else '(absent)'}\n"
              f"proof {reply.proof.hex()}")
    elif command == "head":
        head = await chain.head(stale=stale)
        print(f"height {head.height} block {head.block_hash.hex()} "
              f"state_root {head.state_root.hex()}")
    elif command == "block":
        header, txs = await chain.block(args.height)
        print("\n".join(_describe(header, txs)))
        print(await _certificate_line(cluster, genesis, header))
    elif command == "tail":
        await _tail(chain, args.from_height, args.count)
    else:
        assert command == "export"
        from phalanx.client.chain_export import attach_certificates, fetch_chain, write_export

        blocks = await fetch_chain(chain)
        got = await attach_certificates(cluster, genesis, blocks,
                                        seconds=min(args.timeout, 2.0))
        write_export(args.file, genesis, got.blocks)
        notes = [f"{got.refused} served certificates did not verify"] if got.refused else []
        if got.unreachable:
            notes.append(f"no certificates from {', '.join(got.unreachable)}: not "
                         "answering, or the block-certifier service is off")
        print(f"exported {len(blocks)} blocks ({got.certified} with a certificate) to "
              f"{args.file}" + (f" ({'; '.join(notes)})" if notes else ""))
    return EXIT_OK


async def _certificate_line(cluster: ClusterConfig, genesis: Genesis,
                            header: BlockHeader) -> str:
    """`block N`'s certificate line: the first certificate a node serves for the block."""
    from phalanx.client.chain_light import find_certificate

    view, source = await find_certificate(cluster, genesis, header)
    if view is None:
        return f"  certificate none ({source})"
    verdict = {True: "valid", False: "INVALID", None: "unchecked (cluster.toml has no "
               "node keys)"}[view.valid]
    return (f"  certificate {','.join(view.signers)} ({len(view.signers)} of {view.nodes} "
            f"nodes, quorum {view.quorum}) {verdict}, from {source}")


async def _tail(chain: ChainClient, start: int | None, count: int | None) -> None:
    import trio

    height = start if start is not None else (await chain.head()).height + 1
    shown = 0
    while count is None or shown < count:
        if (await chain.head()).height < height:
            await trio.sleep(0.2)
            continue
        header, txs = await chain.block(height)
        print("\n".join(_describe(header, txs)), flush=True)
        height += 1
        shown += 1


async def _verify(args: argparse.Namespace, cluster: ClusterConfig, genesis: Genesis,
                  prepared: _Inputs) -> int:
    from phalanx.client.chain_light import verify_from_replica

    account = prepared.account
    replica = args.replica or cluster.nodes[0].id
    if replica not in {n.id for n in cluster.nodes}:
        print_error(PROG, f"no node {replica!r} (nodes: "
                          f"{', '.join(n.id for n in cluster.nodes)})")
        return EXIT_USAGE
    v = await verify_from_replica(cluster, genesis, account, replica, within=args.timeout)
    if not v.ok:
        print(f"NOT VERIFIED: {v.reason}", file=sys.stderr)
        return EXIT_NEGATIVE
    assert v.header is not None
    print(f"verified: balance {v.balance} nonce {v.nonce} at block {v.header.height} "
          f"(proof from {replica}; header trusted by {v.trusted_by})")
    return EXIT_OK


def _validate(args: argparse.Namespace) -> int:
    from phalanx.apps.chain.block import chain_id
    from phalanx.apps.chain.validate import ChainInvalid, decode_blocks, validate_chain
    from phalanx.appspec import AppConfigError
    from phalanx.cli.errors import OperatorError
    from phalanx.client.chain_export import ExportFormatError, read_export
    from phalanx.client.chain_light import cluster_keys, cluster_quorum

    path: Path = args.file
    try:
        genesis, data = read_export(path)
    except ExportFormatError as e:
        print_error(PROG, str(e))
        return EXIT_USAGE
    except OSError as e:
        print_error(PROG, f"{path}: {e.strerror or e}")
        return EXIT_USAGE
    keys: dict[str, bytes] | None = None
    quorum = 0
    if args.cluster:
        try:
            cluster, cluster_genesis = _open(args)
        except (_UsageProblem, OperatorError, AppConfigError) as e:
            print_error(PROG, str(e))
            return EXIT_USAGE
        if chain_id(cluster_genesis) != chain_id(genesis):
            print_error(PROG, f"{path} is another chain than {args.cluster}'s (chain id "
                              f"{chain_id(genesis).hex()[:16]}..., the cluster's "
                              f"{chain_id(cluster_genesis).hex()[:16]}...): give the "
                              "cluster it was exported from")
            return EXIT_USAGE
        keys, quorum = cluster_keys(cluster), cluster_quorum(cluster)
    blocks = decode_blocks(data)
    if isinstance(blocks, ChainInvalid):
        print(f"INVALID: {blocks}", file=sys.stderr)
        return EXIT_NEGATIVE
    if keys is not None:
        result = validate_chain(genesis, blocks, node_keys=keys, quorum=quorum,
                                require_proof=False)
    else:
        result = validate_chain(genesis, blocks)
    if isinstance(result, ChainInvalid):
        print(f"INVALID: {result}", file=sys.stderr)
        return EXIT_NEGATIVE
    carried = sum(1 for header, _ in blocks if header.consensus_proof)
    if keys is not None:
        certs = (f"{result.certified} of {result.height} blocks certified (quorum {quorum} of "
                 f"{len(keys)} node keys, every certificate verified)")
    elif args.cluster:
        certs = (f"{carried} blocks carry a certificate, not checked ({args.cluster} has no "
                 "node signing keys)")
    else:
        certs = (f"{carried} blocks carry a certificate, not checked (give --cluster DIR "
                 "to check them against its node keys)")
    print(f"valid: {result.height} blocks, head {result.head_hash.hex()}, "
          f"state_root {result.state_root.hex()}; {certs}")
    return EXIT_OK
