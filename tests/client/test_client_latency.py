"""The client-side latency histogram (`phalanx.client.latency`): every call is counted once,
by kind and outcome, in the bucket its duration falls in; quantile estimates are bucket
bounds; `LatencyCollector` exports the same numbers to a prometheus registry."""

from __future__ import annotations

import pytest
from client_fakes import Action, Certs, FakeNode, KvBackend, Silent, cluster, make_certs, serve_kv
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from phalanx.client.async_client import ClientTimeout
from phalanx.client.latency import (
    LATENCY_BUCKETS,
    LatencyCollector,
    LatencyHistogram,
    LatencySnapshot,
)
from phalanx.net.client_protocol import ClientCall


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("pki"), ("n1",))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=0.0, max_value=30.0, allow_nan=False), min_size=1,
                max_size=50))
def test_each_observation_lands_in_the_first_bucket_that_holds_it(seconds: list[float]) -> None:
    h = LatencyHistogram()
    for s in seconds:
        h.observe("write", "ok", s)
    snap = h.snapshot()[("write", "ok")]
    assert snap.count == len(seconds)
    assert snap.sum == pytest.approx(sum(seconds))
    for i, bound in enumerate((*LATENCY_BUCKETS, float("inf"))):
        low = LATENCY_BUCKETS[i - 1] if i else -1.0
        assert snap.counts[i] == sum(1 for s in seconds if low < s <= bound)
    quantiles = [snap.quantile(q / 10) for q in range(11)]
    assert quantiles == sorted(quantiles)  # monotone
    assert snap.quantile(1.0) >= max(seconds)


def test_quantile_of_nothing_and_out_of_range() -> None:
    empty = LatencySnapshot(bounds=(1.0,), counts=(0, 0), count=0, sum=0.0)
    assert empty.quantile(0.99) == 0.0
    with pytest.raises(ValueError, match="quantile"):
        empty.quantile(1.5)


async def test_a_client_counts_its_calls_by_kind_and_outcome(certs: Certs) -> None:
    async with cluster(certs, {"n1": serve_kv}, KvBackend()) as (client, _):
        for i in range(5):
            await client.put(f"k{i}", b"v")
        assert await client.get("k1") == b"v"
        latency = client.latency()
        assert latency[("write", "ok")].count == 5
        assert latency[("read", "ok")].count == 1
        assert ("write", "error") not in latency
        registry = CollectorRegistry()
        registry.register(LatencyCollector(client))
        samples = {(s.name, s.labels.get("kind"), s.labels.get("outcome"), s.labels.get("le")):
                   s.value for f in text_string_to_metric_families(
                       generate_latest(registry).decode()) for s in f.samples}
        assert samples[("phalanx_client_call_seconds_count", "write", "ok", None)] == 5
        assert samples[("phalanx_client_call_seconds_bucket", "write", "ok", "+Inf")] == 5
        assert samples[("phalanx_client_call_seconds_count", "read", "ok", None)] == 1


async def test_a_timed_out_call_is_an_error_observation(certs: Certs) -> None:
    async def silent(node: FakeNode, call: ClientCall) -> Action:
        return Silent()

    async with cluster(certs, {"n1": silent}, KvBackend(), timeout=0.3) as (client, _):
        with pytest.raises(ClientTimeout):
            await client.put("k", b"v")
        snap = client.latency()[("write", "error")]
        assert snap.count == 1
        assert snap.sum >= 0.3
