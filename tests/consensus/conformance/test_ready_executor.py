"""The shared `ReadyExecutor` carries out a Ready in the contract's order, feeds back
`Persisted` before the replica layer's checkpoints, and does so depth first."""

from __future__ import annotations

import pytest
from ready_executor import ReadyExecutor

from phalanx.consensus.core import (
    Abort,
    CheckpointTaken,
    Input,
    Persisted,
    ReadState,
    Ready,
    Rejection,
    Send,
    Snapshot,
)
from phalanx.consensus.types import (
    ClientRequest,
    Configuration,
    Entry,
    EntryKind,
    HardState,
    Message,
    NodeId,
    SnapshotMeta,
)

N = NodeId("n1")
REQ = ClientRequest(client_id="c", request_no=1, command=b"x")


def entry(i: int) -> Entry:
    return Entry(index=i, term=1, kind=EntryKind.NOOP)


def recording(events: list[str], nested: dict[int, Ready],
              every: int = 0) -> ReadyExecutor:
    def feed(node: NodeId, inp: Input) -> None:
        assert isinstance(inp, Persisted | CheckpointTaken)
        arg = inp.number if isinstance(inp, Persisted) else inp.index
        events.append(f"feed {type(inp).__name__} {arg}")
        if isinstance(inp, Persisted) and inp.number in nested:
            ex.run(node, nested.pop(inp.number))

    ex = ReadyExecutor(
        feed=feed, persist=lambda n, rd: events.append(f"persist {rd.number}"),
        install=lambda n, s: events.append(f"install {s.meta.index}"),
        send=lambda n, s: events.append(f"send {s.to}"),
        apply=lambda n, e: events.append(f"apply {e.index}"),
        read=lambda n, r: events.append(f"read {r.index}"),
        reject=lambda n, j: events.append(f"reject {j.reason}"),
        checkpoint=lambda n, i: events.append(f"checkpoint {i}") or b"cp",
        observe=lambda n, rd: events.append(f"observe {rd.number}"),
        checkpoint_every=every)
    return ex


def test_one_ready_in_the_contract_order() -> None:
    events: list[str] = []
    ready = Ready(
        number=1, early_messages=(Send(to=NodeId("e"), message=Message()),),
        snapshot=Snapshot(meta=SnapshotMeta(index=3, term=1, config=Configuration(voters=(N,))),
                          data=b""),
        hard_state=HardState(term=1), messages=(Send(to=NodeId("m"), message=Message()),),
        committed=(entry(4), entry(5)), reads=(ReadState(request=REQ, index=5),),
        rejected=(Rejection(request=REQ, reason="no"),))
    recording(events, {}, every=2).run(N, ready)
    assert events == ["observe 1", "send e", "persist 1", "install 3", "send m", "apply 4",
                      "apply 5", "read 5", "reject no", "feed Persisted 1", "checkpoint 4",
                      "feed CheckpointTaken 4"]


def test_feedback_is_depth_first_and_checkpoints_follow_persisted() -> None:
    events: list[str] = []
    outer = Ready(number=1, entries=(entry(2),), committed=(entry(2),))
    inner = Ready(number=2, entries=(entry(3),), committed=(entry(3), entry(4)))
    recording(events, {1: inner}, every=2).run(N, outer)
    assert events == [
        "observe 1", "persist 1", "apply 2", "feed Persisted 1",
        "observe 2", "persist 2", "apply 3", "apply 4", "feed Persisted 2",
        "checkpoint 4", "feed CheckpointTaken 4",
        "checkpoint 2", "feed CheckpointTaken 2"]


def test_nothing_to_persist_feeds_nothing_back() -> None:
    events: list[str] = []
    recording(events, {}).run(N, Ready(committed=(entry(1), entry(2))))
    assert events == ["observe 0", "apply 1", "apply 2"]


def test_misuse_raises() -> None:
    def noop(*_: object) -> None:
        pass

    with pytest.raises(ValueError, match="checkpoint hook"):
        ReadyExecutor(feed=noop, persist=noop, install=noop, send=noop, apply=noop,
                      checkpoint_every=4)
    ex = ReadyExecutor(feed=noop, persist=noop, install=noop, send=noop, apply=noop)
    with pytest.raises(ValueError, match="no checkpoint hook"):
        ex.checkpoint(N, 1)
    events: list[str] = []
    recording(events, {}).checkpoint(N, 7)
    assert events == ["checkpoint 7", "feed CheckpointTaken 7"]


def test_aborts_go_to_the_abort_hook_and_are_never_ignored() -> None:
    def noop(*_: object) -> None:
        pass

    ready = Ready(rejected=(Rejection(request=REQ, reason="no"),),
                  aborted=(Abort(request=REQ, reason="dropped"),))
    seen: list[str] = []
    ReadyExecutor(feed=noop, persist=noop, install=noop, send=noop, apply=noop,
                  reject=lambda n, j: seen.append(f"reject {j.reason}"),
                  abort=lambda n, a: seen.append(f"abort {a.reason}")).run(N, ready)
    assert seen == ["reject no", "abort dropped"]
    silent = ReadyExecutor(feed=noop, persist=noop, install=noop, send=noop, apply=noop)
    with pytest.raises(RuntimeError, match="no abort hook"):
        silent.run(N, ready)
