"""Backup and restore of a cluster's state (issue 21, item 4): `save_snapshot` and
`restore_snapshot`, behind `phalanx snapshot save|restore` (`phalanx.cli.snapshot`).

Owns: how a backup is taken and how a new cluster is made from one.

Save (from a live node, through admin calls; not a checkpoint copied off a disk): a
checkpoint already on a node's disk may predate writes the cluster acknowledged, and the
node may remove it while it is read. So `save_snapshot` asks every node for its status,
takes the highest commit index C any of them reports (every write acknowledged before the
save is at or below it), and asks one node (`--node`, else the one that applied most) for a
`BackupCall(min_index=C)`: the node writes its state at an applied index >= C into
``DATA_DIR/backup/`` and announces its length and SHA-256 (`phalanx.runtime.operator_ops`).
The tool then reads that data over the client port in pieces of 1 MiB (`fetch_backup`:
any host that reaches the node with the admin certificate), checks it against the
announcement and writes FILE (`phalanx.ops.backup_file`). The whole state passes through
the tool's memory once. Protocol-neutral: any protocol's replica layer takes the same
checkpoint.

Restore: a NEW cluster directory (`cluster init`: a new CA, so a new cluster identity; new
node keys), with the backup's protocol and app and its node's settings (fsync, timing,
checkpoint interval, protocol options, services: `node_settings`), whose every node starts
from the backup's checkpoint: its data directory gets the checkpoint at the backup's index,
with the new voters as its configuration and term 0 (the new cluster's terms start again;
its log continues after the checkpoint). The new nodes' certificates are signed by the new
CA, so they and the old cluster's nodes refuse each other's TLS handshakes, and a data
directory of one is refused by the other's nodes (`phalanx.runtime.identity`): a restored
copy can never join the old cluster by mistake.
"""

from __future__ import annotations

import datetime
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from phalanx.apps.envelope import decode_meta, encode_meta
from phalanx.apps.interface import SnapshotFormatError
from phalanx.consensus.types import Configuration, NodeId, SnapshotMeta
from phalanx.ops.backup_file import BackupHeader, read_backup, write_backup
from phalanx.ops.local_cluster import find_free_base_port, init_cluster, open_cluster
from phalanx.ops.node_config import (
    ClusterConfig,
    ConfigError,
    NodeConfig,
    TimingConfig,
    load_node_config,
)
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


async def fetch_backup(cluster: ClusterConfig, reply: BackupReply, *, seconds: float = 30.0,
                       name: str = "admin") -> bytes:
    """The data of the backup `reply` announced, read from its node piecewise over the
    client port, checked against the length and SHA-256 the node announced.

    Raises:
        BackupError: the node refused a read (a newer backup replaced this one) or did not
            answer, or the data does not check.
    """
    from phalanx.client.async_client import ClientError
    from phalanx.client.ops_calls import backup_read

    data = bytearray()
    while len(data) < reply.data_bytes:
        try:
            part = await backup_read(cluster, reply.node, index=reply.index,
                                     offset=len(data), seconds=seconds, name=name)
        except ClientError as e:
            raise BackupError(f"reading backup {reply.index} from {reply.node} failed: "
                              f"{e}") from e
        if part.offset != len(data) or not part.chunk:
            raise BackupError(f"{reply.node} answered no data at offset {len(data)} of "
                              f"backup {reply.index}")
        data += part.chunk
    if len(data) != reply.data_bytes or hashlib.sha256(data).hexdigest() != reply.data_sha256:
        raise BackupError(f"backup {reply.index} from {reply.node} does not match the length "
                          "and SHA-256 the node announced: take it again")
    return bytes(data)


def node_settings(config: NodeConfig) -> dict[str, object]:
    """What of `config` a restore repeats (JSON): fsync, timing, the checkpoint interval,
    the protocol's options and the services' tables."""
    return {"fsync": config.fsync, "tick_ms": config.timing.tick_ms,
            "election_ticks": config.timing.election_ticks,
            "heartbeat_ticks": config.timing.heartbeat_ticks,
            "checkpoint_every": config.checkpoint.every_entries,
            "protocol_options": dict(config.protocol_options),
            "services": {name: dict(table) for name, table in config.services.items()}}


def _init_options(settings: Mapping[str, Any]) -> dict[str, Any]:
    """`init_cluster` keyword arguments from `node_settings` (unknown or missing: default)."""
    out: dict[str, Any] = {}
    try:
        if "fsync" in settings:
            out["fsync"] = str(settings["fsync"])
        if "tick_ms" in settings:
            out["timing"] = TimingConfig(tick_ms=int(settings["tick_ms"]),
                                         election_ticks=int(settings["election_ticks"]),
                                         heartbeat_ticks=int(settings["heartbeat_ticks"]))
        if "checkpoint_every" in settings:
            out["checkpoint_every"] = int(settings["checkpoint_every"])
        options = settings.get("protocol_options") or {}
        out["protocol_options"] = {str(k): str(v) for k, v in dict(options).items()}
        services = dict(settings.get("services") or {})
        out["services"] = tuple(services)
        out["service_options"] = {str(k): dict(v) for k, v in services.items()}
    except (KeyError, TypeError, ValueError) as e:
        raise BackupError(f"the backup's settings are malformed ({e})") from None
    return out


def package_backup(cluster: ClusterConfig, reply: BackupReply, commit: int, data: bytes,
                   path: Path) -> Saved:
    """Write the backup `reply` announced, with its fetched `data`, into backup file `path`
    (`phalanx.ops.backup_file`). Raises `BackupError` (bad metadata), `OSError`."""
    from phalanx.runtime.identity import cluster_fingerprint

    try:
        meta = decode_meta(reply.meta)
    except SnapshotFormatError as e:
        raise BackupError(f"the backup from {reply.node} has bad metadata: {e}") from None
    try:
        settings = node_settings(load_node_config(cluster.node_config_path(reply.node)))
    except ConfigError:
        settings = {}  # the node's config is not in DIR: a restore takes the defaults
    header = BackupHeader(
        settings=settings,
        protocol=cluster.protocol, app=cluster.app, index=reply.index, term=meta.term,
        node=reply.node, cluster=cluster_fingerprint(cluster.ca),
        voters=tuple(map(str, meta.config.voters)),
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        data_bytes=len(data), data_sha256=reply.data_sha256)
    write_backup(path, header, StoredCheckpoint(index=reply.index, data=data, meta=reply.meta))
    return Saved(header=header, path=path, commit_index=commit)


def save_snapshot(cluster: ClusterConfig, path: Path, *, node: str | None = None,
                  seconds: float = 30.0, name: str = "admin") -> Saved:
    """Take a backup of `cluster` into `path` (module docstring).

    Raises:
        BackupError: as `request_backup` and `fetch_backup`.
    """
    import trio

    async def take() -> tuple[BackupReply, int, bytes]:
        reply, commit = await request_backup(cluster, node=node, seconds=seconds, name=name)
        return reply, commit, await fetch_backup(cluster, reply, seconds=seconds, name=name)

    reply, commit, data = trio.run(take)
    return package_backup(cluster, reply, commit, data, path)


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
    options = _init_options(header.settings)
    if checkpoint_every is not None:
        options["checkpoint_every"] = checkpoint_every
    cluster = init_cluster(into, protocol=header.protocol, app=header.app, nodes=count,
                           base_port=base_port, refuse_busy_ports=True, **options)
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
