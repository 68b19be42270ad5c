"""The ordered-vote state machine of `stuck_resolution = "pbft"`: what every correct node
computes from the sequence of votes and closes the embedded PBFT instance executes.

Owns: `OrderedState` (the undecided checkpoints with their counted votes and closers, a
bounded FIFO of decided checkpoint ids and one of dropped transaction ids (a node that
catches up by state transfer learns the drops it skipped), the hash chain of executed commands), its
`OrderingSnapshot` (the embedded PBFT's checkpoint data) and the `Decision`s it reaches.

Rules (docs/LEADERLESS.md, "Ordered resolution"):
- An item is judged only on its own content (membership, ids, round, checkpoint id, signature,
  self-certifying evidence): the same verdict at every correct node. Invalid items are
  ignored and counted; of each voter only the first valid vote counts, of each proposer the
  first close; items of a remembered decided checkpoint are ignored.
- Checkpoint C decides once the votes of all n members are counted, or at least n-f votes
  and the closes of at least f+1 distinct members (one of them correct, who waited).
- Per transaction T of C: the endorsements of T the counted votes carry (the first per
  endorser, in order) reaching Q_policy(T) KEEP T (with that proof), else T is DROPPED.
- A checkpoint is named by its ids and its round (`checkpoint_id`): round r > 0 is a new
  checkpoint of ids an earlier round kept (docs/LEADERLESS.md "Kept, then stuck").

Invariants: a pure, deterministic function of the executed sequence (insertion-ordered
dicts, sorted ids, no clocks, no randomness); peer content never raises; memory is bounded
by the open checkpoints (PBFT's water marks bound what executes) plus `max_decided` ids.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import pairwise

from phalanx.consensus.crypto import Crypto, Verifier
from phalanx.consensus.leaderless.checks import endorsement_problem, tx_problem
from phalanx.consensus.leaderless.messages import (
    CloseCheckpoint,
    Endorsement,
    OrderedCheckpointState,
    OrderedVote,
    OrderingSnapshot,
    Transaction,
    TransactionProof,
    TxId,
)
from phalanx.consensus.leaderless.veto_votes import MAX_TX_ID_BYTES, checkpoint_id
from phalanx.consensus.types import NodeId

MAX_IDS = 1024
"""A checkpoint naming more transaction ids is malformed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """Checkpoint `checkpoint` decided: `kept` proofs (one per kept transaction) and the
    `dropped` ids (sorted)."""

    checkpoint: bytes
    tx_ids: tuple[TxId, ...]
    kept: tuple[TransactionProof, ...]
    dropped: tuple[TxId, ...]


@dataclass(slots=True)
class _Open:
    tx_ids: tuple[TxId, ...]
    votes: dict[NodeId, OrderedVote]
    closers: dict[NodeId, None]
    round: int = 0


def valid_ids(tx_ids: object) -> bool:
    """Non-empty, at most MAX_IDS, each 1..MAX_TX_ID_BYTES bytes, sorted and unique."""
    if not isinstance(tx_ids, tuple) or not 1 <= len(tx_ids) <= MAX_IDS:
        return False
    if not all(isinstance(t, bytes) and 1 <= len(t) <= MAX_TX_ID_BYTES for t in tx_ids):
        return False
    return all(a < b for a, b in pairwise(tx_ids))


MAX_ROUND = 2**32 - 1


def valid_round(round_no: object) -> bool:
    """A re-checkpoint round (docs/LEADERLESS.md "Kept, then stuck"): an int in 0..2^32-1."""
    return type(round_no) is int and 0 <= round_no <= MAX_ROUND


class OrderedState:
    """See the module docstring."""

    __slots__ = (
        "_chain",
        "_client_keys",
        "_close_quorum",
        "_counts",
        "_crypto",
        "_decided",
        "_drop_ambiguous",
        "_dropped",
        "_faults",
        "_max_decided",
        "_members",
        "_min_quorum",
        "_nodes",
        "_open",
        "_quorum_for",
        "_tx_id_of",
        "decisions",
    )

    def __init__(self, *, nodes: tuple[NodeId, ...], faults: int, crypto: Crypto,
                 client_keys: Verifier, quorum_for: Callable[[str], int],
                 tx_id_of: Callable[[Transaction], TxId],
                 snapshot: OrderingSnapshot | None = None, max_decided: int = 4096,
                 close_quorum: int | None = None, drop_ambiguous: bool = False,
                 min_quorum: int | None = None) -> None:
        """`close_quorum`: closes needed with n-f votes (f+1; fewer only as the deliberate
        bug `ordered_one_close`). `drop_ambiguous`: the deliberate bug
        `ordered_drop_ambiguous` (drop what the uncounted members could have committed).
        `min_quorum`: the smallest policy quorum, Q (default `quorum_for("")`): the bar for a
        transaction no counted vote has evidence of (its policy is unknown)."""
        self._nodes = nodes
        self._members = frozenset(nodes)
        self._faults = faults
        self._crypto = crypto
        self._client_keys = client_keys
        self._quorum_for = quorum_for
        self._tx_id_of = tx_id_of
        self._max_decided = max_decided
        self._close_quorum = faults + 1 if close_quorum is None else close_quorum
        self._drop_ambiguous = drop_ambiguous
        self._min_quorum = quorum_for("") if min_quorum is None else min_quorum
        self._counts: dict[str, int] = {}
        self.decisions = 0
        """Checkpoints decided since this object was built."""
        snap = snapshot if snapshot is not None else OrderingSnapshot()
        self._chain = snap.chain
        self._open: dict[bytes, _Open] = {
            s.checkpoint: _Open(tx_ids=s.tx_ids, votes={v.voter: v for v in s.votes},
                                closers=dict.fromkeys(s.closers), round=s.round)
            for s in snap.open}
        self._decided: dict[bytes, None] = dict.fromkeys(snap.decided)
        self._dropped: dict[TxId, None] = dict.fromkeys(snap.dropped)

    # Queries ---------------------------------------------------------------------------

    def snapshot(self) -> OrderingSnapshot:
        return OrderingSnapshot(
            chain=self._chain,
            open=tuple(OrderedCheckpointState(checkpoint=cid, tx_ids=o.tx_ids,
                                              votes=tuple(o.votes.values()),
                                              closers=tuple(o.closers), round=o.round)
                       for cid, o in self._open.items()),
            decided=tuple(self._decided), dropped=tuple(self._dropped))

    def decided(self, cid: bytes) -> bool:
        return cid in self._decided

    def was_dropped(self, tx_id: TxId) -> bool:
        """Whether a decision dropped `tx_id` (among the last `max_decided` dropped ids)."""
        return tx_id in self._dropped

    def is_open(self, cid: bytes) -> bool:
        return cid in self._open

    def counted(self, cid: bytes, node: NodeId) -> tuple[bool, bool]:
        """(whether `node`'s vote, whether its close) is counted in undecided `cid`."""
        o = self._open.get(cid)
        return (False, False) if o is None else (node in o.votes, node in o.closers)

    def counts(self) -> Mapping[str, int]:
        return self._counts

    # Execution -------------------------------------------------------------------------

    def execute(self, command: bytes, item: object) -> Decision | None:
        """Execute one ordered command (`item`: its decoding, None when undecodable)."""
        self._chain = hashlib.sha256(self._chain + hashlib.sha256(command).digest()).digest()
        if isinstance(item, OrderedVote):
            return self._vote(item)
        if isinstance(item, CloseCheckpoint):
            return self._close(item)
        self._count("ordered_garbage")
        return None

    def _count(self, reason: str) -> None:
        self._counts[reason] = self._counts.get(reason, 0) + 1

    def _checkpoint(self, cid: object, tx_ids: object, who: object,
                    round_no: object) -> _Open | None:
        if who not in self._members:
            self._count("ordered_not_a_member")
            return None
        if not valid_ids(tx_ids) or not isinstance(cid, bytes) or not valid_round(round_no):
            self._count("ordered_bad_id_list")
            return None
        assert isinstance(tx_ids, tuple)
        assert isinstance(round_no, int)
        if cid != checkpoint_id(self._crypto, tx_ids, round_no):
            self._count("ordered_bad_checkpoint_id")
            return None
        if cid in self._decided:
            self._count("ordered_after_decision")  # a late vote: everyone ignores it
            return None
        o = self._open.get(cid)
        if o is None:
            o = self._open[cid] = _Open(tx_ids=tx_ids, votes={}, closers={}, round=round_no)
        return o

    def _vote(self, vote: OrderedVote) -> Decision | None:
        o = self._checkpoint(vote.checkpoint, vote.tx_ids, vote.voter, vote.round)
        if o is None:
            return None
        held = o.votes.get(vote.voter)
        if held is not None:
            self._count("ordered_duplicate" if held == vote else "ordered_second_vote")
            return None
        if not self._crypto.verify(vote.voter, vote, vote.signature) \
                or not self._evidence_valid(vote):
            self._count("ordered_invalid_vote")
            return None
        o.votes[vote.voter] = vote
        return self._maybe_decide(vote.checkpoint, o)

    def _close(self, close: CloseCheckpoint) -> Decision | None:
        o = self._checkpoint(close.checkpoint, close.tx_ids, close.proposer, close.round)
        if o is None:
            return None
        if close.proposer in o.closers:
            self._count("ordered_duplicate_close")
            return None
        if not self._crypto.verify(close.proposer, close, close.signature):
            self._count("ordered_invalid_close")
            return None
        o.closers[close.proposer] = None
        return self._maybe_decide(close.checkpoint, o)

    def _evidence_valid(self, vote: OrderedVote) -> bool:
        """At most one proof per listed id, sorted by id; each a client-signed transaction
        with valid endorsements of it by distinct members (no refusals)."""
        ids = set(vote.tx_ids)
        if not isinstance(vote.evidence, tuple) or len(vote.evidence) > len(vote.tx_ids):
            return False
        last = b""
        for proof in vote.evidence:
            if not isinstance(proof, TransactionProof) or proof.refusals \
                    or not isinstance(proof.tx, Transaction):
                return False
            tx_id = self._tx_id_of(proof.tx)
            if tx_id not in ids or tx_id <= last \
                    or tx_problem(proof.tx, self._client_keys) is not None:
                return False
            last = tx_id
            seen: set[NodeId] = set()
            for e in proof.endorsements:
                if (not isinstance(e, Endorsement) or e.tx_id != tx_id or e.endorser in seen
                        or endorsement_problem(e, self._nodes, self._crypto) is not None):
                    return False
                seen.add(e.endorser)
        return True

    def _maybe_decide(self, cid: bytes, o: _Open) -> Decision | None:
        n, f = len(self._nodes), self._faults
        votes = len(o.votes)
        if not (votes == n or (votes >= n - f and len(o.closers) >= self._close_quorum)):
            return None
        merged: dict[TxId, tuple[Transaction, dict[NodeId, Endorsement]]] = {}
        for vote in o.votes.values():  # in order: the first endorsement per endorser
            for proof in vote.evidence:
                tx_id = self._tx_id_of(proof.tx)
                _tx, by = merged.setdefault(tx_id, (proof.tx, {}))
                for e in proof.endorsements:
                    by.setdefault(e.endorser, e)
        uncounted = n - votes
        kept: list[TransactionProof] = []
        dropped: list[TxId] = []
        for tx_id in o.tx_ids:
            got = merged.get(tx_id)
            quorum = self._min_quorum if got is None else self._quorum_for(got[0].policy)
            seen = 0 if got is None else len(got[1])
            if got is not None and seen >= quorum:
                kept.append(TransactionProof(tx=got[0], endorsements=tuple(
                    got[1][node] for node in sorted(got[1]))))
            elif seen + uncounted < quorum or self._drop_ambiguous:
                dropped.append(tx_id)
            else:
                # Ambiguous: the uncounted members' endorsements would complete a quorum,
                # and one of them may have committed T (a killed node is silent for as long
                # as it is down: no close timer covers it). Wait for more votes.
                self._count("ordered_ambiguous")
                return None
        del self._open[cid]
        self._decided[cid] = None
        while len(self._decided) > self._max_decided:
            del self._decided[next(iter(self._decided))]
        for tx_id in dropped:
            self._dropped[tx_id] = None
        while len(self._dropped) > self._max_decided:
            del self._dropped[next(iter(self._dropped))]
        self.decisions += 1
        return Decision(checkpoint=cid, tx_ids=o.tx_ids, kept=tuple(kept),
                        dropped=tuple(dropped))
