"""Property 5 of the conformance suite: hostile input never raises.

For every subject, hypothesis (derandomized) draws, for a freshly booted cluster of the
simulator's replicas, a sequence of attacks: messages of the core's own wire types generated
from their fields' types (`wire_strategies`: any ints, bytes, str, node ids, nested records,
optional fields), real captured messages with fields replaced, and replays of real captured
traffic in any order (duplicates included), each from any sender: a member, the receiver
itself, or an id outside the cluster. Each goes through the codec first (what cannot be
encoded or decoded never reaches a core) and is delivered through `SimNode`, so its Ready is
carried out. Checked: delivering never raises; no node's `status().dropped` total ever
decreases; a message from outside the cluster is counted in `dropped`; and afterwards the
cluster still commits a new request on every replica, with the setup's invariant checker
silent.
"""

from __future__ import annotations

import functools

import pytest
from _pytest.mark import ParameterSet
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from sim_cluster import MS, SimCluster
from subjects import IDS, SUBJECTS, Subject
from wire_strategies import Vocabulary, message_strategy, plain_value

from phalanx.consensus.core import Receive
from phalanx.consensus.types import Message
from phalanx.net.codec import DecodeError, EncodeError

OUTSIDERS = ("n99", "", "client-7")
BOOT_NS = 300 * MS

Captured = tuple[tuple[str, str, Message], ...]
"""(src, dst, message) of real traffic."""


@functools.cache
def captured(name: str) -> Captured:
    subject = next(s for s in SUBJECTS if s.name == name)
    cluster = SimCluster(subject, 11, record=True)
    for node in cluster.nodes.values():
        node.start()
    cluster.workload(BOOT_NS + 200 * MS)
    out = []
    for dst in cluster.names:
        for inp in cluster.probes[dst][0].inputs or ():
            if isinstance(inp, Receive):
                out.append((inp.src, dst, inp.message))
    return tuple(out[::7])


def _vocabulary(subject: Subject, traffic: Captured) -> Vocabulary:
    names = tuple(f"n{i}" for i in range(1, subject.nodes + 1))
    vocab = Vocabulary(node_ids=names + OUTSIDERS)
    for _, _, message in traffic:
        vocab.capture(message)
    return vocab


def _attacks(subject: Subject) -> st.SearchStrategy[list[tuple[str, str, Message]]]:
    traffic = captured(subject.name)
    vocab = _vocabulary(subject, traffic)
    names = vocab.node_ids[: subject.nodes]
    forged = st.tuples(st.sampled_from(vocab.node_ids), st.sampled_from(names),
                       message_strategy(subject.messages, vocab)).map(lambda t: [t])
    replayed = st.lists(st.sampled_from(traffic), min_size=1, max_size=12)
    return st.lists(st.one_of(forged, replayed), min_size=1, max_size=6).map(
        lambda groups: [a for g in groups for a in g])


def _dropped(cluster: SimCluster, name: str) -> int:
    core = cluster.nodes[name].core
    return -1 if core is None else sum(core.status().dropped.values())


def _hostile(subject: Subject, attacks: list[tuple[str, str, Message]]) -> None:
    cluster = SimCluster(subject, 5)
    for node in cluster.nodes.values():
        node.start()
    cluster.workload(BOOT_NS)
    codec = cluster.codec
    delivered = 0
    for src, dst, message in attacks:
        try:
            wire = codec.decode(codec.encode(message))
        except (EncodeError, DecodeError):
            continue  # cannot travel: no peer can deliver it
        assert isinstance(wire, Message)
        before = _dropped(cluster, dst)
        cluster.nodes[dst].deliver(src, wire)  # must not raise
        delivered += 1
        after = _dropped(cluster, dst)
        assert after >= before, f"{dst}: dropped went from {before} to {after}"
    request = cluster.new_request("after")
    key = (request.client_id, request.request_no)
    cluster.submit(request)
    cluster.settle()
    assert key in cluster.done, "the cluster no longer commits after hostile input"
    assert [str(v) for v in cluster.checker.violations] == []
    assert cluster.problems == []


@pytest.mark.parametrize("subject", SUBJECTS, ids=IDS)
def test_hostile_input_is_dropped_never_raised(subject: Subject) -> None:
    @settings(max_examples=30, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck),
              phases=(Phase.explicit, Phase.generate))  # no shrinking: keeps a failure fast
    @given(attacks=_attacks(subject))
    def check(attacks: list[tuple[str, str, Message]]) -> None:
        _hostile(subject, attacks)

    check()


def _outsider_cases() -> list[ParameterSet]:
    return [pytest.param(subject, cls, id=f"{subject.name}-{cls.__name__}")
            for subject in SUBJECTS for cls in subject.messages]


@pytest.mark.parametrize(("subject", "cls"), _outsider_cases())
def test_message_from_outside_the_cluster_is_counted(subject: Subject, cls: type) -> None:
    """A real message of every wire type, from a node id outside the cluster, to every
    replica: dropped and counted in `status().dropped` (the `Core` contract: a faulty
    peer's input is dropped and counted), never acted on."""
    traffic = captured(subject.name)
    real = [m for _, _, m in traffic if type(m) is cls][:2]
    if not real:  # not in the captured traffic: a plain one
        real = [plain_value(cls, _vocabulary(subject, traffic))]
    cluster = SimCluster(subject, 5)
    for node in cluster.nodes.values():
        node.start()
    cluster.workload(BOOT_NS)
    for dst in cluster.names:
        for message in real:
            before = _dropped(cluster, dst)
            cluster.nodes[dst].deliver("n99", message)
            assert _dropped(cluster, dst) > before, f"{dst} did not count {message}"
