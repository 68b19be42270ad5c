"""`[checkpoint] recovery_target` on an in-process 3-node Raft cluster (real TLS sockets and
disks): the nodes checkpoint by the target, not the fixed triggers (set far out of reach
here), and a restarted follower measures its load and comes back with everything."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import trio
from runtime_helpers import make_cluster, wait_for
from test_cluster import Cluster, call, put

from phalanx.net.client_protocol import ReplyStatus

VALUE = 16 * 1024
PUTS = 96  # ~1.5 MiB of commands: several times the target's smallest interval (256 KiB)


async def test_nodes_checkpoint_by_the_target_and_a_restart_measures_its_load(
        tmp_path: Path) -> None:
    # Puts of 16 KiB values apply at ~100 MB/s of commands (a value is stored, not parsed),
    # so even 2 ms of replay is ~100 KB: the interval is the 256 KiB floor.
    configs = [dataclasses.replace(c, checkpoint=dataclasses.replace(
        c.checkpoint, recovery_target=0.002)) for c in make_cluster(tmp_path)]
    # every_bytes 64 MiB and every_entries 10,000: the fixed triggers never fire here
    async with trio.open_nursery() as nursery:
        c = Cluster(configs, nursery)
        for config in configs:
            await c.start(config.id)
        leader = await c.leader()
        client = await c.client(leader)
        for i in range(PUTS):
            reply = await call(client, put("tester/loader", i + 1, f"k{i:03d}",
                                           bytes([i % 251]) * VALUE))
            assert reply.status is ReplyStatus.OK, reply
        target = leader.replica.recovery
        assert target is not None
        assert target.replay_samples >= 1  # the applies measured the replay rate
        await wait_for(lambda: leader.replica.status().checkpoints_written >= 2, within=20,
                       what="checkpoints by the recovery target")
        follower = next(n for n in sorted(c.nodes) if n != leader.id)
        await wait_for(lambda: c.nodes[follower].replica.status().checkpoints_written >= 1,
                       within=20, what="a follower checkpoint")
        await c.stop(follower)
        node = await c.start(follower)
        restarted = node.replica.recovery
        assert restarted is not None
        assert restarted.load_samples == 1  # its start timed the checkpoint load
        await wait_for(lambda: node.replica.applied_index >= leader.replica.applied_index,
                       within=20, what="the restarted follower to catch up")
        nursery.cancel_scope.cancel()
