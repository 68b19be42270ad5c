"""`phalanx cluster add-node` (issue 21, item 2) without running nodes: the files it writes,
the bootstrap configuration they give each node, its refusals; the admin wire types and
Raft's mapping of admin operations onto core inputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx.cli.main import main
from phalanx.consensus.raft import ProposeConfChange, TransferLeadership
from phalanx.consensus.raft.confchange import ConfChange
from phalanx.consensus.raft.config import RaftStatus
from phalanx.consensus.types import Configuration, NodeId
from phalanx.net import client_protocol, wire
from phalanx.net.client_protocol import ReplyStatus
from phalanx.ops import admin_messages
from phalanx.ops.add_node import add_node
from phalanx.ops.admin_messages import AdminCall, AdminReply
from phalanx.ops.local_cluster import ClusterError, init_cluster, open_cluster
from phalanx.ops.node_config import load_node_config
from phalanx.protocols.raft_node import RAFT_NODE


def test_add_node_lays_out_a_bootstrap_learner(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "c"
    init_cluster(d, nodes=3, base_port=9000)
    assert main(["cluster", "add-node", str(d)]) == 0
    out = capsys.readouterr().out
    assert "added node n4: peers 127.0.0.1:9003, clients 127.0.0.1:9103" in out
    assert f"phalanx member add n4 --cluster {d}" in out
    n4 = load_node_config(d / "nodes" / "n4.toml")
    assert n4.joined
    assert n4.metrics_listen is not None
    assert n4.metrics_listen.port == 9203
    assert n4.bootstrap_voters() == ("n1", "n2", "n3")
    assert n4.bootstrap_learners() == ("n4",)
    n1 = load_node_config(d / "nodes" / "n1.toml")
    assert [(p.id, p.joined) for p in n1.peers] == [("n2", False), ("n3", False), ("n4", True)]
    assert n1.bootstrap_voters() == ("n1", "n2", "n3")  # n4 is added by `member add`
    assert n1.bootstrap_learners() == ()
    assert [(n.id, n.joined) for n in open_cluster(d).nodes][-1] == ("n4", True)
    assert (d / "nodes" / "n4.pem").is_file()
    assert (d / "data" / "n4" / "IDENTITY").is_file()
    assert add_node(d, "spare").peer_listen.port == 9004  # a chosen id, the next ports
    with pytest.raises(ClusterError, match="node n4 already exists"):
        add_node(d, "n4")
    with pytest.raises(ClusterError, match="invalid identity name"):
        add_node(d, "bad id")


def test_admin_messages_round_trip_through_the_codec() -> None:
    client_protocol.register()
    admin_messages.register()
    call = AdminCall(nonce=3, op="promote", node="n4")
    reply = AdminReply(nonce=3, status=ReplyStatus.OK, message="proposed", node="n1",
                       leader="n1", term=2, commit_index=9, voters=("n1", "n2"),
                       voters_outgoing=("n1",), learners=("n4",), members=("n1", "n2", "n4"),
                       matched=(9, 9, 4))
    for message in (call, reply):
        assert wire.decode(wire.encode(message)) == message


def _status(config: Configuration) -> RaftStatus:
    return RaftStatus(node=NodeId("n1"), role="leader", term=2, commit_index=9,
                      leader=NodeId("n1"), config=config)


def test_raft_maps_admin_operations_onto_core_inputs() -> None:
    n = NodeId
    status = _status(Configuration(voters=(n("n1"), n("n2"), n("n3")), learners=(n("n4"),)))
    assert RAFT_NODE.admin_input("add-learner", "n5", status) == ProposeConfChange(
        change=ConfChange(add_learners=(n("n5"),)))
    assert RAFT_NODE.admin_input("promote", "n4", status) == ProposeConfChange(
        change=ConfChange(add_voters=(n("n4"),)))
    assert RAFT_NODE.admin_input("remove", "n4", status) == ProposeConfChange(
        change=ConfChange(remove_learners=(n("n4"),)))
    assert RAFT_NODE.admin_input("remove", "n2", status) == ProposeConfChange(
        change=ConfChange(remove_voters=(n("n2"),)))
    assert RAFT_NODE.admin_input("transfer", "n2", status) == TransferLeadership(to=n("n2"))
    assert RAFT_NODE.admin_input("promote", "n2", status) == (
        "n2 is not a learner (add it with add-learner first)")
    assert "n4 is not a voter" in str(RAFT_NODE.admin_input("transfer", "n4", status))
    assert RAFT_NODE.admin_input("frobnicate", "n2", status) == (
        "unknown admin operation 'frobnicate'")
