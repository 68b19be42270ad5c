"""A client's retry of a transaction already applied here is answered from the replica's
transaction table (`Replica.applied_result`, `phalanx.runtime.driver_calls`).

A leaderless node that learned a transaction from its peers (the client's first call never
reached it) applies it with no waiter; the client's retry then reaches a core that drops it
as a duplicate submit. Without this answer the client never collects f+1 matching answers
and times out although the transaction committed (seen in `bench/latency_trace.py` when its
client's first call reached one node only). The core here is a stand-in that, like the
leaderless core, answers nothing for a duplicate.
"""

from __future__ import annotations

import trio
from runtime_helpers import wait_for

from phalanx.apps.kv import KvStateMachine
from phalanx.apps.kv_types import Put
from phalanx.apps.kv_wire import encode_command
from phalanx.apps.replica import ApplyStatus, Replica
from phalanx.consensus.core import CoreStatus, Input, Ready, Submit
from phalanx.consensus.leaderless.messages import Transaction
from phalanx.consensus.types import ClientRequest, Entry, EntryKind, NodeId
from phalanx.net import wire
from phalanx.net.client_protocol import ClientCall, ClientReply, ReplyStatus, StatusReply
from phalanx.protocols.leaderless_node import TxLayer, WireTxCodec
from phalanx.runtime.driver import Driver
from phalanx.runtime.group_commit import GroupCommitter
from phalanx.runtime.persistence import ReadyPersister
from phalanx.storage.memory import MemoryDisk

N1 = NodeId("n1")


class SilentCore:
    """Drops every submit (a duplicate, to the leaderless core), counting them."""

    node_id = N1

    def __init__(self) -> None:
        self.submits = 0

    def step(self, inp: Input, /) -> Ready:
        if isinstance(inp, Submit):
            self.submits += 1
        return Ready()

    def status(self) -> CoreStatus:
        return CoreStatus(node=N1, role="endorser", term=0, commit_index=0, leader=None)


class Sink:
    def __init__(self) -> None:
        self.replies: list[ClientReply] = []

    def deliver(self, reply: ClientReply | StatusReply) -> None:
        assert isinstance(reply, ClientReply)
        self.replies.append(reply)


def _request(no: int, key: str) -> ClientRequest:
    tx = Transaction(client="alice", client_id="c1", request_no=no,
                     deadline_ms=1_700_000_060_000, requirements=(),
                     command=encode_command(Put(key=key, value=b"v")))
    return ClientRequest(client_id="c1", request_no=no, command=WireTxCodec().encode(tx))


async def test_a_retry_of_an_applied_transaction_is_answered_from_the_table() -> None:
    replica = Replica(KvStateMachine(), checkpoints=MemoryDisk("r").open().checkpoints,
                      transactions=TxLayer())
    applied, fresh = _request(1, "a"), _request(2, "b")
    assert replica.applied_result(applied.command) is None
    (outcome,) = replica.apply(Entry(index=1, term=0, kind=EntryKind.COMMAND,
                                     requests=(applied,)))  # learned from peers: no waiter
    assert outcome.status is ApplyStatus.APPLIED
    assert replica.applied_result(applied.command) == outcome.result
    assert replica.applied_result(fresh.command) is None
    assert replica.applied_result(b"garbage") is None

    storage = MemoryDisk("n1").open()
    committer = GroupCommitter(
        ReadyPersister(wal=storage.wal, hard_state=storage.hard_state,
                       checkpoints=storage.checkpoints, codec=wire.default_registry()),
        install=None, saved=None)
    core = SilentCore()

    def status_reply(nonce: int, status: CoreStatus, replica: Replica) -> StatusReply:
        raise AssertionError("not used")

    driver = Driver(core=core, replica=replica, committer=committer,
                    send=lambda to, message: True, tick_seconds=3600.0,
                    status_reply=status_reply)
    sink = Sink()
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await driver.call(ClientCall(request=applied), sink)
        await wait_for(lambda: len(sink.replies) == 1, what="the retry's answer")
        await driver.call(ClientCall(request=fresh), sink)
        await wait_for(lambda: core.submits == 1, what="the new transaction's submit")
        nursery.cancel_scope.cancel()
    (reply,) = sink.replies  # the new transaction waits for its commit: no answer yet
    assert reply.status is ReplyStatus.OK
    assert reply.result == outcome.result
    assert core.submits == 1  # the retry never reached the core
    assert driver.stats.session_replies == 1
