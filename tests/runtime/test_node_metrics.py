"""NodeMetrics: the driver hooks update plain numbers; the families come out at scrape time."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from phalanx.consensus.core import CoreStatus
from phalanx.consensus.types import NodeId
from phalanx.runtime.metrics import FSYNC_BUCKETS, NodeMetrics


def scrape(metrics: NodeMetrics) -> dict[str, float]:
    """{sample name with its `le` label, if any: value} of node n1."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            assert sample.labels["node"] == "n1"
            le = sample.labels.get("le")
            out[sample.name + (f"[{le}]" if le else "")] = sample.value
    return out


def status(term: int, role: str, leader: str | None, commit: int) -> CoreStatus:
    return CoreStatus(node=NodeId("n1"), role=role, term=term, commit_index=commit,
                      leader=NodeId(leader) if leader else None)


def test_status_and_apply_hooks_are_exposed_as_counters_and_gauges() -> None:
    m = NodeMetrics("n1")
    m.on_status(status(1, "follower", None, 0), 0)
    m.on_status(status(1, "follower", "n2", 3), 2)
    m.on_status(status(3, "leader", "n1", 5), 4)  # two terms began, a second leader
    m.on_applied(2, 5, 7)
    m.on_applied(1, 6, 7)
    s = scrape(m)
    assert s["phalanx_elections_total"] == 2
    assert s["phalanx_leader_changes_total"] == 2
    assert s["phalanx_term"] == 3
    assert s["phalanx_is_leader"] == 1
    assert s["phalanx_commits_total"] == 3
    assert s["phalanx_commit_index"] == 7
    assert s["phalanx_applied_index"] == 6
    assert s["phalanx_apply_lag"] == 1
    m.on_status(status(3, "follower", "n2", 7), 7)
    s = scrape(m)
    assert s["phalanx_is_leader"] == 0
    assert s["phalanx_apply_lag"] == 0
    assert s["phalanx_leader_changes_total"] == 3


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(min_value=0.0, max_value=2.0, allow_nan=False), max_size=30))
def test_fsync_histogram_counts_each_observation_in_every_bucket_it_fits(
        seconds: list[float]) -> None:
    m = NodeMetrics("n1")
    for value in seconds:
        m.on_fsync(value, 3)
    s = scrape(m)
    for bound in FSYNC_BUCKETS:
        expected = sum(1 for v in seconds if v <= bound)
        assert s[f"phalanx_fsync_seconds_bucket[{float(bound)!r}]"] == expected
    assert s["phalanx_fsync_seconds_bucket[+Inf]"] == len(seconds)
    assert s["phalanx_fsync_seconds_count"] == len(seconds)
    assert abs(s["phalanx_fsync_seconds_sum"] - sum(seconds)) < 1e-9
    assert s["phalanx_fsync_batch_readys_count"] == len(seconds)
    assert s["phalanx_fsync_batch_readys_sum"] == 3 * len(seconds)


def test_byte_sources_are_read_at_scrape_time() -> None:
    m = NodeMetrics("n1")
    counters = {"peer_bytes_out": 10}
    m.add_byte_source(lambda: dict(counters))
    assert scrape(m)["phalanx_peer_bytes_out_total"] == 10
    counters["peer_bytes_out"] = 25
    assert scrape(m)["phalanx_peer_bytes_out_total"] == 25
