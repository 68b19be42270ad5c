"""`phalanx snapshot save|restore`: back up a running cluster's state into one checksummed
file, and make a new cluster from such a file (`phalanx.ops.backup`).

Owns: the command's parsers and handlers; each prints one line saying what it did. Errors
are one line on stderr: 2 a usage or file problem (a damaged backup, a non-empty --into),
3 the node refused, 4 no answer in time, 6 not an admin certificate.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from phalanx.cli.cluster_arg import CLUSTER_ENV, add_cluster_option, open_cluster_arg
from phalanx.cli.errors import (
    EXIT_FORBIDDEN,
    EXIT_INDETERMINATE,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    int_between,
    print_error,
)

_EPILOG = f"""\
examples:
  phalanx snapshot save --cluster ./c backup-$(date +%F).phx
  phalanx snapshot restore backup-2026-12-02.phx --into ./c-restored
  phalanx cluster up ./c-restored

save: asks every node for its commit index, then one node (--node, else the one that
applied most) writes its state at an index at least that high into DATA_DIR/backup/, and
reads it from the node over the client port: every write acknowledged before the save is
in the backup. FILE holds that checkpoint, its index, where it came from, and SHA-256
checksums. Uses DIR/clients/admin.pem (--as NAME for another admin).

restore: creates a NEW cluster at --into (a new CA and keys: it can never join the old
cluster), with the backup's protocol and app, every node starting from the backup. It does
not start the nodes. --cluster defaults to ${CLUSTER_ENV}.

docs/OPERATIONS.md, "Backup and restore", has the whole procedure.
"""


def add_snapshot_command(
        subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``phalanx snapshot save|restore``."""
    snapshot = subparsers.add_parser(
        "snapshot", help="back up a running cluster into a file; restore it as a new cluster",
        description="Back up a running cluster's state, and restore it into a new cluster.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = snapshot.add_subparsers(dest="snapshot_command", metavar="SUBCOMMAND", required=True)
    save = sub.add_parser(
        "save", help="write a consistent, checksummed checkpoint of the cluster into FILE",
        description="Write a consistent checkpoint of a running cluster (every write "
                    "acknowledged before the save) into FILE.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    save.add_argument("file", metavar="FILE", help="the backup file to write (replaced)")
    save.add_argument("--node", metavar="NODE",
                      help="the node to take it from (default: the one that applied most)")
    add_cluster_option(save)
    save.set_defaults(handler=_run_save, timeout=30.0)
    restore = sub.add_parser(
        "restore", help="create a new cluster from a backup FILE",
        description="Create a new cluster directory (new CA, new identity) whose nodes all "
                    "start from the state in backup FILE.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    restore.add_argument("file", metavar="FILE", help="a file `phalanx snapshot save` wrote")
    restore.add_argument("--into", metavar="NEW_CLUSTER_DIR", required=True,
                         help="the new cluster directory (must not exist or be empty)")
    restore.add_argument("--nodes", type=int_between(1, 64), default=None,
                         help="how many nodes (default: as many voters as the backup's "
                              "cluster had)")
    restore.add_argument("--base-port", type=int_between(1, 65_000), default=None,
                         help="the new cluster's port layout (default: a free one)")
    restore.set_defaults(handler=_run_restore)


def _run_save(args: argparse.Namespace) -> int:
    from phalanx.client.errors import ClientTimeout, Forbidden, RequestRejected
    from phalanx.ops.backup import BackupError, save_snapshot

    cluster = open_cluster_arg(args, "phalanx snapshot save")
    if cluster is None:
        return EXIT_USAGE
    name = args.client_name or "admin"
    try:
        saved = save_snapshot(cluster, Path(args.file), node=args.node, seconds=args.timeout,
                              name=name)
    except BackupError as e:
        cause = e.__context__
        print_error("phalanx snapshot save", str(e))
        if isinstance(cause, Forbidden):
            return EXIT_FORBIDDEN
        if isinstance(cause, ClientTimeout):
            return EXIT_INDETERMINATE
        return EXIT_REFUSED if isinstance(cause, RequestRejected) else EXIT_USAGE
    h = saved.header
    print(f"saved {args.file}: index {h.index} from {h.node} (cluster commit index "
          f"{saved.commit_index} before the save), {h.data_bytes} bytes, protocol "
          f"{h.protocol}, app {h.app}, sha256 {h.data_sha256[:16]}")
    return EXIT_OK


def _run_restore(args: argparse.Namespace) -> int:
    from phalanx.ops.backup import BackupError, restore_snapshot

    try:
        header, cluster = restore_snapshot(Path(args.file), Path(args.into), nodes=args.nodes,
                                           base_port=args.base_port)
    except BackupError as e:
        print_error("phalanx snapshot restore", str(e))
        return EXIT_USAGE
    into = os.fspath(args.into)
    print(f"restored index {header.index} ({header.protocol}, app {header.app}, taken from "
          f"{header.node} at {header.created}) into a new cluster at {into}: "
          f"{', '.join(n.id for n in cluster.nodes)}; start it with `phalanx cluster up "
          f"{into}`")
    return EXIT_OK
