"""The normal case of a PBFT replica: pre-prepares, prepares, commits and in-order execution
(Castro-Liskov §4.2).

Owns: `VoteFlow`: the batches committed but not yet executed (`committed`, waiting for their
predecessors) and this replica's own votes sent recorded-first, waiting for the `Persisted`
of the Ready that recorded them (`awaiting`), and the votes that arrived up to one window
above the high water mark (`log.AheadVotes`, replayed by `window_moved` when a new stable
checkpoint moves the window: a primary may move its window first). It checks incoming
votes and stores them in the message log (`Shared.log`), sends this replica's prepares and
commits, decides when a slot is prepared (with verified prepares) and committed-local,
executes committed batches in sequence order into `Ready.committed` (moving
`Shared.executed`), and counts own votes once they are durable. Executing tells
`RequestFlow` (dedup, the primary's next batch), `CatchUp` (its history) and the
`ViewTimer` (the primary works).

Must not import: trio, sockets, clocks, randomness, `phalanx.net`.

Signature checks (the costliest CPU of the normal case: one Ed25519 verification costs
about three signatures on this hardware): a pre-prepare is checked on arrival (a backup
prepares only a validly signed one), and so is a prepare, except one that arrives for a slot
already certified (prepared with quorum-1 verified prepares): it can never be needed, so it
is stored unchecked. A backup thus checks one peer's prepare per slot and the primary two,
not three: 8 verifications per batch at n=4 instead of 12, with no check added to the
critical path (the prepares that complete a certificate were checked on arrival before
too). Safety is unchanged: `prepared` for the commit and for execution, and every
certificate that goes into a ViewChange, count verified prepares only. A forged prepare is
dropped and counted (`bad_signature`) whenever it could count. Commits carry pairwise MACs
(checked on arrival: they are never forwarded).

Invariants: as `PbftCore`'s (see its module docstring): own commits leave only after the
certificate behind them is durable; `Ready.committed` is gap-free and in order.
"""

from __future__ import annotations

from collections.abc import Container
from typing import assert_never

from phalanx.consensus.pbft.log import AddResult, AheadVotes
from phalanx.consensus.pbft.messages import Commit, Prepare, PrePrepare, signed_part
from phalanx.consensus.pbft.request_flow import RequestFlow
from phalanx.consensus.pbft.safety import SafetyViolation
from phalanx.consensus.pbft.shared import Shared, Vote
from phalanx.consensus.pbft.stamp import check_stamp, pp_digest_ok
from phalanx.consensus.pbft.transfer import Batch, CatchUp
from phalanx.consensus.pbft.view_flow import ViewTimer
from phalanx.consensus.types import ClientRequest, Entry, EntryKind, LocalProtocolError


class VoteFlow:
    """The normal case; see the module docstring."""

    __slots__ = (
        "_ahead",
        "_awaiting",
        "_catchup",
        "_commit_quorum",
        "_committed",
        "_quorum",
        "_requests",
        "_s",
        "_stamp_skew",
        "_timer",
    )

    def __init__(
        self,
        shared: Shared,
        *,
        requests: RequestFlow,
        catchup: CatchUp,
        timer: ViewTimer,
        commit_quorum: int,
    ) -> None:
        """`commit_quorum`: matching commits that make a prepared slot committed-local
        (2f+1, `PbftConfig.quorum`)."""
        self._s = shared
        self._requests = requests
        self._catchup = catchup
        self._timer = timer
        self._commit_quorum = commit_quorum
        self._stamp_skew = shared.cfg.block_stamp_skew_ms
        self._quorum = shared.cfg.quorum  # (the config never changes: once, not per vote)
        self._committed: dict[int, Batch] = {}  # committed, waiting to execute in order
        self._awaiting: list[tuple[int, Vote]] = []  # (Ready number, own vote)
        self._ahead = AheadVotes(per_sender=3 * shared.cfg.log_window)

    @property
    def queued(self) -> Container[int]:
        """The seqs committed and waiting for their predecessors to execute."""
        return self._committed

    @property
    def gap(self) -> bool:
        """Whether a later seq committed while an earlier one did not (fetch the missing)."""
        return bool(self._committed)

    def on_vote(self, msg: Vote) -> None:
        """A pre-prepare, prepare or commit of the current view (or of any view, under the
        ``skip_view_check`` bug) from its sender."""
        s = self._s
        log = s.log
        crypto = s.crypto
        if not log.in_window(msg.seq):
            if not (s.active and msg.view == s.view and log.high < msg.seq
                    <= log.high + s.cfg.log_window):
                s.drop("out_of_window")
            elif not self._ahead.add(msg.replica, msg):  # replayed once the window moves
                s.drop("ahead_overflow")
            return
        match msg:
            case PrePrepare():
                if msg.replica != s.cfg.primary(msg.view):
                    s.drop("not_primary")
                    return
                if not pp_digest_ok(crypto, msg):
                    s.drop("bad_digest")
                    return
                if not crypto.verify(msg.replica, signed_part(msg), msg.signature):
                    s.drop("bad_signature")
                    return
                refused = check_stamp(msg, stamps=self._stamp_skew > 0,
                                      skew_ms=self._stamp_skew, now_ms=s.now_ms,
                                      executed_ts=s.executed_ts, log=log)
                if refused is not None:
                    s.drop(refused)
                    return
                result = log.add_pre_prepare(msg, counted=True)
                if result is AddResult.ADDED:
                    # No need to relay these any more; wait for them to execute.
                    self._requests.ordered(msg.batch, wait=True)
                    self.prepare(msg)
            case Prepare():
                if msg.replica == s.cfg.primary(msg.view):
                    s.drop("prepare_from_primary")
                    return
                slot = log.peek(msg.view, msg.seq)
                if slot is not None and slot.certified:
                    # The certificate is made: this one is never needed, so never checked.
                    result = log.add_prepare(msg)
                elif crypto.verify(msg.replica, msg, msg.signature):
                    result = log.add_prepare(msg, verified=True)
                else:
                    s.drop("bad_signature")
                    return
            case Commit():
                if not crypto.verify_mac(msg.replica, msg, msg.auth):
                    s.drop("bad_auth")
                    return
                result = log.add_commit(msg)
            case _:
                assert_never(msg)
        if result is not AddResult.ADDED:
            s.drop(result.value)
            return
        self._progress(msg.view, msg.seq)

    def prepare(self, pp: PrePrepare) -> None:
        """Send our prepare for `pp` (just stored in the log; the caller runs `_progress`
        when it counts our early prepare)."""
        s = self._s
        prepare = Prepare(view=pp.view, seq=pp.seq, digest=pp.digest, replica=s.me)
        early = s.early_ok(pp.view)
        try:
            signed = s.safety.sign_prepare(prepare, early=early)
        except SafetyViolation:
            s.drop("safety_refused")
            return
        s.log.slot(pp.view, pp.seq).prepare_sent = True
        if early:
            s.send_early(signed)
            s.log.add_prepare(signed, verified=True)
        else:
            s.broadcast(signed)
            s.new_own.append(signed)

    def _progress(self, view: int, seq: int) -> None:
        s = self._s
        log = s.log
        slot = log.peek(view, seq)
        if slot is None or slot.pre_prepare is None:
            return
        pp = slot.pre_prepare
        q = self._quorum
        if not slot.certified:
            if not log.prepared(view, seq, q, verified_only=True):
                return
            slot.certified = True
        if not slot.commit_sent:
            slot.commit_sent = True
            log.record_prepared(view, seq, q)
            s.durable_dirty = True
            me = s.me
            commit = Commit(view=view, seq=seq, digest=pp.digest, replica=me)
            for peer in s.peers:
                tag = s.crypto.mac(peer, commit)
                s.send(peer, Commit(view=view, seq=seq, digest=pp.digest, replica=me, auth=tag))
            s.new_own.append(commit)
        if not slot.committed and log.committed_local(view, seq, q, self._commit_quorum):
            slot.committed = True
            if seq > s.executed and seq not in self._committed:
                self._committed[seq] = (view, pp.digest, pp.batch, pp.timestamp, pp.proposer)
            self._execute()

    # ----------------------------------------------------------------------------------
    # Execution

    def _execute(self) -> None:
        s = self._s
        committed = self._committed
        catchup = self._catchup
        progressed = False
        requests: list[ClientRequest] = []
        while s.executed + 1 in committed:
            seq = s.executed + 1
            done = committed.pop(seq)
            view, _, batch, ts, proposer = done
            kind = EntryKind.COMMAND if batch else EntryKind.NOOP
            s.exec_out.append(Entry(index=seq, term=view, kind=kind, requests=batch,
                                    timestamp=ts, proposer=proposer))
            s.executed = seq
            if ts > s.executed_ts:
                s.executed_ts = ts
            catchup.history[seq] = done
            self._requests.was_executed(batch)
            requests.extend(batch)
            progressed = True
        if progressed and s.active:
            self._timer.progressed()
            catchup.progressed()
        if progressed:
            catchup.caught_up(s.executed)
            # A batch left the pipeline: the primary proposes what accumulated.
            self._requests.executed(requests)

    def window_moved(self) -> None:
        """The water marks moved (a new stable checkpoint): the votes kept above the old
        high water mark that are now within the window count as if they arrived now."""
        s = self._s
        if not s.active or not self._ahead:
            return
        for msg in self._ahead.take(s.view, s.log.low, s.log.high):
            self.on_vote(msg)

    def queue(self, seq: int, batch: Batch) -> None:
        """A batch committed elsewhere and fetched (f+1 replicas agree): execute it in turn."""
        self._committed[seq] = batch
        self._execute()

    def installed(self, seq: int) -> None:
        """A checkpoint at `seq` was installed (`Shared.executed` moved to it): forget what
        it covers, execute what follows."""
        committed = self._committed
        for done in [k for k in committed if k <= seq]:
            del committed[done]
        self._execute()

    # ----------------------------------------------------------------------------------
    # Own votes, once durable

    def recorded(self, number: int, votes: list[Vote]) -> None:
        """Our `votes` are recorded by Ready `number`: count them once it is persisted."""
        self._awaiting.extend((number, vote) for vote in votes)

    def on_persisted(self, number: int) -> None:
        s = self._s
        if number > s.ready_number:
            raise LocalProtocolError(
                f"Persisted({number}) but the last Ready was {s.ready_number}"
            )
        persisted = s.persisted = max(s.persisted, number)
        ready = [v for n, v in self._awaiting if n <= persisted]
        self._awaiting = [(n, v) for n, v in self._awaiting if n > persisted]
        log = s.log
        for vote in ready:
            if not log.in_window(vote.seq):
                continue
            match vote:
                case PrePrepare():
                    slot = log.slot(vote.view, vote.seq)
                    if slot.pre_prepare == vote:
                        slot.pre_prepare_counted = True
                case Prepare():
                    log.add_prepare(vote, verified=True)
                case Commit():
                    log.add_commit(vote)
                case _:
                    assert_never(vote)
            self._progress(vote.view, vote.seq)
