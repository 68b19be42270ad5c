"""The endorsement rule of a correct node (docs/LEADERLESS.md "Endorse"; PnyxDB §1.7 step 2).

Owns: `Endorser.decide`, which says whether this node endorses a known pending transaction
now, and with which conditions, and has the safety kernel sign it. For T (neither endorsed
nor refused here):
1. T's deadline has passed → never (the core signs a refusal instead).
2. A requirement does not match the applied version (a base requirement: the base
   version), a key of `app.needs_requirements` has no full requirement, a key of
   `app.needs_base` has none, an update required only by base does not fit its key's run
   (`app.fits_run`), a writing transaction requires a key it does not write, the policy
   refuses, or the deadline lies more than `max_deadline_lead_ms` past the clock → not now.
   (Why the write-set rule: T writing j and requiring k@V, and a later W writing k and
   requiring V, both commit where T applied before W; a node that learns W first could
   never apply T, and T's write of j would be lost there.)
3. A transaction committed here but not yet applied conflicts with T → not now.
4. K = own endorsed pending transactions that conflict with T: K = ∅ → unconditional;
   all of K expired → conditional on K; else not now.

Conflict = the app's `conflicts` of the commands, or one's full-requirement keys meet the
other's writes (base requirements: only the app's `conflicts`). No state of its own
beyond what it reads.
"""

from __future__ import annotations

from phalanx.consensus.leaderless.app_view import AppView
from phalanx.consensus.leaderless.config import LeaderlessConfig
from phalanx.consensus.leaderless.messages import Endorsement, Transaction, TxId
from phalanx.consensus.leaderless.release import ReleaseGate, requirements_hold
from phalanx.consensus.leaderless.safety import SafetyKernel
from phalanx.consensus.leaderless.store import TxRecord, TxState, TxStore


class Endorser:
    __slots__ = ("_app", "_by_key", "_config", "_gate", "_kernel", "_keys_of", "_open",
                 "_open_floor", "_store", "_wild", "skip_requirements", "unconditional_always")

    def __init__(self, *, config: LeaderlessConfig, app: AppView, store: TxStore,
                 kernel: SafetyKernel, gate: ReleaseGate,
                 unconditional_always: bool = False) -> None:
        self._config = config
        self._app = app
        self._store = store
        self._kernel = kernel
        self._gate = gate
        self.unconditional_always = unconditional_always
        self._open: dict[TxId, None] | None = None
        """Own endorsed transactions not yet seen decided (None: not built yet)."""
        self._by_key: dict[str, dict[TxId, None]] = {}
        """`_open` by the keys each touches (`_keys`): K's candidates for a transaction are
        the open ones sharing a key with it, plus `_wild`."""
        self._wild: dict[TxId, None] = {}
        """Open ones whose keys are unknown (not readable here, or key ranges): candidates
        for every transaction."""
        self._keys_of: dict[TxId, tuple[str, ...] | None] = {}
        self._open_floor = 0
        """`len(_open)` after the last full prune (the next one comes at twice that)."""
        self.skip_requirements = False  # the `skip_requirements` bug (bugs.py)

    def conflicts(self, a: TxRecord, b: TxRecord) -> bool:
        if self._app.conflicts(a.tx.command, b.tx.command):
            return True
        # A base requirement orders only against non-commuting writes, which `conflicts`
        # already sees: counting it here would make every pair of commuting updates conflict.
        return (any(r.key in b.writes for r in a.tx.requirements if not r.base)
                or any(r.key in a.writes for r in b.tx.requirements if not r.base))

    def acceptable(self, record: TxRecord) -> bool:
        """Rule 2: requirements hold on the applied state, cover every key that needs one,
        and the policy accepts."""
        tx = record.tx
        full = [r.key for r in tx.requirements if not r.base]
        keys = [r.key for r in tx.requirements]
        if any(k not in full for k in record.needs) or any(
                k not in keys for k in record.needs_base):
            return False
        if record.writes and any(k not in record.writes for k in keys):
            return False  # a writer requiring a key it does not write (module docstring)
        if not self.skip_requirements and not requirements_hold(self._app, tx.requirements):
            return False
        base_only = [r.key for r in tx.requirements if r.base and r.key not in full]
        if base_only and not self._app.fits_run(tx.command, base_only):
            return False
        return self._app.accepts(tx.command, tx.policy)

    @staticmethod
    def _keys(record: TxRecord) -> tuple[str, ...] | None:
        """Every key `record` touches as far as `conflicts` can tell (`TxRecord.keys`: the
        app's keys and its full-requirement keys); None when the app cannot say (key
        ranges): then it may conflict with anything. Two transactions that share none
        never conflict."""
        return record.keys

    def _opened(self, tx_id: TxId) -> None:
        """`tx_id` (just endorsed here) joins `_open` and its key index."""
        assert self._open is not None  # built before: `conflicting_pending` ran first
        self._open[tx_id] = None
        record = self._store.get(tx_id)
        keys = self._keys(record) if record is not None else None
        self._keys_of[tx_id] = keys
        if keys is None:
            self._wild[tx_id] = None
            return
        for key in keys:
            self._by_key.setdefault(key, {})[tx_id] = None

    def _close(self, tx_id: TxId) -> None:
        """`tx_id` is decided or collected: out of `_open` and its index."""
        assert self._open is not None
        del self._open[tx_id]
        keys = self._keys_of.pop(tx_id, None)
        self._wild.pop(tx_id, None)
        for key in keys or ():
            ids = self._by_key.get(key)
            if ids is not None:
                ids.pop(tx_id, None)
                if not ids:
                    del self._by_key[key]

    def _closed(self, other_id: TxId) -> bool:
        """Whether the own endorsement `other_id` is decided or collected (then it is never
        pending again)."""
        other = self._store.get(other_id)
        return ((other is not None and other.state is not TxState.PENDING)
                or self._kernel.endorsement(other_id) is None
                or (other is None and self._store.decided(other_id)))

    def _prune(self) -> None:
        """Close decided ones: the oldest while they are decided (the usual order), and all
        of them whenever `_open` doubled since the last full prune (amortised O(1))."""
        assert self._open is not None
        while self._open:
            first = next(iter(self._open))
            if not self._closed(first):
                break
            self._close(first)
        if len(self._open) > 2 * self._open_floor + 64:
            for other_id in [t for t in self._open if self._closed(t)]:
                self._close(other_id)
            self._open_floor = len(self._open)

    def conflicting_pending(self, tx_id: TxId, tx: Transaction) -> list[TxId]:
        """K: own endorsed transactions, still pending, that conflict with `tx_id`. Walks
        only the own endorsements still pending (`_open`) that share a key with it (or
        whose keys are unknown), not every own endorsement of the GC horizon."""
        record = self._store.get(tx_id)
        if record is None:
            return []
        if self._open is None:  # first use (after a restore): every own endorsement
            self._open = {}
            for other_id in self._kernel.endorsed_ids():
                self._opened(other_id)
        self._prune()
        keys = self._keys(record)
        if keys is None:
            candidates: dict[TxId, None] = dict(self._open)
        else:
            candidates = {}
            for key in keys:
                candidates.update(self._by_key.get(key, {}))
            candidates.update(self._wild)
        out = []
        for other_id in candidates:
            if self._closed(other_id):
                self._close(other_id)  # decided or collected: never pending again
                continue
            other = self._store.get(other_id)
            if other is None:
                continue  # not readable here yet (the kernel's `unreadable` covers it)
            if other_id in self._wild and self._keys(other) is not None:
                self._close(other_id)  # it became readable: index it by its keys
                self._opened(other_id)
            if other_id != tx_id and self.conflicts(record, other):
                out.append(other_id)
        return out

    def _unapplied_conflict(self, record: TxRecord) -> bool:
        keys = record.keys
        mine = set(keys) if keys is not None else None
        for tx_id in self._gate.unapplied_touching(keys):
            other = self._store.get(tx_id)
            if other is None or (mine is not None and other.keys is not None
                                 and mine.isdisjoint(other.keys)):
                continue  # no shared key: no conflict (`_keys`)
            if self.conflicts(record, other):
                return True
        return False

    def decide(self, record: TxRecord, now: int) -> Endorsement | None:
        """This node's endorsement of `record` if the rules allow it now (signed and
        recorded by the kernel), else None."""
        if (record.state is not TxState.PENDING or now > record.deadline
                or record.deadline - now > self._config.max_deadline_lead_ms
                or self._kernel.touched(record.tx_id)):
            return None
        if not self.acceptable(record) or self._unapplied_conflict(record):
            return None
        conditions: tuple[TxId, ...] = ()
        if not self.unconditional_always:
            k = self.conflicting_pending(record.tx_id, record.tx)
            k += [t for t in self._kernel.unreadable() if t != record.tx_id]
            if k:
                if any(self._store.records[t].deadline >= now for t in k
                       if t in self._store.records):
                    return None
                if any(t not in self._store.records for t in k):
                    return None  # an own endorsement we cannot read: wait for it
                conditions = tuple(sorted(set(k)))
        signed = self._kernel.endorse(record.tx_id, record.tx, conditions,
                                      self.conflicting_pending)
        if self._open is not None:
            self._opened(record.tx_id)
        return signed
