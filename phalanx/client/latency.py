"""Client-side call latency: a histogram per kind of call and outcome, kept by every
`phalanx.Client` (`Client.latency()`, `SyncClient.latency()`).

Owns: `LatencyHistogram` (observations, lock-free: a client lives in one trio thread),
`LatencySnapshot` (a copy: counts per bucket, sum, quantile estimates) and
`LatencyCollector` (the histograms as ``phalanx_client_call_seconds{kind,outcome}`` for a
prometheus-client registry of the application's own, imported only when used).

What is measured: from the call's start to its answer or its error, as the caller sees it
(retries, redirects and back-off included). `kind` is ``write`` or ``read``; `outcome` is
``ok`` (an answer, whatever the app's result) or ``error`` (timeout, refusal, closed client:
any exception out of `Client.call`).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

if TYPE_CHECKING:
    from prometheus_client.core import Metric

LATENCY_BUCKETS: Final = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                          1.0, 2.5, 5.0, 10.0)
"""Upper bounds (seconds) of the buckets; the last, implicit bucket is +Inf."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LatencySnapshot:
    """One histogram's state: `counts[i]` calls took <= `bounds[i]` seconds and more than
    the bound before (the last count: more than every bound)."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    count: int
    sum: float

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count else 0.0

    def quantile(self, q: float) -> float:
        """An estimate of quantile `q` (0..1): the upper bound of the bucket it falls in
        (+inf past the last bound; 0.0 without observations)."""
        if not 0 <= q <= 1:
            raise ValueError(f"quantile must be within [0, 1], got {q}")
        if not self.count:
            return 0.0
        rank, seen = q * self.count, 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            seen += n
            if seen >= rank and n:
                return bound
        return float("inf")


class LatencyHistogram:
    """Call latencies by (kind, outcome) (module docstring)."""

    __slots__ = ("_bounds", "_data")

    def __init__(self, bounds: Sequence[float] = LATENCY_BUCKETS) -> None:
        self._bounds = tuple(bounds)
        self._data: dict[tuple[str, str], tuple[list[int], list[float]]] = {}

    def observe(self, kind: str, outcome: str, seconds: float) -> None:
        data = self._data.get((kind, outcome))
        if data is None:
            data = self._data[(kind, outcome)] = ([0] * (len(self._bounds) + 1), [0.0])
        data[0][bisect_left(self._bounds, seconds)] += 1
        data[1][0] += seconds

    def snapshot(self) -> Mapping[tuple[str, str], LatencySnapshot]:
        """Every (kind, outcome) observed so far, copied."""
        return {key: LatencySnapshot(bounds=self._bounds, counts=tuple(counts),
                                     count=sum(counts), sum=total[0])
                for key, (counts, total) in sorted(self._data.items())}


class LatencyCollector:
    """A prometheus-client collector of a client's latencies:
    ``registry.register(LatencyCollector(client))`` (any object with ``latency()``)."""

    def __init__(self, client: _HasLatency) -> None:
        self._client = client

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import HistogramMetricFamily

        family = HistogramMetricFamily(
            "phalanx_client_call_seconds", "Seconds from a client call's start to its answer "
            "or error, retries included, by kind (read/write) and outcome (ok/error)",
            labels=["kind", "outcome"])
        for (kind, outcome), snap in self._client.latency().items():
            cumulative, buckets = 0, []
            for bound, n in zip((*map(repr, snap.bounds), "+Inf"), snap.counts, strict=True):
                cumulative += n
                buckets.append((bound, float(cumulative)))
            family.add_metric([kind, outcome], buckets, snap.sum)
        yield family


class _HasLatency(Protocol):
    def latency(self) -> Mapping[tuple[str, str], LatencySnapshot]: ...
