"""Byzantine endorsers for the leaderless core: an honest core whose wire behaviour lies.

Owns: `LEADERLESS_BEHAVIOURS` (the names), `LeaderlessByzantineCore` (the wrapper),
`choose_liars` (which nodes lie, and how, for a seed) and `LEADERLESS_BYZANTINE` (the
registry's `ByzantineSupport`: the same wrappers on a real node).

Behaviours (every lie is signed with the node's OWN key, so it verifies unless it is a
forgery; a Byzantine node never signs as another node or a client):
- ``silent``: sends nothing (drops then need unanimity: the documented liveness cost).
- ``equivocate``: on first sight of each transaction, endorses it at once to a seeded half
  of its peers unconditionally and to the other half conditioned on another transaction it
  knows (different endorsements to different peers), whatever conflicts it endorsed before.
- ``lie_versions``: endorses every transaction it sees unconditionally, to every peer,
  whether or not its requirements match (a node lying about versions).
- ``forge_conditions``: its endorsements carry made-up conditions (ids of no transaction,
  or of unrelated ones), re-signed (a batch: every item, under one new signature).
- ``withhold_veto``: never vetoes: its veto votes become drop votes without proofs.
- ``forge_veto``: its drop votes become vetoes carrying a proof with forged endorsements.
- ``replay``: re-sends, at random, transactions, endorsements and proofs it sent or saw
  earlier (other nodes' included) to random peers.
With ``stuck_resolution = "pbft"`` the vote lies apply to the ordered votes it hands its peers
(`OrderingSubmit`; its own embedded PBFT keeps the honest one, under the same request number):
``withhold_veto`` strips the evidence, ``forge_veto`` replaces it with forged endorsements,
``equivocate`` strips it for half of its peers (two contents under one number).

Must not import: the simulator, trio, clocks, global random (every draw comes from the
injected `random.Random`). The wrapped core's persistence and execution are untouched: only
messages change. Nothing here raises on peer input.
"""

from __future__ import annotations

import dataclasses
import random
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from phalanx.consensus.core import Core, CoreStatus, Input, Ready, Receive, Send, Submit
from phalanx.consensus.crypto import Crypto
from phalanx.consensus.leaderless.endorsement_batch import batch_of, sign_batch, sign_one
from phalanx.consensus.leaderless.messages import (
    Endorsement,
    EndorsementBatch,
    OrderedVote,
    OrderingSubmit,
    SignatureResend,
    Transaction,
    TransactionProof,
    TxId,
    VetoChoice,
)
from phalanx.consensus.types import LocalProtocolError, Message, NodeId
from phalanx.net import wire
from phalanx.net.codec import DecodeError

if TYPE_CHECKING:
    from phalanx.apps.interface import StateMachine
    from phalanx.ops.node_config import NodeConfig

LEADERLESS_BEHAVIOURS: tuple[str, ...] = (
    "silent", "equivocate", "lie_versions", "forge_conditions", "withhold_veto",
    "forge_veto", "replay",
)
SWEEP_BEHAVIOURS: tuple[str, ...] = LEADERLESS_BEHAVIOURS
_MEMORY = 64


def choose_liars(seed: int, names: Sequence[str], *, count: int,
                 behaviours: tuple[str, ...] = ()) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The seeded plan: `count` nodes, each with the given behaviours or one or two drawn
    from `SWEEP_BEHAVIOURS` (sorted by node)."""
    if not 0 <= count <= len(names):
        raise ValueError(f"cannot make {count} of {len(names)} nodes Byzantine")
    unknown = [b for b in behaviours if b not in LEADERLESS_BEHAVIOURS]
    if unknown:
        raise ValueError(f"unknown leaderless Byzantine behaviour(s) {unknown}; known: "
                         f"{LEADERLESS_BEHAVIOURS}")
    rng = random.Random(f"leaderless-byzantine:{seed}")
    liars = sorted(rng.sample(sorted(names), count))
    return tuple(
        (node, behaviours or tuple(sorted(rng.sample(SWEEP_BEHAVIOURS, rng.randint(1, 2)))))
        for node in liars)


def _resign(message: Message, crypto: Crypto) -> Message:
    if isinstance(message, Endorsement):  # batch-signed: a batch of one
        return sign_one(crypto, message.endorser, message.tx_id, message.conditions)
    blank = dataclasses.replace(message, signature=b"")  # type: ignore[type-var]
    return dataclasses.replace(blank, signature=crypto.sign(blank))  # type: ignore[type-var]


class LeaderlessByzantineCore:
    """An honest leaderless core whose messages pass through the named behaviours.

    Args:
        inner: the honest core (its persistence and execution are left intact).
        behaviours: names from `LEADERLESS_BEHAVIOURS` (unknown ones raise ValueError).
        crypto: this node's crypto (to sign its lies).
        rng: the seeded source of every decision.
        tx_id: the id of a transaction (the core's definition).
        nodes: every node of the cluster.
        rate: probability that ``replay`` and ``forge_conditions`` act on one message.
    """

    def __init__(self, inner: Core, *, behaviours: Iterable[str], crypto: Crypto,
                 rng: random.Random, tx_id: Callable[[Transaction], TxId],
                 nodes: Sequence[str], rate: float = 0.3) -> None:
        chosen = frozenset(behaviours)
        unknown = sorted(chosen - frozenset(LEADERLESS_BEHAVIOURS))
        if unknown:
            raise ValueError(f"unknown leaderless Byzantine behaviour(s) {unknown}")
        if crypto.node_id != inner.node_id:
            raise LocalProtocolError("crypto and core belong to different nodes")
        self.inner = inner
        self.behaviours = chosen
        self._crypto = crypto
        self._rng = rng
        self._tx_id = tx_id
        self._peers = tuple(NodeId(n) for n in sorted(nodes) if n != inner.node_id)
        self._rate = rate
        self._known: dict[TxId, None] = {}
        self._seen: deque[Message] = deque(maxlen=_MEMORY)
        self.lies: dict[str, int] = {}

    @property
    def node_id(self) -> NodeId:
        return self.inner.node_id

    def status(self) -> CoreStatus:
        return self.inner.status()

    def step(self, inp: Input, /) -> Ready:
        fresh = self._learn(inp)
        ready = self.inner.step(inp)
        if "silent" in self.behaviours:
            if ready.messages or ready.early_messages:
                self._count("silent")
                return dataclasses.replace(ready, messages=(), early_messages=())
            return ready
        extra = [s for tx_id in fresh for s in self._endorse(tx_id)]
        if not (ready.messages or ready.early_messages or extra):
            return ready
        return dataclasses.replace(
            ready, early_messages=self._transform(ready.early_messages),
            messages=self._transform(ready.messages) + tuple(extra))

    def _count(self, what: str) -> None:
        self.lies[what] = self.lies.get(what, 0) + 1

    # -- what it learns ---------------------------------------------------------------------

    def _learn(self, inp: Input) -> list[TxId]:
        tx: Transaction | None = None
        if isinstance(inp, Submit):
            try:
                tx = wire.decode(inp.request.command, expected=Transaction)
            except DecodeError:
                tx = None
        elif isinstance(inp, Receive):
            msg = inp.message
            if isinstance(msg, Endorsement | EndorsementBatch | Transaction | TransactionProof):
                self._seen.append(msg)
            if isinstance(msg, Transaction):
                tx = msg
            elif isinstance(msg, TransactionProof):
                tx = msg.tx
        if tx is None:
            return []
        tx_id = self._tx_id(tx)
        if tx_id in self._known:
            return []
        self._known[tx_id] = None
        if len(self._known) > 4 * _MEMORY:
            del self._known[next(iter(self._known))]
        return [tx_id]

    # -- lies it adds -------------------------------------------------------------------------

    def _endorse(self, tx_id: TxId) -> list[Send]:
        b = self.behaviours
        if not b & {"equivocate", "lie_versions"}:
            return []
        plain = _resign(Endorsement(tx_id=tx_id, endorser=self.node_id), self._crypto)
        if "equivocate" not in b:
            self._count("lie_versions")
            return [Send(to=p, message=plain) for p in self._peers]
        others = [t for t in self._known if t != tx_id]
        conditioned: Message = plain
        if others:
            cond = others[self._rng.randrange(len(others))]
            conditioned = _resign(Endorsement(tx_id=tx_id, endorser=self.node_id,
                                              conditions=(cond,)), self._crypto)
        self._count("equivocate")
        return [Send(to=p, message=plain if self._rng.random() < 0.5 else conditioned)
                for p in self._peers]

    # -- lies about what it sends ---------------------------------------------------------------

    def _transform(self, sends: tuple[Send, ...]) -> tuple[Send, ...]:
        if not sends:
            return sends
        out: list[Send] = []
        rng, b = self._rng, self.behaviours
        for send in sends:
            msg = send.message
            if "forge_conditions" in b and isinstance(msg, Endorsement) and (
                    rng.random() < self._rate):
                msg = self._forge_conditions(msg)
            if "forge_conditions" in b and isinstance(msg, EndorsementBatch) and (
                    rng.random() < self._rate):
                msg = self._forge_batch(msg)
            if "forge_conditions" in b and isinstance(msg, SignatureResend) and (
                    msg.endorsements and rng.random() < self._rate):
                msg = dataclasses.replace(msg, endorsements=tuple(
                    f if isinstance(f := self._forge_conditions(e), Endorsement) else e
                    for e in msg.endorsements))
            if isinstance(msg, OrderingSubmit):
                msg = self._lie_ordered(msg, send.to)
            if isinstance(msg, VetoChoice):
                if "withhold_veto" in b and not msg.drop:
                    msg = _resign(dataclasses.replace(msg, drop=True, proofs=()), self._crypto)
                    self._count("withhold_veto")
                elif "forge_veto" in b and msg.drop:
                    msg = self._forge_veto(msg)
            out.append(Send(to=send.to, message=msg))
            if isinstance(msg, Endorsement | EndorsementBatch | Transaction | TransactionProof):
                self._seen.append(msg)
            if "replay" in b and self._seen and rng.random() < self._rate:
                old = self._seen[rng.randrange(len(self._seen))]
                out.append(Send(to=self._peers[rng.randrange(len(self._peers))], message=old))
                self._count("replay")
        return tuple(out)

    def _lie_ordered(self, msg: OrderingSubmit, to: NodeId) -> Message:
        """The ordered-vote lies (see the module docstring); other items pass."""
        try:
            vote = wire.decode(msg.request.command)
        except DecodeError:
            return msg
        if not isinstance(vote, OrderedVote):
            return msg
        b = self.behaviours
        if "forge_veto" in b:
            tx = vote.evidence[0].tx if vote.evidence else None
            if tx is None:
                return msg
            fakes = tuple(Endorsement(tx_id=self._tx_id(tx), endorser=p,
                                      signature=bytes(self._rng.getrandbits(8) for _ in range(32)))
                          for p in self._peers)
            forged = TransactionProof(tx=tx, endorsements=fakes)
            vote = dataclasses.replace(vote, evidence=(forged,))
            self._count("forge_veto")
        elif vote.evidence and ("withhold_veto" in b or (
                "equivocate" in b and self._peers.index(to) % 2 == 1)):
            vote = dataclasses.replace(vote, evidence=())
            self._count("withhold_veto" if "withhold_veto" in b else "equivocate")
        else:
            return msg
        lie = _resign(vote, self._crypto)
        return OrderingSubmit(request=dataclasses.replace(msg.request, command=wire.encode(lie)))

    def _forge_conditions(self, e: Endorsement) -> Message:
        rng = self._rng
        made_up = bytes(rng.getrandbits(8) for _ in range(32))
        known = list(self._known)
        conds = {made_up}
        if known and rng.random() < 0.5:
            conds.add(known[rng.randrange(len(known))])
        conds.discard(e.tx_id)
        self._count("forge_conditions")
        return _resign(dataclasses.replace(e, conditions=tuple(sorted(conds))), self._crypto)

    def _forge_batch(self, batch: EndorsementBatch) -> Message:
        """Its batch with made-up conditions on every item, re-signed (one signature)."""
        items = []
        for item in batch.items:
            forged = self._forge_conditions(Endorsement(tx_id=item.tx_id, endorser=batch.endorser,
                                                        conditions=item.conditions))
            assert isinstance(forged, Endorsement)
            items.append((forged.tx_id, forged.conditions))
        return batch_of(sign_batch(self._crypto, batch.endorser, items))

    def _forge_veto(self, vote: VetoChoice) -> Message:
        """A veto whose proof claims Q endorsements of one of the ids: the transaction is
        one it saw (or none), the endorsements name other nodes with made-up signatures."""
        tx = next((m for m in reversed(self._seen) if isinstance(m, Transaction)), None)
        if tx is None:
            tx = next((m.tx for m in reversed(self._seen) if isinstance(m, TransactionProof)),
                      None)
        proofs: tuple[TransactionProof, ...] = ()
        if tx is not None:
            target = vote.tx_ids[0] if vote.tx_ids else self._tx_id(tx)
            fakes = tuple(Endorsement(tx_id=target, endorser=p,
                                      signature=bytes(self._rng.getrandbits(8) for _ in range(32)))
                          for p in self._peers)
            proofs = (TransactionProof(tx=tx, endorsements=fakes),)
        self._count("forge_veto")
        return _resign(dataclasses.replace(vote, drop=False, proofs=proofs), self._crypto)


class LeaderlessByzantine:
    """The leaderless Byzantine modes on a real node (`phalanx.protocols.spec.ByzantineSupport`,
    `phalanx node run CONFIG --byzantine MODE`, tests and demos only): one
    `LeaderlessByzantineCore` behaviour per node; the state machine stays honest."""

    modes: tuple[str, ...] = LEADERLESS_BEHAVIOURS

    def wrap_core(self, core: Core, mode: str, *, config: NodeConfig,
                  rng: random.Random) -> Core:
        from phalanx.consensus.leaderless.messages import transaction_id
        from phalanx.ops.signing_keys import load_crypto
        from phalanx.protocols.leaderless_node import WireTxCodec

        codec = WireTxCodec()
        return LeaderlessByzantineCore(
            core, behaviours=(mode,), crypto=load_crypto(config),
            rng=random.Random(rng.getrandbits(64)),
            tx_id=lambda tx: transaction_id(tx, codec.encode),
            nodes=tuple(sorted(config.members())))

    def wrap_machine(self, machine: StateMachine, mode: str,
                     rng: random.Random) -> StateMachine:
        return machine


LEADERLESS_BYZANTINE = LeaderlessByzantine()
