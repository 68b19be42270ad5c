"""Byzantine behaviours: wrappers around an honest core that lie on the wire, and twins.

Owns: `BEHAVIOURS` (the names, declared in `phalanx.jepsen.nemesis`), `ByzantineCore` (an
honest `Core` whose outgoing messages pass through seeded mutators), `corrupt_result` (what a
lying replica answers a client), `TwinsCore` and `TwinsChannel` (two honest cores with one
identity and key, each talking to its own side of the cluster: equivocation at the protocol
level, Twins-style).

Behaviours (ByzzFuzz-style small-scope mutations, re-signed with the node's own key so that
signatures verify unless the behaviour is a forgery):

- ``silent``: sends nothing.
- ``omit``: never sends to a seeded half of its peers (selective omission).
- ``equivocate``: as primary, sends a different pre-prepare (another batch, re-signed) for
  the same sequence number to a seeded half of its peers.
- ``replay``: also re-sends, at random, a message it sent earlier.
- ``mutate``: view or sequence number +-1, or a stale digest, re-signed (re-MACed).
- ``forge``: a corrupted signature or MAC (honest replicas must drop it).
- ``bad_checkpoint``: checkpoints carry a wrong state digest (re-signed).
- ``corrupt_reply``: answers clients with a wrong result (`corrupt_result`).

Must not import: the simulator (`phalanx.jepsen.sim`), trio, clocks, global random. Every
draw comes from the injected `random.Random`, so a behaviour is a pure function of its seed
and its inputs; the future real-cluster node modes reuse these wrappers unchanged.

Invariants: the wrappers never touch the inner core's persistence, committed entries or
rejections (a Byzantine node's state machine stays well-formed so the driver can run it);
only messages change. Nothing here raises on peer input.
"""

from __future__ import annotations

import dataclasses
import random
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from phalanx.consensus.core import (
    CheckpointInstalled,
    CheckpointTaken,
    Core,
    CoreStatus,
    Input,
    Persisted,
    Ready,
    Receive,
    Send,
    Submit,
    Tick,
)
from phalanx.consensus.crypto import Crypto, digest_of
from phalanx.consensus.pbft.messages import Checkpoint, Commit, Prepare, PrePrepare, signed_part
from phalanx.consensus.types import LocalProtocolError, Message, NodeId
from phalanx.jepsen.nemesis import BYZANTINE_BEHAVIOURS

if TYPE_CHECKING:
    from phalanx.apps.interface import StateMachine, StateSnapshot
    from phalanx.ops.node_config import NodeConfig

BEHAVIOURS: tuple[str, ...] = BYZANTINE_BEHAVIOURS
_MESSAGE_BEHAVIOURS = frozenset(BEHAVIOURS) - {"corrupt_reply"}
_REPLAY_MEMORY = 64


def corrupt_result(result: bytes, rng: random.Random) -> bytes:
    """A wrong answer to a client: flipped bytes, or garbage when the result is empty."""
    if not result:
        return bytes([rng.randrange(256)])
    pos = rng.randrange(len(result))
    return result[:pos] + bytes([result[pos] ^ 0x5A]) + result[pos + 1 :]


def resign(message: Message, crypto: Crypto, to: NodeId) -> Message:
    """`message` signed (or, for a `Commit`, MACed for `to`) with this node's own key."""
    names = {f.name for f in dataclasses.fields(message)}  # type: ignore[arg-type]
    if "signature" in names:
        blank = dataclasses.replace(message, signature=b"")  # type: ignore[type-var]
        return dataclasses.replace(blank, signature=crypto.sign(signed_part(blank)))  # type: ignore[type-var]
    if "auth" in names:
        blank = dataclasses.replace(message, auth=b"")  # type: ignore[type-var]
        return dataclasses.replace(blank, auth=crypto.mac(to, blank))  # type: ignore[type-var]
    return message


def _forged(message: Message) -> Message:
    for name in ("signature", "auth"):
        tag = getattr(message, name, None)
        if isinstance(tag, bytes):
            bad = bytes(b ^ 0xFF for b in tag) if tag else b"\x00" * 32
            return dataclasses.replace(message, **{name: bad})  # type: ignore[type-var]
    return message


class ByzantineCore:
    """An honest core whose outgoing messages pass through the named behaviours.

    Args:
        inner: the honest core (its persistence and execution are left intact).
        behaviours: names from `BEHAVIOURS`; unknown names raise `ValueError`.
        crypto: this node's crypto (to re-sign what it mutates).
        rng: the seeded source of every decision.
        rate: probability that `replay`, `mutate` and `forge` act on one message.
    """

    def __init__(
        self,
        inner: Core,
        *,
        behaviours: Iterable[str],
        crypto: Crypto,
        rng: random.Random,
        rate: float = 0.3,
    ) -> None:
        chosen = tuple(sorted(set(behaviours)))
        unknown = [b for b in chosen if b not in BEHAVIOURS]
        if unknown:
            raise ValueError(f"unknown Byzantine behaviour(s) {unknown}; known: {BEHAVIOURS}")
        if crypto.node_id != inner.node_id:
            raise LocalProtocolError("crypto and core belong to different nodes")
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"rate must be a probability, got {rate}")
        self.inner = inner
        self.behaviours = frozenset(chosen)
        self._crypto = crypto
        self._rng = rng
        self._rate = rate
        self._sent: deque[Send] = deque(maxlen=_REPLAY_MEMORY)
        self._digests: deque[bytes] = deque(maxlen=8)
        self._halves: dict[str, dict[NodeId, bool]] = {"omit": {}, "equivocate": {}}
        self.mutations: dict[str, int] = {}

    @property
    def node_id(self) -> NodeId:
        return self.inner.node_id

    def status(self) -> CoreStatus:
        return self.inner.status()

    def step(self, inp: Input, /) -> Ready:
        ready = self.inner.step(inp)
        if not (self.behaviours & _MESSAGE_BEHAVIOURS) or not (
            ready.messages or ready.early_messages
        ):
            return ready
        return dataclasses.replace(
            ready,
            early_messages=self.transform(ready.early_messages),
            messages=self.transform(ready.messages),
        )

    def _count(self, what: str) -> None:
        self.mutations[what] = self.mutations.get(what, 0) + 1

    def _half(self, which: str, peer: NodeId) -> bool:
        """Whether `peer` is in the seeded half of the peers named `which` (drawn on first
        sight of the peer, so the split is stable for the node's life)."""
        half = self._halves[which]
        if peer not in half:
            half[peer] = self._rng.random() < 0.5
        return half[peer]

    def transform(self, sends: tuple[Send, ...]) -> tuple[Send, ...]:
        """The messages actually sent instead of the honest `sends`."""
        if "silent" in self.behaviours:
            if sends:
                self._count("silent")
            return ()
        out: list[Send] = []
        rng, rate, b = self._rng, self._rate, self.behaviours
        for send in sends:
            to, msg = send.to, send.message
            if "omit" in b and self._half("omit", to):
                self._count("omit")
                continue
            if "equivocate" in b and isinstance(msg, PrePrepare):
                msg = self._equivocate(msg, to)
            if "bad_checkpoint" in b and isinstance(msg, Checkpoint):
                wrong = self._crypto.digest(msg.digest + b"byzantine")
                msg = resign(dataclasses.replace(msg, digest=wrong), self._crypto, to)
                self._count("bad_checkpoint")
            if "mutate" in b and rng.random() < rate:
                msg = self._mutate(msg, to)
            if "forge" in b and rng.random() < rate:
                msg = _forged(msg)
                self._count("forge")
            if isinstance(msg, PrePrepare | Prepare | Commit):
                self._digests.append(msg.digest)
            sent = Send(to=to, message=msg)
            out.append(sent)
            if "replay" in b and self._sent and rng.random() < rate:
                old = self._sent[rng.randrange(len(self._sent))]
                out.append(Send(to=to, message=old.message))
                self._count("replay")
            self._sent.append(sent)
        return tuple(out)

    def _equivocate(self, pp: PrePrepare, to: NodeId) -> Message:
        if not self._half("equivocate", to):
            return pp
        if len(pp.batch) > 1:
            batch = tuple(reversed(pp.batch))
        elif pp.batch:
            batch = ()  # the null request instead of the client's
        else:
            return pp
        self._count("equivocate")
        other = dataclasses.replace(pp, batch=batch, digest=digest_of(self._crypto, batch))
        return resign(other, self._crypto, to)

    def _mutate(self, msg: Message, to: NodeId) -> Message:
        rng = self._rng
        if isinstance(msg, PrePrepare | Prepare | Commit):
            kind = rng.randrange(3)
            if kind == 0:
                msg = dataclasses.replace(msg, view=max(0, msg.view + rng.choice((-1, 1))))
            elif kind == 1:
                msg = dataclasses.replace(msg, seq=max(1, msg.seq + rng.choice((-1, 1))))
            elif self._digests:
                stale = self._digests[rng.randrange(len(self._digests))]
                msg = dataclasses.replace(msg, digest=stale)
        elif isinstance(msg, Checkpoint):
            msg = dataclasses.replace(msg, seq=max(1, msg.seq + rng.choice((-1, 1))))
        else:
            return msg
        self._count("mutate")
        return resign(msg, self._crypto, to)


class TwinsChannel:
    """The colluders' private link between side-B twins (side-A twins use the network)."""

    def __init__(self) -> None:
        self._inbox: dict[NodeId, list[tuple[NodeId, Message]]] = {}

    def post(self, src: NodeId, dst: NodeId, message: Message) -> None:
        self._inbox.setdefault(dst, []).append((src, message))

    def take(self, dst: NodeId) -> list[tuple[NodeId, Message]]:
        return self._inbox.pop(dst, [])


class TwinsCore:
    """Two honest cores with one identity (and key), Twins-style (Bano et al., 2022).

    Twin A is the node the driver sees: its Readys (persistence, committed entries) pass
    through. Twin B lives in memory: its persistence is acknowledged at once and its
    executions are discarded. Peers are split: `side_a` (honest peers twin A talks to) and
    everyone else (twin B's). Traffic between twinned identities goes over the network for
    twin A and over `channel` for twin B. Client requests go to one twin each, chosen by a
    seeded draw, so the twins propose different batches.
    """

    def __init__(
        self,
        twin_a: Core,
        make_twin_b: Callable[[], Core],
        *,
        side_a: frozenset[NodeId],
        twinned: frozenset[NodeId],
        channel: TwinsChannel,
        rng: random.Random,
    ) -> None:
        self.a = twin_a
        self.b = make_twin_b()
        if self.b.node_id != self.a.node_id:
            raise LocalProtocolError("twins must share one identity")
        self._side_a = side_a
        self._twinned = twinned
        self._channel = channel
        self._rng = rng

    @property
    def node_id(self) -> NodeId:
        return self.a.node_id

    def status(self) -> CoreStatus:
        return self.a.status()

    def step(self, inp: Input, /) -> Ready:
        out: list[Send] = []
        for src, message in self._channel.take(self.node_id):
            self._step_b(Receive(src=src, message=message), out)
        to_a = True
        to_b = False
        match inp:
            case Receive(src=src):
                to_a = src in self._twinned or src in self._side_a
                to_b = not to_a
            case Tick():
                to_b = True
            case Submit():
                to_a = self._rng.random() < 0.5
                to_b = not to_a
            case Persisted() | CheckpointTaken() | CheckpointInstalled():
                pass
        ready = self.a.step(inp) if to_a else Ready()
        if to_b:
            self._step_b(inp, out)
        a_sends = tuple(
            s for s in ready.messages if s.to in self._side_a or s.to in self._twinned
        )
        a_early = tuple(
            s for s in ready.early_messages if s.to in self._side_a or s.to in self._twinned
        )
        return dataclasses.replace(ready, messages=a_sends + tuple(out), early_messages=a_early)

    def _step_b(self, inp: Input, out: list[Send]) -> None:
        queue: deque[Input] = deque([inp])
        while queue:
            ready = self.b.step(queue.popleft())
            for send in ready.early_messages + ready.messages:
                if send.to in self._twinned:
                    self._channel.post(self.node_id, send.to, send.message)
                elif send.to not in self._side_a:
                    out.append(send)
            if ready.has_persistence:
                queue.append(Persisted(number=ready.number))


class CorruptingMachine:
    """The ``corrupt_reply`` mode on a real node: `inner`'s state, wrong results
    (`corrupt_result`)."""

    def __init__(self, inner: StateMachine, rng: random.Random) -> None:
        self.inner = inner
        self._rng = rng
        self.corrupted = 0

    def apply(self, command: bytes) -> bytes:
        self.corrupted += 1
        return corrupt_result(self.inner.apply(command), self._rng)

    def query(self, request: bytes) -> bytes:
        self.corrupted += 1
        return corrupt_result(self.inner.query(request), self._rng)

    def snapshot(self) -> StateSnapshot:
        return self.inner.snapshot()

    def restore(self, data: bytes) -> None:
        self.inner.restore(data)


class PbftByzantine:
    """PBFT's Byzantine modes on a real node (`phalanx.protocols.spec.ByzantineSupport`,
    `phalanx node run CONFIG --byzantine MODE`, tests and the demo only): the `ByzantineCore`
    behaviours, one per node. ``corrupt_reply`` leaves the core honest and wraps the state
    machine so the node answers clients wrong results (its own state, and so its
    checkpoints, diverge: the f+1 rule and the honest 2f+1 must cope with both)."""

    modes: tuple[str, ...] = BEHAVIOURS

    def wrap_core(self, core: Core, mode: str, *, config: NodeConfig,
                  rng: random.Random) -> Core:
        from phalanx.ops.signing_keys import load_crypto

        return ByzantineCore(core, behaviours=(mode,), crypto=load_crypto(config),
                             rng=random.Random(rng.getrandbits(64)))

    def wrap_machine(self, machine: StateMachine, mode: str,
                     rng: random.Random) -> StateMachine:
        if mode == "corrupt_reply":
            return CorruptingMachine(machine, random.Random(rng.getrandbits(64)))
        return machine


PBFT_BYZANTINE = PbftByzantine()
