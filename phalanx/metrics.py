"""Prometheus metrics of one node, on a per-node registry.

Owns: `NodeMetrics` (the metric families, all named `phalanx_*`, on a private
`CollectorRegistry` so several nodes can run in one process) and `serve_metrics`, which
exposes a registry over HTTP on a daemon thread (`prometheus_client.start_http_server`).

Families:
    phalanx_commits_total             entries applied after commit
    phalanx_commit_index              the core's commit index
    phalanx_applied_index             the replica's applied index
    phalanx_apply_lag                 commit index - applied index
    phalanx_fsync_seconds             histogram: one group-commit batch's persist + fsync
    phalanx_fsync_batch_readys        histogram: Readys made durable per fsync
    phalanx_elections_total           terms this node saw begin (elections, won or not)
    phalanx_leader_changes_total      changes of the known leader
    phalanx_term, phalanx_is_leader   gauges
    phalanx_peer_bytes_in_total / _out_total, phalanx_client_bytes_in_total / _out_total
    phalanx_peer_queue_drops_total    messages refused by a full per-peer send queue

Must not import: trio, consensus cores. The driver calls the `on_*` hooks from its one task;
byte counters are read from the transport and the client port at scrape time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from phalanx.consensus.core import CoreStatus

FSYNC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 1024)


class _Bytes(Collector):
    """Byte counters read at scrape time from `source()` -> {name: value}."""

    def __init__(self, node: str, source: Callable[[], dict[str, int]]) -> None:
        self._node = node
        self._source = source

    def collect(self) -> Iterator[CounterMetricFamily]:
        for name, value in sorted(self._source().items()):
            family = CounterMetricFamily(f"phalanx_{name}", f"phalanx {name.replace('_', ' ')}",
                                         labels=["node"])
            family.add_metric([self._node], value)
            yield family


class NodeMetrics:
    """The metrics of node `node`; implements `phalanx.driver.DriverObserver`."""

    def __init__(self, node: str, *, registry: CollectorRegistry | None = None) -> None:
        self.node = node
        self.registry = registry if registry is not None else CollectorRegistry()
        r, labels = self.registry, ["node"]
        self._commits = Counter("phalanx_commits", "Entries applied after commit",
                                labels, registry=r).labels(node)
        self._commit_index = Gauge("phalanx_commit_index", "Commit index", labels,
                                   registry=r).labels(node)
        self._applied_index = Gauge("phalanx_applied_index", "Applied index", labels,
                                    registry=r).labels(node)
        self._lag = Gauge("phalanx_apply_lag", "Commit index minus applied index", labels,
                          registry=r).labels(node)
        self._fsync = Histogram("phalanx_fsync_seconds",
                                "Persist + fsync time of one group-commit batch", labels,
                                buckets=FSYNC_BUCKETS, registry=r).labels(node)
        self._batch = Histogram("phalanx_fsync_batch_readys", "Readys made durable per fsync",
                                labels, buckets=BATCH_BUCKETS, registry=r).labels(node)
        self._elections = Counter("phalanx_elections", "Terms this node saw begin", labels,
                                  registry=r).labels(node)
        self._leader_changes = Counter("phalanx_leader_changes", "Changes of the known leader",
                                       labels, registry=r).labels(node)
        self._term = Gauge("phalanx_term", "Current term", labels, registry=r).labels(node)
        self._is_leader = Gauge("phalanx_is_leader", "1 when this node is leader", labels,
                                registry=r).labels(node)
        self._last_term: int | None = None
        self._last_leader: str | None = None

    def add_byte_source(self, source: Callable[[], dict[str, int]]) -> None:
        """Register counters read at scrape time (e.g. transport bytes in/out)."""
        self.registry.register(_Bytes(self.node, source))

    # -- DriverObserver ---------------------------------------------------------------------

    def on_fsync(self, seconds: float, readys: int) -> None:
        self._fsync.observe(seconds)
        self._batch.observe(readys)

    def on_applied(self, entries: int, applied_index: int, commit_index: int) -> None:
        self._commits.inc(entries)
        self._applied_index.set(applied_index)
        self._lag.set(max(0, commit_index - applied_index))

    def on_status(self, status: CoreStatus, applied_index: int) -> None:
        if self._last_term is not None and status.term > self._last_term:
            self._elections.inc(status.term - self._last_term)
        self._last_term = status.term
        if status.leader != self._last_leader:
            if status.leader is not None:
                self._leader_changes.inc()
            self._last_leader = status.leader
        self._term.set(status.term)
        self._is_leader.set(1 if status.role == "leader" else 0)
        self._commit_index.set(status.commit_index)
        self._applied_index.set(applied_index)
        self._lag.set(max(0, status.commit_index - applied_index))

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format (tests, debugging)."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> tuple[Any, int]:
    """Serve `registry` over HTTP on a daemon thread; returns (server, bound port).

    Call `server.shutdown()` to stop it.
    """
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server, int(server.server_port)
