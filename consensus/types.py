"""Vocabulary shared by every consensus core: ids, client requests, log entries, hard state.

Rules:
- Pure data. This module imports nothing from trio, sockets, clocks or random.
- Every type is a frozen, slotted, keyword-only dataclass with immutable fields, so it can be
  hashed, compared, put in a trace and encoded by `phalanx.net.codec` without copying.
- Protocol messages subclass `Message`; the codec registers each concrete message class
  under a stable type id (see `phalanx.net.wire`).
- Plain declarations: the hot records (`ClientRequest`, `Entry`, `HardState`:
  `TYPES_HOT_RECORDS`) get the cheaper ``__init__`` of the private
  `phalanx.consensus._raw_init` at the end of this module (the same objects); the other
  builders live in `phalanx.consensus._fastpath`.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import NewType

from phalanx.consensus._raw_init import raw_init

NodeId = NewType("NodeId", str)
"""A replica's identity: stable across restarts, unique in a cluster (e.g. ``"n1"``)."""


class LocalProtocolError(Exception):
    """Our own misuse of a core or a contract (a bug in the caller), never a faulty peer.

    A faulty or Byzantine peer's input is dropped and counted by the core; it never raises.
    """


def omit_default_repr(obj: object) -> str:
    """The dataclass repr of `obj` without its ``wire_optional`` fields that hold their
    default, so a field added that way changes neither the wire bytes nor the text (traces,
    logs) of objects that do not use it."""
    parts = []
    for f in dataclasses.fields(obj):  # type: ignore[arg-type]
        value = getattr(obj, f.name)
        if f.metadata.get("wire_optional") and value == f.default:
            continue
        parts.append(f"{f.name}={value!r}")
    return f"{type(obj).__qualname__}({', '.join(parts)})"


class Message:
    """Base class of every protocol message. Subclasses are frozen slotted dataclasses."""

    __slots__ = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientRequest:
    """One client command, the unit that the replica layer deduplicates and applies.

    Attributes:
        client_id: the client's session id.
        request_no: strictly increasing per client; a retry reuses the same number, and the
            replica layer answers a retry from its session table instead of applying twice.
        command: the application's command, opaque to consensus (encoded by the app).
        read_only: a query that does not change state; cores may serve it without a log
            entry (Raft ReadIndex) but never without establishing linearizability.
    """

    client_id: str
    request_no: int
    command: bytes
    read_only: bool = False

    def __post_init__(self) -> None:
        if self.request_no < 0:
            raise ValueError(f"request_no must be >= 0, got {self.request_no}")

    def __eq__(self, other: object) -> bool:
        # The dataclass-generated `__eq__` (the same result: same class, then field by field
        # in order), without building two tuples: the simulator's checkers compare every
        # applied entry's requests across nodes. `__hash__` stays the generated one.
        if not isinstance(other, ClientRequest) or other.__class__ is not self.__class__:
            return NotImplemented
        return (self.client_id == other.client_id and self.request_no == other.request_no
                and self.command == other.command and self.read_only == other.read_only)


class EntryKind(enum.IntEnum):
    """What a log entry carries."""

    NOOP = 0
    """Appended by a new leader to commit entries of earlier terms (Raft §5.4.2)."""
    COMMAND = 1
    """A batch of client requests, applied in order."""
    CONFIG = 2
    """A membership change; `Entry.config` holds the new configuration."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Configuration:
    """A cluster membership: voters, an optional outgoing voter set (joint consensus), learners.

    Invariant: `voters_outgoing` is non-empty exactly while a joint configuration is in force.
    Tuples are kept sorted so that equal configurations compare and encode equal.
    """

    voters: tuple[NodeId, ...]
    voters_outgoing: tuple[NodeId, ...] = ()
    learners: tuple[NodeId, ...] = ()
    addresses: str = field(default="", metadata={"wire_optional": True})
    """Peer addresses of members that joined after bootstrap, so running nodes can link to
    them: ``id=host:port`` items sorted by id, comma-separated ("" for none; left off the
    wire then). Opaque to the cores; `phalanx.consensus.raft.confchange` carries it from
    one configuration to the next and drops removed members'; a runtime reads it
    (`address_map`) and ignores an item it cannot parse."""

    __repr__ = omit_default_repr

    def __post_init__(self) -> None:
        for name in ("voters", "voters_outgoing", "learners"):
            value: tuple[NodeId, ...] = getattr(self, name)
            if list(value) != sorted(set(value)):
                raise ValueError(f"Configuration.{name} must be sorted and unique: {value!r}")
        overlap = set(self.learners) & (set(self.voters) | set(self.voters_outgoing))
        if overlap:
            raise ValueError(f"a node cannot be both voter and learner: {sorted(overlap)}")

    @property
    def joint(self) -> bool:
        return bool(self.voters_outgoing)

    def members(self) -> tuple[NodeId, ...]:
        """Every node that receives replication, sorted (voters of both halves and learners)."""
        return tuple(sorted(set(self.voters) | set(self.voters_outgoing) | set(self.learners)))


def address_map(addresses: str) -> dict[str, str]:
    """`Configuration.addresses` as ``{id: "host:port"}`` (items without ``=`` skipped)."""
    out: dict[str, str] = {}
    for item in addresses.split(","):
        node, sep, address = item.partition("=")
        if sep and node and address:
            out[node] = address
    return out


def format_addresses(addresses: dict[str, str]) -> str:
    """The canonical `Configuration.addresses` text of `addresses` (sorted by id)."""
    return ",".join(f"{node}={addresses[node]}" for node in sorted(addresses))


@dataclass(frozen=True, slots=True, kw_only=True)
class Entry:
    """One position of the replicated log (Raft) or one sequence number (PBFT).

    Invariant: `kind == COMMAND` iff `requests` is non-empty; `kind == CONFIG` iff `config`
    is set.

    Block stamp (only for an app that asks for block time, i.e. has `BatchHooks`; otherwise
    0 and "", which the codec leaves off the wire, so such entries encode as before):
    `timestamp` is the proposer's clock (ms since the epoch) agreed with the entry, and
    `proposer` the node that proposed it. Both are covered by what consensus agreed on
    (PBFT: the batch digest), so they are identical on every replica.
    """

    index: int
    term: int
    kind: EntryKind
    requests: tuple[ClientRequest, ...] = ()
    config: Configuration | None = None
    timestamp: int = field(default=0, metadata={"wire_optional": True})
    proposer: str = field(default="", metadata={"wire_optional": True})

    def __post_init__(self) -> None:
        if self.index < 1:
            raise ValueError(f"log indexes start at 1, got {self.index}")
        if (self.kind is EntryKind.COMMAND) != bool(self.requests):
            raise ValueError("a COMMAND entry carries requests and only a COMMAND entry does")
        if (self.kind is EntryKind.CONFIG) != (self.config is not None):
            raise ValueError("a CONFIG entry carries a configuration and only a CONFIG entry does")

    def __eq__(self, other: object) -> bool:
        # The dataclass-generated `__eq__` (see `ClientRequest.__eq__`); `requests` compares
        # element by element with identity first, as the generated tuple comparison does.
        if not isinstance(other, Entry) or other.__class__ is not self.__class__:
            return NotImplemented
        return (self.index == other.index and self.term == other.term
                and self.kind == other.kind and self.requests == other.requests
                and self.config == other.config and self.timestamp == other.timestamp
                and self.proposer == other.proposer)

    __repr__ = omit_default_repr


@dataclass(frozen=True, slots=True, kw_only=True)
class HardState:
    """What a core must find again after a crash, written atomically before dependent sends.

    Attributes:
        term: Raft's current term (0 for cores without terms).
        vote: the candidate voted for in `term`, if any (Raft).
        view: PBFT's current view (0 for cores without views).
        commit: the highest index known committed; restoring it is an optimisation, never a
            safety requirement.
    """

    term: int = 0
    vote: NodeId | None = None
    view: int = 0
    commit: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotMeta:
    """Where a checkpoint sits in the log: the last index and term it covers, and the
    membership in force at that index."""

    index: int
    term: int
    config: Configuration


TYPES_HOT_RECORDS: tuple[type, ...] = (ClientRequest, Entry, HardState)
"""This module's records built once or more per message: `raw_init` gives each its cheaper
``__init__`` here, once (`phalanx.consensus._fastpath.HOT_RECORDS`)."""

for _cls in TYPES_HOT_RECORDS:
    raw_init(_cls)
