"""INTERIM stand-in for `veto.py` and `refusals.py` (branch i15-veto), written against the
agreed interface so the core and its tests run before that branch lands; `core.py` switches
its import to the real modules at the merge and this file goes.

Owns: a minimal `CheckpointMachine` (batching, unanimity drop, keep on one verified veto)
and `RefusalTally` (n-Q+1+f distinct refusers make an abort certificate).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from phalanx.consensus.core import Send
from phalanx.consensus.crypto import Crypto
from phalanx.consensus.leaderless.messages import (
    Refusal,
    StartCheckpoint,
    TransactionProof,
    TxId,
    VetoChoice,
)
from phalanx.consensus.types import NodeId


@dataclass(frozen=True, slots=True, kw_only=True)
class VetoEffects:
    sends: tuple[Send, ...] = ()
    votes: tuple[VetoChoice, ...] = ()
    dropped: tuple[TxId, ...] = ()
    kept: tuple[TransactionProof, ...] = ()


class CheckpointMachine:
    def __init__(self, *, node_id: NodeId, nodes: tuple[NodeId, ...], crypto: Crypto,
                 checkpoint_ticks: int, batch: int,
                 restored_votes: tuple[VetoChoice, ...] = ()) -> None:
        self._node = node_id
        self._nodes = nodes
        self._crypto = crypto
        self._every = checkpoint_ticks
        self._batch = batch
        self._ticks = 0
        self._queue: dict[TxId, None] = {}
        self._own: dict[bytes, VetoChoice] = {v.checkpoint: v for v in restored_votes}
        self._drops: dict[bytes, dict[NodeId, None]] = {}
        self._decided: dict[bytes, bool] = {}
        self._sends: list[Send] = []
        self._votes: list[VetoChoice] = []
        self._dropped: list[TxId] = []
        self._kept: list[TransactionProof] = []

    def queue(self, tx_id: TxId) -> None:
        self._queue[tx_id] = None

    def tick(self) -> None:
        self._ticks += 1
        if self._ticks % self._every or not self._queue:
            return
        ids = tuple(sorted(self._queue)[: self._batch])
        for t in ids:
            del self._queue[t]
        msg = StartCheckpoint(tx_ids=ids)
        self._sends += [Send(to=n, message=msg) for n in self._nodes if n != self._node]
        self._start(msg, lambda _t: None)

    def _start(self, msg: StartCheckpoint,
               proof_of: Callable[[TxId], TransactionProof | None]) -> None:
        cp = hashlib.sha256(b"".join(msg.tx_ids)).digest()
        if cp in self._own or cp in self._decided:
            return
        proofs = [p for p in (proof_of(t) for t in msg.tx_ids) if p is not None][:1]
        body = VetoChoice(checkpoint=cp, tx_ids=msg.tx_ids, voter=self._node,
                          drop=not proofs, proofs=tuple(proofs))
        vote = VetoChoice(checkpoint=cp, tx_ids=msg.tx_ids, voter=self._node, drop=body.drop,
                          proofs=body.proofs, signature=self._crypto.sign(body))
        self._own[cp] = vote
        self._votes.append(vote)
        self._sends += [Send(to=n, message=vote) for n in self._nodes if n != self._node]
        self._count(vote, lambda _p: True)

    def on_start(self, src: NodeId, msg: StartCheckpoint,
                 proof_of: Callable[[TxId], TransactionProof | None]) -> None:
        ids = msg.tx_ids
        if ids and list(ids) == sorted(set(ids)) and len(ids) <= self._batch:
            self._start(msg, proof_of)

    def on_choice(self, src: NodeId, msg: VetoChoice,
                  verify_proof: Callable[[TransactionProof], bool]) -> None:
        if msg.voter not in self._nodes or not self._crypto.verify(msg.voter, msg, msg.signature):
            return
        if msg.checkpoint != hashlib.sha256(b"".join(msg.tx_ids)).digest():
            return
        self._count(msg, verify_proof)

    def _count(self, vote: VetoChoice, verify_proof: Callable[[TransactionProof], bool]) -> None:
        cp = vote.checkpoint
        if cp in self._decided:
            return
        if not vote.drop:
            good = [p for p in vote.proofs if verify_proof(p)]
            if good:
                self._decided[cp] = False
                self._kept += good
            return
        voters = self._drops.setdefault(cp, {})
        voters[vote.voter] = None
        if len(voters) == len(self._nodes) and cp in self._own:
            self._decided[cp] = True
            self._dropped += vote.tx_ids

    def blocked(self, tx_id: TxId) -> bool:
        return any(v.drop and tx_id in v.tx_ids and cp not in self._decided
                   for cp, v in self._own.items())

    def drain(self) -> VetoEffects:
        out = VetoEffects(sends=tuple(self._sends), votes=tuple(self._votes),
                          dropped=tuple(self._dropped), kept=tuple(self._kept))
        self._sends, self._votes, self._dropped, self._kept = [], [], [], []
        return out

    def votes(self) -> tuple[VetoChoice, ...]:
        return tuple(v for cp, v in self._own.items() if cp not in self._decided)

    def gc(self, live: Callable[[TxId], bool]) -> None:
        for cp in [c for c, v in self._own.items() if not any(live(t) for t in v.tx_ids)]:
            self._own.pop(cp, None)
            self._drops.pop(cp, None)
            self._decided.pop(cp, None)


class RefusalTally:
    def __init__(self, *, n: int, f: int, quorum: int) -> None:
        self._need = n - quorum + 1 + f
        self._by_tx: dict[TxId, dict[NodeId, Refusal]] = {}

    def add(self, refusal: Refusal) -> None:
        self._by_tx.setdefault(refusal.tx_id, {}).setdefault(refusal.endorser, refusal)

    def certificate(self, tx_id: TxId) -> tuple[Refusal, ...] | None:
        got = self._by_tx.get(tx_id, {})
        return tuple(got.values()) if len(got) >= self._need else None

    def forget(self, tx_id: TxId) -> None:
        self._by_tx.pop(tx_id, None)
