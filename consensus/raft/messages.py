"""Raft's wire messages (Ongaro, "Consensus: Bridging Theory and Practice", 2014).

Owns: the message dataclasses the Raft core exchanges, their one-line trace form, and the
stable codec ids in `RAFT_MESSAGES`.

Rules:
- Pure data: imports only `phalanx.consensus.types` (and `_fastpath`). Every message is
  `raw_init` (a cheaper ``__init__``, the same dataclass). No validation that depends on node state
  (that is the core's job, and a malformed message is dropped and counted, never raised on).
- Field types are limited to int, str, bytes, bool, None, tuples, and frozen dataclasses from
  `consensus/types.py`, so `phalanx.net.codec` can encode every message.
- Type ids in `RAFT_MESSAGES` are stable forever (range 100-199): never renumber, only add.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias

from phalanx.consensus._fastpath import maker, raw_init
from phalanx.consensus.types import Configuration, Entry, Message, NodeId


@raw_init
@dataclass(frozen=True, slots=True, kw_only=True)
class RequestVote(Message):
    """Invoked by candidates to gather votes (§3.4, Figure 3.1); a pre-vote (§9.6) when
    `pre_vote` is set: `term` is then the term the sender *would* campaign in, and neither side
    changes its term or vote.

    `leadership_transfer` marks a campaign started by `TimeoutNow` (§3.10): voters answer it
    even while they believe a leader is alive (the check-quorum lease, §4.2.3).
    """

    term: int
    candidate_id: NodeId
    last_log_index: int
    last_log_term: int
    pre_vote: bool = False
    leadership_transfer: bool = False

    def __str__(self) -> str:
        kind = "PreVote" if self.pre_vote else "RequestVote"
        extra = " transfer" if self.leadership_transfer else ""
        return f"{kind} term={self.term} last={self.last_log_index}@{self.last_log_term}{extra}"


@raw_init
@dataclass(frozen=True, slots=True, kw_only=True)
class RequestVoteResponse(Message):
    """A voter's answer (§3.4). For a granted pre-vote, `term` echoes the request's term."""

    term: int
    vote_granted: bool
    pre_vote: bool = False

    def __str__(self) -> str:
        kind = "PreVoteResponse" if self.pre_vote else "RequestVoteResponse"
        return f"{kind} term={self.term} granted={self.vote_granted}"


@raw_init
@dataclass(frozen=True, slots=True, kw_only=True)
class AppendEntries(Message):
    """Invoked by the leader to replicate log entries (§3.5, Figure 3.1).

    `entries` hold indexes prev_log_index+1, prev_log_index+2, ... in order.
    """

    term: int
    leader_id: NodeId
    prev_log_index: int
    prev_log_term: int
    entries: tuple[Entry, ...]
    leader_commit: int

    def __str__(self) -> str:
        ents = " ".join(f"{e.index}@{e.term}" for e in self.entries)
        return (
            f"AppendEntries term={self.term} prev={self.prev_log_index}@{self.prev_log_term}"
            f" commit={self.leader_commit} entries=[{ents}]"
        )


@raw_init
@dataclass(frozen=True, slots=True, kw_only=True)
class AppendEntriesResponse(Message):
    """A follower's answer to `AppendEntries` (§3.5).

    On success, `match_index` is the last index this message made identical to the leader's
    log (prev_log_index + len(entries)), *not* the follower's last index: a stale, reordered
    message must never claim more than it carried.

    On failure, `reject_index` is the rejected prev_log_index and the hints implement the
    fast backtracking of §5.3 (the "conflict term" optimisation): `conflict_term` is the term
    of the follower's entry at reject_index (0 if the follower's log is too short) and
    `conflict_index` the first index the follower holds for that term (or its last index + 1).
    """

    term: int
    success: bool
    match_index: int = 0
    reject_index: int = 0
    conflict_index: int = 0
    conflict_term: int = 0

    def __str__(self) -> str:
        if self.success:
            return f"AppendEntriesResponse term={self.term} match={self.match_index}"
        return (
            f"AppendEntriesResponse term={self.term} reject={self.reject_index}"
            f" hint={self.conflict_index}@{self.conflict_term}"
        )


@raw_init
@dataclass(frozen=True, slots=True, kw_only=True)
class Heartbeat(Message):
    """The leader's empty AppendEntries (§3.4), carrying the ReadIndex round context (§6.4).

    `leader_commit` is min(follower's match, commit) so a follower never commits an index it
    has not matched. `context` is 0 or the id of a ReadIndex round the leader confirms.
    """

    term: int
    leader_id: NodeId
    leader_commit: int
    context: int = 0

    def __str__(self) -> str:
        ctx = f" ctx={self.context}" if self.context else ""
        return f"Heartbeat term={self.term} commit={self.leader_commit}{ctx}"


@raw_init
@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatResponse(Message):
    """A follower's acknowledgement of a heartbeat, echoing its ReadIndex `context`.

    `lost_from` is 0, or the follower's last index + 1 when the heartbeat named a commit
    index beyond its log: the heartbeat's commit is min(match, commit), so the follower lost
    entries it had acknowledged (a lost or repaired disk). The leader lowers its `match` for
    the follower and probes from there; without it the leader would treat every rejection
    below the old `match` as stale and never send the missing entries."""

    term: int
    context: int = 0
    lost_from: int = 0

    def __str__(self) -> str:
        ctx = f" ctx={self.context}" if self.context else ""
        lost = f" lost_from={self.lost_from}" if self.lost_from else ""
        return f"HeartbeatResponse term={self.term}{ctx}{lost}"


@raw_init
@dataclass(frozen=True, slots=True, kw_only=True)
class InstallSnapshot(Message):
    """Invoked by the leader to send chunks of a snapshot to a lagging follower (§5.3,
    Figure 5.3). Chunks are sent in order, one at a time; `offset` is the chunk's byte position.
    """

    term: int
    leader_id: NodeId
    last_included_index: int
    last_included_term: int
    config: Configuration
    offset: int
    data: bytes
    done: bool

    def __str__(self) -> str:
        return (
            f"InstallSnapshot term={self.term} last={self.last_included_index}"
            f"@{self.last_included_term} offset={self.offset} len={len(self.data)}"
            f" done={self.done}"
        )


@raw_init
@dataclass(frozen=True, slots=True, kw_only=True)
class InstallSnapshotResponse(Message):
    """A follower's answer to one snapshot chunk.

    `next_offset` is the byte offset the follower expects next (the leader resends from
    there); `done` means the whole snapshot is installed (or already covered), and the follower
    then matches the leader up to `last_included_index`.
    """

    term: int
    last_included_index: int
    next_offset: int
    done: bool

    def __str__(self) -> str:
        return (
            f"InstallSnapshotResponse term={self.term} last={self.last_included_index}"
            f" next={self.next_offset} done={self.done}"
        )


@raw_init
@dataclass(frozen=True, slots=True, kw_only=True)
class TimeoutNow(Message):
    """Sent by a leader transferring leadership (§3.10): start an election immediately."""

    term: int
    leader_id: NodeId

    def __str__(self) -> str:
        return f"TimeoutNow term={self.term}"


@raw_init
@dataclass(frozen=True, slots=True, kw_only=True)
class TermQuery(Message):
    """A node that lost its state (recovery mode) asks a peer for its current term
    (Protocol-Aware Recovery, FAST'18): it forgot the term it had, so it must not trust any
    leader until a majority of the other voters told it the newest term. Answered whatever
    the two terms are; changes nothing at the receiver."""

    term: int

    def __str__(self) -> str:
        return f"TermQuery term={self.term}"


@raw_init
@dataclass(frozen=True, slots=True, kw_only=True)
class TermQueryResponse(Message):
    """The answer to `TermQuery`: the responder's current term."""

    term: int

    def __str__(self) -> str:
        return f"TermQueryResponse term={self.term}"


RaftMessage: TypeAlias = (
    RequestVote
    | RequestVoteResponse
    | AppendEntries
    | AppendEntriesResponse
    | Heartbeat
    | HeartbeatResponse
    | InstallSnapshot
    | InstallSnapshotResponse
    | TimeoutNow
    | TermQuery
    | TermQueryResponse
)

RAFT_MESSAGES: dict[int, type] = {
    100: RequestVote,
    101: RequestVoteResponse,
    102: AppendEntries,
    103: AppendEntriesResponse,
    104: Heartbeat,
    105: HeartbeatResponse,
    106: InstallSnapshot,
    107: InstallSnapshotResponse,
    108: TimeoutNow,
    109: TermQuery,
    110: TermQueryResponse,
}
"""Stable codec type ids for `phalanx.net.wire` (range 100-199)."""


# Positional builders for the messages of the replication hot path (`_fastpath.maker`: the same
# objects as the keyword constructors, cheaper), every field in declaration order.
new_append_entries: Callable[[int, NodeId, int, int, tuple[Entry, ...], int], AppendEntries] = (
    maker(AppendEntries))
"""(term, leader_id, prev_log_index, prev_log_term, entries, leader_commit)"""
new_append_entries_response: Callable[[int, bool, int, int, int, int], AppendEntriesResponse] = (
    maker(AppendEntriesResponse))
"""(term, success, match_index, reject_index, conflict_index, conflict_term)"""
new_heartbeat: Callable[[int, NodeId, int, int], Heartbeat] = maker(Heartbeat)
"""(term, leader_id, leader_commit, context)"""
new_heartbeat_response: Callable[[int, int, int], HeartbeatResponse] = maker(HeartbeatResponse)
"""(term, context)"""
