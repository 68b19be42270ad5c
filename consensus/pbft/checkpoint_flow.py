"""Checkpoints and catching up for a PBFT replica (Castro-Liskov §4.3; TOCS §5.3).

Owns: `CheckpointFlow`, the part of `PbftCore` (a base class of it) that signs and collects
checkpoint votes (re-broadcasting its newest vote while that checkpoint is not stable), moves
the water marks when a checkpoint becomes stable (garbage-collecting the log, the signer's
record and the catch-up tables), and glues the `CatchUp` sub-machine (transfer.py) to the
core: it starts a state transfer, installs checkpoint data whose digest matches the
certificate (a `Ready.snapshot`), and queues fetched committed batches that f+1 replicas
agree on for in-order execution.

Must not import: trio, sockets, clocks, randomness, `phalanx.net`.

Invariants: the stable checkpoint only moves forward; a snapshot is emitted only for a
checkpoint above the executed seq; after an install, requests the replica waited for are
forgotten (their clients retransmit; the replica layer answers the executed ones).
"""

from __future__ import annotations

from collections.abc import Callable

from phalanx.consensus.core import Snapshot
from phalanx.consensus.crypto import Crypto, digest_of
from phalanx.consensus.pbft.checkpoint import CheckpointTracker, StableCheckpoint
from phalanx.consensus.pbft.config import PbftConfig
from phalanx.consensus.pbft.log import MessageLog
from phalanx.consensus.pbft.messages import (
    Checkpoint,
    CheckpointData,
    CommittedBatch,
    FetchCommitted,
)
from phalanx.consensus.pbft.requests import RequestBook
from phalanx.consensus.pbft.safety import SafetyRules
from phalanx.consensus.pbft.transfer import Batch, CatchUp
from phalanx.consensus.types import (
    Configuration,
    LocalProtocolError,
    Message,
    NodeId,
    SnapshotMeta,
)


class CheckpointFlow:
    """Checkpoints and catch-up for `PbftCore`, which provides the state and helpers
    declared here."""

    _cfg: PbftConfig
    _crypto: Crypto
    _me: NodeId
    _safety: SafetyRules
    _log: MessageLog
    _checkpoints: CheckpointTracker
    _catchup: CatchUp
    _requests: RequestBook
    _view: int
    _active: bool
    _executed: int
    _next_seq: int
    _committed: dict[int, Batch]
    _snapshot_out: Snapshot | None
    _own_vote: Checkpoint | None
    _durable_dirty: bool
    _hard_dirty: bool
    _drop: Callable[[str], None]
    _send: Callable[[NodeId, Message], None]
    _broadcast: Callable[[Message], None]
    is_primary: Callable[[], bool]
    _flush: Callable[..., None]
    _execute: Callable[[], None]

    def _checkpoint_taken(self, index: int, data: bytes) -> None:
        if index > self._executed:
            raise LocalProtocolError(f"checkpoint at {index} beyond executed {self._executed}")
        if index <= self._checkpoints.stable.seq:
            return
        digest = self._crypto.digest(data)
        self._checkpoints.record_own(index, digest, data)
        cp = self._own_vote = self._signed_checkpoint(index, digest)
        self._broadcast(cp)
        self._checkpoint_vote(cp)

    def _signed_checkpoint(self, seq: int, digest: bytes) -> Checkpoint:
        """Our vote that the state after `seq` has `digest` (signing a checkpoint twice is
        harmless: the same statement)."""
        cp = Checkpoint(seq=seq, digest=digest, replica=self._me)
        return Checkpoint(seq=seq, digest=digest, replica=self._me, signature=self._safety.sign(cp))

    def _resend_checkpoint_vote(self) -> None:
        """Re-broadcast our newest vote while its checkpoint is not stable here (periodically,
        from `_tick`). A stable checkpoint needs 2f+1 matching votes; with f replicas
        disagreeing (Byzantine, or a diverged state) that is every honest vote, and a vote
        is otherwise sent once: votes lost to a crash or a partition froze every replica's
        water marks for good (found by the Jepsen harness, corrupt_reply + kill/pause)."""
        vote = self._own_vote
        if vote is not None and vote.seq > self._checkpoints.stable.seq:
            self._broadcast(vote)

    def _on_checkpoint(self, cp: Checkpoint) -> None:
        if not self._crypto.verify(cp.replica, cp, cp.signature):
            self._drop("bad_signature")
            return
        if cp.seq <= self._checkpoints.stable.seq:
            self._drop("stale_checkpoint")
            return
        own = self._checkpoints.own_digest(cp.seq)
        if own is not None and own != cp.digest:
            self._drop("checkpoint_digest_mismatch")
            return
        self._checkpoint_vote(cp)

    def _checkpoint_vote(self, cp: Checkpoint) -> None:
        stable = self._checkpoints.add_vote(cp)
        if stable is not None:
            self._stable_moved(stable)

    def _adopt_stable(self, stable: StableCheckpoint) -> None:
        if self._checkpoints.adopt(stable):
            self._stable_moved(stable)

    def _stable_moved(self, stable: StableCheckpoint) -> None:
        """A new stable checkpoint: move the water marks and collect garbage (§4.3)."""
        self._log.gc(stable.seq, self._cfg.log_window)
        self._safety.prune(stable.seq)
        self._catchup.gc(stable.seq)
        self._durable_dirty = True
        if self._executed < stable.seq:
            self._start_transfer(stable, send=True)
        if self._active and self.is_primary():
            self._next_seq = max(self._next_seq, stable.seq)
            self._flush()

    def _start_transfer(self, target: StableCheckpoint, *, send: bool) -> None:
        fetch = self._catchup.start(target, now=send, view=self._view)
        if fetch is not None:
            self._send(self._catchup.fetch_source(), fetch)

    def _on_checkpoint_data(self, msg: CheckpointData) -> None:
        verdict = self._catchup.accept_data(
            msg, executed=self._executed, digest=self._crypto.digest
        )
        if isinstance(verdict, str):
            self._drop(verdict)
        if not isinstance(verdict, StableCheckpoint):
            return
        meta = SnapshotMeta(
            index=verdict.seq,
            term=self._view,
            config=Configuration(voters=tuple(sorted(self._cfg.replicas))),
        )
        self._snapshot_out = Snapshot(meta=meta, data=msg.data)
        self._executed = verdict.seq
        self._checkpoints.record_own(verdict.seq, verdict.digest, msg.data)
        self._hard_dirty = True
        for seq in [s for s in self._committed if s <= verdict.seq]:
            del self._committed[seq]
        # Which waiting requests the checkpoint executed is unknown here: forget them (their
        # clients retransmit; the replica layer answers the executed ones from its sessions)
        # rather than let them expire the view-change timer.
        self._requests.waiting.clear()
        self._broadcast(
            FetchCommitted(from_seq=verdict.seq + 1, replica=self._me, view=self._view)
        )
        self._execute()

    def _on_committed_batch(self, msg: CommittedBatch) -> None:
        verdict = self._catchup.accept_batch(
            msg,
            executed=self._executed,
            queued=self._committed,
            batch_digest=lambda batch: digest_of(self._crypto, batch),
        )
        if isinstance(verdict, str):
            self._drop(verdict)
        elif verdict is not None:
            self._committed[msg.seq] = verdict
            self._execute()
