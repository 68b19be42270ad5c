"""Peer messages stepped in the reading task (`phalanx.runtime.driver_inline`): only while the
core loop is parked on an empty channel, the frames of one read in one pass whose end
(`end_inline_pass`) sends and flushes, inputs in order whichever way they went, and an inline
pass whose write must first let output go hands it to the core loop (`WAKE`).

Against a scripted core, as `test_driver_pipeline`; synchronisation by events and `wait_for`.
"""

from __future__ import annotations

import threading

import trio
from runtime_helpers import wait_for
from test_driver_pipeline import (
    EARLY,
    LATE,
    N1,
    N2,
    GatedCommitter,
    ScriptedCore,
    Sink,
    call,
    make_driver,
)

from phalanx.apps.kv import KvStateMachine
from phalanx.apps.replica import Replica
from phalanx.consensus.core import CoreStatus, Input, Persisted, Ready, Receive, Send
from phalanx.consensus.raft import AppendEntries
from phalanx.consensus.types import Entry, EntryKind, Message, NodeId
from phalanx.net.client_protocol import StatusReply
from phalanx.runtime.driver import Driver
from phalanx.storage.memory import MemoryDisk


def _append(index: int) -> AppendEntries:
    entry = Entry(index=index, term=1, kind=EntryKind.NOOP, requests=())
    return AppendEntries(term=1, leader_id=N2, prev_log_index=index - 1, prev_log_term=1,
                         entries=(entry,), leader_commit=0)


class AnsweringCore:
    """Answers every peer message with LATE (nothing durable), or, with `persist`, appends
    one entry per message, sending EARLY early and LATE once durable; records which task
    stepped each message."""

    def __init__(self, *, persist: bool = False) -> None:
        self.node_id = N1
        self.persist = persist
        self.received: list[tuple[Message, str]] = []
        self.persisted: list[int] = []
        self._number = 0

    def step(self, inp: Input, /) -> Ready:
        if isinstance(inp, Persisted):
            self.persisted.append(inp.number)
            return Ready()
        if not isinstance(inp, Receive):
            return Ready()
        self.received.append((inp.message, trio.lowlevel.current_task().name))
        if not self.persist:
            return Ready(messages=(Send(to=inp.src, message=LATE),))
        self._number += 1
        entry = Entry(index=self._number, term=1, kind=EntryKind.NOOP, requests=())
        return Ready(number=self._number, entries=(entry,), must_sync=True,
                     early_messages=(Send(to=inp.src, message=EARLY),),
                     messages=(Send(to=inp.src, message=LATE),))

    def status(self) -> CoreStatus:
        return CoreStatus(node=N1, role="follower", term=1, commit_index=0, leader=N2)


def _driver(core: AnsweringCore, committer: GatedCommitter, events: list[str], *,
            idle_inline: bool = False, output_pending: bool = False) -> Driver:
    def send(to: NodeId, message: Message) -> bool:
        events.append(f"send {type(message).__name__}")
        return True

    def status_reply(nonce: int, status: CoreStatus, replica: Replica) -> StatusReply:
        raise AssertionError("not used")

    replica = Replica(KvStateMachine(), checkpoints=MemoryDisk("r").open().checkpoints)
    return Driver(core=core, replica=replica, committer=committer,
                  send=send, tick_seconds=3600.0, status_reply=status_reply,
                  idle_inline=idle_inline, output_pending=lambda: output_pending,
                  flush_sends=lambda: events.append("flush"))


def _squash(events: list[str]) -> list[str]:
    """`events` without repeated flushes (a flush with nothing held is a no-op)."""
    return [e for i, e in enumerate(events) if e != "flush" or events[i - 1:i] != ["flush"]]


async def test_a_read_s_messages_are_stepped_in_the_reading_task_in_one_pass() -> None:
    core, events = AnsweringCore(), list[str]()
    driver = _driver(core, GatedCommitter(), events)
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await wait_for(driver._core_parked)
        me = trio.lowlevel.current_task().name
        await driver.deliver_inline(N2, _append(1))
        await driver.deliver_inline(N2, _append(2))
        # Stepped here, at once; the pass's end (its sends) waits for end_inline_pass.
        assert core.received == [(_append(1), me), (_append(2), me)]
        assert events == []
        driver.end_inline_pass()
        assert _squash(events) == ["send AppendEntriesResponse", "send AppendEntriesResponse",
                                   "flush"]
        done = len(events)
        driver.end_inline_pass()  # nothing open: nothing done
        assert len(events) == done
        assert (driver.stats.inline_passes, driver.stats.inline_inputs) == (1, 2)
        nursery.cancel_scope.cancel()


async def test_inputs_keep_their_order_when_the_core_loop_has_one_in_hand() -> None:
    core, events = AnsweringCore(), list[str]()
    driver = _driver(core, GatedCommitter(), events)
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await wait_for(driver._core_parked)
        await driver.deliver(N2, _append(1))  # handed to the parked loop: it is not parked
        await driver.deliver_inline(N2, _append(2))  # so this one queues behind it
        driver.end_inline_pass()
        assert core.received == []
        await wait_for(lambda: len(core.received) == 2)
        assert [m for m, _ in core.received] == [_append(1), _append(2)]
        assert all(task != trio.lowlevel.current_task().name for _, task in core.received)
        assert driver.stats.inline_passes == 0
        await wait_for(driver._core_parked)  # idle again: the next one is stepped here
        await driver.deliver_inline(N2, _append(3))
        driver.end_inline_pass()
        assert core.received[-1] == (_append(3), trio.lowlevel.current_task().name)
        nursery.cancel_scope.cancel()


async def test_before_the_loop_runs_a_message_queues() -> None:
    core, events = AnsweringCore(), list[str]()
    driver = _driver(core, GatedCommitter(), events)
    await driver.deliver_inline(N2, _append(1))
    driver.end_inline_pass()
    assert core.received == []
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await wait_for(lambda: core.received != [])
        nursery.cancel_scope.cancel()
    assert driver.stats.inline_passes == 0


async def test_an_inline_write_that_must_let_output_go_first_is_left_to_the_core_loop() -> None:
    """The pass holds an early message its writer task has not written (`output_pending`):
    the fsync must not block the loop before it runs, so the reading task does not write;
    the core loop, woken, yields to the writers and then writes on its own task."""
    core, committer, events = AnsweringCore(persist=True), GatedCommitter(), list[str]()
    driver = _driver(core, committer, events, idle_inline=True, output_pending=True)
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await wait_for(driver._core_parked)
        await driver.deliver_inline(N2, _append(1))
        driver.end_inline_pass()
        # The early message left, flushed; no write yet.
        assert _squash(events) == ["send AppendEntries", "flush"]
        assert committer.threads == []
        await wait_for(lambda: core.persisted == [1])
        nursery.cancel_scope.cancel()
    assert committer.threads == [threading.current_thread().name]  # inline, on the loop
    assert _squash(events) == ["send AppendEntries", "flush", "send AppendEntriesResponse",
                               "flush"]  # the late one once durable


async def test_a_call_to_an_idle_node_is_stepped_at_once_and_one_to_a_busy_node_queues() -> None:
    core, committer, sent = ScriptedCore("leader"), GatedCommitter(), list[tuple[NodeId, Message]]()
    committer.gate.clear()  # the write stays in flight: its call keeps waiting
    driver = make_driver(core, committer, sent)
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await wait_for(driver._core_parked)
        await driver.calls([call(1)], Sink())
        # Stepped in this task and its pass ended: proposed, the early message sent.
        assert [[r.request_no for r in p] for p in core.proposals] == [[1]]
        assert sent == [(N2, EARLY)]
        await wait_for(committer.started.is_set)
        await wait_for(driver._core_parked)
        await driver.calls([call(2)], Sink())  # call 1 waits: several clients, so queue
        assert len(core.proposals) == 1
        await wait_for(lambda: len(core.proposals) == 2)
        assert driver.stats.inline_calls == 1
        committer.gate.set()
        nursery.cancel_scope.cancel()
