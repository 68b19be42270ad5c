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
    phalanx_peer_link_up{peer}        1 while the outbound link to that peer is up
                                      (`phalanx.runtime.health`)
    and the counters in `COUNTER_HELP`, each with a HELP line saying what it counts.
Process and Python runtime (`RuntimeCollector`, of the whole process: several nodes in one
process report the same values):
    phalanx_process_resident_memory_bytes, phalanx_process_cpu_seconds_total,
    phalanx_process_open_fds, phalanx_process_max_fds, phalanx_process_start_time_seconds,
    phalanx_python_gc_collections_total{generation}, phalanx_python_gc_objects_collected_total
    {generation}, phalanx_python_gc_uncollectable_total{generation},
    phalanx_python_gc_generation_count{generation}, phalanx_python_threads, phalanx_python_info

Must not import: trio, consensus cores. The driver calls the `on_*` hooks from its one task;
they only update plain Python numbers (no prometheus-client metric objects, whose every
`set`/`inc`/`observe` takes a lock: the hooks run per tick, per batch and per fsync, on the
hot path). Everything is turned into metric families at scrape time, on the HTTP server's
thread (`_NodeCollector`), as are the byte counters of the transport and the client port.
A scrape reads those numbers without a lock: it may miss the observation being recorded at
that instant (a histogram's count is the sum of its buckets, so it is always consistent).
"""

from __future__ import annotations

import gc
import os
import platform
import resource
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from phalanx.consensus.core import CoreStatus
from phalanx.runtime.descriptors import open_descriptors

FSYNC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 1024)


COUNTER_HELP: Final[Mapping[str, str]] = {
    "peer_bytes_in": "Bytes received from peers over their mTLS links (TLS payload)",
    "peer_bytes_out": "Bytes sent to peers over their mTLS links (TLS payload)",
    "client_bytes_in": "Bytes received from clients on the client port",
    "client_bytes_out": "Bytes sent to clients on the client port",
    "peer_queue_drops": "Messages to a peer dropped because its bounded send queue was full",
    "driver_steps": "Inputs stepped through the consensus core (messages, ticks, calls)",
    "driver_io_batches": "Group-commit batches handed to storage (one fsync each, or none)",
    "driver_proposal_batches": "Batches of client requests proposed to the core together",
    "driver_client_redirects": "Client calls answered REDIRECT (this node does not lead)",
    "driver_client_retries": "Client calls answered RETRY (no leader known, or leadership lost)",
    "driver_duplicate_calls": "Client calls that repeated one already waiting here",
    "driver_overloaded_calls": "Writes answered RETRY because too many calls were waiting",
    "driver_slow_passes": "Core-loop passes that took longer than a few ticks (late heartbeats)",
    "driver_lazy_messages": "Commit notices held for the next message to their peer",
    "driver_superseded_messages": "Held commit notices dropped: a newer message said as much",
    "driver_refused_calls": "Client calls refused on arrival (oversized), never proposed",
    "client_connections_shed": "Client connections closed at once: the connection cap was full",
    "client_handshakes_shed": "Pending client TLS handshakes shed for newer ones (flood defence)",
    "client_handshake_rate_waits": "Client handshakes that waited for the handshake rate limit",
    "client_budget_closes": "Client connections closed for exceeding the partial-frame budget",
    "peer_connections_shed": "Inbound peer connections shed by the connection gate",
    "peer_frames_out": "Frames written to peers",
    "peer_direct_write_calls": "Socket writes to peers made directly from the core's task",
    "client_handshake_failures": "Client TLS handshakes that failed (no certificate, wrong CA)",
    "client_unauthenticated": "Client connections without a phalanx client identity",
    "client_forbidden_calls": "Client calls refused FORBIDDEN by the certificate's role",
    "client_forbidden_subscriptions": "ClientHellos for another client's session, refused",
}
"""What each counter a node registers with `NodeMetrics.add_byte_source` counts (its HELP
line on the metrics page); a name without an entry gets a generic one."""


class _Bytes(Collector):
    """Counters read at scrape time from `source()` -> {name: value}, each exported as
    ``phalanx_<name>_total`` with its `COUNTER_HELP` line."""

    def __init__(self, node: str, source: Callable[[], dict[str, int]]) -> None:
        self._node = node
        self._source = source

    def collect(self) -> Iterator[CounterMetricFamily]:
        for name, value in sorted(self._source().items()):
            doc = COUNTER_HELP.get(name, f"phalanx {name.replace('_', ' ')} (a counter)")
            family = CounterMetricFamily(f"phalanx_{name}", doc, labels=["node"])
            family.add_metric([self._node], value)
            yield family


class _Histogram:
    """Bucket counts and a sum, updated without a lock by the one driver task."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # le: value <= bound
        self.total += value

    def family(self, name: str, doc: str, node: str) -> HistogramMetricFamily:
        counts = list(self.counts)
        total = self.total
        cumulative, buckets = 0, []
        for bound, count in zip((*map(_le, self.bounds), "+Inf"), counts, strict=True):
            cumulative += count
            buckets.append((bound, float(cumulative)))
        family = HistogramMetricFamily(name, doc, labels=["node"])
        family.add_metric([node], buckets, total)
        return family


def _le(bound: float) -> str:
    return repr(float(bound))


class NodeMetrics:
    """The metrics of node `node`; implements `phalanx.runtime.driver.DriverObserver`."""

    def __init__(self, node: str, *, registry: CollectorRegistry | None = None) -> None:
        self.node = node
        self.registry = registry if registry is not None else CollectorRegistry()
        self.commits = 0
        self.commit_index = 0
        self.applied_index = 0
        self.elections = 0
        self.leader_changes = 0
        self.term = 0
        self.is_leader = 0
        self.fsync_seconds = _Histogram(FSYNC_BUCKETS)
        self.fsync_batch_readys = _Histogram(BATCH_BUCKETS)
        self._last_term: int | None = None
        self._last_leader: str | None = None
        self.registry.register(_NodeCollector(self))
        self.registry.register(RuntimeCollector(node))

    def add_byte_source(self, source: Callable[[], dict[str, int]]) -> None:
        """Register counters read at scrape time (e.g. transport bytes in/out)."""
        self.registry.register(_Bytes(self.node, source))

    # -- DriverObserver ---------------------------------------------------------------------

    def on_fsync(self, seconds: float, readys: int) -> None:
        self.fsync_seconds.observe(seconds)
        self.fsync_batch_readys.observe(readys)

    def on_applied(self, entries: int, applied_index: int, commit_index: int) -> None:
        self.commits += entries
        self.applied_index = applied_index
        self.commit_index = commit_index

    def on_status(self, status: CoreStatus, applied_index: int) -> None:
        if self._last_term is not None and status.term > self._last_term:
            self.elections += status.term - self._last_term
        self._last_term = status.term
        if status.leader != self._last_leader:
            if status.leader is not None:
                self.leader_changes += 1
            self._last_leader = status.leader
        self.term = status.term
        self.is_leader = 1 if status.role == "leader" else 0
        self.commit_index = status.commit_index
        self.applied_index = applied_index

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format (tests, debugging)."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


class _NodeCollector(Collector):
    """`NodeMetrics`' numbers as metric families, built at scrape time."""

    def __init__(self, metrics: NodeMetrics) -> None:
        self._m = metrics

    def collect(self) -> Iterator[Metric]:
        m, node = self._m, [self._m.node]

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=["node"])
            family.add_metric(node, value)
            return family

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=["node"])
            family.add_metric(node, value)
            return family

        commit, applied = m.commit_index, m.applied_index
        yield counter("phalanx_commits", "Committed entries this node applied to its state "
                      "machine", m.commits)
        yield gauge("phalanx_commit_index", "Highest log index (Raft) or sequence number (PBFT) "
                    "this node knows committed", commit)
        yield gauge("phalanx_applied_index", "Highest committed index applied to the state "
                    "machine here", applied)
        yield gauge("phalanx_apply_lag", "Committed entries not yet applied here (commit index "
                    "minus applied index)", max(0, commit - applied))
        yield m.fsync_seconds.family("phalanx_fsync_seconds",
                                     "Seconds to persist and fsync one group-commit batch",
                                     m.node)
        yield m.fsync_batch_readys.family("phalanx_fsync_batch_readys",
                                          "Core outputs (Readys) made durable by one fsync",
                                          m.node)
        yield counter("phalanx_elections", "Terms (Raft) or views (PBFT) this node saw begin, "
                      "won or not", m.elections)
        yield counter("phalanx_leader_changes", "Times the leader or primary this node knows "
                      "changed to another node", m.leader_changes)
        yield gauge("phalanx_term", "Current term (Raft) or view (PBFT)", m.term)
        yield gauge("phalanx_is_leader", "1 while this node leads (Raft leader, PBFT primary), "
                    "else 0", m.is_leader)


_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_STARTED = time.time()


def _resident_bytes() -> int | None:
    """The process's resident set size now (Linux: /proc/self/statm), or None."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return None


def _process_start() -> float:
    """When this process started (seconds since the epoch; Linux: /proc, else module load)."""
    try:
        with open("/proc/self/stat", "rb") as f:
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
        with open("/proc/stat", "rb") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith(b"btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return _STARTED


class RuntimeCollector(Collector):
    """The process and the Python runtime it runs, read at scrape time (see the module
    docstring). Values are the process's; the `node` label says which node serves them."""

    def __init__(self, node: str) -> None:
        self._node = node
        self._start = _process_start()

    def collect(self) -> Iterator[Metric]:
        node = self._node

        def one(family: GaugeMetricFamily | CounterMetricFamily, value: float
                ) -> GaugeMetricFamily | CounterMetricFamily:
            family.add_metric([node], value)
            return family

        rss = _resident_bytes()
        if rss is not None:
            yield one(GaugeMetricFamily("phalanx_process_resident_memory_bytes", "Resident "
                      "memory of the node's process (RSS), bytes", labels=["node"]), rss)
        times = os.times()
        yield one(CounterMetricFamily("phalanx_process_cpu_seconds", "CPU time the node's "
                  "process used, user plus system, seconds", labels=["node"]),
                  times.user + times.system)
        fds = open_descriptors()
        if fds > 0:
            yield one(GaugeMetricFamily("phalanx_process_open_fds", "File descriptors the "
                      "node's process holds open (sockets, WAL segments, ...)",
                      labels=["node"]), fds)
        yield one(GaugeMetricFamily("phalanx_process_max_fds", "The process's open-file "
                  "limit (soft RLIMIT_NOFILE)", labels=["node"]),
                  resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        yield one(GaugeMetricFamily("phalanx_process_start_time_seconds", "When the node's "
                  "process started, seconds since the Unix epoch", labels=["node"]),
                  self._start)
        stats = gc.get_stats()
        counts = gc.get_count()
        families = (
            CounterMetricFamily("phalanx_python_gc_collections", "Runs of the cyclic garbage "
                                "collector, by generation", labels=["node", "generation"]),
            CounterMetricFamily("phalanx_python_gc_objects_collected", "Objects the cyclic "
                                "garbage collector freed, by generation",
                                labels=["node", "generation"]),
            CounterMetricFamily("phalanx_python_gc_uncollectable", "Objects the cyclic "
                                "garbage collector found but could not free, by generation",
                                labels=["node", "generation"]),
            GaugeMetricFamily("phalanx_python_gc_generation_count", "gc.get_count(): for "
                              "generation 0 the allocations less deallocations since its last "
                              "collection; for 1 and 2 the younger generation's collections "
                              "since theirs", labels=["node", "generation"]))
        for generation, stat in enumerate(stats):
            label = [node, str(generation)]
            families[0].add_metric(label, stat.get("collections", 0))
            families[1].add_metric(label, stat.get("collected", 0))
            families[2].add_metric(label, stat.get("uncollectable", 0))
            families[3].add_metric(label, counts[generation] if generation < len(counts)
                                   else 0)
        yield from families
        yield one(GaugeMetricFamily("phalanx_python_threads", "Threads alive in the node's "
                  "process (the trio thread, checkpoint writers, fsync workers, ...)",
                  labels=["node"]), threading.active_count())
        info = GaugeMetricFamily("phalanx_python_info", "The Python running the node (always "
                                 "1; the labels carry the version)",
                                 labels=["node", "implementation", "version"])
        info.add_metric([node, platform.python_implementation(), platform.python_version()], 1)
        yield info


def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> tuple[Any, int]:
    """Serve `registry` over HTTP on a daemon thread; returns (server, bound port).

    Call `server.shutdown()` to stop it.
    """
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server, int(server.server_port)
