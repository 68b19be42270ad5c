"""Cluster-sending between two real clusters in process, over mutual TLS: a Raft cluster of 3
and a PBFT cluster of 4, made by `cluster init --service clustersend` and `cluster link`.

Checked: values written to one cluster's outbox (a client's put-if-absent through its own
consensus) reach the other cluster's replicated inbox exactly once, in both directions,
with every live member's state agreeing; the sender confirms, and (option gc) compacts its
confirmed outbox slots; a forged certificate sent over
the wire by a linked node (as attempt 0's sender to its receiver) is dropped and counted by
reason; a node of an unlinked cluster is refused by the transport.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import cast

import trio
from linked_clusters import LinkedNodes, running, two_linked_clusters
from runtime_helpers import wait_for

from phalanx.apps.kv import KvStateMachine
from phalanx.client.async_client import open_client
from phalanx.clustersend import (
    Certificate,
    CsSend,
    MemberSignature,
    Mode,
    SendStatement,
    link_seed,
    schedule,
)
from phalanx.clustersend.messages import value_digest
from phalanx.net.intercluster import split_qualified
from phalanx.ops.local_cluster import find_free_base_port, init_cluster
from phalanx.ops.node_config import ClusterConfig
from phalanx.runtime.identity import cluster_fingerprint
from phalanx.services.clustersend_node import ClusterSendService, outbox_command

GUARD = 60.0


class Clusters(LinkedNodes):
    def cs(self, name: str, node: str) -> ClusterSendService:
        return cast(ClusterSendService, self.service(name, node, "clustersend"))

    def state(self, name: str, node: str) -> KvStateMachine:
        machine = self.cs(name, node).mailbox.state
        assert isinstance(machine, KvStateMachine)
        return machine


def _two_clusters(root: Path) -> tuple[ClusterConfig, ClusterConfig, str, str]:
    return two_linked_clusters(root, ("raft", 3), ("pbft", 4), services=("clustersend",),
                               service_options={"clustersend": {"gc": True}})


async def _send(cluster: ClusterConfig, dst: str, values: list[bytes]) -> None:
    async with open_client(cluster, timeout=20) as client:
        for seq, value in enumerate(values):
            await client.call(outbox_command(dst, seq, value))


async def test_raft_and_pbft_clusters_exchange_values_exactly_once(tmp_path: Path) -> None:
    raft, pbft, ida, idb = _two_clusters(tmp_path)
    to_b = [f"a->b {i}".encode() for i in range(3)]
    to_a = [f"b->a {i}".encode() for i in range(2)]
    with trio.fail_after(GUARD):
        async with running(Clusters, ("a", raft), ("b", pbft)) as c:
            await _send(raft, idb, to_b)
            await _send(pbft, ida, to_a)

            def all_in(name: str, nodes: int, src: str, values: list[bytes]) -> bool:
                return all(c.state(name, f"n{i}").get(f"cs/in/{src}/{k:010d}") == v
                           for i in range(1, nodes + 1) for k, v in enumerate(values))

            await wait_for(lambda: all_in("b", 4, ida, to_b) and all_in("a", 3, idb, to_a),
                           within=GUARD)
            await wait_for(lambda: all(
                len(c.cs("a", f"n{i}").confirmed) == len(to_b) for i in (1, 2, 3)),
                within=GUARD)
            # gc: each confirmed outbox slot is compacted (its receiver's acknowledgements
            # verified at apply by every replica of the sending cluster).
            def compacted(name: str, nodes: int, dst: str, count: int) -> bool:
                return all(c.cs(name, f"n{i}").mailbox.outbox_mark(dst) == count
                           and c.state(name, f"n{i}").get(f"cs/out/{dst}/{0:010d}") is None
                           for i in range(1, nodes + 1))

            await wait_for(lambda: compacted("a", 3, idb, len(to_b))
                           and compacted("b", 4, ida, len(to_a)), within=GUARD)
            for i in range(1, 5):  # nothing beyond what was sent
                state = c.state("b", f"n{i}")
                assert state.get(f"cs/in/{ida}/{len(to_b):010d}") is None
            # A forged certificate, over the wire from attempt 0's sender of A to its
            # receiver in B (so it passes the pair check and reaches the certificate check).
            seq = 9
            value = b"forged"
            forged_st = SendStatement(src_cluster=ida, dst_cluster=idb, epoch=0, seq=seq,
                                      digest=value_digest(value))
            raft_info = c.cs("a", "n1").cluster
            pbft_info = c.cs("b", "n1").cluster
            (s_i, r_i), = schedule(Mode.PCS, link_seed(ida, idb, 0, seq), 0, raft_info.n,
                                   pbft_info.n, raft_info.f, pbft_info.f)
            sender = split_qualified(raft_info.members[s_i])[0]
            receiver = pbft_info.members[r_i]
            forged = Certificate(kind=raft_info.kind, statement=forged_st,
                                 signatures=tuple(MemberSignature(signer=m, sig=b"x" * 64)
                                                  for m in raft_info.members[:2]),
                                 term=0, leader=raft_info.members[0], leader_sig=b"y" * 64)
            victim = c.cs("b", split_qualified(receiver)[0])
            before = dict(victim.counters())
            assert c.nodes[("a", sender)].transport.send_nowait(
                receiver, CsSend(attempt=0, value=value, certificate=forged))
            c.nodes[("a", sender)].transport.flush()

            def dropped() -> dict[str, int]:
                now = victim.counters()
                return {k: now[k] - before.get(k, 0) for k in now
                        if k.startswith("machine:dropped") and now[k] != before.get(k, 0)}

            await wait_for(lambda: bool(dropped()), within=GUARD)
            assert dropped() == {"machine:dropped:bad_leader_signature": 1}
            assert victim.mailbox.state.get(f"cs/in/{ida}/{seq:010d}") is None


async def test_a_node_of_an_unlinked_cluster_is_refused(tmp_path: Path) -> None:
    # C links B one-sidedly (C's links/ holds B's material, B's does not hold C's): C's node
    # dials B's nodes, and B refuses it at the TLS handshake (C's CA is not trusted).
    raft, pbft, _, idb = _two_clusters(tmp_path)
    lone = init_cluster(tmp_path / "c", protocol="raft", nodes=1,
                        base_port=_far_from(raft, pbft), services=("clustersend",))
    shutil.copytree(raft.directory / "links", lone.directory / "links")
    with trio.fail_after(GUARD):
        async with running(Clusters, ("b", pbft), ("c", lone)) as c:
            b1 = c.nodes[("b", "n1")].transport
            await wait_for(lambda: b1.statistics().connections_refused >= 1, within=GUARD)
            assert not any(str(p).endswith("@" + _id(lone)) for p in b1.connected_peers())
            assert c.nodes[("c", "n1")].transport.statistics().outbound_established == 0
            assert idb in {split_qualified(str(p))[1] for p in c.nodes[("c", "n1")].transport.peers}


def _id(cluster: ClusterConfig) -> str:
    return cluster_fingerprint(cluster.ca)


def _far_from(*clusters: ClusterConfig) -> int:
    used = [cl.nodes[0].peer_addr.port for cl in clusters]
    while True:
        base = find_free_base_port(1)
        if all(abs(base - u) >= 300 for u in used):
            return base
