"""The default registry: stable ids of the shared consensus types, reserved ranges,
`register_all`, and round trips of the shared types."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.consensus.types import (
    ClientRequest,
    Configuration,
    Entry,
    EntryKind,
    HardState,
    Message,
    NodeId,
    SnapshotMeta,
)
from phalanx.net import wire
from phalanx.net.codec import DecodeError, Registry


def test_shared_type_ids_are_stable() -> None:
    # The ids are the wire format: this table may only ever grow.
    assert dict(wire.SHARED_TYPES) == {
        1: ClientRequest,
        2: Configuration,
        3: Entry,
        4: HardState,
        5: SnapshotMeta,
    }
    registry = wire.default_registry()
    assert {tid: registry.classes()[tid] for tid in wire.SHARED_TYPES} == dict(wire.SHARED_TYPES)
    assert registry.unregistered() == ()
    assert wire.default_registry() is registry


def test_golden_bytes_of_an_entry() -> None:
    """Any change to these bytes is a wire-format break between versions."""
    entry = Entry(
        index=1,
        term=2,
        kind=EntryKind.COMMAND,
        requests=(ClientRequest(client_id="c", request_no=3, command=b"x"),),
    )
    golden = bytes.fromhex("9603010201919501a16303c40178c2c0")
    assert wire.encode(entry) == golden
    assert wire.canonical_bytes(entry) == golden
    assert wire.decode(golden, expected=Entry) == entry


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64) | st.sampled_from([
    bytes.fromhex("9603010201919501a16303c40178c2c0"),  # the golden entry
    bytes.fromhex("9603010201919501a16303c40178c2"),  # cut short
    bytes.fromhex("9604010201919501a16303c40178c2c0"),  # a HardState's id
    bytes.fromhex("9603010201919501a163a133c40178c2c0"),  # request_no a str
]))
def test_decode_entry_matches_decode(data: bytes) -> None:
    """`wire.decode_entry` (the WAL replay's hot path) returns what `decode(expected=Entry)`
    returns, and raises a `DecodeError` with the same message where it raises."""
    def outcome(decode: Callable[[bytes], object]) -> object:
        try:
            return decode(data)
        except DecodeError as exc:
            return ("DecodeError", str(exc))

    assert outcome(wire.decode_entry) == outcome(lambda d: wire.decode(d, expected=Entry))


def test_ranges_do_not_overlap_and_cover_the_shared_ids() -> None:
    owners = list(wire.RANGES.values())
    ids = [i for r in owners for i in r]
    assert len(ids) == len(set(ids))
    assert all(tid in wire.RANGES["shared"] for tid in wire.SHARED_TYPES)


@dataclass(frozen=True, slots=True, kw_only=True)
class Ping(Message):
    term: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Pong(Message):
    term: int


def test_register_all_checks_ranges_and_is_idempotent() -> None:
    registry = Registry()
    with pytest.raises(TypeError, match=r"type ids \[50, 700\] lie outside"):
        wire.register_all({150: Ping, 50: Pong, 700: Pong}, registry=registry)
    assert registry.classes() == {}  # nothing registered when an id is out of range
    wire.register_all({150: Ping, 151: Pong}, registry=registry)
    wire.register_all({150: Ping}, registry=registry)
    with pytest.raises(TypeError, match="type id 150 is already Ping"):
        wire.register_all({150: Pong}, registry=registry)
    data = registry.encode(Ping(term=3))
    assert registry.decode(data, expected=Message) == Ping(term=3)
    with pytest.raises(DecodeError, match="unknown type id 150"):
        wire.decode(data)


node_ids = st.sampled_from(["n1", "n2", "n3", "n4", "n5"]).map(NodeId)
requests = st.builds(
    ClientRequest,
    client_id=st.text(max_size=8),
    request_no=st.integers(min_value=0, max_value=2**64 - 1),
    command=st.binary(max_size=32),
    read_only=st.booleans(),
)


@st.composite
def configurations(draw: st.DrawFn) -> Configuration:
    members = draw(st.lists(node_ids, unique=True, min_size=1))
    learners = draw(st.sets(st.sampled_from(members)))
    voters = sorted(set(members) - learners) or [NodeId("n9")]
    outgoing = draw(st.lists(node_ids.filter(lambda n: n not in learners), unique=True))
    return Configuration(
        voters=tuple(voters),
        voters_outgoing=tuple(sorted(outgoing)),
        learners=tuple(sorted(learners)),
    )


@st.composite
def entries(draw: st.DrawFn) -> Entry:
    kind = draw(st.sampled_from(EntryKind))
    return Entry(
        index=draw(st.integers(min_value=1, max_value=2**63)),
        term=draw(st.integers(min_value=0, max_value=2**63)),
        kind=kind,
        requests=tuple(draw(st.lists(requests, min_size=1, max_size=4)))
        if kind is EntryKind.COMMAND
        else (),
        config=draw(configurations()) if kind is EntryKind.CONFIG else None,
    )


hard_states = st.builds(
    HardState,
    term=st.integers(min_value=0, max_value=2**63),
    vote=st.none() | node_ids,
    view=st.integers(min_value=0, max_value=2**63),
    commit=st.integers(min_value=0, max_value=2**63),
)
snapshots = st.builds(
    SnapshotMeta,
    index=st.integers(min_value=0, max_value=2**63),
    term=st.integers(min_value=0, max_value=2**63),
    config=configurations(),
)


@settings(deadline=None)  # CI shares 2 cores: no per-example timing
@given(st.one_of(entries(), hard_states, snapshots, requests, configurations()))
def test_shared_types_round_trip(obj: object) -> None:
    data = wire.encode(obj)
    assert wire.decode(data, canonical=True) == obj


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("960300020090c0", "Entry rejected its fields: log indexes start at 1"),
        ("960301020190c0", "Entry rejected its fields: a COMMAND entry carries requests"),
        ("960301020290c0", "a CONFIG entry carries a configuration"),
        ("960301020090940291a1619091a161", "Entry.config: Configuration rejected"),
        ("960301020390c0", "Entry.kind: 3 is not a EntryKind"),
        ("9501a16301c4007a", "ClientRequest.read_only: expected bool, got int"),
        ("940292a26e32a26e319090", "Configuration rejected its fields: .* sorted and unique"),
    ],
)
def test_shared_type_invariants_become_decode_errors(raw: str, message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        wire.decode(bytes.fromhex(raw))
