"""The transport's inter-cluster path (`phalanx.net.intercluster`) over real loopback mTLS:
two clusters with their own CAs, linked; a third cluster not linked.

What is checked: a linked node is reached and heard under its qualified id
``<node>@<cluster>``; from it only the messages the inter-cluster filter allows are delivered
(the rest dropped and counted); a node of an unlinked cluster fails the handshake; a linked
cluster's certificate naming one of OUR node ids never passes for that node; a linked
cluster's node that is not in its link is refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from transport_fakes import LogWaiter, address, listen, node, receive

from phalanx.consensus.types import NodeId
from phalanx.net.intercluster import (
    Intercluster,
    LinkedCluster,
    linked_client_context,
    qualify,
    split_qualified,
)
from phalanx.net.transport import PeerAddress
from phalanx.ops import pki

A, B = "clusterA", "clusterB"


def _allowed(message: object) -> bool:
    return isinstance(message, dict) and message.get("kind") == "cs"


class _Cluster:
    def __init__(self, root: Path, name: str, nodes: tuple[str, ...]) -> None:
        self.ca = pki.create_ca()
        pki.write_ca(self.ca, root / name / "ca")
        self.ca_pem = (root / name / "ca" / "ca.pem").read_bytes()
        self.creds = {n: pki.write_credentials(pki.issue_node_cert(self.ca, n),
                                               root / name / "nodes") for n in nodes}


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, _Cluster]:
    root = tmp_path_factory.mktemp("clusters")
    return {A: _Cluster(root, A, ("n1",)), B: _Cluster(root, B, ("n1", "n2")),
            "C": _Cluster(root, "C", ("n1",))}


def _link(me: pki.CredentialPaths, other: _Cluster, cluster_id: str,
          peers: dict[NodeId, PeerAddress]) -> Intercluster:
    return Intercluster(clusters=(LinkedCluster(
        cluster_id=cluster_id, ca_pem=other.ca_pem, peers=peers,
        client_context=linked_client_context(me.certificate, me.private_key, other.ca_pem)),),
        allowed=_allowed)


def test_qualified_ids_round_trip() -> None:
    assert qualify("n1", A) == "n1@clusterA"
    assert split_qualified("n1@clusterA") == ("n1", A)
    assert split_qualified("n1") == ("n1", None)


async def test_linked_clusters_exchange_only_intercluster_messages(
    clusters: dict[str, _Cluster], logs: LogWaiter,
) -> None:
    ca, cb = clusters[A], clusters[B]
    la, lb = await listen(), await listen()
    n1 = NodeId("n1")
    link_a = _link(ca.creds["n1"], cb, B, {n1: address(lb)})  # A knows B's n1 only
    link_b = _link(cb.creds["n1"], ca, A, {n1: address(la)})
    async with node(ca.creds, n1, la, {}, intercluster=link_a) as ta, \
            node(cb.creds, n1, lb, {}, intercluster=link_b) as tb:
        assert set(ta.peers) == {qualify("n1", B)}
        ta.send_nowait(qualify("n1", B), {"kind": "core", "i": 0})  # not inter-cluster
        ta.send_nowait(qualify("n1", B), {"kind": "cs", "i": 1})
        assert await receive(tb) == (qualify("n1", A), {"kind": "cs", "i": 1})
        tb.send_nowait(qualify("n1", A), {"kind": "cs", "i": 2})
        assert await receive(ta) == (qualify("n1", B), {"kind": "cs", "i": 2})
        assert tb.intercluster_refused == 1
        assert tb.statistics().connections_refused == 0


async def test_unlinked_and_unlisted_nodes_are_refused(
    clusters: dict[str, _Cluster], logs: LogWaiter,
) -> None:
    ca, cb, cc = clusters[A], clusters[B], clusters["C"]
    la, lb2, lc = await listen(), await listen(), await listen()
    n1, n2 = NodeId("n1"), NodeId("n2")
    # A links B but lists only B's n1; B's n2 (a valid B certificate) dials A anyway.
    link_a = _link(ca.creds["n1"], cb, B, {n1: PeerAddress(host="127.0.0.1", port=1)})
    link_b2 = _link(cb.creds["n2"], ca, A, {n1: address(la)})
    # C is linked with nobody: its n1 certificate also names "n1", A's own id.
    link_c = _link(cc.creds["n1"], ca, A, {n1: address(la)})
    async with node(ca.creds, n1, la, {}, intercluster=link_a) as ta:
        async with node(cb.creds, n2, lb2, {}, intercluster=link_b2):
            await logs.wait_for("is not a node of linked cluster clusterB")
        async with node(cc.creds, n1, lc, {}, intercluster=link_c):
            await logs.wait_for("TLS handshake failed")
        assert ta.statistics().connections_refused == 2  # counted before logged
        assert ta.statistics().connections_accepted == 0


async def test_a_linked_certificate_never_passes_for_our_own_node(
    clusters: dict[str, _Cluster], logs: LogWaiter,
) -> None:
    # A is a 2-node cluster (n1, n2) linked with B. B's n1 dials A's n1 with a plain
    # (unqualified) context: it is heard as n1@clusterB, never as A's own n1 or n2.
    ca, cb = clusters[A], clusters[B]
    la, lb = await listen(), await listen()
    n1 = NodeId("n1")
    link_a = _link(ca.creds["n1"], cb, B, {n1: address(lb)})
    link_b = _link(cb.creds["n1"], ca, A, {n1: address(la)})
    async with node(ca.creds, n1, la, {}, intercluster=link_a) as ta, \
            node(cb.creds, n1, lb, {}, intercluster=link_b) as tb:
        tb.send_nowait(qualify("n1", A), {"kind": "cs", "i": 3})
        src, _ = await receive(ta)
        assert src == qualify("n1", B)
        assert src != n1


async def test_plain_peers_must_be_our_own(clusters: dict[str, _Cluster]) -> None:
    la = await listen()
    with pytest.raises(ValueError, match="linked cluster"):
        async with node(clusters[A].creds, NodeId("n1"), la,
                        {qualify("n1", B): PeerAddress(host="127.0.0.1", port=1)}):
            pass
