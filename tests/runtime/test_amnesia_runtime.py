"""Amnesia on a real (in-process, TLS) 3-node Raft cluster: the hardening issue's attack.

n1 stops; a put is acknowledged by n2 and n3; n2 and n3 stop; n3 comes back with an empty
data directory (a replaced disk). With the IDENTITY check n3 starts in recovery mode: n1 and
n3 elect nobody, and once n2 returns the write is there and n3 votes again. The control
starts n3 with `bootstrap=True` (what every node did before: an empty directory was a new
node): n1 and n3 elect a leader and the acknowledged write reads as absent.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import trio
import trio.lowlevel
from runtime_helpers import TESTER, RawClient, cluster_client, make_cluster, wait_for
from test_cluster import Cluster

from phalanx.apps import kv_wire
from phalanx.apps.kv_types import Get, Put, Value
from phalanx.consensus.types import ClientRequest
from phalanx.net.client_protocol import ClientCall, ClientReply, ReplyStatus
from phalanx.ops.node_config import NodeConfig
from phalanx.runtime.identity import IDENTITY_NAME
from phalanx.runtime.node import Node, NodeError, open_node


async def call(node: Node, n: int, command: bytes, *, read_only: bool = False) -> ClientReply:
    client = await RawClient.connect(node.client_address, cluster_client(node.config))
    try:
        await client.send(ClientCall(request=ClientRequest(
            client_id=f"{TESTER}/amnesia", request_no=n, command=command, read_only=read_only)))
        with trio.fail_after(10):
            reply = await client.receive()
        assert isinstance(reply, ClientReply)
        return reply
    finally:
        await client.aclose()


def identity_state(config: NodeConfig) -> str:
    return str(json.loads((config.data_dir / IDENTITY_NAME).read_text())["state"])


async def acknowledged_write_then_lose_n3_disk(nodes: Cluster) -> None:
    for node_id in ("n1", "n2", "n3"):
        await nodes.start(node_id)
    await nodes.leader()
    await nodes.stop("n1")
    leader = await nodes.leader()
    reply = await call(leader, 1, kv_wire.encode_command(Put(key="k", value=b"acked")))
    assert reply.status is ReplyStatus.OK
    await wait_for(lambda: all(identity_state(nodes.configs[i]) == "member"
                               for i in ("n2", "n3")), what="IDENTITY member on n2, n3")
    await nodes.stop("n2")
    await nodes.stop("n3")
    shutil.rmtree(nodes.configs["n3"].data_dir)


async def test_node_with_a_lost_disk_recovers_before_it_votes(tmp_path: Path) -> None:
    configs = make_cluster(tmp_path)
    async with trio.open_nursery() as nursery:
        nodes = Cluster(configs, nursery)
        await acknowledged_write_then_lose_n3_disk(nodes)
        await nodes.start("n1")
        n3 = await nodes.start("n3")
        assert n3.core_status().recovering
        assert identity_state(configs[2]) == "recovering"
        # ~10 election timeouts (10 ticks of 10 ms): n1 must never win with n3's vote.
        with trio.move_on_after(1.5):
            while True:
                assert not nodes.leaders(), "n1 won with the vote of a node that lost its disk"
                await trio.sleep(0.02)
        assert n3.core_status().recovering
        assert n3.core_status().dropped.get("vote_while_recovering", 0) > 0
        await nodes.start("n2")
        leader = await nodes.leader()
        assert leader.id == "n2"
        reply = await call(leader, 2, kv_wire.encode_command(Get(key="k")), read_only=True)
        assert reply.status is ReplyStatus.OK
        assert kv_wire.decode_result(reply.result) == Value(value=b"acked")
        await wait_for(lambda: not n3.core_status().recovering, what="n3 caught up")
        await wait_for(lambda: identity_state(configs[2]) == "member",
                       what="n3's IDENTITY back to member")
        nursery.cancel_scope.cancel()


async def test_control_without_the_check_the_write_is_lost(tmp_path: Path) -> None:
    """Today's behaviour (every empty directory is a new node): the attack succeeds."""
    configs = make_cluster(tmp_path)
    async with trio.open_nursery() as nursery:
        nodes = Cluster(configs, nursery)
        await acknowledged_write_then_lose_n3_disk(nodes)
        await nodes.start("n1")
        await nodes.start("n3", bootstrap=True)
        leader = await nodes.leader()
        reply = await call(leader, 2, kv_wire.encode_command(Get(key="k")), read_only=True)
        assert reply.status is ReplyStatus.OK
        assert kv_wire.decode_result(reply.result) == Value(value=None)
        nursery.cancel_scope.cancel()


async def test_missing_hard_state_is_amnesia_too(tmp_path: Path) -> None:
    configs = make_cluster(tmp_path)
    async with trio.open_nursery() as nursery:
        nodes = Cluster(configs, nursery)
        for node_id in ("n1", "n2", "n3"):
            await nodes.start(node_id)
        await nodes.leader()
        await wait_for(lambda: identity_state(configs[2]) == "member", what="n3 member")
        await nodes.stop("n3")
        hard_state = [p for p in configs[2].data_dir.iterdir() if p.name.startswith("hardstate")]
        assert hard_state, sorted(p.name for p in configs[2].data_dir.iterdir())
        for p in hard_state:
            p.unlink()
        n3 = await nodes.start("n3")
        assert n3.core_status().recovering
        await wait_for(lambda: not n3.core_status().recovering, what="n3 caught up")
        nursery.cancel_scope.cancel()


async def test_a_bad_piece_memory_budget_is_one_line_and_frees_the_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    configs = make_cluster(tmp_path)
    monkeypatch.setenv("PHALANX_PIECE_MEMORY_MB", "lots")
    with pytest.raises(NodeError, match=r": PHALANX_PIECE_MEMORY_MB='lots': expected a "
                                        r"whole number of MiB >= 0$"):
        async with open_node(configs[0]):
            pass
    monkeypatch.setenv("PHALANX_PIECE_MEMORY_MB", "0")
    async with open_node(configs[0]):  # the lock was released: the directory opens now
        pass


async def test_another_nodes_data_directory_is_refused(tmp_path: Path) -> None:
    configs = make_cluster(tmp_path)
    wrong = dataclasses.replace(configs[0], data_dir=configs[1].data_dir)
    with pytest.raises(NodeError, match="belongs to node n2, not n1"):
        async with open_node(wrong):
            pass


def test_the_piece_memory_budget_comes_from_the_config_unless_the_variable_is_set(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from phalanx.ops.node_config import CheckpointConfig
    from phalanx.runtime.node_checks import check_piece_memory
    from phalanx.storage.volatile import PIECE_MEMORY_MB

    assert CheckpointConfig().piece_memory_mb == PIECE_MEMORY_MB  # one default, two places
    config = make_cluster(tmp_path)[0]
    monkeypatch.delenv("PHALANX_PIECE_MEMORY_MB", raising=False)
    assert check_piece_memory(config) == PIECE_MEMORY_MB << 20
    small = dataclasses.replace(config, checkpoint=dataclasses.replace(
        config.checkpoint, piece_memory_mb=0))
    assert check_piece_memory(small) == 0
    monkeypatch.setenv("PHALANX_PIECE_MEMORY_MB", "3")
    assert check_piece_memory(small) == 3 << 20
