"""Raft (Ongaro, "Consensus: Bridging Theory and Practice", 2014), sans-IO.

Public API: `RaftCore`, `RaftConfig`, `RaftRestoredState`, `RaftStatus`, the Raft inputs
(`Campaign`, `ProposeConfChange` with `ConfChange`, `TransferLeadership`), the messages and
`RAFT_MESSAGES` (codec ids), and `BUG_NAMES` (test-only switches).
"""

from phalanx.consensus.raft.confchange import ConfChange, ConfChangeError
from phalanx.consensus.raft.config import (
    BUG_NAMES,
    Campaign,
    ProposeBatch,
    ProposeConfChange,
    RaftConfig,
    RaftRestoredState,
    RaftStatus,
    TransferLeadership,
)
from phalanx.consensus.raft.core import RaftCore, RaftInput
from phalanx.consensus.raft.election import Role
from phalanx.consensus.raft.messages import (
    RAFT_MESSAGES,
    AppendEntries,
    AppendEntriesResponse,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    InstallSnapshotResponse,
    RaftMessage,
    RequestVote,
    RequestVoteResponse,
    TermQuery,
    TermQueryResponse,
    TimeoutNow,
)

__all__ = [
    "BUG_NAMES",
    "RAFT_MESSAGES",
    "AppendEntries",
    "AppendEntriesResponse",
    "Campaign",
    "ConfChange",
    "ConfChangeError",
    "Heartbeat",
    "HeartbeatResponse",
    "InstallSnapshot",
    "InstallSnapshotResponse",
    "ProposeBatch",
    "ProposeConfChange",
    "RaftConfig",
    "RaftCore",
    "RaftInput",
    "RaftMessage",
    "RaftRestoredState",
    "RaftStatus",
    "RequestVote",
    "RequestVoteResponse",
    "Role",
    "TermQuery",
    "TermQueryResponse",
    "TimeoutNow",
    "TransferLeadership",
]
