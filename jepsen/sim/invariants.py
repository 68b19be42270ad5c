"""White-box replicated-state-machine invariants, checked continuously during a simulation.

Owns: `LogMirror` (the driver's view of one node's log: what it wrote, rebuilt from storage
after a crash) and `InvariantChecker`, which records every violation of:

- **Election safety**: at most one leader per term (Raft §5.2).
- **Log matching**: two logs holding an entry with the same index and term are identical up
  to that index (Raft §5.3). Checked over whole logs, which is what Raft guarantees;
  incrementally: a pair's agreed prefix is remembered and rescanned only after either log
  lost an entry (`LogMirror.generation`), which gives the verdict of a full rescan.
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
  `durable_window` applied indices each time, so the cost per check is bounded; indices
  found held at the previous check are not re-examined while no log lost an entry since.
  A node recovering from a lost disk counts as a holder: it neither votes nor campaigns
  until it holds every committed entry again (`RaftRestoredState.recovering`), so no
  election quorum can do without a node that holds the entry.

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

    Invariants: `entries[i].index == snapshot_index + 1 + i`; `generation` increases whenever
    an entry is removed (truncation, snapshot), so a log whose generation is unchanged only
    grew since it was last looked at. Change it only through its methods.
    """

    __slots__ = ("entries", "generation", "snapshot_index", "snapshot_term")

    def __init__(
        self, *, snapshot_index: int = 0, snapshot_term: int = 0, entries: Sequence[Entry] = ()
    ) -> None:
        self.snapshot_index = snapshot_index
        self.snapshot_term = snapshot_term
        self.generation = 0
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
        self.generation += 1

    def truncate_from(self, index: int) -> None:
        pos = max(0, index - self.snapshot_index - 1)
        if pos < len(self.entries):
            del self.entries[pos:]
            self.generation += 1

    def append(self, entries: Iterable[Entry]) -> None:
        for entry in entries:
            expected = self.snapshot_index + len(self.entries) + 1  # last_index() + 1
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
        # (a, b) -> (log a, its generation, log b, its generation, v): the two logs were
        # found identical at every common index <= v.
        self._agreed: dict[tuple[str, str], tuple[LogMirror, int, LogMirror, int, int]] = {}
        # The logs (and generations) of the last committed-durable check, and the highest
        # applied index it found held by a majority (with every lower one in its window).
        self._durable_logs: tuple[tuple[str, LogMirror, int], ...] = ()
        self._durable_upto = 0

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
        elif known is not entry and known != entry:  # the leader applies the same object
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
        self, logs: Mapping[str, LogMirror], at_ns: int, *, durable_window: int = 256,
        recovering: frozenset[str] = frozenset(),
    ) -> None:
        """Each of the newest `durable_window` applied entries is held by a majority
        (`recovering` nodes count as holders: see the module docstring)."""
        if not self.applied:
            return
        names = sorted(logs)
        majority = len(names) // 2 + 1
        top = max(self.applied)
        state = tuple((n, logs[n], logs[n].generation) for n in names)
        start = max(1, top - durable_window + 1)
        if len(state) == len(self._durable_logs) and all(
            a[0] == b[0] and a[1] is b[1] and a[2] == b[2]
            for a, b in zip(state, self._durable_logs, strict=True)
        ):
            start = max(start, self._durable_upto + 1)  # held then, and no log lost an entry
        self._durable_logs = state
        self._durable_upto = 0
        for index in range(start, top + 1):
            entry = self.applied.get(index)
            if entry is None:
                continue
            holders = [n for n in names if n in recovering or _holds(logs[n], index, entry)]
            if len(holders) < majority:
                self._violate(
                    "committed-durable",
                    at_ns,
                    f"applied entry {_short(entry)} (applied by {self.applied_by[index]}) "
                    f"is held by only {','.join(holders) or 'no node'}, not a majority of "
                    f"{len(names)}",
                )
                return
        self._durable_upto = top

    def check_log_matching(self, logs: Mapping[str, LogMirror], at_ns: int) -> None:
        """Every pair of logs agrees below their highest common (index, term)."""
        names = sorted(logs)
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                self._check_pair(a, logs[a], b, logs[b], at_ns)

    def _check_pair(self, a: str, la: LogMirror, b: str, lb: LogMirror, at_ns: int) -> None:
        lo = max(la.snapshot_index, lb.snapshot_index) + 1
        hi = min(la.last_index(), lb.last_index())
        # Indices <= `agreed` were identical at the last check and neither log lost an entry
        # since, so they still are: scanning down to there gives the full scan's verdict (an
        # index with equal terms at or below `agreed` only requires what already holds).
        agreed = lo - 1
        key = (a, b)
        known = self._agreed.get(key)
        if (known is not None and known[0] is la and known[1] == la.generation
                and known[2] is lb and known[3] == lb.generation):
            agreed = max(agreed, known[4])
        matched_at = agreed
        # `la.get(index)` and `lb.get(index)`, inlined: index is within both logs here
        # (lo <= index <= hi), so each lookup is a plain list index.
        ea_list, a_base = la.entries, la.snapshot_index + 1
        eb_list, b_base = lb.entries, lb.snapshot_index + 1
        for index in range(hi, agreed, -1):
            ea = ea_list[index - a_base]
            eb = eb_list[index - b_base]
            if matched_at == agreed and ea.term == eb.term:
                matched_at = index
            if matched_at != agreed and ea is not eb and ea != eb:
                self._agreed.pop(key, None)
                self._violate(
                    "log-matching",
                    at_ns,
                    f"{a} and {b} share a later (index, term) but differ at index {index}: "
                    f"{_short(ea)} vs {_short(eb)}",
                )
                return
        self._agreed[key] = (la, la.generation, lb, lb.generation, matched_at)


def _holds(log: LogMirror, index: int, entry: Entry) -> bool:
    """`log` holds `entry` at `index`, in its log or covered by its snapshot."""
    if log.snapshot_index >= index:
        return True
    pos = index - log.snapshot_index - 1  # `log.get(index)`, inlined (pos >= 0 here)
    mine = log.entries[pos] if pos < len(log.entries) else None
    return mine is entry or mine == entry


def _short(entry: Entry | None) -> str:
    if entry is None:
        return "nothing"
    reqs = ",".join(f"{r.client_id}#{r.request_no}" for r in entry.requests[:3])
    more = "..." if len(entry.requests) > 3 else ""
    return f"[{entry.index}@t{entry.term} {entry.kind.name}{' ' + reqs + more if reqs else ''}]"
