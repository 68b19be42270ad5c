"""Garbage and hostile peer input: dropped and counted, never raised on (house style 7.1).

Raft assumes crash faults, but a corrupt, stale or forged message must not crash a node or
break its local invariants.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st
from raft_harness import Cluster

from phalanx.consensus.core import Receive
from phalanx.consensus.raft import (
    AppendEntries,
    AppendEntriesResponse,
    Campaign,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    InstallSnapshotResponse,
    RaftConfig,
    RaftCore,
    RequestVote,
    RequestVoteResponse,
    TimeoutNow,
)
from phalanx.consensus.types import (
    ClientRequest,
    Configuration,
    Entry,
    EntryKind,
    Message,
    NodeId,
)

NODES = st.sampled_from([NodeId("n1"), NodeId("n2"), NodeId("n3"), NodeId("x9")])
INTS = st.integers(-3, 12) | st.integers(-(2**40), 2**40)
TERMS = st.integers(-1, 6)


@st.composite
def entries(draw: st.DrawFn) -> tuple[Entry, ...]:
    out = []
    for _ in range(draw(st.integers(0, 4))):
        idx, term = draw(st.integers(1, 12)), draw(st.integers(0, 6))
        if draw(st.booleans()):
            out.append(Entry(index=idx, term=term, kind=EntryKind.NOOP))
        else:
            r = ClientRequest(client_id="c", request_no=0, command=b"x")
            out.append(Entry(index=idx, term=term, kind=EntryKind.COMMAND, requests=(r,)))
    return tuple(out)


CONFIGS = st.sampled_from([Configuration(voters=(NodeId("n1"), NodeId("n2"), NodeId("n3"))),
                           Configuration(voters=(NodeId("x9"),)), Configuration(voters=())])

MESSAGES: st.SearchStrategy[Message] = st.one_of(
    st.builds(RequestVote, term=TERMS, candidate_id=NODES, last_log_index=INTS,
              last_log_term=TERMS, pre_vote=st.booleans(), leadership_transfer=st.booleans()),
    st.builds(RequestVoteResponse, term=TERMS, vote_granted=st.booleans(),
              pre_vote=st.booleans()),
    st.builds(AppendEntries, term=TERMS, leader_id=NODES, prev_log_index=INTS,
              prev_log_term=TERMS, entries=entries(), leader_commit=INTS),
    st.builds(AppendEntriesResponse, term=TERMS, success=st.booleans(), match_index=INTS,
              reject_index=INTS, conflict_index=INTS, conflict_term=TERMS),
    st.builds(Heartbeat, term=TERMS, leader_id=NODES, leader_commit=INTS, context=INTS),
    st.builds(HeartbeatResponse, term=TERMS, context=INTS),
    st.builds(InstallSnapshot, term=TERMS, leader_id=NODES, last_included_index=INTS,
              last_included_term=TERMS, config=CONFIGS, offset=INTS, data=st.binary(max_size=8),
              done=st.booleans()),
    st.builds(InstallSnapshotResponse, term=TERMS, last_included_index=INTS, next_offset=INTS,
              done=st.booleans()),
    st.builds(TimeoutNow, term=TERMS, leader_id=NODES),
    st.just(Message()),
)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(NODES, MESSAGES), min_size=1, max_size=25), st.booleans())
def test_garbage_never_raises_and_keeps_invariants(
        inputs: list[tuple[NodeId, Message]], leader: bool) -> None:
    c = Cluster(pre_vote=False)
    c.verbose = False
    c.add_nodes(3)
    if leader:
        c.step(NodeId("n1"), Campaign())
        c.stabilize()
    target = c.nodes[NodeId("n1")].core
    for src, msg in inputs:
        c.step(NodeId("n1"), Receive(src=src, message=msg))
        target.log.check_invariants()
        assert target.log.offset <= target.applied <= target.commit <= target.log.last_index()
    c.queue.clear()


def test_malformed_messages_are_counted_by_reason() -> None:
    core = RaftCore(RaftConfig(node_id=NodeId("n1"), voters=(NodeId("n1"), NodeId("n2"))),
                    rng=random.Random(1), restored=None)
    n2 = NodeId("n2")
    bad: list[tuple[NodeId, Message]] = [
        (n2, Message()),
        (NodeId("n1"), HeartbeatResponse(term=1)),
        (n2, RequestVote(term=1, candidate_id=NodeId("n3"), last_log_index=0, last_log_term=0)),
        (n2, AppendEntries(term=1, leader_id=n2, prev_log_index=-1, prev_log_term=0,
                           entries=(), leader_commit=0)),
        (n2, AppendEntries(term=1, leader_id=n2, prev_log_index=0, prev_log_term=0,
                           entries=(Entry(index=5, term=1, kind=EntryKind.NOOP),),
                           leader_commit=0)),
        (n2, AppendEntries(term=1, leader_id=n2, prev_log_index=0, prev_log_term=0,
                           entries=(Entry(index=1, term=9, kind=EntryKind.NOOP),),
                           leader_commit=0)),
    ]
    for src, m in bad:
        rd = core.step(Receive(src=src, message=m))
        assert rd.is_empty
    assert core.status().dropped == {"from_self": 1, "malformed": 1, "malformed_entries": 2,
                                     "spoofed_sender": 1, "unknown_message": 1}
    assert core.term == 0
