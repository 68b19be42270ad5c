"""The PBFT message log: pre-prepares, prepares and commits per (view, seq), the prepared and
committed-local predicates, prepared certificates, and the water marks.

Owns: `MessageLog` (pure bookkeeping, no crypto, no I/O). The core validates and
authenticates a message before it reaches the log; the log decides what it proves.
Must not import: the core, crypto, or anything outside `phalanx.consensus`.

Invariants:
- At most one pre-prepare per (view, seq); a replica's first prepare/commit per (view, seq)
  wins (a second, different one is equivocation and is reported, not stored).
- A prepare may be stored with its signature unchecked (the core skips the check for one
  that can no longer be needed); a prepared certificate (`record_prepared`) and the
  `verified_only` predicates count only prepares marked verified.
- Only slots with low < seq <= high are kept (`gc` drops the rest); `low` is the last
  stable checkpoint (Castro-Liskov §4.3).
- Own votes are stored only once they are durable (the core adds them on `Persisted`),
  except pre-prepares and prepares sent early, stored at once (see `safety.py`).
- `prepared_certs` keeps, per seq above low, the certificate of the highest view.
- A slot's per-digest counts (`Slot.prepares_by_digest`, `verified_by_digest`,
  `commits_by_digest`) always equal what its vote dicts hold: `prepared` and
  `committed_local` read them instead of scanning the votes (O(1) per vote, not O(n) with a
  sort: at n = 180 the scans were most of a simulated replica's CPU).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from phalanx.consensus.pbft.messages import Commit, Prepare, PreparedProof, PrePrepare
from phalanx.consensus.types import NodeId


class AddResult(enum.Enum):
    ADDED = "added"
    DUPLICATE = "duplicate"
    EQUIVOCATION = "equivocation"


@dataclass(slots=True)
class Slot:
    """Everything known about one (view, seq)."""

    pre_prepare: PrePrepare | None = None
    pre_prepare_counted: bool = False
    prepares: dict[NodeId, Prepare] = field(default_factory=dict)
    verified: set[NodeId] = field(default_factory=set)  # whose prepare's signature checked
    commits: dict[NodeId, Commit] = field(default_factory=dict)
    prepares_by_digest: dict[bytes, int] = field(default_factory=dict)
    verified_by_digest: dict[bytes, int] = field(default_factory=dict)
    """How many stored prepares (`verified`: with checked signatures) name each digest."""
    commits_by_digest: dict[bytes, int] = field(default_factory=dict)
    prepare_sent: bool = False
    commit_sent: bool = False
    committed: bool = False
    certified: bool = False  # prepared with verified prepares (the commit may follow)


class MessageLog:
    """Per-(view, seq) slots between the water marks."""

    __slots__ = ("_slots", "high", "low", "prepared_certs")

    def __init__(self, *, low: int, window: int) -> None:
        # Invariant: low < seq <= high for every stored slot.
        self.low = low
        self.high = low + window
        self._slots: dict[tuple[int, int], Slot] = {}
        self.prepared_certs: dict[int, PreparedProof] = {}

    def in_window(self, seq: int) -> bool:
        return self.low < seq <= self.high

    def slot(self, view: int, seq: int) -> Slot:
        key = (view, seq)
        found = self._slots.get(key)
        if found is None:
            found = self._slots[key] = Slot()
        return found

    def peek(self, view: int, seq: int) -> Slot | None:
        return self._slots.get((view, seq))

    def __len__(self) -> int:
        return len(self._slots)

    def add_pre_prepare(self, pp: PrePrepare, *, counted: bool) -> AddResult:
        slot = self.slot(pp.view, pp.seq)
        if slot.pre_prepare is not None:
            return AddResult.DUPLICATE if slot.pre_prepare == pp else AddResult.EQUIVOCATION
        slot.pre_prepare = pp
        slot.pre_prepare_counted = counted
        return AddResult.ADDED

    def stamp_bounds(self, view: int, seq: int) -> tuple[int, int]:
        """(the highest timestamp of a pre-prepare of `view` stored below `seq`, the lowest
        stored above it): a fresh stamp must lie between (`stamp.check_stamp`)."""
        lo, hi = 0, 2**63
        slots = self._slots
        for other in range(self.low + 1, self.high + 1):
            slot = slots.get((view, other))
            if slot is None or slot.pre_prepare is None or other == seq:
                continue
            ts = slot.pre_prepare.timestamp
            if other < seq:
                lo = max(lo, ts)
            elif ts:
                hi = min(hi, ts)
        return lo, hi

    def add_prepare(self, p: Prepare, *, verified: bool = False) -> AddResult:
        """Store `p` (`verified`: its signature is known good, e.g. our own)."""
        slot = self.slot(p.view, p.seq)
        votes = slot.prepares
        old = votes.get(p.replica)
        if old is not None:
            return AddResult.DUPLICATE if old.digest == p.digest else AddResult.EQUIVOCATION
        votes[p.replica] = p
        counts = slot.prepares_by_digest
        counts[p.digest] = counts.get(p.digest, 0) + 1
        if verified:
            slot.verified.add(p.replica)
            counts = slot.verified_by_digest
            counts[p.digest] = counts.get(p.digest, 0) + 1
        return AddResult.ADDED

    def add_commit(self, c: Commit) -> AddResult:
        slot = self.slot(c.view, c.seq)
        votes = slot.commits
        old = votes.get(c.replica)
        if old is not None:
            return AddResult.DUPLICATE if old.digest == c.digest else AddResult.EQUIVOCATION
        votes[c.replica] = c
        counts = slot.commits_by_digest
        counts[c.digest] = counts.get(c.digest, 0) + 1
        return AddResult.ADDED

    def matching_prepares(
        self, view: int, seq: int, *, verified_only: bool = False
    ) -> tuple[Prepare, ...]:
        """Prepares matching the slot's pre-prepare, from replicas other than its primary,
        in replica order (`verified_only`: only those whose signatures were checked)."""
        slot = self._slots.get((view, seq))
        if slot is None or slot.pre_prepare is None:
            return ()
        pp = slot.pre_prepare
        votes = slot.prepares
        return tuple(
            votes[r]
            for r in sorted(votes)
            if r != pp.replica and votes[r].digest == pp.digest
            and (not verified_only or r in slot.verified)
        )

    def prepared(
        self, view: int, seq: int, quorum: int, *, verified_only: bool = False
    ) -> bool:
        """prepared(m, v, n, i): a counted pre-prepare and quorum-1 matching prepares from
        distinct backups (Castro-Liskov §4.2); without `verified_only`, counting prepares
        whose signatures are still unchecked (whether checking them is worth it yet)."""
        slot = self._slots.get((view, seq))
        if slot is None or slot.pre_prepare is None or not slot.pre_prepare_counted:
            return False
        return _matching(slot, slot.pre_prepare, verified_only=verified_only) >= quorum - 1

    def committed_local(self, view: int, seq: int, quorum: int, commit_quorum: int) -> bool:
        """committed-local(m, v, n, i): prepared (with verified prepares) and
        `commit_quorum` matching commits."""
        if not self.prepared(view, seq, quorum, verified_only=True):
            return False
        slot = self._slots[(view, seq)]
        assert slot.pre_prepare is not None  # implied by prepared()
        return slot.commits_by_digest.get(slot.pre_prepare.digest, 0) >= commit_quorum

    def record_prepared(self, view: int, seq: int, quorum: int) -> PreparedProof:
        """Build and keep the prepared certificate of (view, seq) (must be prepared with
        verified prepares: only those go into it)."""
        slot = self._slots[(view, seq)]
        assert slot.pre_prepare is not None
        proof = PreparedProof(
            pre_prepare=slot.pre_prepare,
            prepares=self.matching_prepares(view, seq, verified_only=True)[: quorum - 1],
        )
        old = self.prepared_certs.get(seq)
        if old is None or old.pre_prepare.view <= view:
            self.prepared_certs[seq] = proof
        return proof

    def certificates(self) -> tuple[PreparedProof, ...]:
        """The prepared certificates above low, by seq (the P set of a ViewChange)."""
        return tuple(self.prepared_certs[s] for s in sorted(self.prepared_certs))

    def drop_views_below(self, view: int) -> None:
        """Forget the slots of views before `view` (after a view change)."""
        for key in [k for k in self._slots if k[0] < view]:
            del self._slots[key]

    def gc(self, low: int, window: int) -> None:
        """Move the low water mark to a new stable checkpoint and drop what it covers."""
        if low <= self.low:
            return
        self.low = low
        self.high = low + window
        for key in [k for k in self._slots if k[1] <= low]:
            del self._slots[key]
        for seq in [s for s in self.prepared_certs if s <= low]:
            del self.prepared_certs[seq]


def _matching(slot: Slot, pp: PrePrepare, *, verified_only: bool) -> int:
    """len(`MessageLog.matching_prepares`) of `slot`, from its counts: the prepares
    naming `pp`'s digest, less the primary's own if it sent one (a prepare from the
    primary never counts)."""
    digest = pp.digest
    if verified_only:
        found = slot.verified_by_digest.get(digest, 0)
    else:
        found = slot.prepares_by_digest.get(digest, 0)
    own = slot.prepares.get(pp.replica)
    if own is not None and own.digest == digest and (
            not verified_only or pp.replica in slot.verified):
        found -= 1
    return found


class _HeldVotes:
    """Votes kept for later instead of dropped, bounded per sender (`per_sender`), so a
    Byzantine replica fills only its own share; `add` returns False when the sender's share
    is full (the core drops and counts the message). Replay order is arrival order."""

    __slots__ = ("_count", "_items", "_per_sender")

    def __init__(self, *, per_sender: int) -> None:
        self._per_sender = per_sender
        self._items: list[tuple[NodeId, PrePrepare | Prepare | Commit]] = []
        self._count: dict[NodeId, int] = {}

    def __len__(self) -> int:
        return len(self._items)

    def add(self, src: NodeId, msg: PrePrepare | Prepare | Commit) -> bool:
        held = self._count.get(src, 0)
        if held >= self._per_sender:
            return False
        self._count[src] = held + 1
        self._items.append((src, msg))
        return True

    def _take(self, due: Callable[[PrePrepare | Prepare | Commit], bool],
              keep: Callable[[PrePrepare | Prepare | Commit], bool]
              ) -> list[PrePrepare | Prepare | Commit]:
        """The held votes `due` now, in arrival order; those to `keep` stay, the rest go."""
        out = [m for _, m in self._items if due(m)]
        self._items = [(s, m) for s, m in self._items if keep(m)]
        self._count = {}
        for s, _ in self._items:
            self._count[s] = self._count.get(s, 0) + 1
        return out


class FutureVotes(_HeldVotes):
    """Votes of views this replica has not entered yet, replayed when it enters their view
    (bounded per sender, see `_HeldVotes`)."""

    __slots__ = ()

    def take(self, view: int) -> list[PrePrepare | Prepare | Commit]:
        """The votes of `view`; those of later views stay, those of earlier ones go."""
        return self._take(lambda m: m.view == view, lambda m: m.view > view)


class AheadVotes(_HeldVotes):
    """Votes of the current view for seqs up to one window above the high water mark, kept
    until the water marks move (`take`) instead of dropped (bounded per sender, see
    `_HeldVotes`).

    A backup learns that a checkpoint is stable when 2f+1 checkpoint votes reached it, the
    primary when they reached the primary: over a WAN the primary may move its window and
    pre-prepare above the backup's high water mark a few round trips before the backup
    moves its own. Dropped, such a pre-prepare is never sent again: its slot stalls until a
    view change re-proposes it, and where every correct replica is needed for a quorum (f
    of them crashed) the whole cluster stalls with it.
    """

    __slots__ = ()

    def take(self, view: int, low: int, high: int) -> list[PrePrepare | Prepare | Commit]:
        """The votes of `view` now within (low, high]; those of `view` still above `high`
        stay; the others (older views, seqs at or below `low`) go."""
        return self._take(lambda m: m.view == view and low < m.seq <= high,
                          lambda m: m.view == view and m.seq > high)
