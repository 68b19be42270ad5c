"""Checkpoint writers: turn a checkpoint's bounded serialisation steps into a durable
`StoredCheckpoint` in a `CheckpointStore`, either inline or on a background thread.

Owns: the `CheckpointWriter` protocol the replica layer uses, `InlineCheckpointWriter`
(synchronous and deterministic: the simulator and tests) and `ThreadedCheckpointWriter` (the
runtime and benchmarks: apply keeps running while the checkpoint is serialised and written).

Must not import: consensus cores, trio, the simulator. Only `ThreadedCheckpointWriter` touches
threads and reads a clock (to pace its GIL hand-offs); the inline writer does neither.

Invariants:
- At most one job is in flight per writer (`busy`), and completions come out in start order.
- A completion is reported only after `CheckpointStore.save_stream` returned: the
  checkpoint is durable. Both writers hand the store the job's `Piece`s as they are (a
  content-addressed store skips the ones it holds). A failed save is reported as a completion
  with `error` set, never swallowed.
- The threaded writer yields the GIL after at most `slice_ms` of serialisation steps (each step
  is a fraction of a millisecond), so the applying thread waits about that long at most. It
  streams the steps' output into the checkpoint file (`CheckpointStore.save_stream`, appends of
  about 1 MiB, each a `write` with the GIL released) and never holds the whole checkpoint in
  memory; its completion carries a view of the stored file (`CheckpointStore.read_view`).
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from phalanx.consensus.core import SnapshotData
from phalanx.storage.interface import CheckpointStore, Piece


class ApplyProgress:
    """What the applying thread tells a threaded writer: whether an apply is running (`busy`)
    and how many have finished (`applies`). Plain attributes, written by the applying thread
    only; the writer reads them between its steps (both hold the GIL then)."""

    __slots__ = ("applies", "busy")

    def __init__(self) -> None:
        self.busy = False
        self.applies = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointJob:
    """A checkpoint to write: its index, its serialisation steps, and the metadata bytes;
    `progress`, if given, lets a threaded writer hand the GIL to a waiting apply reliably."""

    index: int
    chunks: Iterator[bytes | Piece]
    meta: bytes
    progress: ApplyProgress | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointDone:
    """A finished job: `data` is durable in the store, unless `error` says why it is not.

    `data` is the checkpoint's bytes (`InlineCheckpointWriter`) or a view that reads the stored
    file on demand (`ThreadedCheckpointWriter`, the runtime's: see `CheckpointStore.read_view`).
    """

    index: int
    data: SnapshotData
    error: str | None = None


class CheckpointWriter(Protocol):
    @property
    def busy(self) -> bool:
        """A job was started and its completion not yet collected by `poll`."""
        ...

    def start(self, job: CheckpointJob) -> None:
        """Begin writing `job`. Raises `RuntimeError` when `busy` (our own misuse)."""
        ...

    def poll(self) -> CheckpointDone | None:
        """The completion of the current job if it finished, else None. Never blocks."""
        ...

    def close(self) -> None:
        """Finish (or abandon) the current job and release resources."""
        ...


def _materialised(chunk: bytes | Piece) -> bytes:
    return chunk if isinstance(chunk, bytes) else chunk.data()


_HANDOFF_SECONDS = 50e-6
"""How long a GIL yield sleeps. `time.sleep(0)` releases the GIL but returns at once, so this
thread usually takes it back before the woken applier runs; CPython's waiter then starts a
new full switch-interval wait (5 ms) before it asks again. A real sleep lets the applier
take the GIL. Same-run A/B (`bench/checkpoint_stall.py --yield-us 50`, load ~6): applies
that waited > 2.5 ms without being preempted fell from 30 to 8 over five runs."""

_HANDOFF_MAX_SECONDS = 2e-3
"""How long a yield may keep sleeping while an apply that is waiting for the GIL has not
run yet (see `_paced`)."""


def _paced(chunks: Iterator[bytes | Piece], slice_seconds: float,
           progress: ApplyProgress | None = None) -> Iterator[bytes | Piece]:
    """The chunks, releasing the GIL (a `_HANDOFF_SECONDS` sleep) after about `slice_seconds`
    of serialisation steps, so the applying thread can run; without that, the applier would
    wait a whole switch interval (5 ms) for the GIL.

    With `progress`: if an apply was running when this thread took the GIL, that apply is now
    waiting for it, and one short sleep is not always enough: the woken thread may not be
    scheduled before the sleep ends (on a VM, waking an idle vCPU takes longer), this thread
    then takes the GIL back, and the apply waits another full switch interval. So the yield
    goes on sleeping until that apply has finished (or no apply is running, or
    `_HANDOFF_MAX_SECONDS` passed)."""
    sleep, clock = time.sleep, time.perf_counter
    deadline = clock() + slice_seconds
    for chunk in chunks:
        yield chunk
        if clock() >= deadline:
            sleep(_HANDOFF_SECONDS)  # release the GIL: let the applying thread run
            if progress is not None and progress.busy:
                seen, give_up = progress.applies, clock() + _HANDOFF_MAX_SECONDS
                while progress.busy and progress.applies == seen and clock() < give_up:
                    sleep(_HANDOFF_SECONDS)
            deadline = clock() + slice_seconds


class InlineCheckpointWriter:
    """Serialises and saves inside `start`: simple, single-threaded, deterministic."""

    def __init__(self, store: CheckpointStore) -> None:
        self._store = store
        self._done: CheckpointDone | None = None
        self._busy = False

    @property
    def busy(self) -> bool:
        return self._busy

    def start(self, job: CheckpointJob) -> None:
        if self._busy:
            raise RuntimeError("a checkpoint is already being written")
        self._busy = True
        chunks = [chunk for chunk in job.chunks if chunk]
        data = b"".join(map(_materialised, chunks))
        try:
            self._store.save_stream(job.index, job.meta, chunks)
        except Exception as exc:  # reported, not swallowed: see CheckpointDone.error
            self._done = CheckpointDone(index=job.index, data=b"", error=repr(exc))
        else:
            self._done = CheckpointDone(index=job.index, data=data)

    def poll(self) -> CheckpointDone | None:
        done, self._done = self._done, None
        if done is not None:
            self._busy = False
        return done

    def close(self) -> None:
        """Nothing to release; an uncollected completion stays available to `poll`."""


class ThreadedCheckpointWriter:
    """Serialises and saves on one daemon worker thread, yielding the GIL every `slice_ms`.

    `slice_ms` trades checkpoint speed against apply latency: the applying thread may wait up
    to about that long for the GIL. It reads `time.perf_counter`, which is why the simulator
    uses `InlineCheckpointWriter` instead.
    """

    def __init__(self, store: CheckpointStore, *, slice_ms: float = 1.0) -> None:
        if slice_ms <= 0:
            raise ValueError(f"slice_ms must be > 0, got {slice_ms}")
        self._slice = slice_ms / 1000
        self._store = store
        self._jobs: queue.SimpleQueue[CheckpointJob | None] = queue.SimpleQueue()
        self._done: deque[CheckpointDone] = deque()
        self._busy = False
        self._barrier = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="phalanx-checkpoint-writer", daemon=True
        )
        self._thread.start()

    @property
    def busy(self) -> bool:
        return self._busy

    def start(self, job: CheckpointJob) -> None:
        if self._busy:
            raise RuntimeError("a checkpoint is already being written")
        if not self._thread.is_alive():
            raise RuntimeError("the checkpoint writer is closed")
        self._busy = True
        self._jobs.put(job)

    def poll(self) -> CheckpointDone | None:
        try:
            done = self._done.popleft()
        except IndexError:
            return None
        self._busy = False
        return done

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every started job has finished (tests, shutdown); completions are
        still collected with `poll`. False if `timeout` (seconds) passed first."""
        self._jobs.put(None)  # a barrier: the worker handles jobs in order
        reached = self._barrier.wait(timeout)
        self._barrier.clear()
        return reached

    def close(self) -> None:
        if self._thread.is_alive():
            self.wait()
            self._jobs.put(_STOP)
            self._thread.join()

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                self._barrier.set()
                continue
            if job is _STOP:
                return
            self._done.append(self._write(job))
            # NB: drop the job before blocking for the next one: its step iterator holds the
            # state snapshot it serialised, which must not outlive the checkpoint.
            del job

    def _write(self, job: CheckpointJob) -> CheckpointDone:
        """Serialise and save `job`, then hand back a view of the stored file instead of the
        serialised bytes: the replica and the core keep the newest checkpoint for lagging
        peers, and a view costs a descriptor, not a copy of the whole state in memory."""
        try:
            self._store.save_stream(job.index, job.meta,
                                    _paced(job.chunks, self._slice, job.progress))
            view = self._store.read_view(job.index)
        except Exception as exc:  # reported to the replica via poll()
            return CheckpointDone(index=job.index, data=b"", error=repr(exc))
        return CheckpointDone(index=job.index, data=view)


_STOP = CheckpointJob(index=-1, chunks=iter(()), meta=b"")
