"""The normal case of a PBFT replica: pre-prepares, prepares, commits and in-order execution
(Castro-Liskov §4.2).

Owns: `VoteFlow`, the part of `PbftCore` (a base class of it) that checks incoming votes and
stores them in the message log, sends this replica's prepares and commits, decides when a
slot is prepared (with verified prepares) and committed-local, executes committed batches in
sequence order into `Ready.committed`, and counts own votes once `Persisted` reports them.

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

from collections.abc import Callable
from typing import assert_never

from phalanx.consensus.core import Send
from phalanx.consensus.crypto import Crypto, digest_of
from phalanx.consensus.pbft.config import PbftConfig
from phalanx.consensus.pbft.log import AddResult, MessageLog
from phalanx.consensus.pbft.messages import Commit, Prepare, PrePrepare, signed_part
from phalanx.consensus.pbft.requests import RequestBook
from phalanx.consensus.pbft.safety import SafetyRules, SafetyViolation
from phalanx.consensus.pbft.transfer import Batch, CatchUp
from phalanx.consensus.types import Entry, EntryKind, LocalProtocolError, Message, NodeId

_Vote = PrePrepare | Prepare | Commit


class VoteFlow:
    """The normal case for `PbftCore`, which provides the state and helpers declared here."""

    _cfg: PbftConfig
    _crypto: Crypto
    _me: NodeId
    _safety: SafetyRules
    _log: MessageLog
    _requests: RequestBook
    _catchup: CatchUp
    _view: int
    _active: bool
    _executed: int
    _backoff: int
    _timer: int | None
    _committed: dict[int, Batch]
    _persisted: int
    _awaiting: list[tuple[int, _Vote]]
    _out: list[Send]
    _exec_out: list[Entry]
    _new_own: list[_Vote]
    _durable_dirty: bool
    _drop: Callable[[str], None]
    _send: Callable[[NodeId, Message], None]
    _broadcast: Callable[[Message], None]
    _early_ok: Callable[[int], bool]
    _send_early: Callable[[PrePrepare | Prepare], None]
    _flush: Callable[..., None]
    is_primary: Callable[[], bool]
    _ready_number: int

    def _on_vote(self, msg: PrePrepare | Prepare | Commit) -> None:
        primary = self._cfg.primary(msg.view)
        if not self._log.in_window(msg.seq):
            self._drop("out_of_window")
            return
        match msg:
            case PrePrepare():
                if msg.replica != primary:
                    self._drop("not_primary")
                    return
                if msg.digest != digest_of(self._crypto, msg.batch):
                    self._drop("bad_digest")
                    return
                if not self._crypto.verify(msg.replica, signed_part(msg), msg.signature):
                    self._drop("bad_signature")
                    return
                result = self._log.add_pre_prepare(msg, counted=True)
                if result is AddResult.ADDED:
                    # No need to relay these any more; wait for them to execute.
                    self._requests.ordered(msg.batch, wait=True)
                    self._send_prepare(msg)
            case Prepare():
                if msg.replica == primary:
                    self._drop("prepare_from_primary")
                    return
                slot = self._log.peek(msg.view, msg.seq)
                if slot is not None and slot.certified:
                    # The certificate is made: this one is never needed, so never checked.
                    result = self._log.add_prepare(msg)
                elif self._crypto.verify(msg.replica, msg, msg.signature):
                    result = self._log.add_prepare(msg, verified=True)
                else:
                    self._drop("bad_signature")
                    return
            case Commit():
                if not self._crypto.verify_mac(msg.replica, msg, msg.auth):
                    self._drop("bad_auth")
                    return
                result = self._log.add_commit(msg)
            case _:
                assert_never(msg)
        if result is not AddResult.ADDED:
            self._drop(result.value)
            return
        self._progress(msg.view, msg.seq)

    def _send_prepare(self, pp: PrePrepare) -> None:
        prepare = Prepare(view=pp.view, seq=pp.seq, digest=pp.digest, replica=self._me)
        early = self._early_ok(pp.view)
        try:
            signed = self._safety.sign_prepare(prepare, early=early)
        except SafetyViolation:
            self._drop("safety_refused")
            return
        self._log.slot(pp.view, pp.seq).prepare_sent = True
        if early:
            self._send_early(signed)
            self._log.add_prepare(signed, verified=True)  # the caller runs `_progress`
        else:
            self._broadcast(signed)
            self._new_own.append(signed)

    def _progress(self, view: int, seq: int) -> None:
        slot = self._log.peek(view, seq)
        if slot is None or slot.pre_prepare is None:
            return
        pp = slot.pre_prepare
        q = self._cfg.quorum
        if not slot.certified:
            if not self._log.prepared(view, seq, q, verified_only=True):
                return
            slot.certified = True
        if not slot.commit_sent:
            slot.commit_sent = True
            self._log.record_prepared(view, seq, q)
            self._durable_dirty = True
            commit = Commit(view=view, seq=seq, digest=pp.digest, replica=self._me)
            for peer in self._cfg.peers():
                tag = self._crypto.mac(peer, commit)
                self._send(
                    peer, Commit(view=view, seq=seq, digest=pp.digest, replica=self._me, auth=tag)
                )
            self._new_own.append(commit)
        if not slot.committed and self._log.committed_local(view, seq, q, self._cfg.commit_quorum):
            slot.committed = True
            if seq > self._executed and seq not in self._committed:
                self._committed[seq] = (view, pp.digest, pp.batch)
            self._execute()

    def _execute(self) -> None:
        progressed = False
        requests = 0
        while self._executed + 1 in self._committed:
            seq = self._executed + 1
            view, digest, batch = self._committed.pop(seq)
            kind = EntryKind.COMMAND if batch else EntryKind.NOOP
            self._exec_out.append(Entry(index=seq, term=view, kind=kind, requests=batch))
            self._executed = seq
            self._catchup.history[seq] = (view, digest, batch)
            self._requests.was_executed(batch)
            requests += len(batch)
            progressed = True
        if progressed and self._active:
            self._backoff = 0
            self._timer = None  # restarted on the next Tick if requests still wait
            self._catchup.progressed()
        if progressed:
            self._catchup.caught_up(self._executed)
            if self.is_primary():
                # A batch left the pipeline: propose what accumulated, once the clients
                # just answered are back (`requests.RequestBook.served`).
                self._requests.served(requests)
                self._flush()

    def _on_persisted(self, number: int) -> None:
        if number > self._ready_number:
            raise LocalProtocolError(
                f"Persisted({number}) but the last Ready was {self._ready_number}"
            )
        self._persisted = max(self._persisted, number)
        ready = [v for n, v in self._awaiting if n <= self._persisted]
        self._awaiting = [(n, v) for n, v in self._awaiting if n > self._persisted]
        for vote in ready:
            if not self._log.in_window(vote.seq):
                continue
            match vote:
                case PrePrepare():
                    slot = self._log.slot(vote.view, vote.seq)
                    if slot.pre_prepare == vote:
                        slot.pre_prepare_counted = True
                case Prepare():
                    self._log.add_prepare(vote, verified=True)
                case Commit():
                    self._log.add_commit(vote)
                case _:
                    assert_never(vote)
            self._progress(vote.view, vote.seq)

