"""The replica and its checkpoint writer taking turns. The threaded writer's GIL yield
(`phalanx.apps.writer._paced`) keeps sleeping while an apply that was running when it took
the GIL has not finished, up to a bound, and does not wait when no apply is running (time and
sleep are faked: each sleep advances the clock). A checkpoint that fell due while the writer
was busy starts from the idle path (`Replica.maintain`)."""

from __future__ import annotations

import pytest

from phalanx.apps import kv_wire, writer
from phalanx.apps.kv import KvStateMachine
from phalanx.apps.kv_types import Put
from phalanx.apps.replica import Replica
from phalanx.apps.writer import ApplyProgress, _paced
from phalanx.consensus.types import ClientRequest, Entry, EntryKind
from phalanx.storage.memory import MemoryDisk


class FakeTime:
    def __init__(self, progress: ApplyProgress, finish_after: int | None) -> None:
        self.now = 0.0
        self.sleeps = 0
        self.progress = progress
        self.finish_after = finish_after

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.now += seconds
        if self.sleeps == self.finish_after:  # the waiting apply got the GIL and finished
            self.progress.busy = False
            self.progress.applies += 1


def _run(monkeypatch: pytest.MonkeyPatch, *, busy: bool, finish_after: int | None) -> int:
    progress = ApplyProgress()
    progress.busy = busy
    fake = FakeTime(progress, finish_after)
    monkeypatch.setattr(writer.time, "perf_counter", fake.perf_counter)
    monkeypatch.setattr(writer.time, "sleep", fake.sleep)
    assert list(_paced(iter([b"a"]), 0.0, progress)) == [b"a"]
    return fake.sleeps


def test_the_yield_waits_for_a_waiting_apply_to_run(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _run(monkeypatch, busy=True, finish_after=4) == 4


def test_no_apply_running_means_one_short_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _run(monkeypatch, busy=False, finish_after=None) == 1


def test_the_wait_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps = _run(monkeypatch, busy=True, finish_after=None)
    bound = writer._HANDOFF_MAX_SECONDS / writer._HANDOFF_SECONDS
    assert bound <= sleeps <= bound + 2


def test_the_replica_reports_its_applies() -> None:
    replica = Replica(KvStateMachine(), checkpoints=MemoryDisk("n1").open().checkpoints)
    progress = replica._progress
    seen: list[bool] = []
    machine = replica.machine
    original = machine.apply

    def spy(command: bytes) -> bytes:
        seen.append(progress.busy)
        return original(command)

    machine.apply = spy  # type: ignore[method-assign]
    for i in (1, 2):
        command = kv_wire.encode_command(Put(key="k", value=b"v"))
        request = ClientRequest(client_id="c", request_no=i, command=command)
        replica.apply(Entry(index=i, term=1, kind=EntryKind.COMMAND, requests=(request,)))
    assert seen == [True, True]
    assert (progress.busy, progress.applies) == (False, 2)


class _HeldWriter:
    """A writer that is busy until the test says otherwise, recording the jobs it gets."""

    def __init__(self) -> None:
        self.busy = True
        self.jobs: list[int] = []

    def start(self, job: writer.CheckpointJob) -> None:
        self.jobs.append(job.index)
        self.busy = True

    def poll(self) -> writer.CheckpointDone | None:
        return None

    def close(self) -> None:
        pass


def test_a_checkpoint_due_while_the_writer_was_busy_starts_when_idle() -> None:
    from phalanx.apps.replica import CheckpointPolicy

    held = _HeldWriter()
    replica = Replica(KvStateMachine(), checkpoints=MemoryDisk("n1").open().checkpoints,
                      writer=held, policy=CheckpointPolicy(every_entries=2, every_bytes=0))
    for i in (1, 2, 3):
        command = kv_wire.encode_command(Put(key=f"k{i}", value=b"v"))
        request = ClientRequest(client_id="c", request_no=i, command=command)
        replica.apply(Entry(index=i, term=1, kind=EntryKind.COMMAND, requests=(request,)))
    assert held.jobs == []  # due since entry 2, but the writer was busy
    replica.maintain()
    assert held.jobs == []  # still busy: nothing started
    held.busy = False
    replica.maintain()  # no write comes: the idle path starts it
    assert held.jobs == [3]
    replica.maintain()
    assert held.jobs == [3]  # not due again


def test_an_idle_replica_checkpoints_the_tail_of_a_burst() -> None:
    from phalanx.apps.replica import CheckpointPolicy

    held = _HeldWriter()
    held.busy = False
    replica = Replica(KvStateMachine(), checkpoints=MemoryDisk("n1").open().checkpoints,
                      writer=held,
                      policy=CheckpointPolicy(every_entries=8, every_bytes=0, idle_calls=3))

    def write(i: int) -> None:
        command = kv_wire.encode_command(Put(key=f"k{i}", value=b"v"))
        request = ClientRequest(client_id="c", request_no=i, command=command)
        replica.apply(Entry(index=i, term=1, kind=EntryKind.COMMAND, requests=(request,)))

    write(1)  # an eighth of the trigger: too little to checkpoint for
    for _ in range(10):
        replica.maintain()
    assert held.jobs == []
    write(2)  # a quarter
    replica.maintain()  # applied something: the idle count starts again
    replica.maintain()
    replica.maintain()
    assert held.jobs == []
    replica.maintain()  # the third idle call in a row
    assert held.jobs == [2]
    held.busy = False
    for _ in range(10):
        replica.maintain()
    assert held.jobs == [2]  # nothing new since


class _ManualWriter:
    """A writer whose jobs finish when the test says so (`finish`)."""

    def __init__(self) -> None:
        self.busy = False
        self.jobs: list[int] = []
        self._done: writer.CheckpointDone | None = None

    def start(self, job: writer.CheckpointJob) -> None:
        if self.busy:
            raise RuntimeError("busy")
        self.jobs.append(job.index)
        self.busy = True
        self._job = job

    def finish(self) -> None:
        data = b"".join(c if isinstance(c, bytes) else c.data() for c in self._job.chunks)
        self._done = writer.CheckpointDone(index=self._job.index, data=data)

    def poll(self) -> writer.CheckpointDone | None:
        done, self._done = self._done, None
        if done is not None:
            self.busy = False
        return done

    def close(self) -> None:
        pass


def _put(replica: Replica, i: int) -> None:
    command = kv_wire.encode_command(Put(key=f"k{i}", value=b"v%d" % i))
    request = ClientRequest(client_id="c", request_no=i, command=command)
    replica.apply(Entry(index=i, term=1, kind=EntryKind.COMMAND, requests=(request,)))


def test_an_aligned_policy_checkpoints_only_at_multiples_and_queues_the_newest_boundary() -> None:
    """PBFT's replicas vote on the state every K sequence numbers: a checkpoint that fell due
    while the writer was busy must not start at whatever index comes next (it did: the
    replicas' votes then never matched and the water marks froze). A busy writer's boundary
    is snapshotted at the boundary and written when the writer is free; a newer boundary
    replaces an older queued one."""
    from phalanx.apps.envelope import parse_envelope
    from phalanx.apps.replica import CheckpointPolicy

    manual = _ManualWriter()
    replica = Replica(KvStateMachine(), checkpoints=MemoryDisk("n1").open().checkpoints,
                      writer=manual,
                      policy=CheckpointPolicy(every_entries=4, every_bytes=0, aligned=True))
    for i in range(1, 6):
        _put(replica, i)
    assert manual.jobs == [4]
    for i in range(6, 14):  # boundaries 8 and 12 come while 4 is still being written
        _put(replica, i)
    assert (manual.jobs, replica.status().checkpoint_in_flight) == ([4], 4)
    manual.finish()
    replica.maintain()  # 4 completes; the newest queued boundary, 12, starts; 8 is skipped
    assert manual.jobs == [4, 12]
    manual.finish()
    taken = replica.poll()
    assert [t.index for t in taken] == [4, 12]
    for _ in range(3):
        replica.maintain()  # idle at 13, not a boundary: nothing starts
    assert manual.jobs == [4, 12]
    # The queued checkpoint holds the state AT its boundary, not when it was written.
    parsed = parse_envelope(bytes(taken[1].data))
    at_twelve = KvStateMachine()
    at_twelve.restore(parsed.app_data)
    assert (parsed.index, at_twelve.get("k12"), at_twelve.get("k13")) == (12, b"v12", None)
    for i in range(14, 17):  # a free writer: the boundary starts at once
        _put(replica, i)
    assert manual.jobs == [4, 12, 16]


def test_an_aligned_policy_needs_an_entry_trigger_only() -> None:
    from phalanx.apps.replica import CheckpointPolicy

    for bad in ({"every_entries": 0, "every_bytes": 0}, {"every_entries": 4},
                {"every_entries": 4, "every_bytes": 0, "idle_calls": 5}):
        with pytest.raises(ValueError, match="aligned"):
            CheckpointPolicy(aligned=True, **bad)  # type: ignore[arg-type]
