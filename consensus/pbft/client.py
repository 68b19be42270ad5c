"""Client-side reply matching for PBFT (Castro-Liskov §4.1): accept a result once f+1 distinct
replicas report the same one.

Owns: `ReplyCollector`, a pure tally of replies to one request. The reply message format
belongs to the runtime; this module only sees (replica, result) pairs.
Must not import: the core, trio, clocks, random.
Invariants: a replica's first reply counts, a different second one from the same replica is
counted as equivocation, replies from non-members are counted as unknown; nothing raises on
peer input. The decided result never changes once returned.
"""

from __future__ import annotations

from phalanx.consensus.quorum import max_byzantine_faults, reply_quorum
from phalanx.consensus.types import NodeId


class ReplyCollector:
    """Collects replies to one request; `add` returns the result once f+1 match."""

    __slots__ = ("_needed", "_replicas", "_replies", "decided", "dropped")

    def __init__(self, replicas: tuple[NodeId, ...]) -> None:
        if not replicas or len(set(replicas)) != len(replicas):
            raise ValueError(f"replicas must be non-empty and unique: {replicas!r}")
        self._replicas = frozenset(replicas)
        self._needed = reply_quorum(max_byzantine_faults(len(replicas)))
        self._replies: dict[NodeId, bytes] = {}
        self.decided: bytes | None = None
        self.dropped: dict[str, int] = {}

    @property
    def needed(self) -> int:
        return self._needed

    def add(self, replica: NodeId, result: bytes) -> bytes | None:
        """Record `replica`'s reply; return the accepted result (f+1 matching) or None."""
        if replica not in self._replicas:
            self._count("unknown_replica")
        elif replica in self._replies:
            if self._replies[replica] != result:
                self._count("equivocation")
        else:
            self._replies[replica] = result
            if self.decided is None:
                votes = sum(1 for r in self._replies.values() if r == result)
                if votes >= self._needed:
                    self.decided = result
        return self.decided

    def _count(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1
