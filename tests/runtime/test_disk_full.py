"""Disk full on a live node (in-process 3-node cluster, real TLS sockets, real files; writes
and fsyncs of one node's data directory fail with ENOSPC by injection).

Before: the node stopped (`No space left on device` raised out of the driver) and clients
saw only timeouts. Now it stays up, answers UNAVAILABLE with the reason, serves stale reads,
acknowledges nothing it could not persist, lets the others elect a new leader, and resumes
(catching up) once writes succeed again.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import trio
from runtime_helpers import TESTER, cluster_client, wait_for
from test_cluster import call, cluster, get, put

from phalanx.apps import kv_wire
from phalanx.apps.kv_types import Value
from phalanx.client.async_client import StorageUnavailable, open_client
from phalanx.net.client_protocol import ReplyStatus
from phalanx.ops import pki
from phalanx.storage.directory import OsDirectory


class DiskFull:
    """Makes appends and fsyncs under the listed directories fail with ENOSPC."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.roots: set[str] = set()
        append, fsync = OsDirectory.append, OsDirectory.fsync

        def full_append(d: OsDirectory, name: str, data: bytes | bytearray) -> None:
            self.check(d)
            append(d, name, data)

        def full_fsync(d: OsDirectory, name: str) -> None:
            self.check(d)
            fsync(d, name)

        monkeypatch.setattr(OsDirectory, "append", full_append)
        monkeypatch.setattr(OsDirectory, "fsync", full_fsync)

    def check(self, d: OsDirectory) -> None:
        if d.root in self.roots:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


async def test_disk_full_node_stays_up_refuses_writes_and_resumes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    disk = DiskFull(monkeypatch)
    async with cluster(tmp_path) as c:
        old = await c.leader()
        client = await c.client(old)
        assert (await call(client, put("tester/a", 1, "k", b"v1"))).status is ReplyStatus.OK
        disk.roots.add(str(old.config.data_dir))
        # The write that hit the full disk:
        first = await call(client, put("tester/a", 2, "k", b"v2"))
        assert first.status is ReplyStatus.RETRY
        assert first.message == "storage unavailable: No space left on device"
        reply = await call(client, put("tester/a", 3, "k", b"v3"))
        assert reply.status is ReplyStatus.UNAVAILABLE
        assert reply.message == "storage unavailable: No space left on device"
        stale = await call(client, get("tester/a", 4, "k", stale=True))
        assert stale.status is ReplyStatus.OK
        assert kv_wire.decode_result(stale.result) == Value(value=b"v1")

        others = [n for n in c.nodes.values() if n is not old]
        await wait_for(lambda: any(n.core_status().role == "leader" for n in others),
                       what="a new leader among the nodes with a working disk")
        new = next(n for n in others if n.core_status().role == "leader")
        other = await c.client(new)
        assert (await call(other, put("tester/b", 1, "k", b"v4"))).status is ReplyStatus.OK
        assert old.driver.storage_error is not None  # still up, still refusing

        disk.roots.clear()
        await wait_for(lambda: old.driver.storage_error is None, within=10,
                       what="the node resuming once its disk has room")
        await wait_for(lambda: old.replica.applied_index >= new.replica.applied_index,
                       within=10, what="the resumed node catching up")
        check = await call(client, get("tester/a", 5, "k", stale=True))
        assert kv_wire.decode_result(check.result) == Value(value=b"v4")
        assert old.driver.stats.storage_failures >= 1
        await client.aclose()
        await other.aclose()
        await trio.lowlevel.checkpoint()


async def test_client_library_reports_storage_unavailable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every node's disk full: the client tries each, then raises `StorageUnavailable` with
    the nodes' reason instead of a bare timeout."""
    disk = DiskFull(monkeypatch)
    async with cluster(tmp_path) as c:
        leader = await c.leader()
        ca = leader.config.tls.ca
        disk.roots.update(str(n.config.data_dir) for n in c.nodes.values())
        addresses = [(n.id, n.client_address.host, n.client_address.port)
                     for n in c.nodes.values()]
        creds = cluster_client(leader.config)
        context = pki.client_context(ca, certificate=creds.certificate,
                                     private_key=creds.private_key, check_hostname=False)
        async with open_client(addresses, ssl_context=context, timeout=2.0,
                               attempt_timeout=0.5, client_id=f"{TESTER}/disk") as client:
            with pytest.raises(StorageUnavailable, match="No space left on device"):
                await client.put("k", b"v")
