"""Deliberate, test-only Raft bugs, switched on through one injected `RaftBugs` object.

Owns: `RaftBugs` (one bool per bug; `RaftCore(..., bugs=...)`, default none) and
`BUG_NAMES`, the names the simulator's ``--bug`` option accepts (`RaftBugs.from_names`
converts them at that boundary). Each bug is minimal and realistic, so the simulator's
checkers can be shown to fail:

- ``commit_on_minority``: an off-by-one in the commit quorum: the leader commits an index
  acknowledged by floor(n/2) voters instead of a majority.
- ``skip_vote_term_check``: a voter tests "is this RequestVote from a newer term?" with
  ``>=`` instead of ``>``, so a request of its *current* term makes it forget the vote it
  already cast in that term: it can vote for two candidates in one term.
- ``forget_persist_vote``: granting a vote does not put the vote in `Ready.hard_state`, so a
  crash forgets it and the node may vote twice in one term.
- ``truncate_matching_suffix``: a follower truncates its log after prev_log_index on every
  non-empty AppendEntries, even when the entries already match (a stale, reordered message
  then erases acknowledged entries).
- ``ignore_recovering``: a node restored in recovery mode (it lost its disk) votes and
  campaigns at once, as every node did before amnesia was detected, so it can help elect a
  leader that lacks an entry it had acknowledged.
- ``count_learner_acks``: the commit rule sizes its quorum by the voters but takes the
  acknowledgements of every node that receives the log, learners included, so a learner
  and the leader can "commit" an entry the other voters never saw (caught by the
  simulator's ``membership`` fault, which adds learners).

Rules: pure data. Every real deployment runs with `NO_BUGS`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields


@dataclass(frozen=True, slots=True, kw_only=True)
class RaftBugs:
    """Which deliberate bugs a `RaftCore` has (all off by default; see the module)."""

    commit_on_minority: bool = False
    skip_vote_term_check: bool = False
    forget_persist_vote: bool = False
    truncate_matching_suffix: bool = False
    ignore_recovering: bool = False
    count_learner_acks: bool = False

    @classmethod
    def from_names(cls, names: Iterable[str]) -> RaftBugs:
        """The switches named in `names` (the simulator's ``--bug`` names); unknown names
        raise ValueError naming the known ones."""
        chosen = frozenset(names)
        unknown = chosen - BUG_NAMES
        if unknown:
            raise ValueError(f"unknown Raft bug switches: {sorted(unknown)}; "
                             f"known: {sorted(BUG_NAMES)}")
        return cls(**{name: True for name in chosen})

    def names(self) -> frozenset[str]:
        """The names of the bugs switched on (the inverse of `from_names`)."""
        return frozenset(f.name for f in fields(self) if getattr(self, f.name))


BUG_NAMES: frozenset[str] = frozenset(f.name for f in fields(RaftBugs))
"""The names `RaftBugs.from_names` accepts: one per field."""

NO_BUGS = RaftBugs()
