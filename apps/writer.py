"""Checkpoint writers: turn a checkpoint's bounded serialisation steps into a durable
`Checkpoint` in a `CheckpointStore`, either inline or on a background thread.

Owns: the `CheckpointWriter` protocol the replica layer uses, `InlineCheckpointWriter`
(synchronous and deterministic: the simulator and tests) and `ThreadedCheckpointWriter` (the
runtime and benchmarks: apply keeps running while the checkpoint is serialised and written).

Must not import: consensus cores, trio, the simulator. Only `ThreadedCheckpointWriter` touches
threads; nothing here reads a clock.

Invariants:
- At most one job is in flight per writer (`busy`), and completions come out in start order.
- A completion is reported only after `CheckpointStore.save` returned (the checkpoint is
  durable). A failed save is reported as a completion with `error` set, never swallowed.
- The threaded writer yields the GIL after every serialisation step, so the applying thread
  waits at most about one step (a fraction of a millisecond) for it.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from phalanx.storage.interface import Checkpoint, CheckpointStore


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointJob:
    """A checkpoint to write: its index, its serialisation steps, and the metadata bytes."""

    index: int
    chunks: Iterator[bytes]
    meta: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointDone:
    """A finished job: `data` is durable in the store, unless `error` says why it is not."""

    index: int
    data: bytes
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


def _join(chunks: Iterator[bytes], pause: bool) -> bytes:
    parts: list[bytes] = []
    for chunk in chunks:
        if chunk:
            parts.append(chunk)
        if pause:
            time.sleep(0)  # release the GIL: let the applying thread run (not a clock read)
    return b"".join(parts)


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
        data = _join(job.chunks, pause=False)
        try:
            self._store.save(Checkpoint(job.index, data, job.meta))
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
        self._done = None
        self._busy = False


class ThreadedCheckpointWriter:
    """Serialises and saves on one daemon worker thread, yielding the GIL between steps."""

    def __init__(self, store: CheckpointStore) -> None:
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
            try:
                data = _join(job.chunks, pause=True)
                self._store.save(Checkpoint(job.index, data, job.meta))
            except Exception as exc:  # reported to the replica via poll()
                self._done.append(CheckpointDone(index=job.index, data=b"", error=repr(exc)))
            else:
                self._done.append(CheckpointDone(index=job.index, data=data))


_STOP = CheckpointJob(index=-1, chunks=iter(()), meta=b"")
