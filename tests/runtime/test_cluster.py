"""An in-process 3-node Raft cluster over real TLS sockets: election, client calls, redirects,
reads, status, malformed client input, reconnect after a node restart, exactly-once across a
leader crash."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
import trio
import trio.lowlevel
from runtime_helpers import RawClient, cluster_client, make_cluster, wait_for

from phalanx.apps import kv_wire
from phalanx.apps.kv_types import CasResult, CompareAndSet, Get, Put, Value
from phalanx.consensus.core import Ready
from phalanx.consensus.raft import (
    AppendEntries,
    AppendEntriesResponse,
    RequestVote,
    RequestVoteResponse,
)
from phalanx.consensus.types import ClientRequest, NodeId
from phalanx.net.client_protocol import (
    ClientCall,
    ClientReply,
    ReadConsistency,
    ReplyStatus,
    StatusCall,
    StatusReply,
)
from phalanx.ops.node_config import NodeConfig
from phalanx.runtime.driver import Driver
from phalanx.runtime.group_commit import GroupCommitter
from phalanx.runtime.node import Node, open_node


def put(client_id: str, n: int, key: str, value: bytes) -> ClientCall:
    command = kv_wire.encode_command(Put(key=key, value=value))
    return ClientCall(request=ClientRequest(client_id=client_id, request_no=n, command=command))


def cas(client_id: str, n: int, key: str, expected: bytes, new: bytes) -> ClientCall:
    command = kv_wire.encode_command(CompareAndSet(key=key, expected=expected, new=new))
    return ClientCall(request=ClientRequest(client_id=client_id, request_no=n, command=command))


def get(client_id: str, n: int, key: str, *, stale: bool = False) -> ClientCall:
    return ClientCall(
        request=ClientRequest(client_id=client_id, request_no=n, read_only=True,
                              command=kv_wire.encode_command(Get(key=key))),
        consistency=ReadConsistency.STALE if stale else ReadConsistency.LINEARIZABLE,
    )


class Cluster:
    def __init__(self, configs: list[NodeConfig], nursery: trio.Nursery) -> None:
        self.configs = {c.id: c for c in configs}
        self.nursery = nursery
        self.nodes: dict[str, Node] = {}
        self.scopes: dict[str, trio.CancelScope] = {}
        self.stopped: dict[str, trio.Event] = {}

    async def start(self, node_id: str, *, bootstrap: bool = False) -> Node:
        config = self.configs[node_id]
        stopped = self.stopped[node_id] = trio.Event()

        async def run(task_status: trio.TaskStatus[Node]) -> None:
            try:
                with trio.CancelScope() as scope:
                    self.scopes[node_id] = scope
                    async with open_node(config, bootstrap=bootstrap) as node:
                        task_status.started(node)
                        await trio.sleep_forever()
            finally:
                stopped.set()

        node = await self.nursery.start(run)
        self.nodes[node_id] = node
        return node

    async def stop(self, node_id: str) -> None:
        """Stop `node_id` and wait until its storage is closed (its data directory unlocked:
        it may start again at once)."""
        self.scopes.pop(node_id).cancel()
        del self.nodes[node_id]
        await self.stopped[node_id].wait()

    def leaders(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.core_status().role == "leader"]

    async def leader(self) -> Node:
        def one_leader() -> bool:
            leaders = self.leaders()
            return len(leaders) == 1 and all(
                n.core_status().leader == leaders[0].id for n in self.nodes.values())

        await wait_for(one_leader, what="a single agreed leader")
        return self.leaders()[0]

    async def client(self, node: Node) -> RawClient:
        return await RawClient.connect(node.client_address, cluster_client(node.config))


@contextlib.asynccontextmanager
async def cluster(root: Path, **kw: object) -> AsyncIterator[Cluster]:
    configs = make_cluster(root, **kw)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        c = Cluster(configs, nursery)
        for config in configs:
            await c.start(config.id)
        try:
            yield c
        finally:
            nursery.cancel_scope.cancel()


async def call(client: RawClient, message: ClientCall) -> ClientReply:
    await client.send(message)
    reply = await client.receive()
    assert isinstance(reply, ClientReply)
    return reply


async def test_elects_serves_redirects_and_reports_status(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        leader = await c.leader()
        client = await c.client(leader)
        reply = await call(client, put("tester/c1", 1, "k", b"v1"))
        assert reply.status is ReplyStatus.OK, reply
        assert reply.replica == leader.id
        # A linearizable read at the leader sees it.
        reply = await call(client, get("tester/c1", 2, "k"))
        assert reply.status is ReplyStatus.OK
        assert kv_wire.decode_result(reply.result) == Value(value=b"v1")
        # A follower redirects writes to the leader...
        follower = next(n for n in c.nodes.values() if n.id != leader.id)
        fclient = await c.client(follower)
        reply = await call(fclient, put("tester/c2", 1, "k", b"v2"))
        assert reply.status is ReplyStatus.REDIRECT
        assert reply.leader_hint == leader.id
        # ... and serves stale reads from its applied state once it has applied the write.
        await wait_for(lambda: follower.replica.applied_index >= leader.replica.applied_index)
        reply = await call(fclient, get("tester/c2", 2, "k", stale=True))
        assert reply.status is ReplyStatus.OK
        assert kv_wire.decode_result(reply.result) == Value(value=b"v1")
        # Status over the client port.
        await fclient.send(StatusCall(nonce=7))
        status = await fclient.receive()
        assert isinstance(status, StatusReply)
        assert status.nonce == 7
        assert status.node == follower.id
        assert status.role == "follower"
        assert status.leader == leader.id
        assert status.applied_index >= 2
        assert status.peers == tuple(
            sorted(i for i in c.nodes if i != follower.id))
        # Pipelining: many calls in flight on one connection, all answered.
        for n in range(3, 43):
            await client.send(put("tester/c1", n, f"p{n}", b"x"))
        replies = [await client.receive() for _ in range(40)]
        assert sorted(r.request_no for r in replies if isinstance(r, ClientReply)
                      and r.status is ReplyStatus.OK) == list(range(3, 43))
        stats = leader.statistics()
        assert stats.fsyncs >= 1
        # Every entry applied once and counted (pipelined writes may share an entry).
        assert stats.driver.applied_entries == leader.replica.applied_index
        assert stats.transport.bytes_out > 0
        await client.aclose()
        await fclient.aclose()


async def test_status_reports_links_between_followers_and_drops_a_stopped_node(
    tmp_path: Path,
) -> None:
    # Followers never message each other, so "heard from" showed them "(down)" to each other;
    # `connected_peers` is the transport's link state.
    async with cluster(tmp_path) as c:
        leader = await c.leader()
        followers = sorted(n for n in c.nodes if n != leader.id)
        every = tuple(sorted(c.nodes))

        def links(node_id: str) -> tuple[str, ...]:
            return c.nodes[node_id].status().connected_peers

        for node_id in every:
            others = tuple(p for p in every if p != node_id)
            await wait_for(lambda n=node_id, o=others: links(n) == o,  # type: ignore[misc]
                           what=f"{node_id} linked to {others}")
        stopped, remaining = followers[0], followers[1]
        await c.stop(stopped)
        await wait_for(lambda: links(remaining) == (leader.id,),
                       what=f"{remaining} sees {stopped} down")
        await wait_for(lambda: links(leader.id) == (remaining,),
                       what=f"{leader.id} sees {stopped} down")


async def test_malformed_client_frames_close_only_that_connection(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        leader = await c.leader()
        good = await c.client(leader)
        bad = await c.client(leader)
        oversized = await c.client(leader)
        await bad.send_raw(b"\x00\x00\x00\x03abc")  # a frame that is not a codec message
        await oversized.send_raw(b"\xff\xff\xff\xff")  # a length beyond max_frame_size
        for conn in (bad, oversized):
            with trio.fail_after(5):
                try:
                    await conn.receive()
                except EOFError:
                    pass
                else:
                    raise AssertionError("the node answered a malformed frame")
        stats = leader.client_port.stats
        assert stats.malformed_frames == 1
        assert stats.oversized_frames == 1
        reply = await call(good, put("tester/c", 1, "k", b"v"))
        assert reply.status is ReplyStatus.OK


async def test_exactly_once_retry_across_leader_crash(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        leader = await c.leader()
        client = await c.client(leader)
        assert (await call(client, put("tester/once", 1, "counter", b"a"))).status is ReplyStatus.OK
        # Request 2, a compare-and-set a -> b (applying it twice would fail the second time),
        # is sent; the leader dies before we read the answer.
        await client.send(cas("tester/once", 2, "counter", b"a", b"b"))
        await wait_for(lambda: all(n.replica.session("tester/once") is not None
                                   and n.replica.session("tester/once").request_no == 2  # type: ignore[union-attr]
                                   for n in c.nodes.values()), what="request 2 replicated")
        old = leader.id
        await c.stop(old)
        new = await c.leader()
        assert new.id != old
        nclient = await c.client(new)
        # The retry carries the same ids; the new leader has already applied request 2, so the
        # driver answers it from the session table with the FIRST application's result (a
        # successful swap), without applying anything again.
        reply = await call(nclient, cas("tester/once", 2, "counter", b"a", b"b"))
        assert reply.status is ReplyStatus.OK
        assert kv_wire.decode_result(reply.result) == CasResult(succeeded=True, current=b"b")
        assert new.statistics().driver.session_replies == 1
        reply = await call(nclient, get("tester/reader", 1, "counter"))
        assert kv_wire.decode_result(reply.result) == Value(value=b"b")
        # The old leader restarts from disk, reconnects and catches up.
        await c.start(old)
        restarted = c.nodes[old]
        await wait_for(lambda: restarted.replica.applied_index >= new.replica.applied_index,
                       what="restarted node catches up")
        assert restarted.replica.session("tester/once") == new.replica.session("tester/once")
        assert new.statistics().transport.outbound_established >= 2


async def test_no_message_leaves_before_its_state_is_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow disk (every batch waits before it is written) widens the window; every message
    a node receives must depend only on its sender's durable state: the sender's term was
    durable, a granted vote was durable, an acknowledged log prefix was durable. A leader's
    AppendEntries may carry entries it has not yet written (`Ready.early_messages`, Raft
    §10.2.1), but never a term it has not written."""
    original = GroupCommitter.persist
    # id(committer) -> (durable term, durable vote, durable last index)
    durable: dict[int, tuple[int, str | None, int]] = {}

    def slow_persist(self: GroupCommitter, batch: Sequence[Ready]) -> bool:
        time.sleep(0.005)
        synced = original(self, batch)
        hs = self.saved_hard_state
        durable[id(self)] = (hs.term, hs.vote, self.persister.wal.last_index())
        return synced

    monkeypatch.setattr(GroupCommitter, "persist", slow_persist)
    violations: list[str] = []
    checked = [0]
    nodes: dict[str, Node] = {}
    original_deliver = Driver.deliver_inline  # the transport's entry (`driver_inline`)

    async def checking_deliver(self: Driver, src: NodeId, message: object) -> None:
        sender = nodes.get(src)
        kinds = RequestVote | AppendEntries | AppendEntriesResponse | RequestVoteResponse
        if sender is not None and isinstance(message, kinds):
            term, vote, last = durable.get(id(sender.driver.committer), (0, None, 0))
            pre_vote = isinstance(message, RequestVote | RequestVoteResponse) and (
                message.pre_vote)
            if not pre_vote and message.term > term:
                violations.append(f"{src} sent term {message.term} with durable term {term}")
            if (isinstance(message, AppendEntriesResponse) and message.success
                    and message.match_index > last):
                violations.append(f"{src} acknowledged {message.match_index} with durable "
                                  f"log end {last}")
            if (isinstance(message, RequestVoteResponse) and message.vote_granted
                    and not message.pre_vote and term == message.term
                    and vote != self.node_id):
                violations.append(f"{src} granted a vote to {self.node_id} with durable "
                                  f"vote {vote}")
            checked[0] += 1
        await original_deliver(self, src, message)

    monkeypatch.setattr(Driver, "deliver_inline", checking_deliver)
    async with cluster(tmp_path) as c:
        nodes.update(c.nodes)
        leader = await c.leader()
        client = await c.client(leader)
        for n in range(1, 21):
            await client.send(put("tester/c", n, f"k{n}", b"v"))
        for _ in range(20):
            reply = await client.receive()
            assert isinstance(reply, ClientReply)
            assert reply.status is ReplyStatus.OK
        # Then one write at a time: each is replicated by its own AppendEntries and
        # acknowledged, whatever the batching of the 20 above (under load they went in as
        # few as 3 checked messages: the count depends on timing).
        for n in range(21, 26):
            await client.send(put("tester/c", n, f"k{n}", b"v"))
            reply = await client.receive()
            assert isinstance(reply, ClientReply)
            assert reply.status is ReplyStatus.OK
    # Not vacuous: the replication of the writes went through the check.
    assert checked[0] >= 10
    assert violations == []


async def test_sequential_writes_carry_commits_in_the_next_append_and_followers_catch_up(
    tmp_path: Path,
) -> None:
    """A closed-loop client: each write's commit notice is superseded by the next write's
    AppendEntries (never sent on its own), the last one leaves with a tick, and every
    follower applies everything; the peer links write a pass's frames per peer at once."""
    async with cluster(tmp_path) as c:
        leader = await c.leader()
        client = await c.client(leader)
        for n in range(1, 21):
            reply = await call(client, put("tester/c1", n, f"k{n}", b"v"))
            assert reply.status is ReplyStatus.OK, reply
        followers = [node for node in c.nodes.values() if node.id != leader.id]
        await wait_for(lambda: all(f.replica.applied_index == leader.replica.applied_index
                                   for f in followers))
        driver = leader.statistics().driver
        # Two followers, up to 19 superseded notices each; a notice a tick releases first is
        # sent instead, so how many depends on timing (8-19 of ~40 held at load ~10, both
        # with and without inline passes). Without superseding it is 0.
        assert driver.superseded_messages >= 4
        assert driver.lazy_messages >= driver.superseded_messages
        transport = leader.statistics().transport
        assert 0 < transport.direct_write_calls <= transport.direct_writes
        scraped = leader.metrics.exposition().decode()
        assert "phalanx_driver_superseded_messages_total" in scraped
        assert "phalanx_peer_direct_write_calls_total" in scraped
        await client.aclose()
