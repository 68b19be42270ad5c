"""The leaderless safety kernel: the only signer of this node's endorsements and refusals.

Owns: this node's own endorsements and refusals (and the transactions behind them, so a
restarted node can still compute conflicts), restored from and written to the durable
record (`LeaderlessDurableState.endorsed`/`refused`/`known`). Endorsements are decided one
by one and signed together (`seal`: one signature over the Merkle root of a step's
endorsements, `endorsement_batch.py`).

The driver writes `Ready.core_state` (with `must_sync`) before it sends `Ready.messages`, and
the core puts every signed endorsement or refusal in `messages` of the Ready whose
core_state records it (never `early_messages`). So no endorsement or refusal leaves before
it is durable, and after any restart the kernel remembers every one that may have left.

Invariants (across restarts too):
- never two endorsements of one transaction, nor an endorsement and a refusal of one;
- never an unconditional endorsement of T while an endorsed, still-pending transaction
  conflicts with T (`conflicting_pending` decides; a transaction of the record this node
  can no longer read is treated as conflicting with everything until it is decided or
  collected). The ``endorse_despite_conflict`` bug switch (`unsafe`) skips this check.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from phalanx.consensus.crypto import Signer
from phalanx.consensus.leaderless.endorsement_batch import sign_batch
from phalanx.consensus.leaderless.growing import GrowingTuple
from phalanx.consensus.leaderless.messages import (
    Endorsement,
    LeaderlessDurableState,
    Refusal,
    Transaction,
    TxId,
)
from phalanx.consensus.types import LocalProtocolError, NodeId


class SafetyKernel:
    __slots__ = ("_endorsed", "_node", "_parts", "_refused", "_signer", "_stale", "_txs",
                 "_unreadable", "_unsealed", "unsafe")

    def __init__(self, signer: Signer, node: NodeId,
                 restored: LeaderlessDurableState | None = None,
                 known: dict[TxId, Transaction] | None = None) -> None:
        self._signer = signer
        self._node = node
        self._endorsed: dict[TxId, Endorsement] = {}
        self._refused: dict[TxId, Refusal] = {}
        self._txs: dict[TxId, Transaction] = {}
        self._unsealed: dict[TxId, Transaction] = {}
        """Endorsements decided but not signed yet (`seal`), with their transactions."""
        self._parts: tuple[GrowingTuple[Endorsement], GrowingTuple[Refusal],
                           GrowingTuple[Transaction]] = (
            GrowingTuple(), GrowingTuple(), GrowingTuple())
        """`record_parts`, kept equal to the three tables by appending and trimming their
        heads (`growing.py`: one copy per read, the same tuples until a change)."""
        self._stale = True
        """The parts must be rebuilt from the tables (they changed some other way)."""
        self.unsafe = False
        if restored is not None:
            for e in restored.endorsed:
                self._endorsed[e.tx_id] = e
            for r in restored.refused:
                self._refused[r.tx_id] = r
            by_id = known or {}
            for tx_id in list(self._endorsed) + list(self._refused):
                if tx_id in by_id:
                    self._txs[tx_id] = by_id[tx_id]
        self._unreadable: dict[TxId, None] = dict.fromkeys(
            t for t in self._endorsed if t not in self._txs)

    # ---------------------------------------------------------------------------- reads

    def endorsement(self, tx_id: TxId) -> Endorsement | None:
        return self._endorsed.get(tx_id)

    def refusal(self, tx_id: TxId) -> Refusal | None:
        return self._refused.get(tx_id)

    def transaction(self, tx_id: TxId) -> Transaction | None:
        """The transaction behind an own endorsement or refusal, when held."""
        return self._txs.get(tx_id)

    def touched(self, tx_id: TxId) -> bool:
        """This node endorsed or refused `tx_id` (it will sign nothing more about it)."""
        return tx_id in self._endorsed or tx_id in self._refused

    def endorsed_ids(self) -> list[TxId]:
        return list(self._endorsed)

    def endorsements(self) -> list[Endorsement]:
        return list(self._endorsed.values())

    def refusals(self) -> list[Refusal]:
        return list(self._refused.values())

    def unreadable(self) -> list[TxId]:
        """Own endorsements whose transaction this node does not hold (a legacy record)."""
        return list(self._unreadable)

    def learn(self, tx_id: TxId, tx: Transaction) -> None:
        """The transaction behind one of our own endorsements or refusals arrived."""
        if (tx_id in self._endorsed or tx_id in self._refused) and tx_id not in self._txs:
            self._txs[tx_id] = tx
            self._unreadable.pop(tx_id, None)
            self._parts[2].append(tx)  # at the end of `_txs` too

    # ---------------------------------------------------------------------------- signing

    def endorse(self, tx_id: TxId, tx: Transaction, conditions: tuple[TxId, ...],
                conflicting_pending: Callable[[TxId, Transaction], list[TxId]]) -> Endorsement:
        """Record this node's one endorsement of `tx_id` with `conditions` (sorted, unique),
        unsigned: `seal` signs it with the others of the step, before anything sends it or
        writes the record (it counts as endorsed at once: `touched`, `endorsement`).

        `conflicting_pending(tx_id, tx)` lists the own endorsed still-pending transactions
        that conflict with `tx` (the caller's K); an unconditional endorsement requires it
        empty, a conditional one requires every one of them among the conditions.
        Raises `LocalProtocolError` on any violation: the caller's rules failed."""
        if self.touched(tx_id):
            raise LocalProtocolError(f"already endorsed or refused {tx_id[:4].hex()}")
        if list(conditions) != sorted(set(conditions)) or tx_id in conditions:
            raise LocalProtocolError("conditions must be sorted, unique, not the tx itself")
        if not self.unsafe:
            missing = [k for k in conflicting_pending(tx_id, tx) if k not in conditions]
            missing += [k for k in self.unreadable() if k not in conditions and k != tx_id]
            if missing:
                raise LocalProtocolError(
                    f"endorsing {tx_id[:4].hex()} would conflict with {len(missing)} "
                    "pending endorsed transaction(s)")
        unsigned = Endorsement(tx_id=tx_id, endorser=self._node, conditions=conditions)
        self._endorsed[tx_id] = unsigned
        self._unsealed[tx_id] = tx
        return unsigned

    def seal(self) -> tuple[Endorsement, ...]:
        """Sign every endorsement decided since the last seal under ONE signature
        (`endorsement_batch.sign_batch`) and return them signed, in decision order (empty:
        none). The core seals before it reads the record or sends an own endorsement."""
        if not self._unsealed:
            return ()
        unsealed, self._unsealed = self._unsealed, {}
        signed = sign_batch(self._signer, self._node,
                            [(t, self._endorsed[t].conditions) for t in unsealed])
        for e in signed:
            self._endorsed[e.tx_id] = e  # same position: the key is already there
        self._appended(signed, (), [(e.tx_id, unsealed[e.tx_id]) for e in signed])
        return signed

    def unsealed(self) -> bool:
        return bool(self._unsealed)

    def refuse(self, tx_id: TxId, tx: Transaction) -> Refusal:
        """Sign this node's refusal of `tx_id` (its deadline passed, never endorsed)."""
        if self.touched(tx_id):
            raise LocalProtocolError(f"already endorsed or refused {tx_id[:4].hex()}")
        body = Refusal(tx_id=tx_id, endorser=self._node)
        signed = Refusal(tx_id=tx_id, endorser=self._node, signature=self._signer.sign(body))
        self._refused[tx_id] = signed
        self._appended((), (signed,), [(tx_id, tx)])
        return signed

    def _appended(self, endorsements: tuple[Endorsement, ...], refusals: tuple[Refusal, ...],
                  txs: list[tuple[TxId, Transaction]]) -> None:
        """`endorsements` and `refusals` were added at the end of their tables, `txs` are
        the transactions behind them: keep the cached `record_parts` by appending all of
        them at once (rebuilding the parts copied every own signature of the horizon,
        and so did appending them one by one: one copy per seal, not per signature)."""
        new_txs = [tx for tx_id, tx in txs if tx_id not in self._txs]
        if len(new_txs) != len(txs):
            self._stale = True  # a held one's value changes in place: rebuild
        for tx_id, tx in txs:
            self._txs[tx_id] = tx
        endorsed, refused, known = self._parts
        endorsed.extend(endorsements)
        refused.extend(refusals)
        known.extend(new_txs)

    # ---------------------------------------------------------------------------- GC, record

    def forget(self, tx_id: TxId) -> None:
        """`tx_id` was garbage-collected (its deadline is older than the horizon). The
        `record_parts` lose their first item when it was the oldest (GC's usual order),
        else are rebuilt."""
        self._unreadable.pop(tx_id, None)
        tables: tuple[dict[TxId, Any], ...] = (self._endorsed, self._refused, self._txs)
        parts: tuple[GrowingTuple[Any], ...] = self._parts
        for table, part in zip(tables, parts, strict=True):
            if tx_id not in table:
                continue
            head = next(iter(table)) == tx_id
            del table[tx_id]
            if head and len(part):
                part.pop_head()
            else:
                self._stale = True

    def record_parts(self) -> tuple[tuple[Endorsement, ...], tuple[Refusal, ...],
                                    tuple[Transaction, ...]]:
        """(endorsed, refused, known) for the durable record, in signing order."""
        if self._unsealed:
            raise LocalProtocolError("record_parts before seal: unsigned own endorsements")
        endorsed, refused, known = self._parts
        if self._stale:
            self._stale = False
            endorsed.reset(self._endorsed.values())
            refused.reset(self._refused.values())
            known.reset(self._txs.values())
        return endorsed.value(), refused.value(), known.value()

    def record_growth(self) -> tuple[tuple[int, tuple[Any, ...]] | None, ...]:
        """How (endorsed, refused, known) changed since the last `mark_record`
        (`growing.Growth.of`; None: some other way). Read right after `record_parts`."""
        return tuple(part.growth.of(part.value()) for part in self._parts)

    def mark_record(self) -> None:
        """The parts as they are now went into a record (the base of `record_growth`)."""
        for part in self._parts:
            part.growth.mark()
