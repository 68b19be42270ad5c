"""The announce service between two real linked clusters, in process, over mutual TLS: PBFT
clusters of 4 (Byzantine certificates) and Raft clusters of 3 (crash certificates), made by
`cluster init --service announce` and `cluster link`.

Checked: each cluster's newest certified checkpoint reaches every live node of the other
cluster and verifies there (its digest is the announcing members' own checkpoint digest);
a forged announcement (bad signatures) and a stale one are dropped and counted by reason;
with one announcing member killed, newer checkpoints are still certified and announced by
the others. Prints the announcement latency (certified -> accepted, loopback).
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
from phalanx.cli.announce import format_announce_status, query_announce
from phalanx.client.async_client import open_client
from phalanx.clustersend import Certificate, CertKind, MemberSignature, SendStatement
from phalanx.ops.node_config import ClusterConfig, NodeConfig
from phalanx.services.announce_api import AnnounceStatus
from phalanx.services.announce_node import Announcement, AnnounceService, announce_digest

GUARD = 60.0
EVERY = 4  # checkpoint every 4 entries (PBFT aligns them: every member at the same indexes)


class Clusters(LinkedNodes):
    def ann(self, name: str, node: str) -> AnnounceService:
        return cast(AnnounceService, self.service(name, node, "announce"))

    def live(self, name: str) -> list[AnnounceService]:
        return [self.ann(n, i) for (n, i) in sorted(self.nodes) if n == name]


def _configs(cluster: ClusterConfig) -> list[NodeConfig]:
    out = []
    for config in node_configs(cluster):
        options = {**config.services["announce"], "tick_ms": 20, "interval": 5}
        out.append(dataclasses.replace(config, services={**config.services,
                                                         "announce": options}))
    return out


def _two_clusters(root: Path, protocol: str, n: int
                  ) -> tuple[ClusterConfig, ClusterConfig, str, str]:
    return two_linked_clusters(root, (protocol, n), (protocol, n), checkpoint_every=EVERY,
                               services=("announce",))


async def _write(cluster: ClusterConfig, prefix: str, count: int) -> None:
    async with open_client(cluster, timeout=20) as client:
        for i in range(count):
            await client.call(encode_command(Put(key=f"{prefix}/{i}", value=b"v")))


def _certified(c: Clusters, name: str, dst: str) -> int:
    return max((s.certified[dst].index for s in c.live(name) if dst in s.certified),
               default=-1)


def _everyone_has(c: Clusters, name: str, origin: str, at_least: int) -> bool:
    return all(origin in s.highest and s.highest[origin].index >= at_least
               for s in c.live(name))


@pytest.mark.parametrize(("protocol", "n", "forged_reason"), [
    ("pbft", 4, "bad_signature"), ("raft", 3, "bad_leader_signature")])
async def test_checkpoints_are_announced_verified_and_survive_a_killed_announcer(
        tmp_path: Path, protocol: str, n: int, forged_reason: str) -> None:
    a, b, ida, idb = _two_clusters(tmp_path, protocol, n)
    with trio.fail_after(GUARD):
        async with running(Clusters, ("a", a), ("b", b), configs=_configs) as c:
            await _write(a, "a", 3 * EVERY)
            await _write(b, "b", 2 * EVERY)
            await wait_for(lambda: _certified(c, "a", idb) >= EVERY
                           and _certified(c, "b", ida) >= EVERY, within=GUARD)
            top_a, top_b = _certified(c, "a", idb), _certified(c, "b", ida)
            await wait_for(lambda: _everyone_has(c, "b", ida, top_a)
                           and _everyone_has(c, "a", idb, top_b), within=GUARD)
            # What every B node holds is A's members' own checkpoint digest at that index.
            held = c.ann("b", "n3").highest[ida]
            own = [s.certified[idb] for s in c.live("a")
                   if idb in s.certified and s.certified[idb].index == held.index]
            assert own
            assert all(o.state_digest == held.state_digest for o in own)
            assert c.ann("b", "n2").gauges()[f"highest_index:{ida}"] == held.index
            rows = await query_announce(b)  # `phalanx announce status`, over the client port
            for row in rows.values():
                assert isinstance(row, AnnounceStatus)
                assert {r.cluster: r.index for r in row.received} == {ida: held.index}
            assert f" {held.index:>10}  {held.state_digest.hex()[:16]}" in \
                format_announce_status(rows)
            latencies = [s.highest[ida].wall - min(
                x.certified_at[(idb, held.index)] for x in c.live("a")
                if (idb, held.index) in x.certified_at) for s in c.live("b")]
            print(f"{protocol}: announcement latency (certified in A -> accepted in B), ms: "
                  f"median {1000 * statistics.median(latencies):.1f} "
                  f"max {1000 * max(latencies):.1f}")

            # A forged announcement (a higher index, signatures of nobody's key) and a stale
            # one (an older certified checkpoint), over the wire from A's n1 to B's n1.
            victim = c.ann("b", "n1")
            before = dict(victim.counters())
            info = c.ann("a", "n1").cluster
            digest = bytes(32)
            forged_st = SendStatement(src_cluster=ida, dst_cluster=idb, epoch=0,
                                      seq=held.index + 1000,
                                      digest=announce_digest(held.index + 1000, digest))
            crash = info.kind is CertKind.CRASH  # a Byzantine certificate names no leader
            forged = Certificate(kind=info.kind, statement=forged_st,
                                 signatures=tuple(MemberSignature(signer=m, sig=b"x" * 64)
                                                  for m in info.members[:info.cert_quorum]),
                                 term=0, leader=info.members[0] if crash else "",
                                 leader_sig=b"y" * 64 if crash else b"")
            a1 = c.nodes[("a", "n1")].transport
            b1 = next(p for p in a1.peers if str(p).startswith("n1@"))
            assert a1.send_nowait(b1, Announcement(index=held.index + 1000,
                                                   state_digest=digest, certificate=forged))
            old = dataclasses.replace(held.certificate, statement=dataclasses.replace(
                held.certificate.statement, seq=0))
            assert a1.send_nowait(b1, Announcement(index=0, state_digest=digest,
                                                   certificate=old))
            a1.flush()

            def dropped() -> dict[str, int]:
                now = victim.counters()
                return {k: now[k] - before.get(k, 0) for k in now
                        if k.startswith("dropped") and now[k] != before.get(k, 0)}

            await wait_for(lambda: len(dropped()) >= 2, within=GUARD)
            assert dropped() == {f"dropped:{forged_reason}": 1, "dropped:stale": 1}
            assert victim.highest[ida].index == held.index

            # Kill one announcer of A (f = 1): the others still certify (2f+1 = 3 of 4, or a
            # majority of 3) and announce newer checkpoints to every node of B.
            c.kill("a", "n2")
            await _write(a, "a2", 2 * EVERY)
            await wait_for(lambda: _certified(c, "a", idb) > top_a, within=GUARD)
            newer = _certified(c, "a", idb)
            await wait_for(lambda: _everyone_has(c, "b", ida, newer), within=GUARD)
            assert all(s.highest[ida].index == newer for s in c.live("b"))
