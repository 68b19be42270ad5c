"""The Raft core's sub-machines on their own: each owns its state behind a small interface
(consensus/raft/core.py composes them), so each can be driven without a `RaftCore`."""

from __future__ import annotations

import ast
import random
from pathlib import Path

import pytest

from phalanx.consensus.core import Snapshot
from phalanx.consensus.raft import RaftConfig, RaftRestoredState, Role
from phalanx.consensus.raft.bugs import NO_BUGS
from phalanx.consensus.raft.election import Election
from phalanx.consensus.raft.logstate import LogState
from phalanx.consensus.raft.messages import RequestVote, RequestVoteResponse
from phalanx.consensus.raft.recovery import Recovery
from phalanx.consensus.raft.replication import Replication
from phalanx.consensus.raft.state import RaftState
from phalanx.consensus.types import (
    Configuration,
    Entry,
    EntryKind,
    HardState,
    LocalProtocolError,
    NodeId,
    SnapshotMeta,
)

N1, N2, N3 = NodeId("n1"), NodeId("n2"), NodeId("n3")
CFG = RaftConfig(node_id=N1, voters=(N1, N2, N3))
RAFT = Path(__file__).resolve().parents[3] / "consensus" / "raft"


def noops(start: int, n: int, term: int = 1) -> list[Entry]:
    return [Entry(index=start + k, term=term, kind=EntryKind.NOOP) for k in range(n)]


def test_no_sub_machine_imports_the_core() -> None:
    for name in ("state", "logstate", "replication", "election", "membership", "proposals",
                 "recovery", "bugs"):
        tree = ast.parse((RAFT / f"{name}.py").read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert "phalanx.consensus.raft.core" not in imported, name


def test_logstate_durable_follows_persisted_readys_and_truncation() -> None:
    ls = LogState(CFG, None)
    ls.on_config = lambda: None
    ls.append(noops(1, 3))
    assert [e.index for e in ls.new_entries] == [1, 2, 3]
    ls.pending_durable.append((1, 3))  # what the core records for Ready 1
    ls.truncate_from(3)  # a follower's conflict: the recorded index drops with the log
    assert (ls.truncate, ls.durable, list(ls.pending_durable)) == (3, 0, [(1, 2)])
    ls.persisted(1)
    assert ls.durable == 2
    ls.commit_to(2)
    with pytest.raises(LocalProtocolError):
        ls.truncate_from(2)  # committed: our own misuse


def test_logstate_config_entry_changes_config_and_runs_the_hook() -> None:
    ls = LogState(CFG, None)
    calls: list[Configuration] = []
    ls.on_config = lambda: calls.append(ls.config)
    new = Configuration(voters=(N1, N2))
    ls.append([Entry(index=1, term=1, kind=EntryKind.CONFIG, config=new)])
    assert calls == [new]
    assert ls.joint.incoming.voters == (N1, N2)


def test_logstate_restores_from_a_snapshot_and_keeps_commit_in_bounds() -> None:
    meta = SnapshotMeta(index=5, term=2, config=CFG.bootstrap_config())
    ls = LogState(CFG, RaftRestoredState(hard_state=HardState(term=2, commit=9),
                                         snapshot=Snapshot(meta=meta, data=b"x"),
                                         entries=tuple(noops(4, 3, term=2))))
    assert (ls.log.offset, ls.log.last_index(), ls.applied, ls.commit, ls.durable) == (
        5, 6, 5, 6, 6)


def test_election_grants_one_vote_per_term_without_a_core() -> None:
    st = RaftState(CFG, term=1, vote=None)
    ls = LogState(CFG, None)
    recovery = Recovery(st, ls, recovering=False, become_follower=lambda t, lead: None)
    el = Election(st, ls, Replication(st, ls, NO_BUGS), recovery, rng=random.Random(1),
                  bugs=NO_BUGS, become_follower=lambda t, lead: None,
                  become_leader=lambda: None, broadcast_heartbeat=lambda: None)
    el.handle_request_vote(N2, RequestVote(term=1, candidate_id=N2, last_log_index=0,
                                           last_log_term=0))
    el.handle_request_vote(N3, RequestVote(term=1, candidate_id=N3, last_log_index=0,
                                           last_log_term=0))
    grants = [(s.to, s.message.vote_granted) for s in st.msgs  # type: ignore[attr-defined]
              if isinstance(s.message, RequestVoteResponse)]
    assert grants == [(N2, True), (N3, False)]
    assert (st.vote, st.role) == (N2, Role.FOLLOWER)
