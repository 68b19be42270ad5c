"""Version-gated release of committed transactions to the replica layer (reference gap 2).

Owns: the local index sequence (one transaction per `Entry`, term 0), the committed
transactions waiting at the gate, and the released ones not yet garbage-collected (their
commit proofs are part of the durable record).

Gate rule: a committed T is released (next local index) only when no released-but-unapplied
transaction (index > `app.applied()`) writes a key T requires, and `app.versions` of T's
required keys equal its requirements (`requirements_hold`: a base requirement against the
base version). A transaction without requirements passes at once
(commuting updates). Waiting transactions are tried in commit order on every step.

Invariants: local indexes are gap-free and increasing; a transaction is released at most
once per process lifetime (a restart releases again what the record holds: the replica
applies each transaction id once).
"""

from __future__ import annotations

from dataclasses import dataclass

from phalanx.consensus.leaderless.app_view import AppView
from phalanx.consensus.leaderless.messages import Requirement, TransactionProof, TxId
from phalanx.consensus.types import ClientRequest, Entry, EntryKind


@dataclass(slots=True, kw_only=True)
class Committed:
    """A committed transaction as the gate holds it."""

    tx_id: TxId
    proof: TransactionProof
    request_command: bytes
    writes: tuple[str, ...]
    index: int = 0


class ReleaseGate:
    __slots__ = ("_app", "gated", "last_index", "no_gate", "released")

    def __init__(self, app: AppView, *, start_index: int, no_gate: bool = False) -> None:
        self._app = app
        self.last_index = start_index
        self.gated: dict[TxId, Committed] = {}
        self.released: dict[TxId, Committed] = {}
        self.no_gate = no_gate

    def __contains__(self, tx_id: TxId) -> bool:
        return tx_id in self.gated or tx_id in self.released

    def add(self, item: Committed) -> None:
        if item.tx_id not in self:
            self.gated[item.tx_id] = item

    def unapplied(self, tx_id: TxId) -> bool:
        """Committed here but not applied yet (gated, or released beyond `applied()`)."""
        if tx_id in self.gated:
            return True
        item = self.released.get(tx_id)
        return item is not None and item.index > self._app.applied()

    def proof(self, tx_id: TxId) -> TransactionProof | None:
        """The commit certificate of a committed transaction the gate still holds."""
        item = self.gated.get(tx_id) or self.released.get(tx_id)
        return item.proof if item is not None else None

    def committed_ids(self) -> list[TxId]:
        """Every committed transaction held, released ones in index order, then gated."""
        return list(self.released) + list(self.gated)

    def unapplied_ids(self) -> list[TxId]:
        """Committed here, not applied yet: the gated ones, then the released ones beyond
        `applied()` (found from the newest release backwards: `released` is in index
        order)."""
        applied = self._app.applied()
        out = list(self.gated)
        for item in reversed(self.released.values()):
            if item.index <= applied:
                break
            out.append(item.tx_id)
        return out

    def release_now(self, item: Committed) -> Entry:
        """Release `item` at the next index without the gate (restart re-release)."""
        self.gated.pop(item.tx_id, None)
        self.last_index += 1
        item.index = self.last_index
        self.released[item.tx_id] = item
        return _entry(item)

    def ready(self, item: Committed) -> bool:
        if self.no_gate:
            return True
        reqs = item.proof.tx.requirements
        if not reqs:
            return True
        keys = [r.key for r in reqs]
        applied = self._app.applied()
        for other in reversed(self.released.values()):
            if other.index <= applied:
                break
            if any(k in other.writes for k in keys):
                return False
        return requirements_hold(self._app, reqs)

    def release(self) -> list[Entry]:
        """Release every waiting transaction that passes the gate, in commit order."""
        out: list[Entry] = []
        for item in list(self.gated.values()):
            if self.ready(item):
                out.append(self.release_now(item))
        return out

    def collect(self, tx_id: TxId) -> bool:
        """Forget a released and applied transaction (GC); False if it must stay."""
        item = self.released.get(tx_id)
        if item is None or item.index > self._app.applied():
            return False
        del self.released[tx_id]
        return True

    def proofs(self) -> tuple[tuple[TransactionProof, ...], int]:
        """(committed proofs, released first in index order then gated, how many released)."""
        done = sorted(self.released.values(), key=lambda c: c.index)
        return tuple(c.proof for c in done) + tuple(c.proof for c in self.gated.values()), len(done)


def requirements_hold(app: AppView, reqs: tuple[Requirement, ...]) -> bool:
    """Whether every requirement holds on `app`'s applied state: a full one against
    `versions`, a base one against `base_versions`."""
    full = [r for r in reqs if not r.base]
    base = [r for r in reqs if r.base]
    if full and app.versions([r.key for r in full]) != tuple(r.version for r in full):
        return False
    return not base or app.base_versions([r.key for r in base]) == tuple(
        r.version for r in base)


def _entry(item: Committed) -> Entry:
    tx = item.proof.tx
    request = ClientRequest(client_id=tx.client_id, request_no=tx.request_no,
                            command=item.request_command, read_only=tx.read_only)
    return Entry(index=item.index, term=0, kind=EntryKind.COMMAND, requests=(request,))
