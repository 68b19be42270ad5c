"""Version-gated release of committed transactions to the replica layer (reference gap 2).

Owns: the local index sequence (one transaction per `Entry`, term 0), the committed
transactions waiting at the gate, and the released ones not yet garbage-collected. The
durable record holds the proofs of the gated ones and of the released ones whose WAL entry
is not yet known durable (`unsynced`: released by a Ready that no fsynced `Persisted` has
covered yet, `mark_synced`); once durable in the WAL a proof leaves the record (the WAL
holds the transaction; see `durable.py` for the crash cases).

Gate rule: a committed T is released (next local index) only when no released-but-unapplied
transaction (index > `app.applied()`) writes a key T requires, and `app.versions` of T's
required keys equal its requirements (`requirements_hold`: a base requirement against the
base version). A transaction without requirements passes at once
(commuting updates). Waiting transactions are tried in commit order on every step. The
released-but-unapplied transactions are indexed by key (`_Unapplied`, rebuilt from
`released` after a restore or an install): the rule, and the endorsement rule's
unapplied-conflict check (`unapplied_touching`), look up keys instead of walking them.

Skip rule (`skip_stale_reads`): a gated READ-ONLY transaction whose deadline lies more than
`grace_ms` in the past leaves the gate unreleased (`skipped`): it changes no state, so
skipping it here changes nothing but this node's answer (the f+1 nodes that applied it in
order answer its client, who stops waiting `abort_grace` after the deadline anyway). Without
it, a read T and a writer W requiring the same version of k, learned W first, left T gated
forever here, and the endorsement rule then refused every later transaction on k
(docs/LEADERLESS.md, "A committed read held at the version gate"). A writing transaction
is never skipped: its writes must apply everywhere.

Invariants: local indexes are gap-free and increasing; a transaction is released at most
once per process lifetime (a restart releases again what the record holds: the replica
applies each transaction id once).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from phalanx.consensus.leaderless.app_view import AppView
from phalanx.consensus.leaderless.growing import GrowingTuple
from phalanx.consensus.leaderless.messages import Requirement, TransactionProof, TxId
from phalanx.consensus.types import ClientRequest, Entry, EntryKind, LocalProtocolError


@dataclass(slots=True, kw_only=True)
class Committed:
    """A committed transaction as the gate holds it."""

    tx_id: TxId
    proof: TransactionProof | None
    """None only for a transaction restored from the WAL after a restart (no proof kept)."""
    request_command: bytes
    writes: tuple[str, ...]
    index: int = 0
    ready: int = 0
    """The number of the Ready that released it (0: not yet numbered)."""
    keys: tuple[str, ...] | None = None
    """Every key it reads or writes (`TxRecord.keys`); None: unknown or a range (it may
    touch any key)."""


class _Unapplied:
    """The released transactions not applied yet (index > `applied()`), indexed by key:
    the gate and the endorsement rule ask "which of them touch these keys" per decision
    (walking all of them cost O(backlog) per transaction: ~1 ms at 64 clients)."""

    __slots__ = ("by_key", "items", "wild")

    def __init__(self, items: Sequence[Committed]) -> None:
        self.items: deque[Committed] = deque()
        self.by_key: dict[str, dict[TxId, Committed]] = {}
        self.wild: dict[TxId, Committed] = {}
        for item in items:
            self.add(item)

    def add(self, item: Committed) -> None:
        """Append `item` (its index above every held one's)."""
        self.items.append(item)
        if item.keys is None:
            self.wild[item.tx_id] = item
            return
        by_key = self.by_key
        for key in {*item.keys, *item.writes}:
            held = by_key.get(key)
            if held is None:
                by_key[key] = {item.tx_id: item}
            else:
                held[item.tx_id] = item

    def prune(self, applied: int) -> None:
        """Forget the oldest items up to index `applied`."""
        items = self.items
        by_key = self.by_key
        while items and items[0].index <= applied:
            item = items.popleft()
            if item.keys is None:
                del self.wild[item.tx_id]
                continue
            for key in {*item.keys, *item.writes}:
                held = by_key[key]
                del held[item.tx_id]
                if not held:
                    del by_key[key]


class ReleaseGate:
    __slots__ = ("_app", "_gated_at_mark", "_gated_proofs", "_proofs", "_unapplied", "_unstamped",
                 "_unsynced_indexes", "_unsynced_proofs", "_unsynced_stale", "gated", "hold_until",
                 "last_index", "no_gate", "released", "skip_count", "skipped", "unsynced")

    def __init__(self, app: AppView, *, start_index: int, no_gate: bool = False) -> None:
        self._app = app
        self.last_index = start_index
        self.gated: dict[TxId, Committed] = {}
        self.released: dict[TxId, Committed] = {}
        self.unsynced: dict[TxId, Committed] = {}
        """Released, WAL entry not yet known durable (index order): still in the record."""
        self.skipped: dict[TxId, None] = {}
        """Committed read-only transactions skipped here (`skip_stale_reads`), until GC."""
        self.skip_count = 0
        """Skipped by this process in all (`LeaderlessStatus.skipped_reads`)."""
        self._unstamped: list[Committed] = []
        self._proofs: tuple[tuple[TransactionProof, ...], tuple[int, ...]] | None = None
        """`proofs()`, cached until a change (the journal diffs the record by identity)."""
        self._unsynced_proofs: GrowingTuple[TransactionProof] = GrowingTuple()
        self._unsynced_indexes: GrowingTuple[int] = GrowingTuple()
        """The unsynced part of `proofs()` and its indexes, kept up to date by appending a
        release and trimming a collected head (`growing.py`: one copy per read; it holds
        the horizon's releases, and rebuilding it per Ready cost O(rate x horizon))."""
        self._unsynced_stale = True
        """They must be rebuilt from `unsynced` (it changed some other way)."""
        self._gated_at_mark = True
        """No gated proof was in the record `mark_record` marked (`record_growth`)."""
        self._gated_proofs: tuple[TransactionProof, ...] | None = None
        """The gated part of `proofs()` (None: rebuild)."""
        self._unapplied: _Unapplied | None = None
        """Released and not applied yet, by key (None: rebuild from `released`)."""
        self.no_gate = no_gate
        self.hold_until = 0
        """Release nothing until `app.applied()` reaches this (an installed checkpoint's
        index: the gate must judge requirements on the installed state, not the old one)."""

    def __contains__(self, tx_id: TxId) -> bool:
        return tx_id in self.gated or tx_id in self.released or tx_id in self.skipped

    def add(self, item: Committed) -> None:
        if item.tx_id not in self:
            self.gated[item.tx_id] = item
            self._gated_changed()

    def _gated_changed(self) -> None:
        self._gated_proofs = None
        self._proofs = None

    def _all_changed(self) -> None:
        self._unapplied = None
        self._unsynced_stale = True
        self._gated_proofs = None
        self._proofs = None

    def unapplied(self, tx_id: TxId) -> bool:
        """Committed here but not applied yet (gated, or released beyond `applied()`)."""
        if tx_id in self.gated:
            return True
        item = self.released.get(tx_id)
        return item is not None and item.index > self._app.applied()

    def proof(self, tx_id: TxId) -> TransactionProof | None:
        """The commit certificate of a committed transaction the gate still holds (None
        also for one restored from the WAL without its proof)."""
        item = self.gated.get(tx_id) or self.released.get(tx_id)
        return item.proof if item is not None else None

    def stamp(self, number: int) -> None:
        """The Ready that carries this step's releases got `number`."""
        for item in self._unstamped:
            item.ready = number
        self._unstamped.clear()

    def mark_synced(self, number: int) -> bool:
        """Every Ready up to `number` is durable and fsynced: their releases are in the WAL
        for good and leave the durable record. True if any did."""
        self._all_changed()
        done = [t for t, item in self.unsynced.items() if 0 < item.ready <= number]
        for tx_id in done:
            del self.unsynced[tx_id]
        return bool(done)

    def restore_wal(self, item: Committed) -> None:
        """A restarted node's transaction found in the WAL at `item.index`: released
        there (the replica applies it from the WAL), never released again."""
        self._all_changed()
        self.gated.pop(item.tx_id, None)
        self.released[item.tx_id] = item
        self.last_index = max(self.last_index, item.index)

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

    def unapplied_touching(self, keys: tuple[str, ...] | None) -> list[TxId]:
        """The ids of `unapplied_ids()` that may touch one of `keys` (None: any key): the
        gated ones, and the released-unapplied ones that name one of `keys` or a range. A
        superset of those that conflict; order: gated, then by key."""
        out = dict.fromkeys(self.gated)
        unapplied = self._unapplied_now()
        if keys is None:
            out.update(dict.fromkeys(item.tx_id for item in unapplied.items))
            return list(out)
        by_key = unapplied.by_key
        for key in keys:
            held = by_key.get(key)
            if held:
                out.update(dict.fromkeys(held))
        out.update(dict.fromkeys(unapplied.wild))
        return list(out)

    def _unapplied_now(self) -> _Unapplied:
        unapplied = self._unapplied
        applied = self._app.applied()
        if unapplied is None:
            unapplied = self._unapplied = _Unapplied(sorted(
                (c for c in self.released.values() if c.index > applied),
                key=lambda c: c.index))
        else:
            unapplied.prune(applied)
        return unapplied

    def release_now(self, item: Committed) -> Entry:
        """Release `item` at the next index without the gate (restart re-release)."""
        if self.gated.pop(item.tx_id, None) is not None:
            self._gated_changed()
        self.last_index += 1
        item.index = self.last_index
        self.released[item.tx_id] = item
        if self._unapplied is not None:
            self._unapplied.add(item)
        self.unsynced[item.tx_id] = item
        self._proofs = None
        if item.proof is not None:
            self._unsynced_proofs.append(item.proof)
            self._unsynced_indexes.append(item.index)
        self._unstamped.append(item)
        return _entry(item)

    def ready(self, item: Committed) -> bool:
        if self.no_gate:
            return True
        if item.proof is None:
            return True
        reqs = item.proof.tx.requirements
        if not reqs:
            return True
        unapplied = self._unapplied_now()
        by_key = unapplied.by_key
        for r in reqs:
            held = by_key.get(r.key)
            if held and any(r.key in other.writes for other in held.values()):
                return False
        for other in unapplied.wild.values():
            if any(r.key in other.writes for r in reqs):
                return False
        return requirements_hold(self._app, reqs)

    def skip_stale_reads(self, now_ms: int | None, grace_ms: int) -> int:
        """Skip every gated read-only transaction whose deadline + `grace_ms` is before
        `now_ms` (module docstring); how many were skipped."""
        if now_ms is None or not self.gated:
            return 0
        stale = [item.tx_id for item in self.gated.values()
                 if not item.writes and item.proof is not None
                 and item.proof.tx.deadline_ms + grace_ms < now_ms]
        for tx_id in stale:
            del self.gated[tx_id]
            self.skipped[tx_id] = None
        if stale:
            self._gated_changed()
            self.skip_count += len(stale)
        return len(stale)

    def release(self) -> list[Entry]:
        """Release every waiting transaction that passes the gate, in commit order."""
        out: list[Entry] = []
        if self.hold_until and self._app.applied() < self.hold_until:
            return out
        for item in list(self.gated.values()):
            if self.ready(item):
                out.append(self.release_now(item))
        return out

    def collect(self, tx_id: TxId) -> bool:
        """Forget a released and applied (or a skipped) transaction (GC); False if it must
        stay."""
        if tx_id in self.skipped:
            del self.skipped[tx_id]
            return True
        item = self.released.get(tx_id)
        if item is None or item.index > self._app.applied():
            return False
        del self.released[tx_id]
        if self.unsynced.pop(tx_id, None) is not None:
            self._proofs = None
            proofs = self._unsynced_proofs
            if len(proofs) and proofs.head() is item.proof:
                proofs.pop_head()  # the oldest: the usual order
                self._unsynced_indexes.pop_head()
            elif item.proof is not None:
                self._unsynced_stale = True
        return True

    def installed(self, index: int, applied: dict[TxId, int]) -> None:
        """A checkpoint holding the transactions `applied` goes in at local `index` (state
        transfer): gated ones it holds count as released there (never released again),
        the next release follows `index`, and nothing is released before the driver
        installed it (`hold_until`)."""
        self._all_changed()
        for tx_id in [t for t in self.gated if t in applied]:
            item = self.gated.pop(tx_id)
            item.index = index
            self.released[tx_id] = item
        self.last_index = index
        self.hold_until = index

    def regate(self, tx_ids: list[TxId]) -> None:
        """An installed checkpoint lacks these released transactions (applied here on the
        state it replaces): they wait at the gate again, ahead of the gated ones (commit
        order), to be released after the install, judged on the installed state. Each
        must still hold its proof (`_entry`)."""
        self._all_changed()
        back: dict[TxId, Committed] = {}
        for tx_id in tx_ids:
            item = self.released.pop(tx_id)
            self.unsynced.pop(tx_id, None)
            item.index = item.ready = 0
            back[tx_id] = item
        self._unstamped = [i for i in self._unstamped if i.tx_id not in back]
        self.gated = {**back, **self.gated}

    def sort_released(self) -> None:
        """Put `released` back in index order (after a restore inserted out of order)."""
        self._all_changed()
        self.released = dict(sorted(self.released.items(), key=lambda kv: kv[1].index))

    def restore_applied(self, item: Committed, index: int) -> None:
        """A restarted node's `item`, released at `index` before the crash and applied since
        (`index <= applied()`): held as released there, not released again."""
        self._all_changed()
        self.gated.pop(item.tx_id, None)
        item.index = index
        self.released[item.tx_id] = item

    def proofs(self) -> tuple[tuple[TransactionProof, ...], tuple[int, ...]]:
        """(the proofs the durable record holds: the unsynced released ones in index order,
        then the gated ones; the unsynced ones' indexes)."""
        if self._proofs is None:
            if self._unsynced_stale:
                self._unsynced_stale = False
                done = [c for c in self.unsynced.values() if c.proof is not None]
                self._unsynced_proofs.reset(c.proof for c in done if c.proof is not None)
                self._unsynced_indexes.reset(c.index for c in done)
            unsynced = self._unsynced_proofs.value()
            gated = self._gated_proofs
            if gated is None:
                gated = self._gated_proofs = tuple(
                    c.proof for c in self.gated.values() if c.proof is not None)
            self._proofs = (unsynced + gated if gated else unsynced,
                            self._unsynced_indexes.value())
        return self._proofs

    def record_growth(self) -> tuple[tuple[int, tuple[object, ...]] | None, ...]:
        """How the (committed, released_at) parts of `proofs()` changed since the last
        `mark_record` (`growing.Growth.of`; None: some other way, or gated proofs were in
        either). Read right after `proofs()`."""
        proofs, indexes = self.proofs()
        if not self._gated_at_mark or self._gated_proofs:
            return None, self._unsynced_indexes.growth.of(indexes)
        return (self._unsynced_proofs.growth.of(proofs),
                self._unsynced_indexes.growth.of(indexes))

    def mark_record(self) -> None:
        """`proofs()` as it is now went into a record (the base of `record_growth`)."""
        self._gated_at_mark = not self._gated_proofs
        self._unsynced_proofs.growth.mark()
        self._unsynced_indexes.growth.mark()


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
    if item.proof is None:
        raise LocalProtocolError("a transaction restored from the WAL is never released again")
    tx = item.proof.tx
    request = ClientRequest(client_id=tx.client_id, request_no=tx.request_no,
                            command=item.request_command, read_only=tx.read_only)
    return Entry(index=item.index, term=0, kind=EntryKind.COMMAND, requests=(request,))
