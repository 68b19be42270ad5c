"""When the driver's peer messages leave (`phalanx.runtime.driver_output.PeerOutput`, and the driver
around it): early messages at the end of a pass, lazy ones (a Raft leader's commit notices)
with the next message to their peer or at the next tick, each link FIFO; the transport's
held frames are flushed at the end of a pass and before the driver blocks on a write.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st
from runtime_helpers import wait_for
from test_driver_pipeline import (
    LATE,
    N1,
    N2,
    GatedCommitter,
    RecordingSink,
    ScriptedCore,
    call,
)

from phalanx.apps.kv import KvStateMachine
from phalanx.apps.replica import Replica
from phalanx.consensus.core import CoreStatus, Input, Persisted, Ready, Receive, Send
from phalanx.consensus.raft import AppendEntries
from phalanx.consensus.types import ClientRequest, Entry, EntryKind, Message, NodeId
from phalanx.net.client_protocol import StatusReply
from phalanx.protocols.raft_node import commit_notice as raft_commit_notice
from phalanx.protocols.raft_node import notice_superseded as raft_notice_superseded
from phalanx.runtime.driver import Driver
from phalanx.runtime.driver_output import PeerOutput
from phalanx.runtime.driver_stats import DriverStatistics
from phalanx.storage.memory import MemoryDisk

N3 = NodeId("n3")


def _notice(commit: int) -> AppendEntries:
    return AppendEntries(term=1, leader_id=N1, prev_log_index=commit, prev_log_term=1,
                         entries=(), leader_commit=commit)


def _append(index: int) -> AppendEntries:
    return AppendEntries(term=1, leader_id=N1, prev_log_index=index - 1, prev_log_term=1,
                         entries=(_entry(index),), leader_commit=index - 1)


def _output(lazy: bool = True, supersede: bool = False
            ) -> tuple[PeerOutput, list[tuple[NodeId, Message]], DriverStatistics]:
    sent: list[tuple[NodeId, Message]] = []

    def send(to: NodeId, message: Message) -> bool:
        sent.append((to, message))
        return True

    stats = DriverStatistics()
    return PeerOutput(send, flush=None, lazy=raft_commit_notice if lazy else None,
                      supersedes=raft_notice_superseded if supersede else None,
                      stats=stats), sent, stats


def test_the_raft_commit_notice_predicate_names_only_empty_append_entries() -> None:
    assert raft_commit_notice(_notice(3))
    assert not raft_commit_notice(_append(4))
    assert not raft_commit_notice(LATE)


def test_a_notice_is_superseded_only_by_an_append_of_its_term_committing_as_far() -> None:
    assert raft_notice_superseded(_append(2), _notice(1))  # leader_commit 1 >= 1
    assert raft_notice_superseded(_notice(2), _notice(1))
    assert not raft_notice_superseded(_append(2), _notice(2))  # commits less
    newer_term = AppendEntries(term=2, leader_id=N1, prev_log_index=1, prev_log_term=1,
                               entries=(), leader_commit=5)
    assert not raft_notice_superseded(newer_term, _notice(1))
    assert not raft_notice_superseded(LATE, _notice(1))


def test_a_superseded_notice_is_dropped_and_the_rest_keep_their_order() -> None:
    out, sent, stats = _output(supersede=True)
    out.hold_early((Send(to=N2, message=_notice(1)), Send(to=N2, message=_notice(3)),
                    Send(to=N3, message=_notice(1))))
    out.release_early()
    out.send(N2, _append(3))  # commits 2: supersedes notice 1, not notice 3
    assert sent == [(N2, _notice(3)), (N2, _append(3))]
    assert stats.superseded_messages == 1
    out.release_lazy()  # N3's was superseded by nothing: it leaves
    assert sent[2:] == [(N3, _notice(1))]


def test_a_commit_notice_waits_for_the_next_message_to_its_peer_and_goes_first() -> None:
    out, sent, stats = _output()
    out.hold_early((Send(to=N2, message=_notice(1)), Send(to=N3, message=_notice(1))))
    assert out.release_early()
    assert sent == []
    assert out.lazy_held == 2
    out.hold_early((Send(to=N2, message=_append(2)),))
    out.release_early()
    # N2's notice leaves first, right before the append; N3's still waits.
    assert sent == [(N2, _notice(1)), (N2, _append(2))]
    assert out.lazy_held == 1
    out.send(N3, LATE)  # an ordinary message to N3 takes its notice along, first
    assert sent[2:] == [(N3, _notice(1)), (N3, LATE)]
    assert out.lazy_held == 0
    assert not out.release_lazy()
    assert (stats.early_messages, stats.lazy_messages) == (3, 2)


def test_a_tick_releases_every_held_notice_in_order() -> None:
    out, sent, _ = _output()
    out.hold_early((Send(to=N3, message=_notice(1)), Send(to=N2, message=_notice(1))))
    out.hold_early((Send(to=N3, message=_notice(2)),))
    out.release_early()
    assert out.release_lazy()
    assert sent == [(N3, _notice(1)), (N3, _notice(2)), (N2, _notice(1))]
    assert out.lazy_held == 0


def test_without_a_predicate_nothing_waits() -> None:
    out, sent, stats = _output(lazy=False)
    assert not out.release_early()  # nothing held
    out.hold_early((Send(to=N2, message=_notice(1)),))
    out.release_early()
    assert sent == [(N2, _notice(1))]
    assert stats.lazy_messages == 0


_PEERS = (N2, N3)
_ops = st.lists(st.tuples(st.sampled_from(["early_notice", "early_append", "send", "send_stale",
                                          "release", "tick"]), st.sampled_from(_PEERS)),
                max_size=40)


def _stale_append(index: int) -> AppendEntries:
    """An AppendEntries that commits nothing: it supersedes no notice."""
    return AppendEntries(term=1, leader_id=N1, prev_log_index=index - 1, prev_log_term=1,
                         entries=(_entry(index),), leader_commit=0)


@given(_ops, st.booleans())
def test_every_link_stays_fifo_and_nothing_is_lost(ops: list[tuple[str, NodeId]],
                                                    supersede: bool) -> None:
    """Whatever the interleaving: per peer, messages leave in the order they were released
    (or sent), each exactly once once a tick has passed, and a lazy one is held only while
    nothing else went to its peer since; only a notice that a later message to its peer
    supersedes is ever dropped."""
    out, sent, stats = _output(supersede=supersede)
    order: dict[NodeId, list[Message]] = {p: [] for p in _PEERS}
    pending: list[Send] = []
    for counter, (op, peer) in enumerate(ops, start=1):
        if op == "early_notice":
            pending.append(Send(to=peer, message=_notice(counter)))
            out.hold_early((pending[-1],))
        elif op == "early_append":
            pending.append(Send(to=peer, message=_append(counter)))
            out.hold_early((pending[-1],))
        elif op in ("send", "send_stale"):
            message = _append(counter) if op == "send" else _stale_append(counter)
            order[peer].append(message)
            out.send(peer, message)
        elif op == "release":
            for one in pending:
                order[one.to].append(one.message)
            pending = []
            out.release_early()
        else:
            out.release_lazy()
        for p in _PEERS:
            left = [m for to, m in sent if to == p]
            # Per peer: what left, left in order; every released message but a notice
            # left at once; a notice is held (or dropped) only while nothing went after it.
            assert _in_order(left, order[p])
            assert all(m in left for m in order[p] if not raft_commit_notice(m))
            if left:
                tail = order[p][order[p].index(left[-1]) + 1:]
                assert all(raft_commit_notice(m) for m in tail)
    for one in pending:
        order[one.to].append(one.message)
    out.release_early()
    out.release_lazy()
    assert out.lazy_held == 0
    dropped = 0
    for p in _PEERS:
        left = [m for to, m in sent if to == p]
        assert _in_order(left, order[p])
        for k, m in enumerate(order[p]):
            if m in left:
                continue
            # Dropped: only a notice, and only for a later message that left and
            # supersedes it.
            assert supersede
            assert raft_commit_notice(m)
            assert any(n in left and raft_notice_superseded(n, m) for n in order[p][k + 1:])
            dropped += 1
    assert stats.superseded_messages == dropped


def _in_order(sub: list[Message], full: list[Message]) -> bool:
    """Whether `sub` is `full` with some elements left out (same relative order)."""
    it = iter(full)
    return all(any(m == f for f in it) for m in sub)


# ---------------------------------------------------------------------------------- driver


class CommittingCore(ScriptedCore):
    """A leader: each proposal appends an entry and sends its AppendEntries early; a
    follower's answer commits it, with an early pure commit notice (as Raft's leader)."""

    def __init__(self, role: str) -> None:
        super().__init__(role)
        self.entries: list[Entry] = []

    def propose(self, requests: tuple[ClientRequest, ...]) -> Ready:
        ready = super().propose(requests)
        self.entries.extend(ready.entries)
        return replace(ready, early_messages=(Send(to=N2, message=_append(ready.number)),))

    def step(self, inp: Input, /) -> Ready:
        super().step(inp)
        if isinstance(inp, Receive) and self.entries:
            committed, self.entries = tuple(self.entries), []
            notice = _notice(committed[-1].index)
            return Ready(committed=committed, early_messages=(Send(to=N2, message=notice),))
        return Ready()


def _driver(core: ScriptedCore, committer: GatedCommitter, events: list[str], *,
            idle_inline: bool, lazy: bool = True, supersede: bool = False,
            tick_seconds: float = 3600.0) -> Driver:
    def send(to: NodeId, message: Message) -> bool:
        events.append(f"send {type(message).__name__}"
                      + (" notice" if raft_commit_notice(message) else ""))
        return True

    def status_reply(nonce: int, status: CoreStatus, replica: Replica) -> StatusReply:
        raise AssertionError("not used")

    replica = Replica(KvStateMachine(), checkpoints=MemoryDisk("r").open().checkpoints)
    return Driver(core=core, replica=replica, committer=committer, send=send,
                  tick_seconds=tick_seconds, status_reply=status_reply,
                  propose_batch=core.propose, idle_inline=idle_inline,
                  flush_sends=lambda: events.append("flush"),
                  after_pass=lambda: events.append("after_pass"),
                  output_pending=lambda: False,
                  lazy=raft_commit_notice if lazy else None,
                  supersedes=raft_notice_superseded if supersede else None)


@pytest.mark.parametrize("idle_inline", [True, False])
async def test_the_commit_notice_rides_with_the_next_write(idle_inline: bool) -> None:
    """A leader's commit notice waits (lazy) and leaves right before the next write's
    AppendEntries to the same follower, in the same flush; nothing leaves unflushed."""
    core, committer = CommittingCore("leader"), GatedCommitter()
    events = committer.events
    driver = _driver(core, committer, events, idle_inline=idle_inline)
    sink = RecordingSink(events)
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await driver.call(call(1), sink)
        await wait_for(lambda: core.persisted == [1])
        await driver.deliver(N2, LATE)  # the entry commits: reply, and a held notice
        await wait_for(lambda: len(sink.replies) == 1)
        await wait_for(lambda: driver.stats.lazy_messages == 1)
        mark = len(events)
        await driver.call(call(2), sink)
        await wait_for(lambda: core.persisted == [1, 2])
        nursery.cancel_scope.cancel()
    sends = [e for e in events if e.startswith("send")]
    assert sends == ["send AppendEntries", "send AppendEntriesResponse",  # write 1
                     "send AppendEntries notice", "send AppendEntries",  # notice, write 2
                     "send AppendEntriesResponse"]
    second = events[mark:]
    # The notice and the second write's AppendEntries leave together, flushed before the
    # write persists; the batch's message is flushed too.
    start = second.index("send AppendEntries notice")
    assert second[start + 1: start + 3] == ["send AppendEntries", "flush"]
    assert second.index("flush", start) < second.index("persisted")
    answer = second.index("send AppendEntriesResponse")
    assert second[answer + 1] == "flush"  # a batch's messages are flushed at once
    assert driver.stats.lazy_messages == 1


@pytest.mark.parametrize("idle_inline", [True, False])
async def test_the_next_write_supersedes_the_commit_notice(idle_inline: bool) -> None:
    """With `supersedes`, the held notice is dropped: the next write's AppendEntries
    commits as far, so the follower neither steps nor answers a notice."""
    core, committer = CommittingCore("leader"), GatedCommitter()
    events = committer.events
    driver = _driver(core, committer, events, idle_inline=idle_inline, supersede=True)
    sink = RecordingSink(events)
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await driver.call(call(1), sink)
        await wait_for(lambda: core.persisted == [1])
        await driver.deliver(N2, LATE)
        await wait_for(lambda: driver.stats.lazy_messages == 1)
        await driver.call(call(2), sink)
        await wait_for(lambda: core.persisted == [1, 2])
        nursery.cancel_scope.cancel()
    sends = [e for e in events if e.startswith("send")]
    assert sends == ["send AppendEntries", "send AppendEntriesResponse"] * 2
    assert driver.stats.superseded_messages == 1
    assert len(sink.replies) == 1  # the first write was answered; the second waits


async def test_a_tick_sends_a_held_commit_notice() -> None:
    core, committer = CommittingCore("leader"), GatedCommitter()
    events = committer.events
    driver = _driver(core, committer, events, idle_inline=True, tick_seconds=0.01)
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await driver.call(call(1), RecordingSink(events))
        await wait_for(lambda: core.persisted == [1])
        await driver.deliver(N2, LATE)
        await wait_for(lambda: "send AppendEntries notice" in events)
        nursery.cancel_scope.cancel()
    at = events.index("send AppendEntries notice")
    assert "flush" in events[at:]  # a tick pass ends with a flush like any other
    assert driver.stats.lazy_messages == 1


async def test_without_the_predicate_the_notice_leaves_after_the_reply() -> None:
    core, committer = CommittingCore("leader"), GatedCommitter()
    events = committer.events
    driver = _driver(core, committer, events, idle_inline=True, lazy=False)
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await driver.call(call(1), RecordingSink(events))
        await wait_for(lambda: core.persisted == [1])
        await driver.deliver(N2, LATE)
        await wait_for(lambda: "send AppendEntries notice" in events)
        nursery.cancel_scope.cancel()
    at = events.index("send AppendEntries notice")
    assert events.index("reply") < at
    assert events[at + 1] == "flush"
    assert driver.stats.lazy_messages == 0


def _entry(index: int) -> Entry:
    return Entry(index=index, term=1, kind=EntryKind.COMMAND, requests=(call(index).request,))


class FollowerCore:
    """A follower: an AppendEntries with an entry appends it and answers after the write; a
    pure commit notice commits the entry before it and answers at once (no write)."""

    def __init__(self) -> None:
        self.node_id = N2
        self.persisted: list[int] = []
        self._number = 0

    def step(self, inp: Input, /) -> Ready:
        if isinstance(inp, Persisted):
            self.persisted.append(inp.number)
            return Ready()
        if not isinstance(inp, Receive) or not isinstance(inp.message, AppendEntries):
            return Ready()
        answer = (Send(to=N1, message=LATE),)
        if not inp.message.entries:
            return Ready(committed=(_entry(inp.message.leader_commit),), messages=answer)
        self._number += 1
        return Ready(number=self._number, entries=inp.message.entries, must_sync=True,
                     messages=answer)

    def status(self) -> CoreStatus:
        return CoreStatus(node=N2, role="follower", term=1, commit_index=0, leader=N1)


async def test_a_batch_sends_and_flushes_all_its_messages_before_applying() -> None:
    """A notice and the next append arrive in one pass and persist as one batch: both
    answers leave (and are flushed) before the notice's entry is applied."""
    core, committer = FollowerCore(), GatedCommitter()
    events = committer.events
    applied_at_send: list[int] = []
    replica = Replica(KvStateMachine(), checkpoints=MemoryDisk("r").open().checkpoints)

    def send(to: NodeId, message: Message) -> bool:
        applied_at_send.append(replica.applied_index)
        events.append("send")
        return True

    def status_reply(nonce: int, status: CoreStatus, replica: Replica) -> StatusReply:
        raise AssertionError("not used")

    driver = Driver(core=core, replica=replica, committer=committer, send=send,
                    tick_seconds=3600.0, status_reply=status_reply, idle_inline=True,
                    flush_sends=lambda: events.append("flush"))
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        await driver.deliver(N1, _append(1))
        await wait_for(lambda: core.persisted == [1])
        await driver.deliver(N1, _notice(1))  # both in the channel before the loop runs
        await driver.deliver(N1, _append(2))
        await wait_for(lambda: core.persisted == [1, 2])
        nursery.cancel_scope.cancel()
    assert applied_at_send == [0, 0, 0]  # entry 1 was applied after both answers left
    assert replica.applied_index == 1
    second = events[events.index("persisted", events.index("persisted") + 1):]
    assert second[:4] == ["persisted", "send", "send", "flush"]
