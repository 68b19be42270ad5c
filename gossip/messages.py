"""Gossip wire messages: rumor spreading (GP calls), anti-entropy and SWIM membership.

Owns: the wire types of `phalanx.gossip` and their stable codec ids `GOSSIP_MESSAGES`
(550-579, inside the "runtime" range 500-599 of `phalanx.net.wire`; 500-505 are the client
protocol's). Register them with ``phalanx.net.wire.register_all(GOSSIP_MESSAGES)``.

Must not import: `phalanx.net` (the codec registers these classes, not the reverse), trio,
clocks, random.

Who signs what:
- A `Rumor` is signed by its ORIGIN (`signature` covers the rumor with that field emptied).
  Every node verifies it before delivering or forwarding it; a forwarder cannot alter it.
- A `Grant`'s `seed` is not signed: it must equal `wave_seed(...)` of the signed `seed` of
  the grant's own rumors (so it is as authentic as they are), whose signed `wave` must be
  the grant's.
  `lo`/`hi` are the caller's word, and a receiver never contacts a position of a wave
  twice whatever grants say.
- A `MemberUpdate` saying ALIVE is signed by the node it is about. Suspect/dead updates and
  the probe/anti-entropy messages are unsigned: they count as the sender's, which the
  transport authenticates (`Receive.src`).

Invariants: every class is a frozen, slotted, keyword-only dataclass of ints, strs, bytes,
enums, tuples or nested registered dataclasses (canonical encoding); `__post_init__` rejects
shapes no correct node produces (negative numbers, lo > hi), so the codec drops them.
"""

from __future__ import annotations

import enum
import functools
import hashlib
from dataclasses import dataclass

from phalanx.consensus.types import Message, NodeId


class MemberStatus(enum.IntEnum):
    """SWIM's view of a member. Ref: Das et al., SWIM (DSN 2002) §4.2; memberlist state.go."""

    ALIVE = 0
    SUSPECT = 1
    DEAD = 2


def _non_negative(**values: int) -> None:
    for name, value in values.items():
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")


@dataclass(frozen=True, slots=True, kw_only=True, order=True)
class RumorId(Message):
    """A rumor's identity: the `seq`-th rumor `origin` published in its `incarnation`."""

    origin: NodeId
    incarnation: int
    seq: int

    def __post_init__(self) -> None:
        _non_negative(incarnation=self.incarnation, seq=self.seq)


@dataclass(frozen=True, slots=True, kw_only=True)
class Rumor(Message):
    """An application payload published by `origin`, signed by it.

    `wave` is the number of the origin's wave (batch) that carries it and `seed` the random
    seed the origin drew for that wave (equal in all its rumors). Both are signed: a
    forwarder can neither mint new waves out of authentic rumors (each would cost every node
    up to n-1 more calls) nor change a wave's permutation; and any non-empty subset of a
    wave's rumors names the same permutation, so dropping rumors from a grant only loses
    those rumors (anti-entropy restores them), never the wave's structure."""

    origin: NodeId
    incarnation: int
    seq: int
    wave: int
    seed: bytes
    payload: bytes
    signature: bytes = b""

    def __post_init__(self) -> None:
        _non_negative(incarnation=self.incarnation, seq=self.seq, wave=self.wave)
        if len(self.seed) > 64:
            raise ValueError(f"seed of {len(self.seed)} bytes (at most 64)")

    @property
    def rumor_id(self) -> RumorId:
        # Hot (twice per rumor a node takes): `RumorId(origin=..., incarnation=..., seq=...)`
        # without re-running the checks this rumor's `__post_init__` already passed.
        rid = object.__new__(RumorId)
        object.__setattr__(rid, "origin", self.origin)
        object.__setattr__(rid, "incarnation", self.incarnation)
        object.__setattr__(rid, "seq", self.seq)
        return rid

    def __str__(self) -> str:
        return f"Rumor {self.origin}/{self.incarnation}/{self.seq} |p|={len(self.payload)}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Grant(Message):
    """"You now own positions [lo, hi) of wave `wave`'s permutation" (protocols.md §3.2's
    RUMOR message). A wave is one batch of rumors from `origin`, spread by GP interval
    splitting over a permutation of the other members drawn from `seed`; `instance` tells
    the f+1 independent instances of the same batch apart. An empty range (lo == hi) just
    delivers the rumors."""

    origin: NodeId
    incarnation: int
    wave: int
    instance: int
    seed: bytes
    lo: int
    hi: int
    rumors: tuple[Rumor, ...]

    def __post_init__(self) -> None:
        _non_negative(incarnation=self.incarnation, wave=self.wave, instance=self.instance,
                      lo=self.lo, hi=self.hi)
        if self.lo > self.hi:
            raise ValueError(f"empty interval must have lo <= hi, got [{self.lo}, {self.hi})")


@functools.lru_cache(maxsize=4096)
def wave_seed(origin: NodeId, incarnation: int, wave: int, instance: int,
              seed: bytes) -> bytes:
    """The permutation seed of one instance of a wave: SHA-256 over the wave's id, the
    instance and the origin's signed `Rumor.seed`, so instances are independent and no
    forwarder can steer a permutation. Memoised (bounded, least recently used out): a pure
    function of its arguments, checked by every callee of a wave, so the memo changes no
    value and no decision, only how often the same hash is computed in one process."""
    h = hashlib.sha256(b"phalanx-gossip-wave\x00")
    h.update(f"{origin}\x00{incarnation}\x00{wave}\x00{instance}\x00".encode())
    h.update(seed)
    return h.digest()


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberUpdate(Message):
    """SWIM's alive/suspect/dead message about `node` at `incarnation`, piggy-backed.
    `source` names who first suspected or declared it (Lifeguard counts independent
    suspicions); it is `node` itself for alive. An alive update is signed by `node` (only a
    node can say it lives at a new incarnation, so no one can keep a crashed node alive);
    suspect and dead are unsigned (a false one is refuted by the node itself)."""

    node: NodeId
    status: MemberStatus
    incarnation: int
    source: NodeId
    signature: bytes = b""

    def __post_init__(self) -> None:
        if self.incarnation < 0:  # hot: one check, not `_non_negative`
            raise ValueError(f"incarnation must be >= 0, got {self.incarnation}")

    def __str__(self) -> str:
        return f"{self.status.name.lower()}({self.node}, {self.incarnation})"


@dataclass(frozen=True, slots=True, kw_only=True)
class Call(Message):
    """One GP contact: the grants (several waves may share a contact) and piggy-backed
    membership updates. The callee answers `CallAck(call_id)` iff it accepted every grant
    and `call_id` is not 0 (0: the caller wants no ack, as nothing depends on the outcome of
    a call whose grants are all empty once it keeps its share at once: `parallel_calls`)."""

    call_id: int
    grants: tuple[Grant, ...]
    updates: tuple[MemberUpdate, ...] = ()

    def __post_init__(self) -> None:
        _non_negative(call_id=self.call_id)


@dataclass(frozen=True, slots=True, kw_only=True)
class CallAck(Message):
    """The transport-level ACK of §3.2, explicit: the callee took ownership of the grants."""

    call_id: int
    updates: tuple[MemberUpdate, ...] = ()

    def __post_init__(self) -> None:
        _non_negative(call_id=self.call_id)


@dataclass(frozen=True, slots=True, kw_only=True)
class Ping(Message):
    """SWIM probe of the receiver (`target` names it, so a stale address is noticed)."""

    seq: int
    target: NodeId
    updates: tuple[MemberUpdate, ...] = ()

    def __post_init__(self) -> None:
        _non_negative(seq=self.seq)


@dataclass(frozen=True, slots=True, kw_only=True)
class PingReq(Message):
    """SWIM indirect probe: "ping `target` for me and relay its ack under my `seq`"."""

    seq: int
    target: NodeId
    updates: tuple[MemberUpdate, ...] = ()

    def __post_init__(self) -> None:
        _non_negative(seq=self.seq)


@dataclass(frozen=True, slots=True, kw_only=True)
class PingAck(Message):
    """Answer to `Ping(seq)`, or a helper relaying `target`'s answer to a `PingReq(seq)`."""

    seq: int
    target: NodeId
    updates: tuple[MemberUpdate, ...] = ()

    def __post_init__(self) -> None:
        _non_negative(seq=self.seq)


@dataclass(frozen=True, slots=True, kw_only=True)
class Digest(Message):
    """Push-pull anti-entropy: the ids of every rumor the sender holds (sorted, unique) and
    its whole membership table (memberlist's push-pull state sync). `reply` asks the
    receiver to answer with its own `Digest(reply=False)`; each side then pushes the rumors
    the other lacks in a `RumorPush`."""

    ids: tuple[RumorId, ...]
    reply: bool
    table: tuple[MemberUpdate, ...] = ()
    updates: tuple[MemberUpdate, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class RumorPush(Message):
    """Rumors the receiver's digest lacked (each still verified by the receiver)."""

    rumors: tuple[Rumor, ...]
    updates: tuple[MemberUpdate, ...] = ()


GossipMessage = Call | CallAck | Ping | PingReq | PingAck | Digest | RumorPush
"""The closed union of what one gossip node sends another."""

GOSSIP_MESSAGES: dict[int, type] = {
    550: RumorId,
    551: Rumor,
    552: Grant,
    553: MemberUpdate,
    554: Call,
    555: CallAck,
    556: Ping,
    557: PingReq,
    558: PingAck,
    559: Digest,
    560: RumorPush,
}
"""Stable codec type ids (never renumber; 561-579 are free for gossip's later messages)."""
