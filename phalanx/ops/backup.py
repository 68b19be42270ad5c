"""Backup and restore of a cluster's state (issue 21, item 4): `save_snapshot` and
`restore_snapshot`, behind `phalanx snapshot save|restore` (`phalanx.cli.snapshot`).

Owns: how a backup is taken and how a new cluster is made from one.

Save (from a live node, through an admin call; not a checkpoint copied off a disk): a
checkpoint already on a node's disk may predate writes the cluster acknowledged, and the
node may remove it while it is read. So `save_snapshot` asks every node for its status,
takes the highest commit index C any of them reports (every write acknowledged before the
save is at or below it), and asks one node (`--node`, else the one that applied most) for a
`BackupCall(min_index=C)`: the node writes its state at an applied index >= C into
``DATA_DIR/backup/`` (`phalanx.runtime.operator_ops`). The tool then loads that checkpoint
(every piece checked against its SHA-256) and writes FILE (`phalanx.ops.backup_file`).
It reads the node's data directory, so it runs on the node's host (a local cluster: any
node). Protocol-neutral: any protocol's replica layer takes the same checkpoint.

Restore: a NEW cluster directory (`cluster init`: a new CA, so a new cluster identity; new
node keys), with the backup's protocol and app, whose every node starts from the backup's
checkpoint: its data directory gets the checkpoint at the backup's index, with the new
voters as its configuration and term 0 (the new cluster's terms start again; its log
continues after the checkpoint). The new nodes' certificates are signed by the new CA, so
they and the old cluster's nodes refuse each other's TLS handshakes, and a data directory
of one is refused by the other's nodes (`phalanx.runtime.identity`): a restored copy can
never join the old cluster by mistake.
"""

from __future__ import annotations

import datetime
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from phalanx.apps.envelope import decode_meta, encode_meta
from phalanx.apps.interface import SnapshotFormatError
from phalanx.consensus.types import Configuration, NodeId, SnapshotMeta
from phalanx.ops.backup_file import BackupHeader, read_backup, write_backup
from phalanx.ops.local_cluster import find_free_base_port, init_cluster, open_cluster
from phalanx.ops.node_config import ClusterConfig, ConfigError, load_node_config
from phalanx.ops.processes import ClusterError
from phalanx.storage.checkpoint import FileCheckpointStore
from phalanx.storage.directory import OsDirectory
from phalanx.storage.interface import StorageError, StoredCheckpoint

if TYPE_CHECKING:
    from phalanx.ops.ops_messages import BackupReply


class BackupError(ClusterError):
    """An operator-fixable problem taking or restoring a backup (one line)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Saved:
    header: BackupHeader
    path: Path
    commit_index: int
    """The highest commit index a node reported before the save (the backup covers it)."""


async def request_backup(cluster: ClusterConfig, *, node: str | None = None,
                         seconds: float = 30.0, name: str = "admin"
                         ) -> tuple[BackupReply, int]:
    """Ask `node` (default: the one that applied most) for a backup covering the highest
    commit index any node reports; its reply and that commit index.

    Raises:
        BackupError: no node answered, `node` is unknown, or the node refused or timed out
            (the client error is the exception's context).
    """
    import trio

    from phalanx.client.async_client import ClientError, open_client
    from phalanx.client.ops_calls import backup_call

    commits: dict[str, tuple[int, int]] = {}
    async with open_client(cluster, timeout=min(seconds, 3.0)) as client:

        async def ask(n: str) -> None:
            try:
                reply = await client.status(n)
            except ClientError:
                return
            commits[n] = (reply.commit_index, reply.applied_index)

        async with trio.open_nursery() as nursery:
            for peer in cluster.nodes:
                nursery.start_soon(ask, peer.id)
    if not commits:
        raise BackupError(f"no node of {cluster.directory} answered; is the cluster running "
                          f"(`phalanx status --cluster {cluster.directory}`)?")
    commit = max(c for c, _ in commits.values())
    order = [p.id for p in cluster.nodes]
    if node is None:
        node = max(commits, key=lambda n: (commits[n][1], -order.index(n)))
    elif node not in order:
        raise BackupError(f"no node {node!r} in {cluster.directory} (nodes: "
                          f"{', '.join(order)})")
    try:
        return await backup_call(cluster, node, min_index=commit, seconds=seconds,
                                 name=name), commit
    except ClientError as e:
        raise BackupError(f"the backup on {node} failed: {e}") from e


def save_snapshot(cluster: ClusterConfig, path: Path, *, node: str | None = None,
                  seconds: float = 30.0, name: str = "admin") -> Saved:
    """Take a backup of `cluster` into `path` (module docstring).

    Raises:
        BackupError: as `request_backup`; or the node's backup directory is not on this
            host or does not load.
    """
    import trio

    reply, commit = trio.run(lambda: request_backup(cluster, node=node, seconds=seconds,
                                                    name=name))
    return package_backup(cluster, reply, commit, path)


def package_backup(cluster: ClusterConfig, reply: BackupReply, commit: int,
                   path: Path) -> Saved:
    """Load the checkpoint `reply` says its node wrote (every piece checked) and write it
    into backup file `path`. Raises `BackupError`."""
    from phalanx.runtime.identity import cluster_fingerprint
    from phalanx.runtime.operator_ops import BACKUP_DIR

    node = reply.node
    try:
        local = load_node_config(cluster.node_config_path(node)).data_dir / BACKUP_DIR
    except ConfigError:
        local = Path(reply.directory)
    directory = Path(reply.directory)
    if not directory.is_dir():
        directory = local
    if not directory.is_dir():
        raise BackupError(f"{node} wrote its backup into {reply.directory} on its host, "
                          f"which is not here: run `phalanx snapshot save --node {node}` on "
                          "that host")
    store_dir = OsDirectory(str(directory))
    try:
        loaded = FileCheckpointStore(store_dir, keep=1).load_latest()
    finally:
        store_dir.close()
    ckpt = loaded.checkpoint
    if ckpt is None or ckpt.index < reply.index:
        why = "; ".join(loaded.problems) or "no checkpoint in it"
        raise BackupError(f"the backup {node} wrote into {directory} does not load: {why}")
    try:
        meta = decode_meta(ckpt.meta)
    except SnapshotFormatError as e:
        raise BackupError(f"the backup in {directory} has bad metadata: {e}") from None
    header = BackupHeader(
        protocol=cluster.protocol, app=cluster.app, index=ckpt.index, term=meta.term,
        node=node, cluster=cluster_fingerprint(cluster.ca),
        voters=tuple(map(str, meta.config.voters)),
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        data_bytes=len(ckpt.data), data_sha256=hashlib.sha256(ckpt.data).hexdigest())
    write_backup(path, header, ckpt)
    return Saved(header=header, path=path, commit_index=commit)


def restore_snapshot(path: Path, into: Path, *, nodes: int | None = None,
                     base_port: int | None = None, checkpoint_every: int | None = None
                     ) -> tuple[BackupHeader, ClusterConfig]:
    """Make a new cluster at `into` from backup file `path` (module docstring): its header
    and the new cluster's config. The nodes are not started (`phalanx cluster up INTO`).

    Raises:
        BackupError: the file does not check, or the new cluster cannot be made (`into`
            not empty, ports in use, ...); nothing is left at `into` then.
    """
    from phalanx.ops.backup_file import BackupFileError

    try:
        header, checkpoint = read_backup(path)
        decode_meta(checkpoint.meta)
    except (BackupFileError, SnapshotFormatError) as e:
        raise BackupError(str(e)) from None
    count = nodes if nodes is not None else max(1, len(header.voters))
    if base_port is None:
        base_port = find_free_base_port(count)
    cluster = init_cluster(into, protocol=header.protocol, app=header.app, nodes=count,
                           base_port=base_port, checkpoint_every=checkpoint_every,
                           refuse_busy_ports=True)
    try:
        for peer in cluster.nodes:
            config = load_node_config(cluster.node_config_path(peer.id))
            meta = SnapshotMeta(index=checkpoint.index, term=0, config=Configuration(
                voters=tuple(NodeId(v) for v in config.bootstrap_voters())))
            directory = OsDirectory(str(config.data_dir))
            try:
                FileCheckpointStore(directory, keep=1).save(StoredCheckpoint(
                    index=checkpoint.index, data=checkpoint.data, meta=encode_meta(meta)))
            finally:
                directory.close()
    except (OSError, StorageError, ConfigError) as e:
        import shutil

        shutil.rmtree(into, ignore_errors=True)
        raise BackupError(f"restoring into {into} failed: {e}") from None
    return header, open_cluster(into)
