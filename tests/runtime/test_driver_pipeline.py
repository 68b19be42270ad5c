"""The driver's pipeline against a scripted core: early messages leave before the disk write,
ordinary ones only after it; writes arriving in one pass become one proposal (bounded); a
leader persists on a worker thread, a follower on the core task only when asked.

The core here is a stand-in that returns fixed Readys, so each test pins one rule of
`phalanx.runtime.driver` without Raft's own behaviour in the way. Synchronisation is by events and
`wait_for`, never by elapsed time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import pytest
import trio
from runtime_helpers import wait_for

from phalanx.apps.kv import KvStateMachine
from phalanx.apps.replica import Replica
from phalanx.consensus.core import CoreStatus, Input, Persisted, Ready, Receive, Send
from phalanx.consensus.raft import AppendEntries, AppendEntriesResponse
from phalanx.consensus.types import ClientRequest, Entry, EntryKind, Message, NodeId
from phalanx.net import wire
from phalanx.net.client_protocol import ClientCall, ClientReply, ReplyStatus, StatusReply
from phalanx.runtime.driver import DRAIN_LIMIT, PROPOSAL_MAX_REQUESTS, Driver
from phalanx.runtime.group_commit import GroupCommitter
from phalanx.runtime.persistence import ReadyPersister
from phalanx.runtime.phase_trace import PhaseTrace
from phalanx.storage.memory import MemoryDisk

N1, N2 = NodeId("n1"), NodeId("n2")
EARLY = AppendEntries(term=1, leader_id=N1, prev_log_index=0, prev_log_term=0, entries=(),
                      leader_commit=0)
LATE = AppendEntriesResponse(term=1, success=True, match_index=1)


class ScriptedCore:
    """Every batch of client requests becomes one Ready that appends one entry, sends EARLY
    early and LATE after persisting."""

    def __init__(self, role: str) -> None:
        self.role = role
        self.node_id = N1
        self.proposals: list[tuple[ClientRequest, ...]] = []
        self.persisted: list[int] = []
        self._number = 0

    def propose(self, requests: tuple[ClientRequest, ...]) -> Ready:
        self.proposals.append(requests)
        self._number += 1
        entry = Entry(index=self._number, term=1, kind=EntryKind.COMMAND, requests=requests)
        return Ready(number=self._number, entries=(entry,), must_sync=True,
                     early_messages=(Send(to=N2, message=EARLY),),
                     messages=(Send(to=N2, message=LATE),))

    def step(self, inp: Input, /) -> Ready:
        if isinstance(inp, Persisted):
            self.persisted.append(inp.number)
        return Ready()

    def status(self) -> CoreStatus:
        leader = N1 if self.role == "leader" else None
        return CoreStatus(node=N1, role=self.role, term=1, commit_index=0, leader=leader)


class Sink:
    def __init__(self) -> None:
        self.replies: list[ClientReply | StatusReply] = []

    def deliver(self, reply: ClientReply | StatusReply) -> None:
        self.replies.append(reply)


class GatedCommitter(GroupCommitter):
    """Blocks every persist until `gate` is set; records the thread it ran on."""

    def __init__(self) -> None:
        storage = MemoryDisk("n1").open()
        super().__init__(ReadyPersister(wal=storage.wal, hard_state=storage.hard_state,
                                        checkpoints=storage.checkpoints,
                                        codec=wire.default_registry()),
                         install=None, saved=None)
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Event()
        self.threads: list[str] = []
        self.events: list[str] = []

    def persist(self, batch: Sequence[Ready]) -> bool:
        self.threads.append(threading.current_thread().name)
        self.started.set()
        self.gate.wait(timeout=30)
        self.events.append("persisted")
        return super().persist(batch)


def make_driver(core: ScriptedCore, committer: GatedCommitter,
                sent: list[tuple[NodeId, Message]], *, tick_seconds: float = 3600.0,
                max_pending_calls: int = 2048,
                idle_inline: bool = False, trace: PhaseTrace | None = None,
                send: Callable[[NodeId, Message], bool] | None = None) -> Driver:
    def record(to: NodeId, message: Message) -> bool:
        sent.append((to, message))
        committer.events.append(type(message).__name__)
        return True

    def status_reply(nonce: int, status: CoreStatus, replica: Replica) -> StatusReply:
        raise AssertionError("not used")

    replica = Replica(KvStateMachine(), checkpoints=MemoryDisk("r").open().checkpoints)
    return Driver(core=core, replica=replica, committer=committer, send=send or record,
                  tick_seconds=tick_seconds, status_reply=status_reply,
                  propose_batch=core.propose,
                  max_pending_calls=max_pending_calls, idle_inline=idle_inline,
                  trace=trace)


def call(n: int) -> ClientCall:
    return ClientCall(request=ClientRequest(client_id="c", request_no=n, command=b"x"))


async def test_early_messages_leave_before_the_write_and_the_rest_after() -> None:

    core, committer, sent = ScriptedCore("leader"), GatedCommitter(), []
    committer.gate.clear()
    driver = make_driver(core, committer, sent)
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await driver.call(call(1), Sink())
        await wait_for(lambda: committer.started.is_set())
        await wait_for(lambda: len(sent) >= 1)
        assert sent == [(N2, EARLY)]  # the write is still blocked: only the early one left
        committer.gate.set()
        await wait_for(lambda: len(sent) == 2)
        assert committer.events == ["AppendEntries", "persisted", "AppendEntriesResponse"]
        await wait_for(lambda: core.persisted == [1])
        nursery.cancel_scope.cancel()
    assert committer.threads[0] != threading.current_thread().name  # leader: worker thread


async def test_writes_of_one_pass_are_one_proposal() -> None:
    core, committer, sent = ScriptedCore("leader"), GatedCommitter(), []
    driver = make_driver(core, committer, sent)
    for n in range(1, 6):  # queued before the loop runs: all in its first pass
        await driver.call(call(n), Sink())
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await wait_for(lambda: core.persisted == [1])
        nursery.cancel_scope.cancel()
    assert [[r.request_no for r in p] for p in core.proposals] == [[1, 2, 3, 4, 5]]
    assert driver.stats.proposal_batches == 1
    assert sent == [(N2, EARLY), (N2, LATE)]


async def test_a_long_pass_is_cut_into_bounded_proposals() -> None:
    core, committer, sent = ScriptedCore("leader"), GatedCommitter(), []
    driver = make_driver(core, committer, sent)
    total = PROPOSAL_MAX_REQUESTS + 3
    for n in range(1, total + 1):
        await driver.call(call(n), Sink())
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await wait_for(lambda: core.persisted[-1:] == [2])
        nursery.cancel_scope.cancel()
    sizes = [len(p) for p in core.proposals]
    assert sizes == [PROPOSAL_MAX_REQUESTS, 3]
    assert [r.request_no for p in core.proposals for r in p] == list(range(1, total + 1))


async def test_a_follower_persists_on_a_worker_thread_by_default() -> None:
    core, committer, sent = ScriptedCore("follower"), GatedCommitter(), []
    driver = make_driver(core, committer, sent)
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await driver.call(call(1), Sink())
        await wait_for(lambda: core.persisted == [1])
        nursery.cancel_scope.cancel()
    assert committer.threads != [threading.current_thread().name]


async def test_an_idle_leader_persists_a_small_batch_on_the_core_task() -> None:
    core, committer, sent = ScriptedCore("leader"), GatedCommitter(), []
    driver = make_driver(core, committer, sent, idle_inline=True)
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await driver.call(call(1), Sink())
        await wait_for(lambda: core.persisted == [1])
        nursery.cancel_scope.cancel()
    assert committer.threads == [threading.current_thread().name]
    assert driver.stats.io_batches == 0  # no worker-thread hand-off
    # The ordering rule is unchanged: early message, then the write, then the rest.
    assert committer.events == ["AppendEntries", "persisted", "AppendEntriesResponse"]


async def test_an_idle_leader_lets_the_transport_write_early_messages_before_its_fsync() -> None:
    """The transport writes from its own tasks: an inline write must not block the event
    loop before they took the early messages (they would leave only after the fsync)."""
    core, committer, sent = ScriptedCore("leader"), GatedCommitter(), []
    wire_tx, wire_rx = trio.open_memory_channel[Message](16)
    driver = make_driver(core, committer, sent, idle_inline=True,
                         send=lambda to, m: _enqueue(wire_tx, m))

    async def link_task() -> None:  # the transport's per-peer pump
        async for message in wire_rx:
            committer.events.append(f"wire {type(message).__name__}")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(link_task)
        await nursery.start(driver.run)
        await driver.call(call(1), Sink())
        await wait_for(lambda: core.persisted == [1])
        await wait_for(lambda: len(committer.events) == 3)
        nursery.cancel_scope.cancel()
    assert committer.threads == [threading.current_thread().name]  # inline
    assert committer.events == ["wire AppendEntries", "persisted", "wire AppendEntriesResponse"]


class FollowUpCore(ScriptedCore):
    """`Persisted(1)` makes a second durable Ready (a next phase: PBFT's commit after its
    prepare), which the driver persists in the same flush."""

    def step(self, inp: Input, /) -> Ready:
        super().step(inp)
        if isinstance(inp, Persisted) and inp.number == 1:
            self._number += 1
            entry = Entry(index=self._number, term=1, kind=EntryKind.NOOP)
            return Ready(number=self._number, entries=(entry,), must_sync=True,
                         messages=(Send(to=N2, message=EARLY),))
        return Ready()


async def test_messages_of_one_batch_are_written_before_the_next_inline_fsync() -> None:
    core, committer, sent = FollowUpCore("leader"), GatedCommitter(), []
    wire_tx, wire_rx = trio.open_memory_channel[Message](16)
    driver = make_driver(core, committer, sent, idle_inline=True,
                         send=lambda to, m: _enqueue(wire_tx, m))

    async def link_task() -> None:
        async for message in wire_rx:
            committer.events.append(f"wire {type(message).__name__}")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(link_task)
        await nursery.start(driver.run)
        await driver.call(call(1), Sink())
        await wait_for(lambda: core.persisted == [1, 2])
        await wait_for(lambda: len(committer.events) == 5)
        nursery.cancel_scope.cancel()
    assert committer.threads == [threading.current_thread().name] * 2  # both inline
    assert committer.events == ["wire AppendEntries", "persisted", "wire AppendEntriesResponse",
                                "persisted", "wire AppendEntries"]


def _enqueue(channel: trio.MemorySendChannel[Message], message: Message) -> bool:
    channel.send_nowait(message)
    return True


async def test_a_busy_leader_keeps_persisting_on_the_worker_thread() -> None:
    """Inputs still waiting in the channel when the pass ends: the batch goes to the worker
    thread, so the loop keeps stepping them while the disk works."""
    core, committer, sent = ScriptedCore("leader"), GatedCommitter(), []
    driver = make_driver(core, committer, sent, idle_inline=True)
    await driver.call(call(1), Sink())
    for _ in range(DRAIN_LIMIT + 10):  # more than one pass takes: some still wait
        await driver.deliver(N2, LATE)
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await wait_for(lambda: core.persisted == [1])
        nursery.cancel_scope.cancel()
    assert committer.threads != [threading.current_thread().name]
    assert driver.stats.io_batches == 1


async def test_a_retried_write_waits_with_the_first_instead_of_a_second_proposal() -> None:
    core, committer, sent = ScriptedCore("leader"), GatedCommitter(), []
    committer.gate.clear()  # the first proposal stays unanswered
    driver = make_driver(core, committer, sent, tick_seconds=0.01)
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await wait_for(lambda: driver.stats.leader_changes == 1)  # a tick saw it lead
        await driver.call(call(1), Sink())
        await wait_for(lambda: len(core.proposals) == 1)
        await driver.call(call(1), Sink())  # the client's retry, same ids
        await driver.call(call(2), Sink())
        await wait_for(lambda: len(core.proposals) == 2)
        committer.gate.set()
        nursery.cancel_scope.cancel()
    assert [[r.request_no for r in p] for p in core.proposals] == [[1], [2]]
    assert driver.stats.duplicate_calls == 1
    assert driver.waiter_count() == 2  # requests 1 (both callers) and 2 still wait


async def test_an_overloaded_leader_answers_new_writes_with_retry_naming_itself() -> None:
    # Backpressure: with max_pending_calls unanswered calls, a new write is refused at once
    # (RETRY, leader hint = this node: "come back later"), not queued; a retry of a write
    # already waiting still joins it.
    core, committer, sent = ScriptedCore("leader"), GatedCommitter(), []
    committer.gate.clear()
    driver = make_driver(core, committer, sent, tick_seconds=0.01, max_pending_calls=3)
    sink = Sink()
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await wait_for(lambda: driver.stats.leader_changes == 1)
        for n in (1, 2, 3):
            await driver.call(call(n), sink)
        await wait_for(lambda: driver.waiter_count() == 3)
        await driver.call(call(4), sink)  # over the bound
        await driver.call(call(2), sink)  # a retry of a waiting write: not new load
        await wait_for(lambda: len(sink.replies) == 1)
        await wait_for(lambda: driver.stats.duplicate_calls == 1)
        committer.gate.set()
        nursery.cancel_scope.cancel()
    [refused] = sink.replies
    assert isinstance(refused, ClientReply)
    assert refused.request_no == 4
    assert refused.status is ReplyStatus.RETRY
    assert refused.leader_hint == "n1"
    assert driver.stats.overloaded_calls == 1
    assert [r.request_no for p in core.proposals for r in p] == [1, 2, 3]


def test_max_pending_calls_must_be_positive() -> None:
    core, committer = ScriptedCore("leader"), GatedCommitter()
    with pytest.raises(ValueError, match="max_pending_calls"):
        make_driver(core, committer, [], max_pending_calls=0)


NOTICE = AppendEntries(term=1, leader_id=N1, prev_log_index=1, prev_log_term=1, entries=(),
                       leader_commit=1)


class CommittingCore(ScriptedCore):
    """A follower's answer (`LATE` received) commits the proposed entry, with an early
    commit notice (as Raft's leader broadcasts after advancing its commit index)."""

    def __init__(self, role: str) -> None:
        super().__init__(role)
        self.entries: list[Entry] = []

    def propose(self, requests: tuple[ClientRequest, ...]) -> Ready:
        ready = super().propose(requests)
        self.entries.extend(ready.entries)
        return ready

    def step(self, inp: Input, /) -> Ready:
        super().step(inp)
        if isinstance(inp, Receive) and self.entries:
            committed, self.entries = tuple(self.entries), []
            return Ready(committed=committed, early_messages=(Send(to=N2, message=NOTICE),))
        return Ready()


class RecordingSink(Sink):
    def __init__(self, events: list[str]) -> None:
        super().__init__()
        self.events = events

    def deliver(self, reply: ClientReply | StatusReply) -> None:
        super().deliver(reply)
        self.events.append("reply")


@pytest.mark.parametrize("idle_inline", [True, False])
async def test_the_reply_leaves_before_the_commit_notice(idle_inline: bool) -> None:
    """Early messages are held to the end of the pass (or the next write): a commit
    notice, which wakes every follower, leaves after the reply it follows."""
    core, committer, sent = CommittingCore("leader"), GatedCommitter(), []
    driver = make_driver(core, committer, sent, idle_inline=idle_inline)
    sink = RecordingSink(committer.events)
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await driver.call(call(1), sink)
        await wait_for(lambda: core.persisted == [1])
        await driver.deliver(N2, LATE)  # the follower's answer: the entry commits
        await wait_for(lambda: len(committer.events) == 5)
        nursery.cancel_scope.cancel()
    assert committer.events == ["AppendEntries", "persisted", "AppendEntriesResponse",
                                "reply", "AppendEntries"]
    assert sent[-1] == (N2, NOTICE)
    [reply] = sink.replies
    assert isinstance(reply, ClientReply)
    assert reply.status is ReplyStatus.OK
