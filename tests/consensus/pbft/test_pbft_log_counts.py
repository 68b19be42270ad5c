"""`MessageLog`'s per-digest counts give the same `prepared` / `committed_local` verdicts as
counting the stored votes (the scan they replaced), whatever the arrival order, digests,
verification and duplicates; and `durable_ready` builds what `dataclasses.replace` does."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.consensus.core import Ready, Send
from phalanx.consensus.pbft.log import MessageLog
from phalanx.consensus.pbft.messages import Commit, Prepare, PrePrepare
from phalanx.consensus.types import HardState, NodeId
from phalanx.jepsen.sim.protocols import durable_ready

REPLICAS = [NodeId(f"n{i}") for i in range(1, 8)]
DIGESTS = [b"a" * 32, b"b" * 32]

_vote = st.tuples(st.sampled_from(("prepare", "commit", "pre_prepare")),
                  st.sampled_from(REPLICAS), st.sampled_from(DIGESTS), st.booleans())


def _scan_prepared(log: MessageLog, quorum: int, verified_only: bool) -> bool:
    slot = log.peek(0, 1)
    if slot is None or slot.pre_prepare is None or not slot.pre_prepare_counted:
        return False
    return len(log.matching_prepares(0, 1, verified_only=verified_only)) >= quorum - 1


@settings(max_examples=80, deadline=None)
@given(st.lists(_vote, max_size=30), st.integers(2, 6), st.integers(2, 6))
def test_counts_agree_with_a_scan_of_the_votes(
        votes: list[tuple[str, NodeId, bytes, bool]], quorum: int, commit_quorum: int) -> None:
    log = MessageLog(low=0, window=8)
    for kind, replica, digest, flag in votes:
        if kind == "prepare":
            log.add_prepare(Prepare(view=0, seq=1, digest=digest, replica=replica),
                            verified=flag)
        elif kind == "commit":
            log.add_commit(Commit(view=0, seq=1, digest=digest, replica=replica))
        else:
            log.add_pre_prepare(PrePrepare(view=0, seq=1, digest=digest, replica=replica,
                                           batch=()), counted=flag)
        for verified_only in (False, True):
            assert log.prepared(0, 1, quorum, verified_only=verified_only) == \
                _scan_prepared(log, quorum, verified_only)
        slot = log.peek(0, 1)
        assert slot is not None
        scan_committed = _scan_prepared(log, quorum, True) and slot.pre_prepare is not None \
            and sum(c.digest == slot.pre_prepare.digest
                    for c in slot.commits.values()) >= commit_quorum
        assert log.committed_local(0, 1, quorum, commit_quorum) == scan_committed


def test_durable_ready_is_replace() -> None:
    send = Send(to=NodeId("n2"), message=Commit(view=0, seq=1, digest=b"x", replica="n1"))
    ready = Ready(number=3, messages=(send,), early_messages=(send,), core_state=object(),
                  aborted=())
    hard = HardState(term=2, commit=1)
    got = durable_ready(ready, hard)
    assert got == dataclasses.replace(ready, core_state=None, hard_state=hard, must_sync=True)
    assert type(got) is Ready
