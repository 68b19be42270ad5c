"""Catching up: state transfer and committed-batch fetching (Castro-Liskov TOCS §5.3).

Owns: `CatchUp`, the sub-machine a PBFT replica uses to get what it missed:
- the batches it executed above its stable checkpoint (`history`), served to peers that ask
  with `FetchCommitted`;
- fetching committed batches it missed: a `FetchCommitted` after `fetch_ticks` ticks with a
  gap (a later seq committed locally while an earlier one did not), and acceptance of a
  `CommittedBatch` once f+1 distinct replicas report the same (seq, view, digest) (the
  digest covers the batch and its block stamp, `stamp.batch_digest`);
- state transfer to a stable checkpoint it has not executed: `FetchCheckpoint` to the
  replicas that signed its certificate in turn (another one every `fetch_ticks` ticks), and
  acceptance of `CheckpointData` whose digest matches the certificate.

It decides; the core sends, executes and installs. Must not import: the core, clocks,
randomness. Crypto (the batch digest) is passed in by the core.

Invariants: `history` and `fetched` only hold seqs above the stable checkpoint (`gc`);
`fetched` holds at most one reply per replica per seq, for seqs within one log window above
the executed seq; peer input never raises (a drop reason is returned instead).
"""

from __future__ import annotations

from collections.abc import Callable, Container

from phalanx.consensus.pbft.checkpoint import StableCheckpoint
from phalanx.consensus.pbft.config import PbftConfig
from phalanx.consensus.pbft.messages import (
    CheckpointData,
    CommittedBatch,
    FetchCheckpoint,
    FetchCommitted,
)
from phalanx.consensus.types import ClientRequest, NodeId

Batch = tuple[int, bytes, tuple[ClientRequest, ...], int, str]
"""(view, digest, batch, timestamp, proposer) of one committed sequence number (the last two
its block stamp, 0 and "" when unstamped)."""


class CatchUp:
    """See the module docstring."""

    __slots__ = ("_cfg", "_gap_ticks", "_ticks", "_tries", "fetched", "history", "target")

    def __init__(self, config: PbftConfig, *, restarted: bool) -> None:
        self._cfg = config
        self.history: dict[int, Batch] = {}
        self.fetched: dict[int, dict[NodeId, CommittedBatch]] = {}
        self.target: StableCheckpoint | None = None
        self._tries = 0
        self._ticks = 0
        # A restarted replica asks for what it missed on its first fetch round.
        self._gap_ticks = config.fetch_ticks if restarted else 0

    # ------------------------------------------------------------------ serving

    def serve(self, from_seq: int, executed: int) -> list[CommittedBatch]:
        out = []
        for seq in range(max(from_seq, 1), executed + 1):
            found = self.history.get(seq)
            if found is not None:
                view, digest, batch, ts, proposer = found
                out.append(CommittedBatch(seq=seq, view=view, digest=digest, batch=batch,
                                          replica=self._cfg.node_id, timestamp=ts,
                                          proposer=proposer))
        return out

    def gc(self, stable_seq: int) -> None:
        for table in (self.history, self.fetched):
            for seq in [s for s in table if s <= stable_seq]:
                del table[seq]

    def progressed(self) -> None:
        """Execution moved forward by itself: no gap to fetch for now."""
        self._gap_ticks = 0

    # ------------------------------------------------------------------ state transfer

    def start(
        self, target: StableCheckpoint, *, now: bool, view: int
    ) -> FetchCheckpoint | None:
        """Aim at `target` (if it is newer); the fetch to send now, if `now`."""
        if self.target is not None and self.target.seq >= target.seq:
            return None
        self.target = target
        self._tries = 0
        if now:
            return self._fetch(view)
        self._ticks = self._cfg.fetch_ticks  # the next tick sends it
        return None

    def fetch_source(self) -> NodeId:
        """Who the next `FetchCheckpoint` goes to (one signer of the certificate after the
        other; any peer when the certificate names none)."""
        assert self.target is not None  # only called while transferring
        me = self._cfg.node_id
        sources = [c.replica for c in self.target.proof if c.replica != me]
        sources = sources or list(self._cfg.peers())
        return sources[self._tries % len(sources)]

    def _fetch(self, view: int) -> FetchCheckpoint:
        assert self.target is not None  # only called while transferring
        self._ticks = 0
        return FetchCheckpoint(seq=self.target.seq, replica=self._cfg.node_id, view=view)

    def tick(
        self, *, executed: int, view: int, gap: bool
    ) -> tuple[tuple[NodeId, FetchCheckpoint] | None, FetchCommitted | None]:
        """(a FetchCheckpoint to send to its peer, a FetchCommitted to broadcast), each
        optional."""
        if self.target is not None:
            self._ticks += 1
            if self._ticks >= self._cfg.fetch_ticks:
                self._tries += 1
                peer = self.fetch_source()
                return (peer, self._fetch(view)), None
            return None, None
        if self._gap_ticks >= self._cfg.fetch_ticks or gap:
            self._gap_ticks += 1
            if self._gap_ticks >= self._cfg.fetch_ticks:
                self._gap_ticks = 0
                ask = FetchCommitted(from_seq=executed + 1, replica=self._cfg.node_id, view=view)
                return None, ask
        return None, None

    def accept_data(
        self, msg: CheckpointData, *, executed: int, digest: Callable[[bytes], bytes]
    ) -> StableCheckpoint | str | None:
        """The checkpoint to install, a drop reason, or None (no longer needed)."""
        target = self.target
        if target is None or msg.seq != target.seq:
            return "unexpected_checkpoint_data"
        if target.seq <= executed:  # caught up by executing fetched batches meanwhile
            self.target = None
            return None
        if digest(msg.data) != target.digest:
            return "bad_checkpoint_digest"
        self.target = None
        self.history.clear()
        return target

    def caught_up(self, executed: int) -> None:
        """Execution reached the transfer target some other way."""
        if self.target is not None and self.target.seq <= executed:
            self.target = None

    # ------------------------------------------------------------------ committed batches

    def accept_batch(
        self,
        msg: CommittedBatch,
        *,
        executed: int,
        queued: Container[int],
        digest_ok: Callable[[CommittedBatch], bool],
    ) -> Batch | str | None:
        """The batch to execute at `msg.seq` once f+1 replicas agree, a drop reason, or None
        (not decided yet, or already queued)."""
        if not executed < msg.seq <= executed + self._cfg.log_window:
            return "unexpected_committed_batch"
        if msg.seq in queued:
            return None
        if not digest_ok(msg):
            return "bad_digest"
        replies = self.fetched.setdefault(msg.seq, {})
        replies.setdefault(msg.replica, msg)
        matching = [r for r in replies.values() if (r.view, r.digest) == (msg.view, msg.digest)]
        if len(matching) < self._cfg.weak_quorum:
            return None
        del self.fetched[msg.seq]
        return (msg.view, msg.digest, msg.batch, msg.timestamp, msg.proposer)
