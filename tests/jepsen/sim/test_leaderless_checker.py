"""The leaderless workload and checker, as pure code: a fake cluster of KV replicas that
applies what it is told, in the order it is told, so each check can be made to pass and to
fail on purpose."""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections.abc import Sequence

from phalanx.apps import kv_ops, kv_wire
from phalanx.apps.kv import KvStateMachine
from phalanx.apps.kv_types import Done, Put
from phalanx.consensus.leaderless.messages import Requirement, Transaction
from phalanx.consensus.types import ClientRequest
from phalanx.jepsen.sim.leaderless_checker import QUIESCENCE_GRACE_MS, ApplyLog, check, quiescence
from phalanx.jepsen.sim.leaderless_workload import (
    FAIL,
    INFO,
    OK,
    LeaderlessWorkload,
    TxRecord,
    WorkloadConfig,
)
from phalanx.jepsen.sim.loop import EventLoop

NODES = ("n1", "n2", "n3", "n4")
DONE = kv_wire.encode_result(Done())
_MS = 1_000_000


def conflicts(a: bytes, b: bytes) -> bool:
    m = KvStateMachine()
    return m.access(a).conflicts_with(m.access(b), m.commutes)


class FakeCluster:
    """Records submissions; `apply_at(node, record)` applies one transaction at one
    replica (logging it like the simulator's recording state machine)."""

    def __init__(self) -> None:
        self.machines = {n: KvStateMachine() for n in NODES}
        self.log = ApplyLog()
        self.submitted: list[tuple[str, ClientRequest]] = []

    def submit(self, node: str, request: ClientRequest) -> None:
        self.submitted.append((node, request))

    def versions(self, node: str, keys: Sequence[str], *, base: bool = False
                 ) -> tuple[bytes, ...] | None:
        m = self.machines[node]
        return m.base_versions(keys) if base else m.versions(keys)

    def apply_at(self, node: str, record: TxRecord, incarnation: int = 1) -> bytes:
        m = self.machines[node]
        keys = sorted(set(m.access(record.command).writes) | set(m.access(record.command).reads))
        before = tuple(zip(keys, m.versions(keys), m.base_versions(keys), strict=True))
        self.log.record(node, incarnation, record.command, before)
        tx_id = hashlib.sha256(repr(record.tx).encode()).digest()
        return m.apply_tx(tx_id, record.command)  # transaction mode, as the replica runs it

    def finals(self, keys: Sequence[str]) -> dict[str, dict[str, bytes | None]]:
        return {n: {k: m.get(k) for k in keys} for n, m in self.machines.items()}


def workload(cluster: FakeCluster, loop: EventLoop, **kw: int) -> LeaderlessWorkload:
    return LeaderlessWorkload(
        WorkloadConfig(**kw),  # type: ignore[arg-type]
        loop=loop, rng=random.Random(7), nodes=NODES, faults=1, transport=cluster,
        sign=lambda tx: dataclasses.replace(tx, signature=b"sig:" + tx.client.encode()),
        encode_tx=lambda tx: repr(tx).encode(), now_ms=lambda: loop.now // _MS,
    )


def judge(cluster: FakeCluster, w: LeaderlessWorkload, honest: Sequence[str] = NODES
          ) -> list[str]:
    return check(records=w.records, log=cluster.log, finals=cluster.finals(w.config.keys),
                 honest=honest, faults=1, conflicts=conflicts)


def run_all(cluster: FakeCluster, w: LeaderlessWorkload, order: Sequence[str] = NODES
            ) -> None:
    """Apply every issued transaction at every node, in issue order, answering the client."""
    for record in w.records:
        for node in order:
            result = cluster.apply_at(node, record)
            w.answer(node, record.tx.client_id, record.tx.request_no, result)


def test_workload_signs_submits_to_all_and_records_ok_after_f_plus_one() -> None:
    loop, cluster = EventLoop(), FakeCluster()
    w = workload(cluster, loop)
    r = w.issue("c0", ("add", "a0"))
    assert r.tx.signature == b"sig:c0"
    assert r.tx.requirements == (Requirement(key="a0", version=b"", base=True),)
    assert sorted(n for n, _ in cluster.submitted) == list(NODES)
    w.answer("n1", "c0", 1, DONE)
    assert r.outcome is None
    w.answer("n1", "c0", 1, DONE)  # the same node twice counts once
    assert r.outcome is None
    w.answer("n2", "c0", 1, DONE)
    assert r.outcome == OK


def test_put_requires_the_version_f_plus_one_nodes_report() -> None:
    loop, cluster = EventLoop(), FakeCluster()
    for n in ("n1", "n2", "n3"):
        cluster.machines[n].apply(kv_wire.encode_command(Put(key="r0", value=b"x")))
    r = workload(cluster, loop).issue("c0", ("put", "r0"))
    assert r.tx.requirements[0].version == kv_ops.version_of(b"x")


def test_aborts_make_fail_and_silence_makes_info() -> None:
    loop, cluster = EventLoop(), FakeCluster()
    w = workload(cluster, loop, short_pct=0, deadline_max_ms=300)
    a = w.issue("c0", ("add", "a0"))
    b = w.issue("c1", ("add", "a0"))
    w.abort("n1", "c0", 1)
    w.abort("n3", "c0", 1)
    assert a.outcome == FAIL
    loop.run_until(10_000 * _MS)
    assert b.outcome == INFO


def test_a_closed_loop_run_of_honest_replicas_passes() -> None:
    loop, cluster = EventLoop(), FakeCluster()
    w = workload(cluster, loop, ops_per_client=4)
    w.start()
    # Decide each transaction at once as it is issued (a trivially correct "protocol"):
    # applied everywhere when its requirements hold, else aborted everywhere.
    for _ in range(200):
        loop.run_until(loop.now + 5 * _MS)
        for record in w.records:
            if record.outcome is not None or record.results or record.aborted_by:
                continue
            tx = record.tx
            held = all(cluster.versions("n1", (q.key,)) == (q.version,)
                       for q in tx.requirements)
            for node in NODES:
                if held:
                    cluster.apply_at(node, record)
                    w.answer(node, tx.client_id, tx.request_no, DONE)
                else:
                    w.abort(node, tx.client_id, tx.request_no)
    assert len(w.records) >= 12
    assert w.ok + w.failed == len(w.records)
    assert w.ok >= 6
    assert {r.kind for r in w.records} >= {"add", "put"}
    assert judge(cluster, w) == []


def test_divergence_a_double_apply_and_an_unapplied_ok_are_caught() -> None:
    loop, cluster = EventLoop(), FakeCluster()
    w = workload(cluster, loop)
    a = w.issue("c0", ("add", "a0"))
    run_all(cluster, w, order=("n1", "n2", "n3"))  # n4 never applies it
    problems = judge(cluster, w)
    assert any(p.startswith("converge:") for p in problems)
    assert any(p.startswith("folds:") and "n4" in p for p in problems)
    cluster.apply_at("n4", a)
    assert judge(cluster, w) == []
    cluster.apply_at("n4", a)  # twice in one incarnation
    problems = judge(cluster, w)
    assert any(p.startswith("once:") for p in problems)
    assert any(p.startswith("folds:") for p in problems)


def test_an_aborted_transaction_that_applied_is_caught() -> None:
    loop, cluster = EventLoop(), FakeCluster()
    w = workload(cluster, loop)
    a = w.issue("c0", ("add", "a0"))
    w.abort("n1", "c0", 1)
    w.abort("n2", "c0", 1)
    for node in NODES:
        cluster.apply_at(node, a)
    assert any(p.startswith("outcomes:") and "abort" in p for p in judge(cluster, w))


def test_conflicting_puts_in_two_orders_break_order_and_requirements() -> None:
    loop, cluster = EventLoop(), FakeCluster()
    w = workload(cluster, loop)
    a = w.issue("c0", ("put", "r0"))
    b = w.issue("c1", ("put", "r0"))  # both require "absent": they conflict
    for node in ("n1", "n2"):
        cluster.apply_at(node, a)
        cluster.apply_at(node, b)
    for node in ("n3", "n4"):
        cluster.apply_at(node, b)
        cluster.apply_at(node, a)
    problems = judge(cluster, w)
    assert any(p.startswith("order:") for p in problems)
    assert any(p.startswith("requirements:") for p in problems)
    assert any(p.startswith("converge:") for p in problems)
    # A Byzantine replica's executions are not judged.
    assert not any(p.startswith("order:") for p in judge(cluster, w, honest=("n1", "n2")))


def test_commuting_adds_in_any_order_converge_and_fold() -> None:
    loop, cluster = EventLoop(), FakeCluster()
    w = workload(cluster, loop)
    records = [w.issue(f"c{i}", ("add", "a0")) for i in range(3)]
    records += [w.issue(f"c{i}", ("sadd", "s0")) for i in range(3)]
    rng = random.Random(3)
    for node in NODES:
        order = list(records)
        rng.shuffle(order)
        for record in order:
            cluster.apply_at(node, record)
    assert judge(cluster, w) == []
    total = sum(int(kv_wire.decode_command(r.command).amount)  # type: ignore[union-attr]
                for r in records[:3])
    assert cluster.machines["n1"].get("a0") == str(total).encode()


def test_validity_an_unissued_command_is_caught() -> None:
    loop, cluster = EventLoop(), FakeCluster()
    w = workload(cluster, loop)
    forged = TxRecord(client="x", kind="add", key="a0", invoked_ns=0,
                      tx=Transaction(client="x", client_id="x", request_no=1, deadline_ms=1,
                                     requirements=(), command=b"junk"))
    cluster.log.record("n1", 1, forged.command, ())
    assert any(p.startswith("validity:") for p in judge(cluster, w))


def test_an_install_starts_a_new_stretch_for_once_and_order() -> None:
    """A replica that installs a checkpoint applies again what the checkpoint lacks
    (docs/LEADERLESS.md "The livelock, fixed"): n4 applies a and b, installs a state
    holding neither (here: an empty one) and applies a and b again. With the install
    logged that is one apply each per stretch; without it, `once` and `order` fire."""
    loop, cluster = EventLoop(), FakeCluster()
    w = workload(cluster, loop)
    w.issue("c0", ("put", "r0"))
    run_all(cluster, w)
    w.issue("c1", ("put", "r0"))  # requires a's version: after a everywhere
    for node in NODES:
        cluster.apply_at(node, w.records[-1])
        w.answer(node, "c1", 1, DONE)
    plain = ApplyLog(runs={k: list(v) for k, v in cluster.log.runs.items()})
    cluster.log.installed("n4", 1)
    for log in (cluster.log, plain):
        for command, before in cluster.log.runs[("n1", 1)]:  # a, then b, as at n1
            log.record("n4", 1, command, before)
    assert judge(cluster, w) == []
    problems = check(records=w.records, log=plain, finals=cluster.finals(w.config.keys),
                     honest=NODES, faults=1, conflicts=conflicts)
    assert any(p.startswith("once:") for p in problems)
    assert any(p.startswith("order:") for p in problems)


def test_quiescence_reports_only_a_transaction_pending_past_its_settling_time() -> None:
    """A node still holding a transaction whose deadline passed more than `delta_old_ms` +
    `QUIESCENCE_GRACE_MS` before the end is reported; a younger one (it may still be
    checkpointed and decided) and a node with nothing pending are not."""
    now, delta_old = 10_000, 1_000
    settle = now - delta_old - QUIESCENCE_GRACE_MS
    pending = {"n1": (2, settle), "n2": (1, settle + 1), "n3": (0, 0)}
    assert quiescence(pending, now_ms=now, delta_old_ms=delta_old) == [
        f"quiescence: n1 holds 2 pending transaction(s), the oldest {now - settle} ms past "
        "its deadline at the end (never committed or dropped)"]
    assert quiescence({}, now_ms=now, delta_old_ms=delta_old) == []
