"""The delta journal of the leaderless record (`durable.py`) and the crash cases it argues:
exact replay, deltas proportional to the change, released proofs leaving the record once
fsynced, and a restart at every crash point (WAL before journal and the reverse, with and
without losing unsynced WAL data) that neither loses nor doubles an apply."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st
from leaderless_harness import (
    CODEC,
    EPOCH,
    REGISTRY,
    KvApp,
    client_keys,
    endorsement,
    make_tx,
    tx_id,
)

from phalanx.consensus.core import Input, Persisted, Ready, Receive, Tick
from phalanx.consensus.crypto import FastCrypto
from phalanx.consensus.leaderless.config import LeaderlessConfig
from phalanx.consensus.leaderless.core import LeaderlessCore
from phalanx.consensus.leaderless.durable import (
    CATEGORIES,
    OPTIONAL_CATEGORIES,
    SCALARS,
    WHOLE_IF_CHANGED,
    LeaderlessDeltaRules,
    apply_items,
    diff_items,
)
from phalanx.consensus.leaderless.messages import (
    CheckpointDecision,
    LeaderlessDurableState,
    LeaderlessStateDelta,
    StartCheckpoint,
    Transaction,
    TxId,
    VoteRelay,
)
from phalanx.consensus.leaderless.store import TxState
from phalanx.consensus.types import Entry, NodeId
from phalanx.net.codec_fast import unpack

N1, N2, N3 = NodeId("n1"), NodeId("n2"), NodeId("n3")
RULES = LeaderlessDeltaRules()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 5), max_size=30), st.lists(st.integers(0, 5), max_size=30))
def test_diff_items_is_exact_for_any_two_sequences(old: list[int], new: list[int]) -> None:
    removed, added = diff_items(tuple(old), tuple(new))
    assert apply_items(tuple(old), removed, added) == tuple(new)


def test_diff_items_of_a_grown_or_trimmed_tuple_is_the_change() -> None:
    items = tuple(object() for _ in range(10_000))
    grown = (*items, "a", "b")
    assert diff_items(items, grown) == ((), ("a", "b"))
    trimmed = items[:10] + items[11:5000] + items[5001:] + ("c",)
    assert diff_items(items, trimmed) == ((10, 5000), ("c",))
    collected = (*items[3:], "d")  # GC of the oldest, then an append: the fast path
    assert diff_items(items, collected) == ((0, 1, 2), ("d",))
    assert diff_items(items, items[20:]) == (tuple(range(20)), ())  # past it: the walk


def test_the_delta_covers_every_field_of_the_record() -> None:
    """A record field the delta does not carry would be lost on replay: every field of
    `LeaderlessDurableState` is a diffed category or a whole scalar, and the delta has
    exactly their fields."""
    record = {f.name for f in dataclasses.fields(LeaderlessDurableState)}
    tuples = CATEGORIES + OPTIONAL_CATEGORIES
    assert set(tuples) | set(SCALARS) | set(WHOLE_IF_CHANGED) == record
    assert not set(tuples) & set(SCALARS)
    assert {f.name for f in dataclasses.fields(LeaderlessStateDelta)} == set(SCALARS) | set(
        WHOLE_IF_CHANGED) | {f"{c}_{part}" for c in tuples for part in ("removed", "added")}


def _decision(i: int, drop: bool = True) -> CheckpointDecision:
    return CheckpointDecision(tx_ids=(bytes([i]) * 32,), drop=drop)


def test_veto_decisions_replay_exactly_and_older_records_and_deltas_still_load() -> None:
    """`veto_decisions` (None when empty) is left off the wire: a record or delta without
    decisions encodes as before the field existed (so those older bytes decode, to None),
    and a change of decisions is a delta of the change, replayed exactly."""
    plain = LeaderlessDurableState(gc_horizon_ms=5, relays=(_relay(1, "n1"),))
    raw = unpack(REGISTRY.encode(plain))
    assert isinstance(raw, list)
    assert len(raw) == len(dataclasses.fields(LeaderlessDurableState))  # type id + old fields
    assert REGISTRY.decode(REGISTRY.encode(plain)) == plain
    quiet = RULES.diff(plain, dataclasses.replace(plain, gc_horizon_ms=6))
    assert quiet is not None
    raw = unpack(REGISTRY.encode(quiet))
    assert isinstance(raw, list)
    assert len(raw) == len(dataclasses.fields(LeaderlessStateDelta)) - 1  # + id - 2 new

    d1, d2 = _decision(1), _decision(2, drop=False)
    one = dataclasses.replace(plain, veto_decisions=(d1, d2))
    two = dataclasses.replace(plain, veto_decisions=(d2,))
    for old, new in ((plain, one), (one, two), (two, plain), (plain, two)):
        delta = RULES.diff(old, new)
        assert delta is not None
        assert RULES.apply(old, delta) == new
        assert REGISTRY.decode(REGISTRY.encode(delta)) == delta
        assert REGISTRY.decode(REGISTRY.encode(new)) == new
    delta = RULES.diff(one, two)
    assert delta is not None
    assert (delta.veto_decisions_removed, delta.veto_decisions_added) == ((0,), None)
    assert RULES.diff(one, dataclasses.replace(one)) is None


def test_one_more_release_adds_one_index_to_the_delta_not_all_of_them() -> None:
    """`released_at` holds an index per released proof of the horizon: a delta carries
    the change, not the whole tuple (it did: O(rate x horizon) bytes per save)."""
    old = LeaderlessDurableState(released_at=tuple(range(1, 5001)), released=5000)
    new = LeaderlessDurableState(released_at=tuple(range(2, 5002)), released=5000)
    delta = RULES.diff(old, new)
    assert delta is not None
    assert (delta.released_at_removed, delta.released_at_added) == ((0,), (5001,))
    assert len(REGISTRY.encode(delta)) < 100
    assert RULES.apply(old, delta) == new


def _relay(cp: int, voter: str, echo: bytes = b"e", ready: bytes = b"") -> VoteRelay:
    return VoteRelay(checkpoint=bytes((cp,)), voter=NodeId(voter), echo=echo, ready=ready)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["n1", "n2"]),
                          st.booleans()), max_size=8),
       st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["n1", "n2"]),
                          st.booleans()), max_size=8),
       st.integers(0, 10**6), st.lists(st.integers(1, 50), max_size=4))
def test_relays_fence_and_release_indexes_replay_exactly(
        old: list[tuple[int, str, bool]], new: list[tuple[int, str, bool]], fence: int,
        released_at: list[int]) -> None:
    def relays(spec: list[tuple[int, str, bool]]) -> tuple[VoteRelay, ...]:
        return tuple(_relay(cp, v, ready=b"r" if r else b"") for cp, v, r in spec)

    a = LeaderlessDurableState(relays=relays(old))
    b = LeaderlessDurableState(relays=relays(new), fence_until_ms=fence,
                               released_at=tuple(released_at), released=len(released_at))
    delta = RULES.diff(a, b)
    assert (delta is None) == (a == b)
    if delta is not None:
        assert RULES.apply(a, delta) == b
        assert REGISTRY.decode(REGISTRY.encode(delta)) == delta


def _core(app: KvApp, restored: LeaderlessDurableState | None = None,
          entries: tuple[Entry, ...] = ()) -> LeaderlessCore:
    ids = tuple(NodeId(f"n{i}") for i in range(1, 5))
    return LeaderlessCore(LeaderlessConfig(node_id=N1, nodes=ids), crypto=FastCrypto(N1),
                          client_keys=client_keys(), app=app, codec=CODEC, restored=restored,
                          restored_entries=entries)


def _inputs(txs: list[Transaction]) -> list[Input]:
    out: list[Input] = [Tick(now_ms=EPOCH)]
    for tx in txs:
        out.append(Receive(src=N2, message=tx))
        out += [Receive(src=n, message=endorsement(n, tx)) for n in ("n2", "n3")]
    return out


def _txs() -> list[Transaction]:
    txs = [make_tx(f"add x {i}", no=i + 1) for i in range(3)]
    txs.append(make_tx("set y 1", no=9, reqs={"y": b""}))  # a requirement: the gate checks
    return txs


@dataclass
class Disk:
    """What a node's storage holds: the WAL (and how much of it is fsynced) and the journal
    (each save fsynced: `StateJournal`)."""

    wal: list[Entry] = field(default_factory=list)
    synced: int = 0
    record: LeaderlessDurableState | None = None
    records: list[LeaderlessDurableState] = field(default_factory=list)


def _persist(disk: Disk, ready: Ready, *, wal: bool = True, journal: bool = True) -> None:
    if wal:
        disk.wal += ready.entries
    if journal and ready.core_state is not None:
        assert isinstance(ready.core_state, LeaderlessDurableState)
        disk.record = ready.core_state
        disk.records.append(ready.core_state)
    if wal and ready.must_sync:
        disk.synced = len(disk.wal)


def _drive(core: LeaderlessCore, app: KvApp, disk: Disk, inputs: list[Input],
           crash: tuple[int, str] | None = None) -> None:
    """The driver's ordering rule for each input (persist, apply, feed `Persisted`); stops
    at `crash` = (step number, how far that step's Ready got: "none", "wal", "journal",
    "both")."""
    queue = list(inputs)
    k = 0
    while queue:
        ready = core.step(queue.pop(0))
        if crash is not None and k == crash[0]:
            _persist(disk, ready, wal=crash[1] in ("wal", "both"),
                     journal=crash[1] in ("journal", "both"))
            return
        _persist(disk, ready)
        for entry in ready.committed:
            app.apply(entry)
        if ready.number:
            queue.insert(0, Persisted(number=ready.number))
        k += 1


def _ids(entries: list[Entry]) -> list[TxId]:
    out = []
    for e in entries:
        tx = CODEC.decode(e.requests[0].command)
        assert tx is not None
        out.append(tx_id(tx))
    return out


def test_delta_of_each_save_is_small_and_replays_exactly() -> None:
    app, disk = KvApp(), Disk()
    _drive(_core(app), app, disk, _inputs([make_tx(f"add x {i}", no=i + 1)
                                            for i in range(20)]))
    records = disk.records
    assert len(records) > 20
    for old, new in itertools.pairwise(records):
        delta = RULES.diff(old, new)
        if delta is None:
            assert old == new
            continue
        assert RULES.apply(old, delta) == new
        assert len(REGISTRY.encode(delta)) < 1500  # one tx's worth, not the record
    assert len(REGISTRY.encode(records[-1])) > 3000  # 20 txs' own endorsements, tombstones


def test_restart_at_every_crash_point_neither_loses_nor_doubles_an_apply() -> None:
    """Crash at every step, with that step's Ready not persisted, persisted WAL-first (the
    runtime's order), journal-first (the simulator's), or both; with and without the
    unsynced WAL tail; the replica restarting from scratch (the runtime: the core re-emits
    the WAL) or having replayed the WAL (the simulator)."""
    inputs = _inputs(_txs())
    cases = 0
    for k in range(len(inputs) * 2):  # Persisted inputs interleave: cover them too
        for mode in ("none", "wal", "journal", "both"):
            for lose in (False, True):
                for replayed in (False, True):
                    _crash_case(inputs, (k, mode), lose=lose, replayed=replayed)
                    cases += 1
    assert cases > 200


def _crash_case(inputs: list[Input], crash: tuple[int, str], *, lose: bool,
                replayed: bool) -> None:
    app, disk = KvApp(), Disk()
    _drive(_core(app), app, disk, inputs, crash)
    durable = _ids(disk.wal[:disk.synced])  # survives any crash
    if lose:
        disk.wal = disk.wal[:disk.synced]
    held = set(_ids(disk.wal))
    if disk.record is not None:
        held |= {tx_id(p.tx) for p in disk.record.committed}
    app2 = KvApp()
    if replayed:
        for entry in disk.wal:
            app2.apply(entry)
    core = _core(app2, disk.record, tuple(disk.wal))
    for t in _ids(disk.wal):  # every WAL transaction is committed after the restart
        assert core._store.state_of(t) is TxState.COMMITTED
    disk2 = Disk(wal=list(disk.wal))
    _drive(core, app2, disk2, [Tick(now_ms=EPOCH + 10)])
    where = f"crash={crash} lose={lose} replayed={replayed}"
    assert set(durable) <= held <= set(app2.applied_ids), where  # nothing lost
    _drive(core, app2, disk2, inputs[1:])  # the peers re-send: everything commits
    log = _ids(disk2.wal)
    assert [e.index for e in disk2.wal] == list(range(1, len(log) + 1)), where
    assert sorted(log) == sorted(set(log)) == sorted(tx_id(t) for t in _txs()), where


def test_a_wal_only_commit_is_never_voted_dropped_after_a_restart() -> None:
    """Crash after the WAL append, before the journal append: the record never heard of
    the commit; the WAL did. The restarted node must not vote drop on it (it has no proof
    to veto with either: it abstains)."""
    tx = make_tx("add x 1")
    app, disk = KvApp(), Disk()
    _drive(_core(app), app, disk, _inputs([tx]), crash=(4, "wal"))  # the step that commits
    assert len(disk.wal) == 1
    assert disk.record is not None
    assert disk.record.committed == ()
    core = _core(KvApp(), disk.record, tuple(disk.wal))
    ready = core.step(Receive(src=N2, message=StartCheckpoint(tx_ids=(tx_id(tx),))))
    assert [e.index for e in ready.committed] == [1]  # re-emitted from the WAL
    assert ready.entries == ()  # not appended again
    assert not any(getattr(s.message, "drop", False) for s in ready.messages)
    assert core.durable_state().votes == ()


def test_an_idle_commit_survives_its_gc_and_a_crash_that_loses_the_unsynced_wal() -> None:
    """The commit of a transaction this node had endorsed earlier signs nothing: its Ready
    appends the WAL entry without `must_sync` (the record, fsynced by the journal, holds
    the proof). Idle after that (nothing signed, so nothing syncs the WAL), GC past the
    horizon takes the proof out of the record; a machine crash then lost the WAL entry
    too: the commit was gone (applied and answered before). GC must first have the WAL
    synced (a `must_sync` Ready, known durable by its `Persisted`)."""
    tx = make_tx("add x 1")
    app, disk = KvApp(), Disk()
    core = _core(app)
    _drive(core, app, disk, _inputs([tx]))
    assert _ids(disk.wal) == [tx_id(tx)]  # committed ...
    assert disk.synced == 0  # ... its WAL entry not synced
    horizon = LeaderlessConfig(node_id=N1, nodes=(N1,)).gc_horizon_ms
    later = [Tick(now_ms=tx.deadline_ms + horizon + 1 + k) for k in range(3)]
    _drive(core, app, disk, later)
    assert core._store.state_of(tx_id(tx)) is None  # collected
    disk.wal = disk.wal[:disk.synced]  # a machine crash: the unsynced WAL tail is lost
    assert disk.record is not None
    held = set(_ids(disk.wal)) | {tx_id(p.tx) for p in disk.record.committed}
    assert tx_id(tx) in held, "an applied commit lost: neither the WAL nor the record holds it"
