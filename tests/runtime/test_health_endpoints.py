"""`/health`, `/ready` and `/metrics` on a node's metrics listener (issue 21, item 5):
the readiness rule for each registered protocol, the HTTP answers and status codes, the
per-peer link gauge and the metric help strings. A real node answers them in
tests/cli/test_cluster_up_safety.py."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from phalanx.consensus.core import CoreStatus
from phalanx.consensus.types import NodeId
from phalanx.protocols import CallStrategy, ProtocolSpec, specs
from phalanx.protocols import get as protocol
from phalanx.runtime.health import (
    READY_MAX_APPLY_LAG,
    HealthState,
    LinkCollector,
    readiness_problem,
    serve_http,
)
from phalanx.runtime.metrics import COUNTER_HELP, NodeMetrics


def _status(*, leader: str | None = "n1", commit: int = 10,
            recovering: bool = False) -> CoreStatus:
    return CoreStatus(node=NodeId("n1"), role="x", term=1, commit_index=commit,
                      leader=NodeId(leader) if leader else None, recovering=recovering)


@pytest.mark.parametrize("spec", list(specs()), ids=lambda s: s.name)
def test_readiness_rule_for_every_protocol(spec: ProtocolSpec) -> None:
    n = spec.default_nodes
    quorum = n - spec.max_faults(n)

    def problem(*, status: CoreStatus | None = None, connected: int = n - 1) -> str | None:
        return readiness_problem(status=status or _status(), applied_index=10,
                                 connected=connected, members=n, spec=spec)

    assert problem() is None
    assert problem(connected=quorum - 1) is None  # exactly a quorum with itself
    assert problem(connected=quorum - 2) == (
        f"linked to {quorum - 2} of {n - 1} peers; a quorum of {quorum} needs {quorum - 1}")
    assert problem(status=_status(recovering=True)) == (
        "recovering: lost its durable state, catching up before it votes")
    assert problem(status=_status(commit=10 + READY_MAX_APPLY_LAG + 1)) == (
        f"catching up: {READY_MAX_APPLY_LAG + 1} committed entries not applied yet")
    if spec.call_strategy is CallStrategy.ENDORSEMENT:
        assert problem(status=_status(leader=None)) is None  # no leader to know
    else:
        assert problem(status=_status(leader=None)) == (
            f"no known {spec.leader_role} (an election or view change is under way)")


def test_a_single_node_needs_no_links() -> None:
    raft = protocol("raft")
    assert readiness_problem(status=_status(), applied_index=10, connected=0, members=1,
                             spec=raft) is None


@pytest.fixture
def served() -> Iterator[tuple[str, HealthState]]:
    metrics = NodeMetrics("n1")
    health = HealthState(peers=("n2", "n3"))
    metrics.registry.register(LinkCollector("n1", health))
    metrics.add_byte_source(lambda: {"peer_bytes_in": 5, "something_new": 1})
    server, port = serve_http(metrics.registry, health, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{port}", health
    finally:
        server.shutdown()
        server.server_close()


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_health_ready_and_metrics_answer_with_status_codes(
    served: tuple[str, HealthState]
) -> None:
    base, health = served
    assert _get(f"{base}/health") == (200, "ok\n")
    assert _get(f"{base}/ready") == (503, "not ready: starting\n")
    health.update("no known leader (an election or view change is under way)",
                  frozenset({"n2"}))
    assert _get(f"{base}/ready") == (
        503, "not ready: no known leader (an election or view change is under way)\n")
    health.update(None, frozenset({"n2", "n3"}))
    assert _get(f"{base}/ready") == (200, "ready\n")
    code, page = _get(f"{base}/metrics")
    assert code == 200
    assert 'phalanx_peer_link_up{node="n1",peer="n2"} 1.0' in page
    assert 'phalanx_peer_link_up{node="n1",peer="n3"} 1.0' in page
    assert f"# HELP phalanx_peer_bytes_in_total {COUNTER_HELP['peer_bytes_in']}" in page
    assert "# HELP phalanx_something_new_total phalanx something new (a counter)" in page
    health.update(None, frozenset({"n3"}))
    assert 'phalanx_peer_link_up{node="n1",peer="n2"} 0.0' in _get(f"{base}/metrics")[1]
    assert _get(f"{base}/")[0] == 200  # the old address of the metrics page
    assert _get(f"{base}/nope")[0] == 404


def test_every_metric_has_a_help_line_that_says_what_it_counts() -> None:
    from prometheus_client import generate_latest

    metrics = NodeMetrics("n1")
    metrics.add_byte_source(lambda: dict.fromkeys(COUNTER_HELP, 0))
    registry: CollectorRegistry = metrics.registry
    helps = [line for line in generate_latest(registry).decode().splitlines()
             if line.startswith("# HELP ")]
    assert len(helps) >= len(COUNTER_HELP) + 10
    for line in helps:
        name, doc = line[len("# HELP "):].split(" ", 1)
        assert len(doc.split()) >= 3, line  # a phrase, not the name again
        assert doc.lower() != name.replace("_", " ").lower(), line


def test_the_reported_peers_follow_the_configuration_in_force() -> None:
    """A node added at run time counts toward the quorum and gets a link gauge; a removed
    one drops out (before, only the config file's start-up peers were ever reported)."""
    from phalanx.consensus.raft.config import RaftStatus
    from phalanx.consensus.types import Configuration
    from phalanx.runtime.health import assess

    def status(voters: tuple[str, ...], learners: tuple[str, ...] = ()) -> RaftStatus:
        return RaftStatus(node=NodeId("n1"), role="leader", term=1, commit_index=10,
                          leader=NodeId("n1"),
                          config=Configuration(voters=tuple(NodeId(v) for v in voters),
                                               learners=tuple(NodeId(v) for v in learners)))

    raft = protocol("raft")
    start = ("n2", "n3")
    # Grown to five voters; n2 and n3 are down, the new n4 and n5 are linked: a quorum of 3.
    peers, problem, up = assess(status(("n1", "n2", "n3", "n4", "n5"), learners=("n6",)),
                                applied_index=10, linked=["n4", "n5", "n6"], peers=start,
                                spec=raft)
    assert peers == ("n2", "n3", "n4", "n5", "n6")
    assert up == frozenset({"n4", "n5", "n6"})
    assert problem is None
    # n3 removed: it is no longer reported, and only n2 of the three voters is linked.
    peers, problem, up = assess(status(("n1", "n2")), applied_index=10, linked=["n3"],
                                peers=peers, spec=raft)
    assert (peers, up) == (("n2",), frozenset())
    assert problem == "linked to 0 of 1 peers; a quorum of 2 needs 1"
    # A core without a configuration keeps the config file's peers.
    peers, problem, up = assess(_status(), applied_index=10, linked=["n3", "n9"],
                                peers=start, spec=protocol("pbft"))
    assert (peers, up) == (start, frozenset({"n3"}))
