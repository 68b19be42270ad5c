"""A seeded random schedule over the test harness: message loss, duplication and reordering,
partitions, crashes and restarts, proposals, reads, membership changes and checkpoints.

`run_schedule` returns the violations of Raft's safety properties it observed (empty when
the run is safe): Election Safety (one leader per term), State Machine Safety (the harness
itself checks every applied index against every other node's), Log Matching over committed
prefixes, and Leader Completeness (a leader holds every entry committed before its term).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from raft_harness import Cluster

from phalanx.consensus.core import Receive
from phalanx.consensus.raft import Campaign, ConfChange, ProposeConfChange
from phalanx.consensus.types import NodeId


@dataclass
class Outcome:
    violations: list[str] = field(default_factory=list)
    committed: int = 0
    deliveries: int = 0
    leaders: dict[int, NodeId] = field(default_factory=dict)


def _check(c: Cluster, out: Outcome) -> None:
    for nid, node in c.nodes.items():
        core = node.core
        if not node.up:
            continue
        if core.role.value == "leader":
            prev = out.leaders.setdefault(core.term, nid)
            if prev != nid:
                out.violations.append(f"two leaders in term {core.term}: {prev} and {nid}")
            # Leader Completeness: every entry applied anywhere in an earlier term is held.
            for idx, e in c.committed_at.items():
                if e.term < core.term and idx > core.log.offset:
                    t = core.log.term_at(idx)
                    if t is not None and t != e.term:
                        out.violations.append(
                            f"leader {nid} term {core.term} lacks committed {idx}@{e.term}")
        try:
            core.log.check_invariants()
        except AssertionError as err:
            out.violations.append(f"{nid}: {err}")


def run_schedule(seed: int, *, steps: int = 400, nodes: int = 3,
                 bugs: frozenset[str] = frozenset(), membership: bool = False,
                 crash_rate: float = 0.02, campaign_rate: float = 0.0,
                 **config: object) -> Outcome:
    rng = random.Random(seed)
    c = Cluster(bugs=bugs, **{"election_ticks": 4, "snapshot_chunk_size": 8,
                              "log_tail_after_compaction": 2, "max_inflight": 4, **config})
    c.verbose = False
    c.add_nodes(nodes)
    ids = list(c.nodes)
    if membership:
        c.add_node(NodeId(f"n{nodes + 1}"), ())
    out = Outcome()
    req = 0
    for _ in range(steps):
        r = rng.random()
        nid = rng.choice(ids)
        try:
            if rng.random() < campaign_rate:
                c.step(nid, Campaign())
            elif r < 0.40 and c.queue:
                i = rng.randrange(len(c.queue)) if rng.random() < 0.3 else 0
                src, dst, msg = c.queue[i]
                if rng.random() < 0.9:
                    del c.queue[i]  # else: duplicated (delivered and kept)
                if (src, dst) not in c.blocked and c.nodes[dst].up:
                    out.deliveries += 1
                    c.step(dst, Receive(src=src, message=msg))
            elif r < 0.50 and c.queue:
                del c.queue[rng.randrange(len(c.queue))]
            elif r < 0.70:
                c.tick(nid)
            elif r < 0.82:
                req += 1
                c.propose(nid, f"v{req}", request_no=req, read_only=rng.random() < 0.2)
            elif r < 0.84:
                c.step(nid, Campaign())
            elif r < 0.86 or rng.random() < crash_rate:
                if c.nodes[nid].up:
                    c.crash(nid)
                else:
                    c.restart(nid)
            elif r < 0.88:
                k = rng.randrange(1, len(ids))
                c.partition(tuple(ids[:k]), tuple(ids[k:]))
            elif r < 0.90:
                c.heal()
            elif r < 0.92 and c.nodes[nid].up and c.nodes[nid].applied_index > 0:
                c.checkpoint(nid)
            elif r < 0.94 and membership:
                extra = NodeId(f"n{nodes + 1}")
                cfg = c.nodes[nid].core.config
                if extra in cfg.voters:
                    change = ConfChange(remove_voters=(extra,))
                elif extra in cfg.learners:
                    change = ConfChange(add_voters=(extra,))
                else:
                    change = ConfChange(add_learners=(extra,))
                c.step(nid, ProposeConfChange(change=change))
        except AssertionError as err:  # the harness's State Machine Safety check
            out.violations.append(str(err))
            return out
        _check(c, out)
        if out.violations:
            return out
    # Liveness: heal, restart everyone, and let the cluster settle.
    c.heal()
    for nid in ids:
        if not c.nodes[nid].up:
            c.restart(nid)
    try:
        for _ in range(60):
            for nid in ids:
                c.tick(nid)
            c.stabilize()
        leader = c.leader()
        if leader is None:
            out.violations.append("liveness: no leader after healing")
        else:
            c.propose(leader, "final", client="final")
            for _ in range(5):
                for nid in ids:
                    c.tick(nid)
                c.stabilize()
            members = c.nodes[leader].core.config.members()
            for nid in members:
                if "final" not in c.nodes[nid].app:
                    out.violations.append(f"liveness: {nid} did not apply the final write")
    except AssertionError as err:
        out.violations.append(str(err))
    _check(c, out)
    out.committed = max(n.core.commit for n in c.nodes.values())
    return out
