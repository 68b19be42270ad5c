"""PBFT's incremental durable state: `PbftDeltaRules` replays exactly, and `StateJournal`
keeps the last saved record across crashes, torn tails, compaction and an upgrade from the
whole-file store, with one fsync per save."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.consensus.pbft import PBFT_MESSAGES, PbftDurableState
from phalanx.consensus.pbft.durable import PbftDeltaRules, PbftStateDelta
from phalanx.consensus.pbft.messages import (
    Checkpoint,
    Prepare,
    PreparedProof,
    PrePrepare,
    SafetyData,
    SignedVote,
    VoteKind,
)
from phalanx.consensus.types import ClientRequest, NodeId
from phalanx.net import wire
from phalanx.runtime.persistence import JOURNAL_NAME, StateJournal
from phalanx.storage.hardstate import FileHardStateStore
from phalanx.storage.interface import CorruptionError
from phalanx.storage.memory import MemoryDirectory

wire.register_all(PBFT_MESSAGES)
CODEC = wire.default_registry()
RULES = PbftDeltaRules()


def _vote(kind: int, view: int, seq: int, tag: int) -> SignedVote:
    return SignedVote(kind=VoteKind(kind), view=view, seq=seq, digest=bytes([tag]) * 4,
                      signature=b"s" + bytes([tag]))


def _proof(view: int, seq: int, size: int) -> PreparedProof:
    batch = tuple(ClientRequest(client_id="c", request_no=i, command=b"x" * 20)
                  for i in range(size))
    pp = PrePrepare(view=view, seq=seq, digest=bytes([size]) * 4, batch=batch,
                    replica=NodeId("n0"), signature=b"sig")
    prepares = tuple(Prepare(view=view, seq=seq, digest=pp.digest, replica=NodeId(f"n{i}"))
                     for i in (1, 2))
    return PreparedProof(pre_prepare=pp, prepares=prepares)


@st.composite
def states(draw: st.DrawFn) -> PbftDurableState:
    """Canonical records: votes sorted by key and unique, certificates sorted by seq."""
    stable = draw(st.integers(0, 6))
    floor = draw(st.sampled_from([stable, 0]))
    keys = draw(st.sets(st.tuples(st.integers(0, 1), st.integers(0, 2), st.integers(0, 12)),
                        max_size=10))
    votes = tuple(_vote(k, v, s, draw(st.integers(0, 3))) for k, v, s in sorted(keys))
    seqs = draw(st.sets(st.integers(0, 12), max_size=6))
    prepared = tuple(_proof(draw(st.integers(0, 2)), s, draw(st.integers(0, 2)))
                     for s in sorted(seqs))
    proof = tuple(Checkpoint(seq=stable, digest=b"d", replica=NodeId(f"n{i}"))
                  for i in range(draw(st.integers(0, 3))))
    return PbftDurableState(view=draw(st.integers(0, 3)), view_active=draw(st.booleans()),
                            stable_seq=stable, stable_digest=bytes([stable]),
                            stable_proof=proof,
                            safety=SafetyData(floor=floor, votes=votes,
                                              early_view=draw(st.integers(-1, 3))),
                            prepared=prepared)


@settings(max_examples=200, deadline=None)
@given(states(), states())
def test_delta_replays_exactly(old: PbftDurableState, new: PbftDurableState) -> None:
    _replayed_delta(old, new)


def _replayed_delta(old: PbftDurableState, new: PbftDurableState) -> PbftStateDelta | None:
    """The delta from `old` to `new` (None when they are equal), checked to bring `old` to
    exactly `new` after a codec round trip."""
    delta = RULES.diff(old, new)
    if old == new:
        assert delta is None
        return None
    assert delta is not None
    assert RULES.apply(old, CODEC.decode(CODEC.encode(delta))) == new
    return delta


@st.composite
def successors(draw: st.DrawFn) -> tuple[PbftDurableState, PbftDurableState]:
    """A record and a next one sharing most of its objects (what the core hands the
    journal): some votes and certificates kept as they are, some dropped, some replaced by
    an equal copy or a different one, some added."""
    old = draw(states())
    nxt = draw(states())

    def mix(a: tuple, b: tuple, key) -> tuple:  # type: ignore[no-untyped-def,type-arg]
        merged = {}
        for item in a:
            fate = draw(st.sampled_from(["keep", "drop", "copy"]))
            if fate == "keep":
                merged[key(item)] = item
            elif fate == "copy":
                merged[key(item)] = dataclasses.replace(item)
        for item in b:
            if draw(st.booleans()):
                merged[key(item)] = item
        return tuple(merged[k] for k in sorted(merged))

    votes = mix(old.safety.votes, nxt.safety.votes, lambda v: (int(v.kind), v.view, v.seq))
    prepared = mix(old.prepared, nxt.prepared, lambda p: p.pre_prepare.seq)
    new = dataclasses.replace(nxt, safety=dataclasses.replace(nxt.safety, votes=votes),
                              prepared=prepared)
    return old, new


@settings(max_examples=80, deadline=None)
@given(successors())
def test_delta_replays_exactly_between_related_records(
    pair: tuple[PbftDurableState, PbftDurableState],
) -> None:
    old, new = pair
    delta = _replayed_delta(old, new)
    if delta is None:
        return
    kept = {id(v) for v in old.safety.votes}
    assert all(id(v) not in kept for v in delta.votes)  # shared objects are never re-sent


def test_delta_carries_only_what_changed() -> None:
    certs = tuple(_proof(0, s, 64) for s in range(1, 60))
    old = PbftDurableState(prepared=certs)
    new = PbftDurableState(prepared=(*certs, _proof(0, 60, 64)),
                           safety=SafetyData(votes=(_vote(1, 0, 60, 1),)))
    delta = RULES.diff(old, new)
    assert delta is not None
    assert len(CODEC.encode(delta)) * 30 < len(CODEC.encode(new))
    assert RULES.apply(old, delta) == new


class CountingDirectory(MemoryDirectory):
    def __init__(self) -> None:
        super().__init__("journal")
        self.fsyncs = 0

    def fsync(self, name: str) -> None:
        self.fsyncs += 1
        super().fsync(name)

    def fsync_dir(self) -> None:
        self.fsyncs += 1
        super().fsync_dir()


def _journal(d: MemoryDirectory, compact_bytes: int = 8 << 20) -> StateJournal:
    return StateJournal(d, codec=CODEC, rules=RULES, compact_bytes=compact_bytes)


@settings(max_examples=40, deadline=None)
@given(st.lists(states(), min_size=1, max_size=8), st.integers(0, 2**32))
def test_journal_survives_crashes_and_compaction(history: list[PbftDurableState],
                                                 seed: int) -> None:
    rng = random.Random(seed)
    d = MemoryDirectory("j")
    j = _journal(d, compact_bytes=rng.choice([1, 400, 8 << 20]))
    for state in history:
        j.save_state(state)
        if rng.random() < 0.4:
            d.crash(rng)  # everything saved is durable: a crash loses nothing
            j = _journal(d, compact_bytes=j._compact_bytes)
        assert _journal(d).load_state() == state


def test_one_fsync_per_save_after_the_first() -> None:
    d = CountingDirectory()
    j = _journal(d)
    assert j.load_state() is None
    j.save_state(PbftDurableState(view=1))
    first = d.fsyncs  # the first record creates the file: file fsync + directory fsync
    for seq in range(1, 20):
        j.save_state(PbftDurableState(view=1, prepared=tuple(_proof(1, s, 2)
                                                              for s in range(1, seq + 1))))
    assert d.fsyncs - first == 19
    assert j.appends == 19
    assert j.compactions == 1
    j.save_state(PbftDurableState(view=1, prepared=tuple(_proof(1, s, 2) for s in range(1, 20))))
    assert d.fsyncs - first == 19  # unchanged record: nothing written


def test_torn_final_record_is_dropped_and_the_journal_goes_on() -> None:
    d = MemoryDirectory("j")
    j = _journal(d)
    a, b = PbftDurableState(view=1), PbftDurableState(view=2)
    j.save_state(a)
    size = d.size(JOURNAL_NAME)
    j.save_state(b)
    d.tear(JOURNAL_NAME, d.size(JOURNAL_NAME) - 3)
    j2 = _journal(d)
    assert j2.load_state() == a
    assert d.size(JOURNAL_NAME) == size
    c = PbftDurableState(view=3)
    j2.save_state(c)
    assert _journal(d).load_state() == c


def test_a_damaged_record_before_the_end_is_corruption() -> None:
    d = MemoryDirectory("j")
    j = _journal(d)
    j.save_state(PbftDurableState(view=1))
    j.save_state(PbftDurableState(view=2, stable_digest=b"x" * 64))
    j.save_state(PbftDurableState(view=3))
    data = bytearray(d.read(JOURNAL_NAME))
    data[-60] ^= 0x10  # inside the middle record's payload
    d.create(JOURNAL_NAME)
    d.append(JOURNAL_NAME, bytes(data))
    with pytest.raises(CorruptionError):
        _journal(d).load_state()


def test_upgrade_from_the_whole_file_store() -> None:
    d = MemoryDirectory("j")
    old = PbftDurableState(view=5, safety=SafetyData(votes=(_vote(0, 5, 1, 1),)))
    FileHardStateStore(d).save(CODEC.encode(old))
    j = _journal(d)
    assert j.load_state() == old
    new = PbftDurableState(view=6, safety=old.safety)
    j.save_state(new)
    assert _journal(d).load_state() == new
