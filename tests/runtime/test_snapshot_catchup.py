"""A restarted follower that needs a snapshot catches up with the checkpoint sent about once,
on an in-process 3-node cluster over real TLS sockets and real disks (the attack: with a
132 MB checkpoint, the leader sent 46 GB and the follower never caught up, because every
heartbeat started another copy of the transfer; docs/RELIABILITY.md). The leader's core sends
a piece manifest, the follower fetches the pieces (`phalanx.runtime.piece_transfer`): the
bound holds for both together. The full-size measurement on separate processes is
`bench/snapshot_catchup.py`.
"""

from __future__ import annotations

from pathlib import Path

from runtime_helpers import wait_for
from test_cluster import call, cluster, put

from phalanx.consensus.raft import RaftCore
from phalanx.net.client_protocol import ReplyStatus
from phalanx.runtime import piece_manifest

VALUE = 64 * 1024
PUTS = 64  # ~4 MiB of state


async def test_restarted_follower_gets_the_snapshot_about_once(tmp_path: Path) -> None:
    async with cluster(tmp_path, checkpoint_every=16) as c:
        leader = await c.leader()
        follower = next(n for n in sorted(c.nodes) if n != leader.id)
        await c.stop(follower)
        client = await c.client(leader)
        for i in range(PUTS):
            value = bytes([i % 251]) * VALUE
            reply = await call(client, put("tester/loader", i + 1, f"k{i:03d}", value))
            assert reply.status is ReplyStatus.OK, reply
        core = leader.driver.core
        assert isinstance(core, RaftCore)

        def compacted_past_follower() -> bool:
            snap = core.snapshot
            return snap is not None and snap.meta.index >= PUTS and core.log.offset > 1

        await wait_for(compacted_past_follower, within=20, what="a checkpoint past the load")
        snap = core.snapshot
        assert snap is not None
        manifest = piece_manifest.decode(snap.data[:])
        assert not isinstance(manifest, str), manifest
        size, index = manifest.data_len, snap.meta.index
        assert size > 3 * 2**20

        node = await c.start(follower)
        await wait_for(lambda: node.replica.applied_index >= index, within=30,
                       what="the follower to install the snapshot")
        received = node.transport.statistics().bytes_in  # all from the leader, since restart
        assert received <= 2 * size, (received, size)
        assert node.replica.applied_index >= index
