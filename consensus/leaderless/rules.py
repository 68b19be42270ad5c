"""Applicability and the commit rule over the transaction store (PnyxDB §1.7 steps 4-5,
with reference gaps 1 and 3 fixed).

Owns: `Rules`, pure reads of a `TxStore`:
- `applicable(tx_id)`: committed → true; dropped or unknown → false; otherwise at least
  Q_policy endorsements none of whose conditions is applicable. A visited set makes a
  cycle of conditions not applicable (gap 3: Byzantine endorsers can build one).
- `definitely_valid(record)`: the endorsements whose every condition is dropped
  (unconditional ones always); one whose condition committed is permanently invalid.
- `committable(record)`: pending with at least Q_policy definitely valid endorsements.
- `dead(record)`: the held endorsements one of whose conditions COMMITTED here: never
  definitely valid at any correct node (a committed transaction is dropped at none), so
  their endorsers, like refusers, never count towards this transaction's commit
  (`intake.py` `_check_certificate`: the abort certificate counts both).
- `stuck(old)`: what to queue for a checkpoint (docs/LEADERLESS.md "Deadlocks"): a
  condition of an applicable pending transaction's endorsement that is unknown, or pending,
  not applicable and expired before `old` (= now - delta_old); a pending transaction, not
  applicable, whose deadline is before `old`.

Invariant: no method changes the store; results depend only on the store's content (the
memo lives for one `Rules` pass and is cleared by `invalidate`).
"""

from __future__ import annotations

from collections.abc import Callable

from phalanx.consensus.leaderless.messages import Endorsement, TxId
from phalanx.consensus.leaderless.store import TxRecord, TxState, TxStore

QUORUM_MEMO = 64
"""Policies whose quorum `Rules.quorum` remembers."""


class Rules:
    __slots__ = ("_memo", "_quorum_for", "_quorums", "_store", "count_conditional")

    def __init__(self, store: TxStore, quorum_for: Callable[[str], int]) -> None:
        self._store = store
        self._quorum_for = quorum_for
        self._quorums: dict[str, int] = {}
        """`quorum_for` of the policies asked (a pure function of the configuration; at most
        `QUORUM_MEMO` policies: a client names any)."""
        self._memo: dict[TxId, bool] = {}
        self.count_conditional = False  # the `count_conditional` bug (bugs.py)

    def invalidate(self) -> None:
        """Forget memoised applicability (call after any change to the store)."""
        self._memo.clear()

    def quorum(self, record: TxRecord) -> int:
        policy = record.tx.policy
        found = self._quorums.get(policy)
        if found is None:
            found = self._quorum_for(policy)
            if len(self._quorums) < QUORUM_MEMO:
                self._quorums[policy] = found
        return found

    def applicable(self, tx_id: TxId) -> bool:
        return self._applicable(tx_id, [])[0]

    def _applicable(self, tx_id: TxId, path: list[TxId]) -> tuple[bool, frozenset[TxId]]:
        """(applicable, the ids on `path` that `tx_id`'s conditions reach back to). A
        transaction whose conditions reach back to itself or to an ancestor on the path is
        on a cycle: not applicable."""
        cached = self._memo.get(tx_id)
        if cached is not None:
            return cached, frozenset()
        state = self._store.state_of(tx_id)
        if state is TxState.COMMITTED:
            return True, frozenset()
        if tx_id in path:
            return False, frozenset((tx_id,))
        if state is not TxState.PENDING:
            return False, frozenset()  # dropped or unknown
        record = self._store.records[tx_id]
        path.append(tx_id)
        valid = 0
        hits: frozenset[TxId] = frozenset()
        for endorsement in record.endorsements.values():
            ok = True
            for condition in endorsement.conditions:
                sub, back = self._applicable(condition, path)
                hits |= back
                if sub:
                    ok = False
                    break
            valid += ok
        path.pop()
        if hits:
            return False, hits - {tx_id}  # on a cycle: not applicable
        result = valid >= self.quorum(record)
        self._memo[tx_id] = result
        return result, frozenset()

    def endorsement_valid(self, endorsement: Endorsement) -> bool:
        """None of its conditions is applicable (it counts towards applicability)."""
        return not any(self.applicable(c) for c in endorsement.conditions)

    def definitely_valid(self, record: TxRecord) -> list[Endorsement]:
        if self.count_conditional:  # the `count_conditional` bug (bugs.py)
            return list(record.endorsements.values())
        dropped = TxState.DROPPED
        state_of = self._store.state_of
        return [e for e in record.endorsements.values()
                if not e.conditions or all(state_of(c) is dropped for c in e.conditions)]

    def dead(self, record: TxRecord) -> list[Endorsement]:
        committed = TxState.COMMITTED
        return [e for e in record.endorsements.values()
                if any(self._store.state_of(c) is committed for c in e.conditions)]

    def committable(self, record: TxRecord) -> bool:
        return (record.state is TxState.PENDING
                and len(self.definitely_valid(record)) >= self.quorum(record))

    def stuck(self, old: int) -> list[TxId]:
        out: dict[TxId, None] = {}
        for record in self._store.pending():
            if self.applicable(record.tx_id):
                for e in record.endorsements.values():
                    for c in e.conditions:
                        if self._stuck_condition(c, old):
                            out[c] = None
            elif record.deadline < old:
                out[record.tx_id] = None
        return list(out)

    def _stuck_condition(self, c: TxId, old: int) -> bool:
        state = self._store.state_of(c)
        if state is None:
            return True
        return (state is TxState.PENDING and not self.applicable(c)
                and self._store.records[c].deadline < old)
