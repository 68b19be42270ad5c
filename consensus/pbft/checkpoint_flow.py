"""Checkpoints and catching up for a PBFT replica (Castro-Liskov §4.3; TOCS §5.3).

Owns: `CheckpointFlow`: the `CheckpointTracker` (checkpoint.py: own checkpoints, votes, the
stable checkpoint), this replica's newest checkpoint vote, and the `CatchUp` sub-machine
(transfer.py; `VoteFlow` records executed batches into its history). It signs and collects
checkpoint votes (re-broadcasting its newest vote while that checkpoint is not stable),
moves the water marks when a checkpoint becomes stable (garbage-collecting the log, the
signer's record and the catch-up tables), serves checkpoint data and committed batches to
lagging peers, starts a state transfer, installs checkpoint data whose digest matches the
certificate (a `Ready.snapshot`), and hands fetched committed batches that f+1 replicas
agree on to `VoteFlow` for in-order execution.

Must not import: trio, sockets, clocks, randomness, `phalanx.net`.

Invariants: the stable checkpoint only moves forward; a snapshot is emitted only for a
checkpoint above the executed seq; after an install, requests the replica waited for are
forgotten (their clients retransmit; the replica layer answers the executed ones).
"""

from __future__ import annotations

from collections.abc import Callable

from phalanx.consensus.core import Snapshot
from phalanx.consensus.pbft.checkpoint import CheckpointTracker, StableCheckpoint
from phalanx.consensus.pbft.messages import (
    Checkpoint,
    CheckpointData,
    CommittedBatch,
    FetchCommitted,
)
from phalanx.consensus.pbft.request_flow import RequestFlow
from phalanx.consensus.pbft.shared import Shared
from phalanx.consensus.pbft.stamp import batch_digest
from phalanx.consensus.pbft.transfer import CatchUp
from phalanx.consensus.pbft.vote_flow import VoteFlow
from phalanx.consensus.types import (
    Configuration,
    LocalProtocolError,
    NodeId,
    SnapshotMeta,
)


class CheckpointFlow:
    """Checkpoints and catch-up; see the module docstring."""

    __slots__ = ("_catchup", "_digest", "_own_vote", "_requests", "_s", "_tracker", "_votes")

    def __init__(
        self,
        shared: Shared,
        *,
        stable: StableCheckpoint,
        catchup: CatchUp,
        requests: RequestFlow,
        votes: VoteFlow,
        data: bytes | None = None,
        state_digest: Callable[[bytes], bytes] | None = None,
    ) -> None:
        """`stable`: the stable checkpoint restored; `data`: the state at `Shared.executed`
        the restored state machine holds (served to lagging peers), if any; `state_digest`:
        the digest of checkpoint data (default `crypto.digest`, see `PbftCore`)."""
        self._s = shared
        self._digest = state_digest or shared.crypto.digest
        self._catchup = catchup
        self._requests = requests
        self._votes = votes
        self._tracker = CheckpointTracker(quorum=shared.cfg.quorum, stable=stable)
        self._own_vote: Checkpoint | None = None
        if data is not None:
            executed = shared.executed
            digest = self._digest(data)
            self._tracker.record_own(executed, digest, data)
            if executed > stable.seq:
                # Our vote for it may have died with the process: sign it again so
                # `resend_vote` can repeat it until it is stable.
                self._own_vote = self._signed_checkpoint(executed, digest)
                if shared.cfg.quorum > 1:  # (n = 1 takes its checkpoints stable at once anyway)
                    self._tracker.add_vote(self._own_vote)

    @property
    def stable(self) -> StableCheckpoint:
        return self._tracker.stable

    @property
    def transferring(self) -> bool:
        """Whether a state transfer is under way."""
        return self._catchup.target is not None

    # ----------------------------------------------------------------------------------
    # Own checkpoints

    def taken(self, index: int, data: bytes, digest: bytes | None = None) -> None:
        """The replica layer took a checkpoint at `index` (`CheckpointTaken`), with the
        app's own digest of it when it has one."""
        s = self._s
        if index > s.executed:
            raise LocalProtocolError(f"checkpoint at {index} beyond executed {s.executed}")
        if index <= self._tracker.stable.seq:
            return
        if digest is None:
            digest = self._digest(data)
        self._tracker.record_own(index, digest, data)
        cp = self._own_vote = self._signed_checkpoint(index, digest)
        s.broadcast(cp)
        self._checkpoint_vote(cp)

    def installed(self, index: int, data: bytes) -> None:
        """The replica layer installed a checkpoint at `index` (`CheckpointInstalled`)."""
        s = self._s
        if index > s.executed:
            s.executed = index
            self._tracker.record_own(index, self._digest(data), data)

    def _signed_checkpoint(self, seq: int, digest: bytes) -> Checkpoint:
        """Our vote that the state after `seq` has `digest` (signing a checkpoint twice is
        harmless: the same statement)."""
        s = self._s
        cp = Checkpoint(seq=seq, digest=digest, replica=s.me)
        return Checkpoint(seq=seq, digest=digest, replica=s.me, signature=s.safety.sign(cp))

    def resend_vote(self) -> None:
        """Re-broadcast our newest vote while its checkpoint is not stable here (periodically,
        on a tick). A stable checkpoint needs 2f+1 matching votes; with f replicas
        disagreeing (Byzantine, or a diverged state) that is every honest vote, and a vote
        is otherwise sent once: votes lost to a crash or a partition froze every replica's
        water marks for good (found by the Jepsen harness, corrupt_reply + kill/pause)."""
        vote = self._own_vote
        if vote is not None and vote.seq > self._tracker.stable.seq:
            self._s.broadcast(vote)

    # ----------------------------------------------------------------------------------
    # Votes and stability

    def on_checkpoint(self, cp: Checkpoint) -> None:
        s = self._s
        if not s.crypto.verify(cp.replica, cp, cp.signature):
            s.drop("bad_signature")
            return
        if cp.seq <= self._tracker.stable.seq:
            s.drop("stale_checkpoint")
            return
        own = self._tracker.own_digest(cp.seq)
        if own is not None and own != cp.digest:
            s.drop("checkpoint_digest_mismatch")
            return
        self._checkpoint_vote(cp)

    def _checkpoint_vote(self, cp: Checkpoint) -> None:
        stable = self._tracker.add_vote(cp)
        if stable is not None:
            self._stable_moved(stable)

    def adopt_stable(self, stable: StableCheckpoint) -> None:
        """A verified certificate (a NewView's min-s) made `stable` stable."""
        if self._tracker.adopt(stable):
            self._stable_moved(stable)

    def _stable_moved(self, stable: StableCheckpoint) -> None:
        """A new stable checkpoint: move the water marks and collect garbage (§4.3)."""
        s = self._s
        s.log.gc(stable.seq, s.cfg.log_window)
        s.safety.prune(stable.seq)
        self._catchup.gc(stable.seq)
        s.durable_dirty = True
        if s.executed < stable.seq:
            self.start_transfer(stable, send=True)
        self._requests.stable_moved(stable.seq)
        self._votes.window_moved()

    # ----------------------------------------------------------------------------------
    # Serving lagging peers

    def serve_checkpoint(self, src: NodeId, seq: int) -> None:
        """`src` asks for our checkpoint data at `seq` (`FetchCheckpoint`)."""
        s = self._s
        data = self._tracker.own_data(seq)
        if data is None:
            s.drop("fetch_unavailable")
        else:
            s.send(src, CheckpointData(seq=seq, data=data, replica=s.me))

    def serve_committed(self, src: NodeId, from_seq: int) -> None:
        """`src` asks for the batches we executed from `from_seq` on (`FetchCommitted`)."""
        s = self._s
        for reply in self._catchup.serve(from_seq, s.executed):
            s.send(src, reply)

    # ----------------------------------------------------------------------------------
    # Catching up

    def tick(self, *, gap: bool) -> None:
        """Retry a state transfer, or fetch the committed batches of a gap (`gap`: a later
        seq committed while an earlier one did not)."""
        s = self._s
        fetch, fetch_committed = self._catchup.tick(executed=s.executed, view=s.view, gap=gap)
        if fetch is not None:
            s.send(*fetch)
        if fetch_committed is not None:
            s.broadcast(fetch_committed)

    def start_transfer(self, target: StableCheckpoint, *, send: bool) -> None:
        fetch = self._catchup.start(target, now=send, view=self._s.view)
        if fetch is not None:
            self._s.send(self._catchup.fetch_source(), fetch)

    def on_checkpoint_data(self, msg: CheckpointData) -> None:
        s = self._s
        verdict = self._catchup.accept_data(msg, executed=s.executed, digest=self._digest)
        if isinstance(verdict, str):
            s.drop(verdict)
        if not isinstance(verdict, StableCheckpoint):
            return
        meta = SnapshotMeta(
            index=verdict.seq,
            term=s.view,
            config=Configuration(voters=tuple(sorted(s.cfg.replicas))),
        )
        s.snapshot_out = Snapshot(meta=meta, data=msg.data)
        s.executed = verdict.seq
        self._tracker.record_own(verdict.seq, verdict.digest, msg.data)
        s.hard_dirty = True
        self._requests.forget_waiting()
        s.broadcast(FetchCommitted(from_seq=verdict.seq + 1, replica=s.me, view=s.view))
        self._votes.installed(verdict.seq)

    def on_committed_batch(self, msg: CommittedBatch) -> None:
        s = self._s
        verdict = self._catchup.accept_batch(
            msg,
            executed=s.executed,
            queued=self._votes.queued,
            digest_ok=lambda m: m.digest == batch_digest(s.crypto, m.batch, m.timestamp,
                                                         m.proposer),
        )
        if isinstance(verdict, str):
            s.drop(verdict)
        elif verdict is not None:
            self._votes.queue(msg.seq, verdict)
