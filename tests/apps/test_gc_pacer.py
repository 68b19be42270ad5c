"""`GcPacer`: freezes after loads and every N applies, so full GC passes stay short."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from phalanx.apps.gc_pacer import GcPacer
from phalanx.apps.kv import KvStateMachine
from phalanx.apps.kv_types import Put
from phalanx.apps.kv_wire import encode_command
from phalanx.apps.replica import CheckpointPolicy, Replica
from phalanx.consensus.types import ClientRequest, Entry, EntryKind
from phalanx.storage.memory import MemoryDisk


@pytest.fixture(autouse=True)
def _unfreeze() -> Iterator[None]:
    yield
    gc.unfreeze()  # the pacer's effect is process-global: give the objects back


def put(index: int) -> Entry:
    command = encode_command(Put(key=f"k{index % 50}", value=b"v" * 10))
    return Entry(index=index, term=1, kind=EntryKind.COMMAND,
                 requests=(ClientRequest(client_id="c", request_no=index, command=command),))


def test_every_applies_must_be_positive() -> None:
    with pytest.raises(ValueError, match="every_applies"):
        GcPacer(every_applies=0)


def test_freezes_every_n_applies_and_moves_objects_out_of_the_generations() -> None:
    storage = MemoryDisk().open()
    pacer = GcPacer(every_applies=10)
    replica = Replica(KvStateMachine(), checkpoints=storage.checkpoints, gc_pacer=pacer,
                      policy=CheckpointPolicy(every_entries=0, every_bytes=0))
    frozen_before = gc.get_freeze_count()
    marker: list[int] = []  # a tracked object that is alive at the next freeze
    assert any(o is marker for o in gc.get_objects())
    for i in range(1, 36):
        replica.apply(put(i))
    assert pacer.freezes == 3
    assert gc.get_freeze_count() > frozen_before
    # What was alive at a freeze is in no generation any more: no pass walks it again.
    assert not any(o is marker for o in gc.get_objects())


def batch(index: int, requests: int) -> Entry:
    """One log entry holding `requests` commands (Raft's `ProposeBatch`: a pipelined
    leader proposes up to 256 writes as one entry)."""
    return Entry(index=index, term=1, kind=EntryKind.COMMAND, requests=tuple(
        ClientRequest(client_id="c", request_no=index * 1000 + i,
                      command=encode_command(Put(key=f"k{index}-{i}", value=b"v" * 10)))
        for i in range(requests)))


def test_a_batched_entry_counts_each_of_its_commands() -> None:
    """Issue 23, "Elections under pipelined load": counted per entry, a node applying
    entries of 256 writes froze once per 65,536 writes, and the full passes in between
    walked all of them (50 ms of CPU with the GIL held; a leader's followers timed out)."""
    storage = MemoryDisk().open()
    pacer = GcPacer(every_applies=256)
    replica = Replica(KvStateMachine(), checkpoints=storage.checkpoints, gc_pacer=pacer,
                      policy=CheckpointPolicy(every_entries=0, every_bytes=0))
    for i in range(1, 5):
        replica.apply(batch(i, 256))
    assert pacer.freezes == 4  # one per 256 commands: each entry reaches the count
    replica.apply(batch(5, 100))
    replica.apply(batch(6, 100))
    assert pacer.freezes == 4  # 200 commands since the last freeze
    replica.apply(batch(7, 100))
    assert pacer.freezes == 5


def test_an_entry_without_commands_still_counts_as_one_apply() -> None:
    pacer = GcPacer(every_applies=2)
    storage = MemoryDisk().open()
    replica = Replica(KvStateMachine(), checkpoints=storage.checkpoints, gc_pacer=pacer,
                      policy=CheckpointPolicy(every_entries=0, every_bytes=0))
    replica.apply(Entry(index=1, term=1, kind=EntryKind.NOOP))
    replica.apply(Entry(index=2, term=1, kind=EntryKind.NOOP))
    assert pacer.freezes == 1


def test_settle_after_recovery_and_no_pacing_while_the_collector_is_off() -> None:
    storage = MemoryDisk().open()
    first = Replica(KvStateMachine(), checkpoints=storage.checkpoints,
                    policy=CheckpointPolicy(every_entries=0, every_bytes=0))
    for i in range(1, 6):
        first.apply(put(i))
    assert first.checkpoint_now()
    first.poll()
    pacer = GcPacer(every_applies=2)
    again = Replica(KvStateMachine(), checkpoints=storage.checkpoints, gc_pacer=pacer)
    report = again.restore_latest()
    assert report.checkpoint_index == 5
    assert pacer.freezes == 1  # settled once after the load
    gc.disable()
    try:
        pacer.note_apply()
        pacer.note_apply()
    finally:
        gc.enable()
    assert pacer.freezes == 1
