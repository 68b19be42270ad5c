"""Stateless checks of incoming Raft messages: what a crash-faulty or corrupt peer may send.

Owns: `drop_reason(src, message)`, the reason to drop a message that no honest Raft node
could have sent, independent of the receiver's state (negative indexes, non-contiguous
entries, a sender claiming another node's identity, ...).

Rules: pure, imports only the message and type modules. Never raises on peer input: it
returns a short reason string (counted in `RaftStatus.dropped`) or None.
"""

from __future__ import annotations

from phalanx.consensus.raft.messages import (
    AppendEntries,
    AppendEntriesResponse,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    InstallSnapshotResponse,
    RequestVote,
    RequestVoteResponse,
    TermQuery,
    TermQueryResponse,
    TimeoutNow,
)
from phalanx.consensus.types import Message, NodeId


def drop_reason(src: NodeId, m: Message) -> str | None:
    """Why `m` from `src` is malformed, or None if it is well-formed."""
    match m:
        case AppendEntries():
            if m.leader_id != src:
                return "spoofed_sender"
            if min(m.term, m.prev_log_index, m.prev_log_term, m.leader_commit) < 0:
                return "malformed"
            if m.prev_log_term > m.term:
                return "malformed"
            prev_term = m.prev_log_term
            expect = m.prev_log_index + 1
            for e in m.entries:
                if e.index != expect or e.term < prev_term or e.term > m.term:
                    return "malformed_entries"
                prev_term = e.term
                expect += 1
            return None
        case AppendEntriesResponse():
            if min(m.term, m.match_index, m.reject_index, m.conflict_index,
                   m.conflict_term) < 0:
                return "malformed"
            return None
        case Heartbeat():
            if m.leader_id != src:
                return "spoofed_sender"
            if min(m.term, m.leader_commit, m.context) < 0:
                return "malformed"
            return None
        case HeartbeatResponse():
            return "malformed" if min(m.term, m.context, m.lost_from) < 0 else None
        case RequestVote():
            if m.candidate_id != src:
                return "spoofed_sender"
            if min(m.term, m.last_log_index, m.last_log_term) < 0 or m.last_log_term > m.term:
                return "malformed"
            return None
        case RequestVoteResponse():
            return "malformed" if m.term < 0 else None
        case InstallSnapshot():
            if m.leader_id != src:
                return "spoofed_sender"
            if (min(m.term, m.last_included_term, m.offset) < 0 or m.last_included_index < 1
                    or m.last_included_term > m.term or not m.config.voters):
                return "malformed"
            return None
        case InstallSnapshotResponse():
            if min(m.term, m.last_included_index, m.next_offset) < 0:
                return "malformed"
            return None
        case TimeoutNow():
            if m.leader_id != src:
                return "spoofed_sender"
            return "malformed" if m.term < 0 else None
        case TermQuery() | TermQueryResponse():
            return "malformed" if m.term < 0 else None
        case _:
            return "unknown_message"
