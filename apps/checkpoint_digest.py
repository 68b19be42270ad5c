"""Checkpoint digests from the application's own digest (`interface.CheckpointDigest`).

Owns: the digest of a replica checkpoint whose machine supplies its own state digest, both
ways it is computed, and the rule that they agree:

    D = SHA-256("phalanx.replica.checkpoint-digest.v1\\0" || SHA-256(envelope prefix) || app)

where the envelope prefix is everything before the app's bytes (header, session table,
tombstones, transaction table: `phalanx.apps.envelope`) and `app` is the machine's digest.
- When a checkpoint is taken (`DigestingChunks`): the app digest is read from the live
  machine at the checkpoint's index (O(1) for the chain) and the prefix is hashed as the
  writer serialises it, so the app's state is never hashed as bytes.
- From bytes (`digest_function`: a fetched checkpoint in state transfer, a restart): the
  envelope is parsed and the app's `snapshot_digest` checks its part as strictly as
  `restore`; malformed data gets ``b""``, which no certified digest equals (peer input
  never raises).
Apps without the hook keep the digest their core computes (PBFT: SHA-256 of the bytes).

Must not import: consensus cores, storage, trio, clocks.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator

from phalanx.apps.envelope import parse_envelope
from phalanx.apps.interface import (
    CheckpointDigest,
    SnapshotFormatError,
    StatePiece,
    StateSnapshot,
)

_TAG = b"phalanx.replica.checkpoint-digest.v1\x00"


def combine(prefix_digest: bytes, app_digest: bytes) -> bytes:
    """D from the prefix's SHA-256 and the app's digest."""
    return hashlib.sha256(_TAG + prefix_digest + app_digest).digest()


class MarkedSnapshot:
    """The app's snapshot, telling `DigestingChunks` where the envelope prefix ends."""

    __slots__ = ("_inner", "started")

    def __init__(self, inner: StateSnapshot) -> None:
        self._inner = inner
        self.started = False

    def chunks(self) -> Iterator[bytes]:
        self.started = True
        yield from self._inner.chunks()


class DigestingChunks:
    """Wraps a checkpoint's chunk iterator (built over a `MarkedSnapshot`): hashes the
    envelope prefix as it passes; `digest` is D once the iterator is exhausted."""

    __slots__ = ("_app", "_chunks", "_marked", "_prefix")

    def __init__(self, chunks: Iterator[bytes | StatePiece], marked: MarkedSnapshot,
                 app_digest: bytes) -> None:
        self._chunks = chunks
        self._marked = marked
        self._app = app_digest
        self._prefix = hashlib.sha256()

    def __iter__(self) -> Iterator[bytes | StatePiece]:
        return self

    def __next__(self) -> bytes | StatePiece:
        chunk = next(self._chunks)
        if not self._marked.started and isinstance(chunk, bytes):  # the envelope's prefix
            self._prefix.update(chunk)
        return chunk

    @property
    def digest(self) -> bytes:
        return combine(self._prefix.digest(), self._app)


class CheckpointDigests:
    """The replica's side: wraps each checkpoint job of a machine with `CheckpointDigest`
    (`chunks`) and hands over D when the job is done (`taken`); for other machines it
    passes the job through and `taken` gives None (the core hashes the bytes)."""

    __slots__ = ("_jobs", "_state_digest")

    def __init__(self, machine: object) -> None:
        self._state_digest = (machine.state_digest if isinstance(machine, CheckpointDigest)
                              else None)
        self._jobs: dict[int, DigestingChunks] = {}

    def chunks(self, index: int,
               envelope: Callable[[StateSnapshot], Iterator[bytes | StatePiece]],
               app: StateSnapshot) -> Iterator[bytes | StatePiece]:
        """The chunks of the checkpoint at `index`: `envelope(app snapshot)`, digested when
        the app has its own digest (read now: the state at `index`)."""
        if self._state_digest is None:
            return envelope(app)
        marked = MarkedSnapshot(app)
        job = self._jobs[index] = DigestingChunks(envelope(marked), marked,
                                                  self._state_digest())
        return job

    def taken(self, index: int) -> bytes | None:
        """D of the finished job at `index` (None without the hook); forgets older jobs
        (replaced or failed)."""
        job = self._jobs.pop(index, None)
        for stale in [i for i in self._jobs if i < index]:
            del self._jobs[stale]
        return job.digest if job is not None else None


def digest_function(machine: object) -> Callable[[bytes], bytes] | None:
    """D of checkpoint bytes for `machine`'s app, or None when it has no `CheckpointDigest`."""
    if not isinstance(machine, CheckpointDigest):
        return None
    app = machine

    def digest(data: bytes) -> bytes:
        try:
            parsed = parse_envelope(data)
            app_digest = app.snapshot_digest(parsed.app_data)
        except SnapshotFormatError:
            return b""
        prefix = memoryview(data)[: len(data) - len(parsed.app_data)]
        return combine(hashlib.sha256(prefix).digest(), app_digest)

    return digest
