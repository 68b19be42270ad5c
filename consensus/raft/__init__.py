"""Raft (Ongaro, "Consensus: Bridging Theory and Practice", 2014), sans-IO.

Public API: `RaftCore`, `RaftConfig`, `RaftRestoredState`, `RaftStatus`, the Raft inputs
(`Campaign`, `ProposeConfChange` with `ConfChange`, `TransferLeadership`), the messages and
`RAFT_MESSAGES` (codec ids), and the test-only bug switches `RaftBugs` (`BUG_NAMES`).
"""

from phalanx.consensus.raft.bugs import BUG_NAMES, RaftBugs
from phalanx.consensus.raft.confchange import ConfChange, ConfChangeError
from phalanx.consensus.raft.config import (
    Campaign,
    ProposeBatch,
    ProposeConfChange,
    RaftConfig,
    RaftRestoredState,
    RaftStatus,
    TransferLeadership,
)
from phalanx.consensus.raft.core import RaftCore, RaftInput
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
from phalanx.consensus.raft.state import Role

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
    "RaftBugs",
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
