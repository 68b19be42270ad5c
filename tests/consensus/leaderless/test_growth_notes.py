"""Growth notes (`durable.py`, `growing.py`): a `GrowingTuple` equals its model list after
any appends, head removals and resets, and its `Growth` turns the marked base into it; on
a cluster of cores built with ``growth_notes``, every journal diff taken from the notes is
the delta the comparison finds, and it replays to the record, whichever records the journal
skips (group commit writes only a batch's last one), through commits, aborts, GC and a
restart; and a real `StateJournal` over those records (compactions included) loads the
last one saved."""

from __future__ import annotations

import itertools
import random
import threading

from hypothesis import given, settings
from hypothesis import strategies as st
from leaderless_harness import CODEC, Cluster, KvApp, Node, client_keys, make_tx, version

from phalanx.consensus.core import Input, Ready
from phalanx.consensus.crypto import FastCrypto
from phalanx.consensus.leaderless import durable
from phalanx.consensus.leaderless.config import LeaderlessConfig
from phalanx.consensus.leaderless.core import LeaderlessCore
from phalanx.consensus.leaderless.durable import CATEGORIES, LeaderlessDeltaRules, diff_items
from phalanx.consensus.leaderless.growing import GrowingTuple
from phalanx.consensus.leaderless.messages import (
    LEADERLESS_MESSAGES,
    DecidedTx,
    LeaderlessDurableState,
)
from phalanx.consensus.types import NodeId
from phalanx.net import wire
from phalanx.runtime.persistence import StateJournal
from phalanx.storage.memory import MemoryDirectory

OPS = st.lists(st.tuples(st.sampled_from(["append", "extend", "pop", "pop", "reset", "read"]),
                         st.integers(0, 5)), max_size=60)


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_a_growing_tuple_matches_its_model_and_its_growth(ops: list[tuple[str, int]]) -> None:
    grown: GrowingTuple[int] = GrowingTuple(range(3))
    model = list(range(3))
    base = grown.value()
    grown.growth.mark()
    fresh = 100
    for op, k in ops:
        if op == "append":
            grown.append(fresh)
            model.append(fresh)
            fresh += 1
        elif op == "extend":
            grown.extend(range(fresh, fresh + k))
            model += range(fresh, fresh + k)
            fresh += k
        elif op == "pop" and model:
            assert grown.head() == model[0]
            grown.pop_head()
            model.pop(0)
        elif op == "reset":
            model = list(range(fresh, fresh + k))
            fresh += k
            grown.reset(model)
        assert len(grown) == len(model)
        if op == "read":
            now = grown.value()
            assert now == tuple(model)
            assert grown.value() is now  # the same tuple until a change
            growth = grown.growth.of(now)
            if growth is not None:
                trimmed, added = growth
                assert base[trimmed:] + added == now
            base = now
            grown.growth.mark()
    assert grown.value() == tuple(model)


def noted_core(node: NodeId, ids: tuple[NodeId, ...], config: dict[str, object], app: KvApp,
               durable: LeaderlessDurableState | None, recovering: bool) -> LeaderlessCore:
    """A core with growth notes on, as a real node builds it."""
    cfg = LeaderlessConfig(node_id=node, nodes=ids, **config)  # type: ignore[arg-type]
    return LeaderlessCore(cfg, crypto=FastCrypto(node), client_keys=client_keys(), app=app,
                          codec=CODEC, restored=durable, recovering=recovering,
                          growth_notes=True)


class JournalCluster(Cluster):
    """Cores with growth notes; each node's records go through a simulated journal that
    saves a random subset of them (in order), checking every delta."""

    def __init__(self, **config: object) -> None:
        self.journal_rng = random.Random(7)
        self.rules = LeaderlessDeltaRules()
        self.saved: dict[NodeId, LeaderlessDurableState] = {}
        self.saves = 0
        super().__init__(**config)

    def _make(self, node: NodeId, app: KvApp, durable: LeaderlessDurableState | None,
              recovering: bool = False) -> Node:
        core = noted_core(node, self.ids, self.config, app, durable, recovering)
        if durable is not None:
            self.saved[node] = durable  # a restart's journal starts from the loaded record
        return Node(core=core, app=app, crypto=FastCrypto(node), durable=durable)

    def step(self, node: NodeId, inp: Input) -> Ready:
        ready = super().step(node, inp)
        state = ready.core_state
        if isinstance(state, LeaderlessDurableState) and self.journal_rng.random() < 0.6:
            last = self.saved.get(node)
            if last is not None:
                delta = self.rules.diff(last, state)
                for name in CATEGORIES:  # what the comparison alone finds
                    expected = diff_items(getattr(last, name), getattr(state, name))
                    got = ((getattr(delta, f"{name}_removed"), getattr(delta, f"{name}_added"))
                           if delta is not None else ((), ()))
                    assert got == expected, name
                assert (self.rules.apply(last, delta) if delta is not None else last) == state
                self.saves += 1
            self.saved[node] = state
        return ready


def test_noted_deltas_are_the_compared_ones_through_commits_aborts_gc_and_a_restart() -> None:
    c = JournalCluster(gc_horizon_ms=300)
    c.tick(100)
    no = 0
    for round_ in range(12):
        for k in range(6):
            no += 1
            key = f"k{round_}-{k}" if k % 3 else "hot"  # every third one conflicts
            tx = make_tx(f"set {key} v{no}", client=f"c{k % 2 + 1}", no=no,
                         reqs={key: version(None)}, deadline=c.now + 250)
            c.submit(tx, to=c.ids if k % 2 else c.ids[:3])
        c.deliver()
        c.tick(100, rounds=2)
        if round_ == 6:
            c.restart(NodeId("n2"))
    c.tick(100, rounds=10)  # past every deadline and the horizon: GC trims the heads
    assert c.saves > 100
    assert c.rules.noted > 100  # the notes were used, not only the comparison
    assert len({tuple(sorted(s.items())) for s in c.states()}) == 1


class RealJournalCluster(Cluster):
    """Cores with growth notes whose records n1 saves through a real `StateJournal` (tiny
    compaction threshold: full rewrites between the deltas), as a node's persistence does."""

    def __init__(self, **config: object) -> None:
        self.directory = MemoryDirectory("journal")
        self.rules = LeaderlessDeltaRules()
        self.journal = StateJournal(self.directory, codec=wire.default_registry(),
                                    rules=self.rules, compact_bytes=20_000)
        self.last: LeaderlessDurableState | None = None
        super().__init__(**config)

    def _make(self, node: NodeId, app: KvApp, durable: LeaderlessDurableState | None,
              recovering: bool = False) -> Node:
        core = noted_core(node, self.ids, self.config, app, durable, recovering)
        return Node(core=core, app=app, crypto=FastCrypto(node), durable=durable)

    def step(self, node: NodeId, inp: Input) -> Ready:
        ready = super().step(node, inp)
        if node == NodeId("n1") and isinstance(ready.core_state, LeaderlessDurableState):
            self.journal.save_state(ready.core_state)
            self.last = ready.core_state
        return ready


def test_a_state_journal_fed_with_noted_records_loads_the_last_one() -> None:
    wire.register_all(LEADERLESS_MESSAGES)
    c = RealJournalCluster(gc_horizon_ms=300)
    c.tick(100)
    no = 0
    for _ in range(10):
        for k in range(5):
            no += 1
            tx = make_tx(f"set key{no} v", client=f"c{k % 2 + 1}", no=no,
                         reqs={f"key{no}": version(None)}, deadline=c.now + 250)
            c.submit(tx, to=c.ids)
        c.deliver()
        c.tick(100, rounds=2)
    c.tick(100, rounds=8)
    assert c.journal.compactions > 1
    assert c.journal.appends > 20
    assert c.rules.noted > 20
    loaded = StateJournal(c.directory, codec=wire.default_registry(),
                          rules=LeaderlessDeltaRules()).load_state()
    assert loaded == c.last


def test_notes_are_taken_on_one_thread_while_another_adds_them() -> None:
    """A real node's journal diffs on the persistence worker thread while the core adds
    notes on its task: the chain walk must never see the notes change under it."""
    base = LeaderlessDurableState(decided=())
    records = [base]
    for i in range(1, 400):  # a line of records, one tombstone appended per record
        records.append(LeaderlessDurableState(decided=(*records[-1].decided, DecidedTx(
            tx_id=i.to_bytes(32, "big"), deadline_ms=i, committed=True))))
    errors: list[BaseException] = []
    done = threading.Event()

    def noise() -> None:  # another core's notes, added and evicted all the time
        other = [LeaderlessDurableState(gc_horizon_ms=i) for i in range(64)]
        while not done.is_set():
            for a, b in itertools.pairwise(other):
                durable.note_growth(a, b, {})

    durable.guard_notes(threading.Lock())  # as a real node does (leaderless_node)
    rules = LeaderlessDeltaRules()
    thread = threading.Thread(target=noise)
    thread.start()
    try:
        for old, new in itertools.pairwise(records):
            durable.note_growth(old, new, {"decided": (0, new.decided[-1:])})
            try:
                delta = rules.diff(old, new)
            except RuntimeError as e:  # "deque mutated during iteration"
                errors.append(e)
                continue
            assert delta is not None
            assert rules.apply(old, delta) == new
    finally:
        done.set()
        thread.join()
    assert not errors
