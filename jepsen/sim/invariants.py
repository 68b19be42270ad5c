"""White-box replicated-state-machine invariants, checked continuously during a simulation.

Owns: `LogMirror` (the driver's view of one node's log: what it wrote, rebuilt from storage
after a crash) and `InvariantChecker`, which records every violation of:

- **Election safety**: at most one leader per term (Raft §5.2).
- **Log matching**: two logs holding an entry with the same index and term are identical up
  to that index (Raft §5.3). Checked over whole logs, which is what Raft guarantees.
- **Leader completeness**: a node that becomes leader holds every entry applied anywhere
  before it took office (Raft §5.4), unless covered by its snapshot.
- **State-machine safety**: no two nodes apply different entries at one index; a global
  index → entry map of applied entries (Raft §5.4.3).
- **Monotone commit**: a node's commit index never decreases within one incarnation (a
  restart may restore a lower, still safe, commit index).
- Violations found elsewhere (a protocol's white-box message watch, e.g. Raft's one vote
  per term) are recorded through `record`.
- **Committed means durable on a majority**: every applied entry is held (in its log, or
  covered by its snapshot) by a majority of the nodes' written logs (Raft §5.4's premise;
  any majority-quorum protocol with a static membership). Checked over the newest
  `durable_window` applied indices each time, so the cost per check is bounded.

Rules:
- Pure bookkeeping over values handed in by the simulator; no clocks, no randomness, no
  storage and no cores imported. Iteration is over sorted keys only.
- A violation is recorded, never raised, so a run reports every broken invariant with the
  virtual time it was first seen.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from phalanx.consensus.types import Entry


@dataclass(frozen=True, slots=True, kw_only=True)
class Violation:
    """One broken invariant: which, when (virtual ns) and a readable explanation."""

    invariant: str
    at_ns: int
    detail: str

    def __str__(self) -> str:
        return f"{self.invariant} at t={self.at_ns / 1e6:.3f}ms: {self.detail}"


class LogMirror:
    """One node's log as the driver wrote it: a snapshot point and the entries after it.

    Invariant: `entries[i].index == snapshot_index + 1 + i`.
    """

    __slots__ = ("entries", "snapshot_index", "snapshot_term")

    def __init__(
        self, *, snapshot_index: int = 0, snapshot_term: int = 0, entries: Sequence[Entry] = ()
    ) -> None:
        self.snapshot_index = snapshot_index
        self.snapshot_term = snapshot_term
        self.entries: list[Entry] = []
        self.append(entries)

    def last_index(self) -> int:
        return self.snapshot_index + len(self.entries)

    def get(self, index: int) -> Entry | None:
        """The entry at `index`, or None when outside the held range."""
        pos = index - self.snapshot_index - 1
        if 0 <= pos < len(self.entries):
            return self.entries[pos]
        return None

    def install_snapshot(self, index: int, term: int) -> None:
        self.snapshot_index = index
        self.snapshot_term = term
        self.entries = []

    def truncate_from(self, index: int) -> None:
        pos = max(0, index - self.snapshot_index - 1)
        del self.entries[pos:]

    def append(self, entries: Iterable[Entry]) -> None:
        for entry in entries:
            expected = self.last_index() + 1
            if entry.index != expected:
                raise ValueError(f"log mirror: appending index {entry.index}, expected {expected}")
            self.entries.append(entry)


class InvariantChecker:
    """Accumulates violations; `ok` is True while none was seen."""

    def __init__(self, *, leader_role: str = "leader") -> None:
        self.leader_role = leader_role
        self.violations: list[Violation] = []
        self.leaders: dict[int, str] = {}
        self.applied: dict[int, Entry] = {}
        self.applied_by: dict[int, str] = {}
        self._commit: dict[str, tuple[int, int]] = {}  # node -> (incarnation, commit)
        self._seen: set[str] = set()

    @property
    def ok(self) -> bool:
        return not self.violations

    def record(self, invariant: str, at_ns: int, detail: str) -> None:
        """Record a violation found outside this checker (e.g. a protocol's message watch)."""
        self._violate(invariant, at_ns, detail)

    def _violate(self, invariant: str, at_ns: int, detail: str) -> None:
        key = f"{invariant}:{detail}"
        if key in self._seen:
            return
        self._seen.add(key)
        self.violations.append(Violation(invariant=invariant, at_ns=at_ns, detail=detail))

    def observe_role(
        self, node: str, *, role: str, term: int, log: LogMirror | None, at_ns: int
    ) -> None:
        """After every step: election safety, and leader completeness on taking office."""
        if role != self.leader_role:
            return
        holder = self.leaders.get(term)
        if holder is None:
            self.leaders[term] = node
            if log is not None:
                self._check_completeness(node, term, log, at_ns)
        elif holder != node:
            self._violate(
                "election-safety", at_ns, f"two leaders in term {term}: {holder} and {node}"
            )

    def _check_completeness(self, node: str, term: int, log: LogMirror, at_ns: int) -> None:
        for index in sorted(self.applied):
            if index <= log.snapshot_index:
                continue
            mine = log.get(index)
            if mine != self.applied[index]:
                self._violate(
                    "leader-completeness",
                    at_ns,
                    f"{node} became leader of term {term} without committed entry "
                    f"{_short(self.applied[index])} (applied by {self.applied_by[index]}); "
                    f"its log has {_short(mine)}",
                )
                return

    def observe_apply(self, node: str, entry: Entry, at_ns: int) -> None:
        """A node applied `entry` to its state machine."""
        known = self.applied.get(entry.index)
        if known is None:
            self.applied[entry.index] = entry
            self.applied_by[entry.index] = node
        elif known != entry:
            self._violate(
                "state-machine-safety",
                at_ns,
                f"index {entry.index}: {self.applied_by[entry.index]} applied {_short(known)}, "
                f"{node} applied {_short(entry)}",
            )

    def observe_commit(self, node: str, *, incarnation: int, commit: int, at_ns: int) -> None:
        prev = self._commit.get(node)
        if prev is not None and prev[0] == incarnation and commit < prev[1]:
            self._violate(
                "monotone-commit",
                at_ns,
                f"{node} commit index went from {prev[1]} to {commit} without a restart",
            )
        self._commit[node] = (incarnation, commit)

    def check_committed_durable(
        self, logs: Mapping[str, LogMirror], at_ns: int, *, durable_window: int = 256
    ) -> None:
        """Each of the newest `durable_window` applied entries is held by a majority."""
        if not self.applied:
            return
        names = sorted(logs)
        majority = len(names) // 2 + 1
        top = max(self.applied)
        for index in range(max(1, top - durable_window + 1), top + 1):
            entry = self.applied.get(index)
            if entry is None:
                continue
            holders = [
                n for n in names
                if logs[n].snapshot_index >= index or logs[n].get(index) == entry
            ]
            if len(holders) < majority:
                self._violate(
                    "committed-durable",
                    at_ns,
                    f"applied entry {_short(entry)} (applied by {self.applied_by[index]}) "
                    f"is held by only {','.join(holders) or 'no node'}, not a majority of "
                    f"{len(names)}",
                )
                return

    def check_log_matching(self, logs: Mapping[str, LogMirror], at_ns: int) -> None:
        """Every pair of logs agrees below their highest common (index, term)."""
        names = sorted(logs)
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                self._check_pair(a, logs[a], b, logs[b], at_ns)

    def _check_pair(self, a: str, la: LogMirror, b: str, lb: LogMirror, at_ns: int) -> None:
        lo = max(la.snapshot_index, lb.snapshot_index) + 1
        hi = min(la.last_index(), lb.last_index())
        matched = False
        for index in range(hi, lo - 1, -1):
            ea = la.get(index)
            eb = lb.get(index)
            if ea is None or eb is None:
                continue
            if not matched:
                matched = ea.term == eb.term
            if matched and ea != eb:
                self._violate(
                    "log-matching",
                    at_ns,
                    f"{a} and {b} share a later (index, term) but differ at index {index}: "
                    f"{_short(ea)} vs {_short(eb)}",
                )
                return


def _short(entry: Entry | None) -> str:
    if entry is None:
        return "nothing"
    reqs = ",".join(f"{r.client_id}#{r.request_no}" for r in entry.requests[:3])
    more = "..." if len(entry.requests) > 3 else ""
    return f"[{entry.index}@t{entry.term} {entry.kind.name}{' ' + reqs + more if reqs else ''}]"
