"""Normal-case PBFT: ordering, batching, dedup, silent replicas, Persisted gating."""

from __future__ import annotations

import pytest
from pbft_harness import Cluster, req

from phalanx.consensus.core import Receive, Submit, Tick
from phalanx.consensus.types import EntryKind


@pytest.mark.parametrize("n", [4, 7])
def test_normal_case_commits_in_order_on_all_replicas(n: int) -> None:
    c = Cluster(n, batch_size=2)
    for no in range(6):
        c.submit(c.ids[0], req("a", no))
        c.deliver()
    c.tick(2)
    c.deliver()
    for i in c.honest():
        cmds = [r.command for e in c.entries[i] for r in e.requests]
        assert cmds == [f"a:{no}".encode() for no in range(6)], i
        assert [e.index for e in c.entries[i]] == list(range(1, len(c.entries[i]) + 1))
        assert all(e.kind is EntryKind.COMMAND for e in c.entries[i])
    c.assert_agreement()


def test_backup_forwards_to_primary_and_requests_are_deduplicated() -> None:
    c = Cluster(4, batch_size=1)
    c.submit_all(req("a", 1))  # the client sends to every replica; backups forward
    c.deliver()
    c.tick(3)
    c.deliver()
    for i in c.honest():
        assert [r.command for e in c.entries[i] for r in e.requests] == [b"a:1"]


def test_a_retry_after_execution_is_ordered_once_more_older_ones_never() -> None:
    # The client retries when it lacks f+1 replies (crashed or state-transferred replicas
    # never answered): the primary orders the latest request once more, so every replica
    # answers it from its session table (the replica layer never runs a duplicate again).
    c = Cluster(4, batch_size=1)
    c.submit_all(req("a", 1))
    c.deliver()
    c.submit_all(req("a", 1))
    c.submit_all(req("a", 1))  # while the first retry is in progress: not again
    c.submit_all(req("a", 0))  # older than the client's latest: nothing waits for it
    c.deliver()
    c.tick(3)
    c.deliver()
    for i in c.honest():
        assert [r.command for e in c.entries[i] for r in e.requests] == [b"a:1", b"a:1"]


@pytest.mark.parametrize("n", [4, 7])
def test_f_silent_replicas_do_not_block(n: int) -> None:
    c = Cluster(n, batch_size=1)
    f = (n - 1) // 3
    silent = c.ids[-f:]
    for s in silent:
        c.crash(s)
    for no in range(3):
        c.submit(c.ids[0], req("a", no))
    c.deliver()
    for i in c.honest():
        if i not in silent:
            assert len(c.entries[i]) == 3


def test_f_plus_one_silent_replicas_block_progress() -> None:
    c = Cluster(4, batch_size=1)
    c.crash(c.ids[2])
    c.crash(c.ids[3])
    c.submit(c.ids[0], req("a", 0))
    c.deliver()
    assert c.entries[c.ids[0]] == []
    assert c.entries[c.ids[1]] == []


def test_own_votes_do_not_count_before_persisted() -> None:
    c = Cluster(4, batch_size=1)
    primary = c.cores[c.ids[0]]
    ready = primary.step(Submit(request=req("a", 0)))
    assert ready.number == 1
    assert ready.core_state is not None
    assert ready.must_sync
    pp = ready.messages[0].message
    # Prepares from two backups arrive before the primary's pre-prepare is durable.
    for b in c.ids[1:3]:
        prep = c.cores[b].step(Receive(src=c.ids[0], message=pp))
        for send in prep.messages:
            if send.to == c.ids[0]:
                out = primary.step(Receive(src=b, message=send.message))
                assert not any(type(s.message).__name__ == "Commit" for s in out.messages)
    # Only Persisted makes the pre-prepare count: then the primary is prepared and commits.
    from phalanx.consensus.core import Persisted

    out = primary.step(Persisted(number=1))
    assert any(type(s.message).__name__ == "Commit" for s in out.messages)


def test_batch_flushes_on_tick_while_a_batch_is_in_flight() -> None:
    c = Cluster(4, batch_size=10, batch_ticks=2, max_inflight_batches=1)
    c.submit(c.ids[0], req("a", 0))  # nothing in flight: proposed at once
    c.submit(c.ids[0], req("a", 1))  # batch 1 in flight: waits for it or the batch timer
    pre_prepares = [m for _, _, m in c.net if type(m).__name__ == "PrePrepare"]
    assert {m.seq for m in pre_prepares} == {1}  # type: ignore[attr-defined]
    c.step(c.ids[0], Tick())
    assert {m.seq for _, _, m in c.net if type(m).__name__ == "PrePrepare"} == {1}  # type: ignore[attr-defined]
    c.step(c.ids[0], Tick())
    assert {m.seq for _, _, m in c.net if type(m).__name__ == "PrePrepare"} == {1, 2}  # type: ignore[attr-defined]
    c.deliver()
    assert [e.index for e in c.entries[c.ids[1]]] == [1, 2]
