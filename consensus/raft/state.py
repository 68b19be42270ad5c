"""The state every Raft sub-machine shares: who we are, the term, the vote, the role, the
leader we follow, and the messages a step produced.

Owns: `Role` and `RaftState` (a plain slotted object; the core builds one and hands it to
each sub-machine, see core.py). The sub-machines own everything else.

Invariants:
- Only the core's `_become_*` transitions and `Election` (candidacy, granting a vote)
  change `role`, `term` and `vote`; the term never decreases.
- `early` holds only a leader's AppendEntries and heartbeats (`send`, §10.2.1): messages
  that depend on nothing unpersisted. Everything else waits in `msgs` until its Ready is
  persisted. The core hands both lists over in the step's Ready and starts fresh ones.
- `dropped` counts peer input we refused, by reason; it only grows.
"""

from __future__ import annotations

import enum

from phalanx.consensus._fastpath import new_send
from phalanx.consensus.core import Send
from phalanx.consensus.raft.config import RaftConfig
from phalanx.consensus.raft.messages import AppendEntries, Heartbeat
from phalanx.consensus.types import Message, NodeId


class Role(enum.Enum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre_candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


_EARLY_KINDS = (AppendEntries, Heartbeat)
"""What a leader may send before its Ready is persisted (see `RaftState.send`)."""
_LEADER = Role.LEADER


class RaftState:
    """Term, vote, role and leader of one node, its drop counters and a step's messages."""

    __slots__ = ("cfg", "dropped", "early", "id", "lead_transferee", "leader", "msgs",
                 "now_ms", "role", "term", "vote")

    def __init__(self, cfg: RaftConfig, *, term: int, vote: NodeId | None) -> None:
        self.cfg = cfg
        self.id: NodeId = cfg.node_id
        self.term = term
        self.vote = vote
        self.role = Role.FOLLOWER
        self.leader: NodeId | None = None
        self.lead_transferee: NodeId | None = None
        """Leader: the target of a leadership transfer in progress (§3.10)."""
        self.dropped: dict[str, int] = {}
        self.msgs: list[Send] = []
        self.early: list[Send] = []
        self.now_ms = 0
        """The newest clock reading (`Tick.now_ms`; 0: none yet), for block stamps."""

    def send(self, to: NodeId, message: Message) -> None:
        # Ref: §10.2.1: a leader's AppendEntries and heartbeats depend on nothing that is not
        # durable: its term was durable before its RequestVotes left (so before it could
        # win), and it counts its own entries only after `Persisted`. They go out early, in
        # parallel with the leader's own disk write. Everything else (votes, responses,
        # anything a follower or candidate says) waits for step 1 of its Ready.
        if self.role is _LEADER and isinstance(message, _EARLY_KINDS):
            self.early.append(new_send(to, message))
        else:
            self.msgs.append(new_send(to, message))

    def drop(self, reason: str) -> None:
        """Count refused peer input."""
        self.dropped[reason] = self.dropped.get(reason, 0) + 1
