"""A node's HTTP endpoint on its metrics listener: ``/metrics``, ``/health`` and ``/ready``.

Owns:
    * `readiness_problem`: why a node is not ready to serve (None when it is), a pure function
      of its core's status, its applied index, its live peer links and its protocol's spec.
    * `HealthState`: the node's latest verdict and per-peer link state, written by the node's
      trio task (`watch_health`) and read by the HTTP thread (attribute assignments of
      immutable values: no lock; `assess` keeps its peers those of the configuration in
      force); `LinkCollector` exports the links as
      ``phalanx_peer_link_up{peer}``.
    * `serve_http`: a small threaded HTTP server (stdlib `http.server`) answering
        - ``GET /metrics`` (and ``/``): the Prometheus text exposition of the node's registry;
        - ``GET /health``: 200 ``ok`` while the process serves at all (liveness: restart the
          node when it fails);
        - ``GET /ready``: 200 ``ready`` when the node is a member of a quorum and caught up,
          else 503 and one line saying why (readiness: route clients elsewhere meanwhile);
        - anything else: 404.

Ready means, for every protocol (read from its `ProtocolSpec`, never its name):
    * not recovering after lost state (`CoreStatus.recovering`);
    * a protocol with a leader or primary knows one (`CoreStatus.leader`);
    * linked to enough peers to form a quorum with them: live outbound links + itself
      >= n - f (`ProtocolSpec.max_faults`; a crash majority, 2f+1 of 3f+1 for Byzantine);
    * caught up: at most `READY_MAX_APPLY_LAG` committed entries not yet applied.
For a core that reports its configuration (Raft: membership changes), n and the links count
the voters in force, and a node outside the configuration is ``not a member`` (removed).
Until the node has computed a first verdict it answers 503 ``starting``.

The HTTP server runs on its own daemon thread and never touches the core or the transport.
Must not import: consensus cores.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final

import trio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from phalanx.consensus.core import CoreStatus
from phalanx.protocols import CallStrategy, ProtocolSpec

READY_MAX_APPLY_LAG: Final = 1000
"""Committed entries a ready node may still have to apply (a busy node lags by a batch or
two; a node replaying a long log after a restart lags by thousands)."""

HEALTH_POLL_SECONDS: Final = 0.2
"""How often the node recomputes its verdict (`watch_health`)."""


def readiness_problem(
    *, status: CoreStatus, applied_index: int, connected: int, members: int,
    spec: ProtocolSpec,
) -> str | None:
    """Why the node is not ready (one line), or None when it is (see the module docstring).
    `connected`: peers with a live outbound link; `members`: the cluster's size."""
    if status.recovering:
        return "recovering: lost its durable state, catching up before it votes"
    if spec.call_strategy is not CallStrategy.ENDORSEMENT and status.leader is None:
        return f"no known {spec.leader_role} (an election or view change is under way)"
    quorum = members - spec.max_faults(members)
    if connected + 1 < quorum:
        return (f"linked to {connected} of {members - 1} peers; a quorum of {quorum} needs "
                f"{quorum - 1}")
    lag = status.commit_index - applied_index
    if lag > READY_MAX_APPLY_LAG:
        return f"catching up: {lag} committed entries not applied yet"
    return None


@dataclass(slots=True)
class HealthState:
    """The latest verdict (None: ready) and which peers have a live link, written by the
    node's task, read by the HTTP thread and the link collector."""

    problem: str | None = "starting"
    peers: Sequence[str] = ()
    linked: frozenset[str] = field(default_factory=frozenset)

    def update(self, problem: str | None, linked: frozenset[str]) -> None:
        self.problem = problem
        self.linked = linked


class _Handler(BaseHTTPRequestHandler):
    registry: CollectorRegistry
    health: HealthState

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path in ("/metrics", "/"):
            self._reply(200, generate_latest(self.registry), CONTENT_TYPE_LATEST)
        elif path == "/health":
            self._reply(200, b"ok\n")
        elif path == "/ready":
            problem = self.health.problem
            if problem is None:
                self._reply(200, b"ready\n")
            else:
                self._reply(503, f"not ready: {problem}\n".encode())
        else:
            self._reply(404, b"not found: try /metrics, /health or /ready\n")

    def _reply(self, code: int, body: bytes,
               content_type: str = "text/plain; charset=utf-8") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # scrapes every few seconds: not worth a log line each


def serve_http(registry: CollectorRegistry, health: HealthState, host: str,
               port: int) -> tuple[ThreadingHTTPServer, int]:
    """Serve ``/metrics``, ``/health`` and ``/ready`` on a daemon thread; returns (server,
    bound port). Stop it with ``server.shutdown(); server.server_close()``."""
    handler = type("Handler", (_Handler,), {"registry": registry, "health": health})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="phalanx-http", daemon=True).start()
    return server, int(server.server_address[1])


class LinkCollector(Collector):
    """``phalanx_peer_link_up{node,peer}``: 1 while this node's outbound link to the peer is
    up (as of the last `watch_health` pass), else 0."""

    def __init__(self, node: str, health: HealthState) -> None:
        self._node = node
        self._health = health

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "phalanx_peer_link_up", "1 while this node's outbound mTLS link to the peer is up, "
            "else 0", labels=["node", "peer"])
        linked = self._health.linked
        for peer in self._health.peers:
            family.add_metric([self._node, peer], int(peer in linked))
        yield family


def assess(status: CoreStatus, *, applied_index: int, linked: Iterable[str],
           peers: Sequence[str], spec: ProtocolSpec
           ) -> tuple[tuple[str, ...], str | None, frozenset[str]]:
    """One verdict: (the peers to report, the problem or None, the live links among them).
    For a core that reports its configuration (Raft) the peers are the configuration's other
    members, so a node added at run time counts and gets its link gauge and a removed one
    drops out; otherwise `peers` (the config file's) stay."""
    config = getattr(status, "config", None)  # a core that changes membership (Raft)
    me = str(status.node)
    voters = {str(v) for v in getattr(config, "voters", ())}
    members = voters | {str(m) for m in (*getattr(config, "voters_outgoing", ()),
                                         *getattr(config, "learners", ()))}
    reported = tuple(sorted(members - {me})) if voters else tuple(peers)
    up = frozenset(p for p in linked if p in reported)
    problem: str | None
    if voters and me not in members:
        problem = "not a member of the configuration (removed: stop this node)"
    elif voters:  # the configuration in force, not the config file's peers
        problem = readiness_problem(status=status, applied_index=applied_index,
                                    connected=len(up & voters), members=len(voters), spec=spec)
    else:
        problem = readiness_problem(status=status, applied_index=applied_index,
                                    connected=len(up), members=len(reported) + 1, spec=spec)
    return reported, problem, up


async def watch_health(health: HealthState, *, status: Callable[[], CoreStatus],
                       applied_index: Callable[[], int], linked: Callable[[], Iterable[str]],
                       spec: ProtocolSpec) -> None:
    """Recompute the node's verdict every `HEALTH_POLL_SECONDS`, in the node's trio task
    (which owns the core and the transport) so the HTTP thread only reads the result."""
    while True:
        peers, problem, up = assess(status(), applied_index=applied_index(), linked=linked(),
                                    peers=health.peers, spec=spec)
        health.peers = peers
        health.update(problem, up)
        await trio.sleep(HEALTH_POLL_SECONDS)
