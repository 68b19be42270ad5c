"""Properties 1 and 2 of the conformance suite, for every subject, driven through the
simulator's `Ready` executor (`SimNode`) with crashes inside Readys (`sim_cluster.CUTS`).

1. Persist-before-send: a node crashed after sending a Ready's early messages but before
   persisting it, after persisting but before sending, after sending but before applying,
   or before `Persisted` came back, restarts from its disk only; no message it sent may
   contradict that durable state. Checked by the setup's invariant checker (election
   safety, log matching, leader completeness, committed-durable, agreement, validity) and
   message watch (Raft: one vote per term per voter across restarts; PBFT: one digest per
   (kind, view, seq) per replica), and by every request committing once healed with every
   replica's state equal to one replay of the committed sequence.
2. Exactly once, in order: from every boot of every node (and every checkpoint installed
   from peers), the state machine applies indices start+1, start+2, ... with no gap or
   repeat, the same entry at an index
   everywhere, and after healing every node holds the state of applying the committed
   sequence once.
"""

from __future__ import annotations

import functools

import pytest
from sim_cluster import CUTS, MS, SimCluster
from subjects import IDS, SUBJECTS, Subject

SEEDS = range(6)


@functools.cache
def crashed_run(name: str, seed: int) -> SimCluster:
    subject = next(s for s in SUBJECTS if s.name == name)
    cluster = SimCluster(subject, seed, crash_p=0.08)
    for node in cluster.nodes.values():
        node.start()
    cluster.workload(1_200 * MS)
    cluster.settle()
    return cluster


def _runs(subject: Subject) -> list[SimCluster]:
    return [crashed_run(subject.name, seed) for seed in SEEDS]


@pytest.mark.parametrize("subject", SUBJECTS, ids=IDS)
def test_crash_inside_ready_keeps_safety(subject: Subject) -> None:
    cuts = dict.fromkeys(CUTS, 0)
    for cluster in _runs(subject):
        assert [str(v) for v in cluster.checker.violations] == []
        assert cluster.problems == []
        missing = sorted(k for k in cluster.issued if k not in cluster.done)
        assert missing == [], f"requests never committed after healing: {missing[:5]}"
        reference = cluster.kv(cluster.reference())
        for name, node in cluster.nodes.items():
            assert node.replica is not None
            assert cluster.kv(node.replica) == reference, name
        for point, n in cluster.cuts.items():
            cuts[point] += n
    assert min(cuts.values()) >= 3, f"every crash point must be exercised: {cuts}"


@pytest.mark.parametrize("subject", SUBJECTS, ids=IDS)
def test_applied_exactly_once_in_order_across_restarts(subject: Subject) -> None:
    restarts = from_checkpoint = 0
    for cluster in _runs(subject):
        top = max(cluster.committed)
        for name, segments in cluster.applied.items():
            restarts += sum(s.how == "boot" for s in segments) - 1
            for seg in segments:
                from_checkpoint += seg.how == "boot" and seg.start > 0
                expected = list(range(seg.start + 1, seg.start + 1 + len(seg.indices)))
                assert seg.indices == expected, (name, seg.how, seg.start, seg.indices[:20])
            node = cluster.nodes[name]
            assert node.replica is not None
            assert node.replica.applied_index == top, name
        assert sorted(cluster.committed) == list(range(1, top + 1))
    assert restarts >= 10, restarts
    assert from_checkpoint >= 3, from_checkpoint
