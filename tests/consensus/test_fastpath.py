"""`phalanx.consensus._fastpath`. `raw_init`: the hot records' cheaper ``__init__`` builds
the same objects as the dataclass-generated one, keeps their validation, and refuses classes
it cannot serve; `maker` / `slot_twin`: the positional builders (through a layout twin) do
the same; and every hot record has the cheaper ``__init__``."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from phalanx.consensus._fastpath import (
    HOT_RECORDS,
    make_ready,
    maker,
    new_persisted,
    new_receive,
    new_send,
    raw_init,
    slot_twin,
)
from phalanx.consensus.core import Persisted, Ready, Receive, Send
from phalanx.consensus.raft.messages import (
    AppendEntries,
    AppendEntriesResponse,
    Heartbeat,
    HeartbeatResponse,
    RequestVote,
    new_append_entries,
    new_append_entries_response,
    new_heartbeat,
    new_heartbeat_response,
)
from phalanx.consensus.types import (
    ClientRequest,
    Entry,
    EntryKind,
    HardState,
    NodeId,
)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Plain:
    """The generated-``__init__`` twin of `_Fast` (the reference behaviour)."""

    a: int
    b: str = "x"
    c: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.a < 0:
            raise ValueError("a must be >= 0")


@raw_init
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Fast:
    a: int
    b: str = "x"
    c: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.a < 0:
            raise ValueError("a must be >= 0")


@given(a=st.integers(min_value=0), b=st.text(max_size=5), c=st.lists(st.integers(), max_size=3))
def test_raw_init_builds_what_the_generated_init_builds(a: int, b: str, c: list[int]) -> None:
    fast, plain = _Fast(a=a, b=b, c=tuple(c)), _Plain(a=a, b=b, c=tuple(c))
    assert dataclasses.astuple(fast) == dataclasses.astuple(plain)
    assert fast == _Fast(a=a, b=b, c=tuple(c))
    assert hash(fast) == hash(_Fast(a=a, b=b, c=tuple(c)))
    assert repr(fast) == repr(plain).replace("_Plain", "_Fast")
    assert dataclasses.replace(fast, a=a + 1).a == a + 1
    assert _Fast(a=a) == _Fast(a=a, b="x", c=())  # defaults


def test_raw_init_keeps_keyword_only_frozen_and_validation() -> None:
    with pytest.raises(TypeError):
        _Fast(1)  # type: ignore[misc]  # keyword-only
    with pytest.raises(TypeError):
        _Fast()  # type: ignore[call-arg]  # required field missing
    with pytest.raises(TypeError):
        _Fast(a=1, d=2)  # type: ignore[call-arg]  # unknown field
    with pytest.raises(ValueError, match="a must be"):
        _Fast(a=-1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        _Fast(a=1).a = 2  # type: ignore[misc]
    assert getattr(_Fast.__init__, "__raw_init__", False)


def test_hot_records_still_validate() -> None:
    with pytest.raises(ValueError, match="log indexes start at 1"):
        Entry(index=0, term=1, kind=EntryKind.NOOP)
    with pytest.raises(ValueError, match="COMMAND entry carries requests"):
        Entry(index=1, term=1, kind=EntryKind.COMMAND)
    with pytest.raises(ValueError, match="request_no"):
        ClientRequest(client_id="c", request_no=-1, command=b"")
    assert HardState() == HardState(term=0, vote=None, view=0, commit=0)
    e = Entry(index=2, term=1, kind=EntryKind.COMMAND,
              requests=(ClientRequest(client_id="c", request_no=1, command=b"x"),))
    m = AppendEntries(term=1, leader_id=NodeId("n1"), prev_log_index=1, prev_log_term=1,
                      entries=(e,), leader_commit=1)
    assert m == dataclasses.replace(m)
    assert hash(m) == hash(dataclasses.replace(m))
    assert RequestVote(term=1, candidate_id=NodeId("n1"), last_log_index=0,
                       last_log_term=0).pre_vote is False


@dataclasses.dataclass(slots=True, kw_only=True)
class _NotFrozen:
    """Refused by `raw_init`, `maker` and `slot_twin` (mutable)."""

    a: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class _NoSlots:
    """Refused by `raw_init`, `maker` and `slot_twin` (no slots)."""

    a: int


def test_raw_init_refuses_what_it_cannot_serve() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Positional:
        a: int

    @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
    class Factory:
        a: list[int] = dataclasses.field(default_factory=list)

    for cls in (_NotFrozen, _NoSlots, Positional, Factory, int):
        with pytest.raises(TypeError):
            raw_init(cls)


def test_make_ready_builds_the_keyword_ready() -> None:
    e = Entry(index=1, term=1, kind=EntryKind.NOOP)
    send = Send(to=NodeId("n2"), message=RequestVote(
        term=1, candidate_id=NodeId("n1"), last_log_index=0, last_log_term=0))
    hs = HardState(term=1, vote=NodeId("n1"))
    fast = make_ready(3, (send,), None, 2, (e,), hs, True, (send, send), (e,), (), ())
    slow = Ready(number=3, early_messages=(send,), truncate_from=2, entries=(e,), hard_state=hs,
                 must_sync=True, messages=(send, send), committed=(e,))
    assert fast == slow
    assert fast.core_state is None
    assert fast.has_persistence


@given(a=st.integers(min_value=0), b=st.text(max_size=5), c=st.lists(st.integers(), max_size=3))
def test_maker_builds_what_the_keyword_constructor_builds(a: int, b: str, c: list[int]) -> None:
    make = maker(_Fast)
    fast, slow = make(a, b, tuple(c)), _Fast(a=a, b=b, c=tuple(c))
    assert type(fast) is _Fast
    assert fast == slow
    assert hash(fast) == hash(slow)
    assert repr(fast) == repr(slow)
    assert dataclasses.replace(fast) == slow
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.a = 2  # type: ignore[misc]
    assert maker(_Fast) is make  # cached


def test_maker_keeps_validation_and_refuses_what_it_cannot_serve() -> None:
    with pytest.raises(ValueError, match="a must be"):
        maker(_Fast)(-1, "x", ())
    with pytest.raises(ValueError, match="log indexes start at 1"):
        maker(Entry)(0, 1, EntryKind.NOOP, (), None, 0, "")
    with pytest.raises(TypeError):
        maker(_Fast)(1, "x")  # every field, positionally

    class Base:
        __slots__ = ()

        def __init__(self) -> None:
            pass

    @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
    class CustomBase(Base):
        a: int

    for cls in (_NotFrozen, _NoSlots, CustomBase, int):
        with pytest.raises(TypeError):
            slot_twin(cls)
        with pytest.raises(TypeError):
            maker(cls)


def test_hot_path_makers_build_the_keyword_records() -> None:
    n1, n2 = NodeId("n1"), NodeId("n2")
    e = Entry(index=2, term=1, kind=EntryKind.COMMAND,
              requests=(ClientRequest(client_id="c", request_no=1, command=b"x"),))
    ae = AppendEntries(term=3, leader_id=n1, prev_log_index=1, prev_log_term=1, entries=(e,),
                       leader_commit=1)
    pairs: list[tuple[object, object]] = [
        (new_append_entries(3, n1, 1, 1, (e,), 1), ae),
        (new_append_entries_response(3, True, 2, 0, 0, 0),
         AppendEntriesResponse(term=3, success=True, match_index=2)),
        (new_heartbeat(3, n1, 1, 7), Heartbeat(term=3, leader_id=n1, leader_commit=1, context=7)),
        (new_heartbeat_response(3, 7, 2), HeartbeatResponse(term=3, context=7, lost_from=2)),
        (new_send(n2, ae), Send(to=n2, message=ae)),
        (new_receive(n1, ae), Receive(src=n1, message=ae)),
        (new_persisted(4), Persisted(number=4)),
    ]
    for fast, slow in pairs:
        assert type(fast) is type(slow)
        assert fast == slow
        assert hash(fast) == hash(slow)


_requests = st.builds(
    ClientRequest,
    client_id=st.sampled_from(["c1", "c2"]),
    request_no=st.integers(0, 2),
    command=st.sampled_from([b"", b"x"]),
    read_only=st.booleans(),
)
_entries = st.builds(
    Entry,
    index=st.integers(1, 2),
    term=st.integers(0, 1),
    kind=st.just(EntryKind.COMMAND),
    requests=st.lists(_requests, min_size=1, max_size=2).map(tuple),
)


@given(a=_entries, b=_entries)
def test_hand_written_eq_is_the_generated_one(a: Entry, b: Entry) -> None:
    """`Entry` and `ClientRequest` spell out the dataclass `__eq__`: equal exactly when
    every field is, in which case the (generated) hashes agree; other classes are not
    equal."""
    fields_equal = dataclasses.astuple(a) == dataclasses.astuple(b)
    assert (a == b) is fields_equal
    assert (a != b) is not fields_equal
    if fields_equal:
        assert hash(a) == hash(b)
    ra, rb = a.requests[0], b.requests[0]
    assert (ra == rb) is (dataclasses.astuple(ra) == dataclasses.astuple(rb))
    assert a != (a.index, a.term, a.kind, a.requests, a.config)
    assert ra != "c1"
    assert a == dataclasses.replace(a, requests=tuple(dataclasses.replace(r) for r in a.requests))


def test_every_hot_record_has_the_cheaper_init() -> None:
    """`types` and `core` apply `raw_init` to the contract's hot records at import (the
    declarations stay plain), and Raft's messages keep theirs: the codec's fast decoder
    relies on it."""
    from phalanx.consensus import raft
    from phalanx.consensus.core import ReadState, Rejection, Submit

    contract = (ClientRequest, Entry, HardState, Receive, Submit, Persisted, Send, ReadState,
                Rejection, Ready)
    assert set(HOT_RECORDS) == set(contract)
    for cls in (*contract, *raft.RAFT_MESSAGES.values()):
        assert getattr(cls.__init__, "__raw_init__", False), cls
