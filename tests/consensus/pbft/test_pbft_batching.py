"""Adaptive batching at the primary: propose at once when idle or when a batch is full;
accumulate while `max_inflight_batches` batches are in flight; propose the accumulated
requests as soon as a batch executes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from pbft_harness import Cluster, req

from phalanx.consensus.core import Submit
from phalanx.consensus.pbft.messages import PrePrepare
from phalanx.consensus.pbft.requests import RequestBook


def _pre_prepares(c: Cluster) -> list[PrePrepare]:
    seen: dict[int, PrePrepare] = {}
    for _, _, m in c.net:
        if isinstance(m, PrePrepare):
            seen[m.seq] = m
    return [seen[s] for s in sorted(seen)]


def test_an_idle_primary_proposes_a_lone_request_in_the_same_step() -> None:
    c = Cluster(4, batch_size=64)
    ready = c.cores[c.ids[0]].step(Submit(request=req("a", 0)))
    sent = [s.message for s in ready.messages if isinstance(s.message, PrePrepare)]
    assert len(sent) == 3
    assert all(pp.batch == (req("a", 0),) for pp in sent)


def test_requests_accumulate_while_batches_are_in_flight_then_go_as_one() -> None:
    c = Cluster(4, batch_size=64, max_inflight_batches=2)
    primary = c.ids[0]
    for no in range(7):
        c.submit(primary, req("a", no))
    # Two lone batches went at once; the other five wait for one of them to execute.
    assert [len(pp.batch) for pp in _pre_prepares(c)] == [1, 1]
    c.deliver()
    batches = [len(e.requests) for e in c.entries[c.ids[1]]]
    assert batches == [1, 1, 5]
    assert [r.request_no for e in c.entries[c.ids[2]] for r in e.requests] == list(range(7))
    c.assert_agreement()


def test_a_full_batch_goes_even_while_batches_are_in_flight() -> None:
    c = Cluster(4, batch_size=3, max_inflight_batches=1)
    for no in range(7):
        c.submit(c.ids[0], req("a", no))
    assert [len(pp.batch) for pp in _pre_prepares(c)] == [1, 3, 3]
    c.deliver()
    assert [r.request_no for e in c.entries[c.ids[3]] for r in e.requests] == list(range(7))


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 200), st.integers(1, 64), st.integers(0, 5), st.integers(1, 4))
def test_flush_rule(pending: int, batch_size: int, inflight: int, window: int) -> None:
    book = RequestBook(max_pending=1000)
    for no in range(pending):
        assert book.queue_pending(req("c", no))
    flush = book.should_flush(batch_size=batch_size, inflight=inflight, max_inflight=window)
    assert flush == (pending > 0 and (pending >= batch_size or inflight < window))
