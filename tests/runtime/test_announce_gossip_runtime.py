"""Announcements spread inside the receiving cluster through its gossip service: two real linked
Raft clusters (3 announcing, 4 receiving) in process over mutual TLS, every node running both
`announce` and `gossip` (`cluster init --service announce --service gossip`).

A's members each announce to ONE node of B (fanout 1, no periodic rounds during the test),
so only B's n1..n3 receive A's checkpoint directly; n4 can only get it from inside B.
Checked: every node of B holds A's checkpoint, none relayed it with direct sends (the direct
receivers published it as a gossip rumor), n4 received it as a rumor and verified it
like any announcement. The same topology without the gossip service (`long`, for the
comparison) relays directly. Prints the latency (certified in A -> accepted at each node of B).
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path
from typing import cast

import pytest
import trio
from linked_clusters import LinkedNodes, node_configs, running, two_linked_clusters
from runtime_helpers import wait_for

from phalanx.apps.kv_types import Put
from phalanx.apps.kv_wire import encode_command
from phalanx.client.async_client import open_client
from phalanx.ops.node_config import ClusterConfig, NodeConfig
from phalanx.services.announce_node import AnnounceService

GUARD = 60.0
EVERY = 4


class Clusters(LinkedNodes):
    def ann(self, name: str, node: str) -> AnnounceService:
        return cast(AnnounceService, self.service(name, node, "announce"))

    def live(self, name: str) -> list[AnnounceService]:
        return [self.ann(n, i) for (n, i) in sorted(self.nodes) if n == name]


def _configs(cluster: ClusterConfig) -> list[NodeConfig]:
    out = []
    for config in node_configs(cluster):
        announce = {**config.services["announce"], "tick_ms": 20, "interval": 100_000,
                    "fanout": 1}
        services = {**config.services, "announce": announce}
        if "gossip" in services:
            services["gossip"] = {**services["gossip"], "tick_ms": 10}
        out.append(dataclasses.replace(config, services=services))
    return out


async def _write(cluster: ClusterConfig, count: int) -> None:
    async with open_client(cluster, timeout=20) as client:
        for i in range(count):
            await client.call(encode_command(Put(key=f"k/{i}", value=b"v")))


def _certified(c: Clusters, dst: str) -> int:
    return max((s.certified[dst].index for s in c.live("a") if dst in s.certified),
               default=-1)


@pytest.mark.parametrize("services", [
    ("announce", "gossip"), pytest.param(("announce",), marks=pytest.mark.long)])
async def test_a_received_announcement_spreads_in_the_cluster_as_a_gossip_rumor(
        tmp_path: Path, services: tuple[str, ...]) -> None:
    gossip = "gossip" in services
    a, b, ida, idb = two_linked_clusters(tmp_path, ("raft", 3), ("raft", 4),
                                         checkpoint_every=EVERY, services=services)
    with trio.fail_after(GUARD):
        async with running(Clusters, ("a", a), ("b", b), configs=_configs) as c:
            await _write(a, 2 * EVERY)
            await wait_for(lambda: _certified(c, idb) >= EVERY, within=GUARD)
            top = _certified(c, idb)
            await wait_for(lambda: all(ida in s.highest and s.highest[ida].index >= top
                                       for s in c.live("b")), within=GUARD)
            counters = {i: c.ann("b", i).counters() for i in ("n1", "n2", "n3", "n4")}
            relayed = sum(k.get("relayed", 0) for k in counters.values())
            gossiped = sum(k.get("gossiped", 0) for k in counters.values())
            if not gossip:  # the direct relay, kept without the gossip service
                assert relayed >= 3, counters
                assert gossiped == 0, counters
            else:
                assert relayed == 0, counters
                assert gossiped >= 1, counters
                for node in ("n4",):  # no A member announces to it: only B's gossip
                    assert counters[node].get("rumor_received", 0) >= 1, counters
                    assert counters[node]["accepted"] >= 1
                    assert not any(k.startswith("dropped") for k in counters[node])
            held = c.ann("b", "n4").highest[ida]
            own = [s.certified[idb] for s in c.live("a")
                   if idb in s.certified and s.certified[idb].index == held.index]
            assert own
            assert all(o.state_digest == held.state_digest for o in own)
            certified_at = min(x.certified_at[(idb, held.index)] for x in c.live("a")
                               if (idb, held.index) in x.certified_at)
            latencies = [s.highest[ida].wall - certified_at for s in c.live("b")
                         if s.highest[ida].index == held.index]
            print(f"announcement {'through gossip' if gossip else 'relayed directly'} "
                  f"(certified in A -> accepted in B), ms: "
                  f"median {1000 * statistics.median(latencies):.1f} "
                  f"max {1000 * max(latencies):.1f} over {len(latencies)} nodes")
