"""Data-driven interaction tests for the Raft core (after etcd-io/raft's testdata/).

Each file in testdata/ is a script (see `tests/datadriven.py` for the format; rewrite the
expected output with ``PHALANX_REWRITE=1`` and review the diff). Commands:

    add-nodes N [start=K] [voters=(..)] [learners=(..)] [<RaftConfig field>=v ...]
    campaign NODE                       propose NODE CMD [CMD ...]      read NODE KEY
    deliver [from=N] [to=N] [type=T] [count=C] [skip=S]    drop [from=N] [to=N] [type=T]
    partition a=(n1) b=(n2,n3)           heal
    crash NODE                          restart NODE
    tick NODE [NODE ...] [count=C]       tick-election NODE
    stabilize                           compact NODE
    conf-change NODE [add=(..)] [remove=(..)] [add-learner=(..)] [remove-learner=(..)]
    transfer-leadership NODE to=N       status NODE [NODE ...]          log NODE [NODE ...]
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import datadriven
import pytest
from raft_harness import Cluster, fmt_entry

from phalanx.consensus.raft import (
    Campaign,
    ConfChange,
    ProposeConfChange,
    TransferLeadership,
)
from phalanx.consensus.types import Message, NodeId

TESTDATA = Path(__file__).parent / "testdata"
_INT_FIELDS = {"election_ticks", "heartbeat_ticks", "max_inflight", "max_batch_entries",
               "max_batch_bytes", "snapshot_chunk_size", "log_tail_after_compaction",
               "log_tail_max_bytes"}
_BOOL_FIELDS = {"pre_vote", "check_quorum"}


def _positional(d: datadriven.TestData) -> list[NodeId]:
    return [NodeId(k) for k, v in d.args.items() if v == () and k.startswith("n")]


def _filter(d: datadriven.TestData) -> Callable[[NodeId, NodeId, Message], bool]:
    src, dst, kind = d.arg("from", ""), d.arg("to", ""), d.arg("type", "")

    def pred(s: NodeId, t: NodeId, m: Message) -> bool:
        return ((not src or s == src) and (not dst or t == dst)
                and (not kind or type(m).__name__ == kind))
    return pred


class Env:
    def __init__(self) -> None:
        self.c = Cluster()

    def handle(self, d: datadriven.TestData) -> str:
        c = self.c
        c.trace = []
        nodes = _positional(d)
        match d.cmd:
            case "add-nodes":
                self._add_nodes(d)
            case "campaign":
                c.step(nodes[0], Campaign())
            case "propose":
                cmds = [k for k in d.args if not k.startswith("n")]
                for i, cmd in enumerate(cmds):
                    c.propose(nodes[0], cmd, request_no=i)
            case "read":
                key = next(k for k in d.args if not k.startswith("n"))
                c.propose(nodes[0], key, read_only=True)
            case "deliver":
                count = d.arg("count", "")
                c.deliver(_filter(d), limit=int(count) if count else None,
                          skip=int(d.arg("skip", "0")))
            case "drop":
                pred = _filter(d)
                for s, t, m in [x for x in c.queue if pred(*x)]:
                    c.trace.append(f"dropped {s}->{t} {m}")
                c.drop(pred)
            case "partition":
                c.partition(*(tuple(NodeId(n) for n in v) for v in d.args.values()))
            case "heal":
                c.heal()
            case "crash":
                c.crash(nodes[0])
            case "restart":
                c.restart(nodes[0])
                c.trace.append(self._status(nodes[0]))
            case "tick":
                for n in nodes:
                    c.tick(n, int(d.arg("count", "1")))
            case "tick-election":
                c.tick_election(nodes[0])
            case "stabilize":
                c.stabilize()
            case "compact":
                c.checkpoint(nodes[0])
                c.trace.append(self._status(nodes[0]))
            case "conf-change":
                change = ConfChange(
                    add_voters=tuple(NodeId(n) for n in d.args.get("add", ())),
                    remove_voters=tuple(NodeId(n) for n in d.args.get("remove", ())),
                    add_learners=tuple(NodeId(n) for n in d.args.get("add-learner", ())),
                    remove_learners=tuple(NodeId(n) for n in d.args.get("remove-learner", ())),
                )
                c.step(nodes[0], ProposeConfChange(change=change))
                err = c.nodes[nodes[0]].core.status().conf_change_error
                if err:
                    c.trace.append(f"refused: {err}")
            case "transfer-leadership":
                c.step(nodes[0], TransferLeadership(to=NodeId(d.arg("to"))))
            case "status":
                c.trace.extend(self._status(n) for n in nodes)
            case "log":
                for n in nodes:
                    node = c.nodes[n]
                    ents = node.core.log.entries
                    c.trace.append(f"{n} log: " + (" | ".join(fmt_entry(e) for e in ents)
                                                   or "(empty)"))
                    c.trace.append(f"{n} app: " + (",".join(node.app) or "(empty)"))
            case _:
                raise ValueError(f"{d.pos}: unknown command {d.cmd!r}")
        return "\n".join(c.trace) + ("\n" if c.trace else "") if c.trace else "ok\n"

    def _add_nodes(self, d: datadriven.TestData) -> None:
        n = int(next(k for k, v in d.args.items() if v == () and k.isdigit()))
        start = int(d.arg("start", "1"))
        ids = tuple(NodeId(f"n{i}") for i in range(start, start + n))
        voters = tuple(NodeId(v) for v in d.args["voters"]) if "voters" in d.args else ids
        learners = tuple(NodeId(v) for v in d.args.get("learners", ()))
        overrides: dict[str, object] = {}
        for k, v in d.args.items():
            if k in _INT_FIELDS:
                overrides[k] = int(v[0])
            elif k in _BOOL_FIELDS:
                overrides[k] = v[0] == "true"
        for nid in ids:
            self.c.add_node(nid, voters, learners, **overrides)

    def _status(self, nid: NodeId) -> str:
        node = self.c.nodes[nid]
        if not node.up:
            return f"{nid} down"
        s = node.core.status()
        cfg = "v=" + ",".join(s.config.voters)
        if s.config.voters_outgoing:
            cfg += " out=" + ",".join(s.config.voters_outgoing)
        if s.config.learners:
            cfg += " l=" + ",".join(s.config.learners)
        line = (f"{nid} {s.role} term={s.term} vote={s.vote or '-'} leader={s.leader or '-'}"
                f" commit={s.commit_index} applied={s.applied} last={s.last_index}@{s.last_term}"
                f" snap={s.snapshot_index} [{cfg}]")
        for p, pr in s.progress.items():
            line += f"\n  {p}: {pr}"
        if s.dropped:
            line += "\n  dropped: " + " ".join(f"{k}={v}" for k, v in s.dropped.items())
        return line


@pytest.mark.parametrize("path", sorted(TESTDATA.glob("*.txt")), ids=lambda p: p.stem)
def test_interaction(path: Path) -> None:
    env = Env()
    datadriven.run_file(path, env.handle)
