"""Pure quorum math: how many replicas make a decision, and what a set of acks decides.

Owns: the quorum sizes of every protocol (crash majority, Byzantine 2f+1 of 3f+1, the
leaderless endorsement quorum ceil((n+f+1)/2)), commit-index and vote tallies over a
configuration, and their composition over joint configurations (both halves must agree).

Rules:
- No dependency on any protocol; functions of their arguments only.
- Conventions are written once here so that joint quorums compose (after etcd's quorum/):
  an *empty* voter set wins every vote and commits every index, so a joint configuration
  whose outgoing half is empty behaves exactly like its incoming half.
- Iteration never depends on set order: voters are tuples and results are computed from
  sorted values.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from phalanx.consensus.types import Configuration, NodeId


def majority(n: int) -> int:
    """Crash-fault quorum: the smallest number of n voters that any two quorums share one of.

    >>> [majority(n) for n in (1, 2, 3, 4, 5)]
    [1, 2, 2, 3, 3]
    """
    _check_n(n)
    return n // 2 + 1


def max_byzantine_faults(n: int) -> int:
    """The largest f with n >= 3f + 1."""
    _check_n(n)
    return (n - 1) // 3


def byzantine_quorum(n: int) -> int:
    """PBFT quorum: 2f+1 for n = 3f+1. In general n - f with f = floor((n-1)/3), so that any
    two quorums intersect in at least f+1 replicas, one of them honest."""
    return n - max_byzantine_faults(n)


def reply_quorum(f: int) -> int:
    """Matching replies a PBFT client needs: f+1, so at least one comes from an honest replica."""
    if f < 0:
        raise ValueError(f"f must be >= 0, got {f}")
    return f + 1


def leaderless_quorum(n: int, f: int) -> int:
    """The endorsement quorum of the leaderless (PnyxDB-style) core: ceil((n + f + 1) / 2).

    Any two such quorums intersect in at least f+1 nodes, so in at least one honest node, which
    never endorses two conflicting transactions.
    """
    _check_n(n)
    if not f >= 0 or 3 * f >= n:
        raise ValueError(f"need 0 <= f and n > 3f, got n={n} f={f}")
    return -(-(n + f + 1) // 2)


def _check_n(n: int) -> None:
    if n < 1:
        raise ValueError(f"a cluster has at least one replica, got n={n}")


class VoteResult(enum.Enum):
    PENDING = "pending"
    WON = "won"
    LOST = "lost"


@dataclass(frozen=True, slots=True)
class MajorityConfig:
    """A set of voters deciding by simple majority."""

    voters: tuple[NodeId, ...]

    def committed_index(self, acked: Mapping[NodeId, int]) -> int:
        """The largest index acknowledged by a majority of voters (missing voters count as 0).

        An empty config commits everything (returns a sentinel larger than any index), which
        makes it neutral inside a joint configuration.
        """
        voters = self.voters
        if not voters:
            return _INFINITE_INDEX
        get = acked.get
        indexes = []
        for v in voters:  # (a loop, not a list comprehension: no extra frame on this hot path)
            indexes.append(get(v, 0))
        indexes.sort(reverse=True)
        return indexes[len(indexes) // 2]  # the majority(n)-th largest: majority(n) = n//2 + 1

    def vote_result(self, votes: Mapping[NodeId, bool]) -> VoteResult:
        """WON once a majority granted, LOST once a majority is out of reach, else PENDING."""
        if not self.voters:
            return VoteResult.WON
        granted = sum(1 for v in self.voters if votes.get(v) is True)
        rejected = sum(1 for v in self.voters if votes.get(v) is False)
        q = majority(len(self.voters))
        if granted >= q:
            return VoteResult.WON
        if len(self.voters) - rejected < q:
            return VoteResult.LOST
        return VoteResult.PENDING

    def has_quorum(self, nodes: Iterable[NodeId]) -> bool:
        """Whether `nodes` contains a majority of the voters."""
        present = set(nodes)
        if not self.voters:
            return True
        return sum(1 for v in self.voters if v in present) >= majority(len(self.voters))


_INFINITE_INDEX = 1 << 62
INFINITE_INDEX = _INFINITE_INDEX
"""What `MajorityConfig.committed_index` returns for an empty configuration."""


@dataclass(frozen=True, slots=True)
class JointConfig:
    """Two majority configurations that must both agree (Raft joint consensus, §6)."""

    incoming: MajorityConfig
    outgoing: MajorityConfig

    @classmethod
    def of(cls, config: Configuration) -> JointConfig:
        return cls(MajorityConfig(config.voters), MajorityConfig(config.voters_outgoing))

    def committed_index(self, acked: Mapping[NodeId, int]) -> int:
        """The largest index committed in both halves. 0 if there are no voters at all."""
        if not self.outgoing.voters:  # not joint: the outgoing half is neutral
            idx = self.incoming.committed_index(acked)
        else:
            idx = min(self.incoming.committed_index(acked), self.outgoing.committed_index(acked))
        return 0 if idx == _INFINITE_INDEX else idx

    def vote_result(self, votes: Mapping[NodeId, bool]) -> VoteResult:
        a = self.incoming.vote_result(votes)
        b = self.outgoing.vote_result(votes)
        if a is b:
            return a
        if VoteResult.LOST in (a, b):
            return VoteResult.LOST
        return VoteResult.PENDING

    def has_quorum(self, nodes: Iterable[NodeId]) -> bool:
        present = tuple(nodes)
        return self.incoming.has_quorum(present) and self.outgoing.has_quorum(present)

    def voters(self) -> tuple[NodeId, ...]:
        return tuple(sorted(set(self.incoming.voters) | set(self.outgoing.voters)))
