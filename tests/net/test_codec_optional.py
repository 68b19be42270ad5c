"""Trailing ``wire_optional`` fields (`phalanx.net.codec`): left off the array at their default,
so adding one keeps the bytes of every message that does not use it; one encoding per value
(present at its default is refused); misuse raises at registration."""

from __future__ import annotations

from dataclasses import dataclass, field

import msgpack  # type: ignore[import-untyped]
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.consensus.types import ClientRequest, Entry, EntryKind
from phalanx.net import wire
from phalanx.net.codec import DecodeError, Registry

OPT = {"wire_optional": True}


@dataclass(frozen=True, slots=True, kw_only=True)
class Stamped:
    x: int
    ts: int = field(default=0, metadata=OPT)
    who: str = field(default="", metadata=OPT)


@dataclass(frozen=True, slots=True, kw_only=True)
class Plain:
    x: int


def registry() -> Registry:
    r = Registry()
    r.register(7, Stamped)
    r.register(8, Plain)
    return r


def test_defaults_are_left_off_and_bytes_match_the_class_without_the_fields() -> None:
    r = registry()
    assert r.encode(Stamped(x=5)) == r.encode(Plain(x=5)).replace(b"\x08", b"\x07", 1)
    assert msgpack.unpackb(r.encode(Stamped(x=5, ts=3))) == [7, 5, 3]
    assert msgpack.unpackb(r.encode(Stamped(x=5, who="n1"))) == [7, 5, 0, "n1"]


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**63 - 1), st.integers(0, 2**40), st.text(max_size=5))
def test_round_trip_is_canonical(x: int, ts: int, who: str) -> None:
    r = registry()
    obj = Stamped(x=x, ts=ts, who=who)
    assert r.decode(r.encode(obj), canonical=True) == obj


@pytest.mark.parametrize("raw", [[7, 1, 0], [7, 1, 2, ""], [7, 1, 0, ""]])
def test_a_present_default_is_refused(raw: list[object]) -> None:
    with pytest.raises(DecodeError, match="non-canonical"):
        registry().decode(msgpack.packb(raw))


@pytest.mark.parametrize("raw", [[7], [7, 1, 2, "a", 3]])
def test_arity_still_checked(raw: list[object]) -> None:
    with pytest.raises(DecodeError, match="fields"):
        registry().decode(msgpack.packb(raw))


def test_misuse_raises_at_registration() -> None:
    @dataclass(frozen=True, slots=True, kw_only=True)
    class NotTrailing:
        a: int = field(default=0, metadata=OPT)
        b: int = 0

    @dataclass(frozen=True, slots=True, kw_only=True)
    class NotScalar:
        a: tuple[int, ...] = field(default=(), metadata=OPT)

    with pytest.raises(TypeError, match="come last"):
        Registry().register(9, NotTrailing)
    with pytest.raises(TypeError, match="scalar"):
        Registry().register(9, NotScalar)


def test_an_unstamped_entry_keeps_its_bytes_and_repr() -> None:
    request = ClientRequest(client_id="c", request_no=1, command=b"x")
    entry = Entry(index=3, term=2, kind=EntryKind.COMMAND, requests=(request,))
    assert msgpack.unpackb(wire.encode(entry))[:1] == [3]
    assert len(msgpack.unpackb(wire.encode(entry))) == 6  # type id + the five old fields
    assert "timestamp" not in repr(entry)
    stamped = Entry(index=3, term=2, kind=EntryKind.COMMAND, requests=(request,),
                    timestamp=1_700_000_000_000, proposer="n1")
    assert wire.decode_entry(wire.encode(stamped)) == stamped
    assert stamped != entry
    assert hash(stamped) != hash(entry)
