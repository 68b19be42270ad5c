"""Backups from running nodes (`BackupCall`, `phalanx.runtime.operator_ops`) and restores
(`phalanx.ops.backup`), with the nodes in this process, for every registered protocol (the
default one in the fast suite, the others long; real processes, Raft and PBFT:
tests/cli/test_snapshot_e2e.py): the backup covers the cluster's commit
index at the call, the restored cluster serves every key written before it and takes new
writes; only an admin certificate may ask; the old and the new cluster do not trust each
other."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import trio

from phalanx.client.async_client import ClientError, Forbidden, RequestRejected, open_client
from phalanx.client.ops_calls import backup_call, backup_read
from phalanx.ops.backup import (
    fetch_backup,
    package_backup,
    request_backup,
    restore_snapshot,
)
from phalanx.ops.backup_file import read_backup
from phalanx.ops.local_cluster import find_free_base_port, init_cluster, open_cluster
from phalanx.ops.node_config import ClusterConfig, load_node_config
from phalanx.protocols import DEFAULT_PROTOCOL
from phalanx.protocols import get as protocol_spec
from phalanx.protocols import names as protocol_names
from phalanx.runtime.node import serve_node


async def _serve(cluster: ClusterConfig, nursery: trio.Nursery) -> None:
    for peer in cluster.nodes:
        await nursery.start(serve_node, load_node_config(cluster.node_config_path(peer.id)))


@pytest.mark.parametrize("protocol", [
    name if name == DEFAULT_PROTOCOL else pytest.param(name, marks=pytest.mark.long)
    for name in protocol_names()])  # every registered protocol; the default one fast
async def test_a_backup_restores_every_acknowledged_key_into_a_new_cluster(
        tmp_path: Path, protocol: str) -> None:
    nodes = protocol_spec(protocol).fault_model.nodes_for(1)
    init_cluster(tmp_path / "old", protocol=protocol, nodes=nodes,
                 base_port=find_free_base_port(nodes), checkpoint_every=16)
    old = open_cluster(tmp_path / "old")
    written = {f"k{i}": f"v{i}".encode() for i in range(25)}
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await _serve(old, nursery)
            async with open_client(old, timeout=20) as client:
                for key, value in written.items():
                    await client.put(key, value)
                reply, commit = await request_backup(old, seconds=20)
                assert reply.index >= commit >= len(written)
                data = await fetch_backup(old, reply, seconds=20)
                part = await backup_read(old, reply.node, index=reply.index, offset=10,
                                         length=100)
                assert part.chunk == data[10:110]
                with pytest.raises(RequestRejected, match="is gone"):
                    await backup_read(old, reply.node, index=reply.index + 1, offset=0)
                with pytest.raises(Forbidden, match="role admin"):
                    await backup_call(old, "n1", name="client", seconds=5)
                await client.put("after", b"x")
            nursery.cancel_scope.cancel()
    saved = package_backup(old, reply, commit, data, tmp_path / "b.phx")
    header, _ = read_backup(tmp_path / "b.phx")
    assert header == saved.header
    assert header.protocol == protocol
    assert len(header.voters) == nodes

    _, new = restore_snapshot(tmp_path / "b.phx", tmp_path / "new")
    was, now = (load_node_config(c.node_config_path("n1")) for c in (old, new))
    assert now.checkpoint == was.checkpoint  # the settings came along (every 16 entries)
    assert (now.timing, now.fsync, now.protocol_options) == (
        was.timing, was.fsync, was.protocol_options)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await _serve(new, nursery)
            async with open_client(new, timeout=20) as client:
                for key, value in written.items():
                    assert await client.get(key) == value
                assert await client.get("after") is None  # written after the backup
                await client.put("fresh", b"y")
                assert await client.get("fresh") == b"y"
            # the old cluster's client credentials are not trusted by the new cluster
            stranger = dataclasses.replace(new, ca=old.ca, client_cert=old.client_cert,
                                           client_key=old.client_key)
            async with open_client(stranger, timeout=0.5) as client:
                with pytest.raises(ClientError):
                    await client.status("n1")
            nursery.cancel_scope.cancel()
