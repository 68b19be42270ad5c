"""Which rumors (and waves) a node has seen: deduplication, replay detection, bounded memory.

Owns: `SeenLog` (per-origin numbering: incarnation, a floor, the numbers seen above it) and
`RumorStore` (verified rumors kept for anti-entropy until they age out).

Invariants:
- A number is "fresh" iff its origin's incarnation is the newest known and it is above the
  floor and not yet seen. Everything at or below the floor, or of an older incarnation, is
  stale: a replay (or a rumor so late that its memory was collected) and is dropped.
- Memory is bounded by age: a number seen more than `ttl` ticks ago is folded into the floor
  (the floor jumps to it), and stored rumors older than `ttl` are discarded. A rumor that
  reaches a node more than `ttl` ticks after a later rumor of the same origin is therefore
  dropped as stale; `ttl` must exceed the dissemination time (anti-entropy included).
- Deterministic: iteration is over sorted keys or insertion-ordered dicts only.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

from phalanx.gossip.messages import Rumor, RumorId


@dataclass(slots=True)
class _OriginLog:
    incarnation: int
    floor: int = -1
    above: dict[int, int] = field(default_factory=dict)  # number -> tick first seen


class SeenLog:
    """Per-origin numbers seen (rumor seqs, or wave numbers), with age-bounded memory.

    An origin is any hashable key: a node id for rumors, (node id, instance) for waves."""

    __slots__ = ("_logs", "ttl")

    def __init__(self, ttl: int) -> None:
        self.ttl = ttl
        self._logs: dict[Hashable, _OriginLog] = {}

    def classify(self, origin: Hashable, incarnation: int, number: int) -> str:
        """"fresh", "duplicate" (seen and remembered) or "stale" (older than memory)."""
        log = self._logs.get(origin)
        if log is None or incarnation > log.incarnation:
            return "fresh"
        if incarnation < log.incarnation or number <= log.floor:
            return "stale"
        return "duplicate" if number in log.above else "fresh"

    def add(self, origin: Hashable, incarnation: int, number: int, now: int) -> None:
        """Record a fresh number (the caller checked `classify`)."""
        log = self._logs.get(origin)
        if log is None or incarnation > log.incarnation:
            log = self._logs[origin] = _OriginLog(incarnation=incarnation)
        log.above[number] = now
        while log.floor + 1 in log.above:  # contiguous numbers need no memory
            log.floor += 1
            del log.above[log.floor]

    def collect(self, now: int) -> None:
        """Fold numbers older than `ttl` into their origin's floor."""
        for log in self._logs.values():
            old = [n for n, seen in log.above.items() if now - seen > self.ttl]
            if not old:
                continue
            log.floor = max(log.floor, *old)
            log.above = {n: t for n, t in log.above.items() if n > log.floor}
            while log.floor + 1 in log.above:
                log.floor += 1
                del log.above[log.floor]

    def remembered(self) -> int:
        """How many numbers are held above the floors (the memory bound's measure)."""
        return sum(len(log.above) for log in self._logs.values())


class RumorStore:
    """Verified rumors by id, kept `ttl` ticks for anti-entropy, and the seen-log."""

    __slots__ = ("_rumors", "seen", "ttl")

    def __init__(self, ttl: int) -> None:
        self.ttl = ttl
        self.seen = SeenLog(ttl)
        self._rumors: dict[RumorId, tuple[Rumor, int]] = {}

    def classify(self, rumor: Rumor) -> str:
        """"fresh", "duplicate", "stale", or "conflict" (same id as a stored rumor, other
        bytes: a forgery that still has to fail verification, or an origin equivocating)."""
        held = self._rumors.get(rumor.rumor_id)
        if held is not None:
            return "duplicate" if held[0] == rumor else "conflict"
        return self.seen.classify(rumor.origin, rumor.incarnation, rumor.seq)

    def add(self, rumor: Rumor, now: int) -> None:
        """Store a fresh, verified rumor."""
        self.seen.add(rumor.origin, rumor.incarnation, rumor.seq, now)
        self._rumors[rumor.rumor_id] = (rumor, now)

    def get(self, rumor_id: RumorId) -> Rumor | None:
        held = self._rumors.get(rumor_id)
        return None if held is None else held[0]

    def ids(self) -> tuple[RumorId, ...]:
        """The ids held, sorted (a `Digest`)."""
        return tuple(sorted(self._rumors))

    def missing_from(self, ids: tuple[RumorId, ...]) -> tuple[Rumor, ...]:
        """The rumors held whose ids are not in `ids`, in id order."""
        have = set(ids)
        return tuple(self._rumors[i][0] for i in sorted(self._rumors) if i not in have)

    def collect(self, now: int) -> int:
        """Drop rumors older than `ttl`; returns how many."""
        old = [i for i, (_, t) in self._rumors.items() if now - t > self.ttl]
        for i in old:
            del self._rumors[i]
        self.seen.collect(now)
        return len(old)

    def __len__(self) -> int:
        return len(self._rumors)
