"""What a node's memory covers: may it vote DROP on a checkpoint id it holds nothing of?

Owns: `Memory`: the deadlines learnt from the transaction bodies a `StartCheckpoint`
carries (`txs`) for listed ids this node holds nothing of (bounded, oldest out first), the
bodies this node attaches to the `StartCheckpoint`s it sends, and the coverage rule
`covers` (docs/LEADERLESS.md "Forgotten commits").

The rule. A node keeps the record or the tombstone of every transaction it committed while
that transaction's deadline is not older than its GC horizon (`store.py`: decided records
and tombstones go only once their deadline is older; an install adds the tombstones of the
installed table within the horizon, `catch_up.py`). So, for an id it holds nothing of:
- its deadline known (a body that hashes to the id) and not older than the horizon: this
  node never committed it (it covers the id), and a drop vote is safe (from the vote on,
  `blocked` keeps it from committing it);
- its deadline older than the horizon: it may have committed it and forgotten it;
- its deadline unknown: the same, unless the horizon is still at or below 0 (every
  deadline is >= 0, `checks.tx_problem`, so nothing was collected yet).
In the last two cases it must not vote drop: the checkpoint machines abstain
(`unprovable`) until a body shows the id covered, or a veto's proof arrives.

Invariants: sans-IO and deterministic (insertion-ordered dict); at most `limit` learnt
deadlines; peer input never raises (a body not about a listed id is ignored, and the
caller counts it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from phalanx.consensus.core import Send
from phalanx.consensus.leaderless.messages import StartCheckpoint, Transaction, TxId


class Memory:
    """Learnt deadlines of unknown checkpoint ids, and the coverage rule (module docstring)."""

    __slots__ = ("_deadlines", "_limit", "drop_forgotten")

    def __init__(self, *, limit: int) -> None:
        self._deadlines: dict[TxId, int] = {}
        self._limit = limit
        self.drop_forgotten = False
        """The `drop_forgotten` bug (bugs.py): every id counts as covered (the rule before
        2026-12-02: a node votes drop on whatever it does not hold)."""

    def learn(self, msg: StartCheckpoint, tx_id_of: Callable[[Transaction], TxId],
              held: Callable[[TxId], bool]) -> int:
        """Take the deadlines of `msg`'s bodies of listed ids this node holds nothing of;
        returns how many bodies were not about a listed id (or were not transactions)."""
        txs: object = msg.txs  # peer input: the codec gives whatever was sent
        ids: object = msg.tx_ids
        if not isinstance(txs, tuple) or not isinstance(ids, tuple):
            return 1
        listed = set(ids)
        bad = 0
        for tx in txs[: len(ids)]:
            tx_id = tx_id_of(tx) if isinstance(tx, Transaction) else None
            if tx_id is None or tx_id not in listed or not isinstance(tx.deadline_ms, int):
                bad += 1
            elif not held(tx_id) and tx_id not in self._deadlines:
                self._deadlines[tx_id] = tx.deadline_ms
                while len(self._deadlines) > self._limit:
                    del self._deadlines[next(iter(self._deadlines))]
        return bad + max(0, len(txs) - len(ids))

    def covers(self, tx_id: TxId, horizon: int) -> bool:
        """Whether this node, holding nothing of `tx_id`, would still hold it had it
        committed it (so it may vote drop on it)."""
        if self.drop_forgotten or horizon <= 0:
            return True
        deadline = self._deadlines.get(tx_id)
        return deadline is not None and deadline >= horizon

    def __len__(self) -> int:
        return len(self._deadlines)


def with_bodies(sends: Iterable[Send], body_of: Callable[[TxId], Transaction | None],
                ) -> list[Send]:
    """`sends` with every `StartCheckpoint` carrying the bodies of the listed ids this node
    holds (one body per id, in id order; a body is looked up once per message)."""
    out: list[Send] = []
    attached: dict[StartCheckpoint, StartCheckpoint] = {}
    for send in sends:
        msg = send.message
        if isinstance(msg, StartCheckpoint) and not msg.txs:
            full = attached.get(msg)
            if full is None:
                bodies = tuple(tx for tx in map(body_of, msg.tx_ids) if tx is not None)
                full = dataclasses.replace(msg, txs=bodies) if bodies else msg
                attached[msg] = full
            send = Send(to=send.to, message=full)
        out.append(send)
    return out
