"""The gossip workload's history vocabulary and its checker (real clusters and the simulator).

Owns the operations a gossip history holds, shared by `phalanx jepsen run --workload gossip`
(`phalanx.jepsen.harness.gossip_run`, real processes) and the seeded simulator sweep
(`phalanx.jepsen.gossip_sweep`, `phalanx.gossip.sim`), and `check_gossip`:

    * ``publish`` (key: the node asked to publish; invoke value: the payload, a string
      unique in the history): ``ok`` value ``(origin, incarnation, seq, unix_ms)``
      (`publish_ok_value`: the rumor id the node gave it and when, on the node's clock);
      ``fail``: certainly not published; ``info``: maybe published.
    * ``deliveries`` (key: a node), one per node after healing and settling: ``ok`` value
      (`FinalRead`) ``{"incarnation", "started_ms", "capacity", "rumors"}``: the
      node's current process (the incarnation it started with, which its rumor ids carry,
      and when it started, on the same clock as ``unix_ms``) and its delivery log: every
      rumor it published or delivered since it started, oldest first, as ``(origin,
      incarnation, seq, payload, unix_ms)``; the log keeps at most ``capacity`` entries.
      ``fail``: the node did not answer (it is not "alive at the end").

What `check_gossip` requires (each violation listed in the details, first `MAX_REPORTED`):

    1. **delivered**: a rumor is *required* when its publish was acknowledged (``ok``) by a
       process still running at the end (its origin's final incarnation is the rumor's: a
       node killed after acknowledging loses rumors it had not sent yet, rumors are not
       persisted). Every node alive at the end must hold every required rumor published
       after its current process started or less than ``rumor_ttl_ms / 2`` before: a
       restarted node remembers nothing, and gets back by anti-entropy only what its
       peers still hold (``rumor_ttl`` after they got it; half of it is the margin for
       slow ticks and the settle time). Older rumors are allowed to be missing there.
    2. **not forged**: every log entry is a publish of the history: its payload was
       invoked at its origin (the publish's key), and when that publish was acknowledged
       its rumor id is the acknowledged one; one rumor id never carries two payloads.
    3. **once**: no rumor id appears twice in one node's log.

A log at ``capacity`` may have dropped its oldest entries: a required rumor older than such
a log's oldest entry cannot be checked there and makes the verdict ``unknown`` (if nothing
else is wrong). No node alive at the end, nothing acknowledged, or nothing required (every
origin was killed after its publishes): ``unknown``. Informational: how many acknowledged
rumors that were not required reached every other node anyway.

Malformed ops raise `HistoryError`.

Must not import trio, the client, the runtime or anything doing I/O: a pure function of the
history.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import immutables

from phalanx.jepsen.checker import CheckerResult
from phalanx.jepsen.history import FAIL, INFO, OK, History, HistoryError, Value, value_from_json
from phalanx.jepsen.linearizability import UNKNOWN, Verdict

CHECKER: Final = "gossip"
PUBLISH: Final = "publish"
DELIVERIES: Final = "deliveries"
MAX_REPORTED: Final = 10

RumorKey = tuple[str, int, int]
"""A rumor id: (origin, incarnation, seq)."""


def publish_ok_value(origin: str, incarnation: int, seq: int, unix_ms: int) -> Value:
    """A ``publish`` op's ``ok`` value."""
    return (origin, incarnation, seq, unix_ms)


@dataclass(frozen=True, slots=True, kw_only=True)
class FinalRead:
    """One node's delivery log at the end (a ``deliveries`` op's ``ok`` value)."""

    incarnation: int
    started_ms: int
    capacity: int
    rumors: tuple[tuple[str, int, int, str, int], ...]
    """(origin, incarnation, seq, payload, unix_ms), oldest first."""

    def to_value(self) -> Value:
        """The op value (module docstring); pass it to the recorder."""
        return value_from_json({"incarnation": self.incarnation,
                                "started_ms": self.started_ms, "capacity": self.capacity,
                                "rumors": [list(r) for r in self.rumors]})


@dataclass(frozen=True, slots=True)
class _Published:
    node: str
    outcome: str
    rumor: RumorKey | None
    unix_ms: int | None


def _as_int(v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise HistoryError(f"gossip history: not an integer: {v!r}")
    return v


def _fields(v: object, n: int, what: str) -> tuple[Value, ...]:
    if not isinstance(v, tuple) or len(v) != n:
        raise HistoryError(f"gossip history: a {what} must be a list of {n} values, got {v!r}")
    return v


def _publishes(history: History) -> tuple[dict[str, list[_Published]], Counter[str]]:
    by_payload: dict[str, list[_Published]] = {}
    outcomes: Counter[str] = Counter()
    for pair in history.pairs:
        inv = pair.invoke
        if inv.f != PUBLISH:
            continue
        outcome = pair.outcome
        outcomes[outcome] += 1
        rumor: RumorKey | None = None
        unix_ms: int | None = None
        if outcome == OK and pair.completion is not None:
            origin, inc, seq, ms = _fields(pair.completion.value, 4, "publish's ok value")
            rumor = (str(origin), _as_int(inc), _as_int(seq))
            unix_ms = _as_int(ms)
        by_payload.setdefault(str(inv.value), []).append(
            _Published(node=str(inv.key), outcome=outcome, rumor=rumor, unix_ms=unix_ms))
    return by_payload, outcomes


def final_reads(history: History) -> dict[str, FinalRead]:
    """Each node's last ``ok`` deliveries read."""
    out: dict[str, FinalRead] = {}
    for pair in history.pairs:
        if pair.invoke.f != DELIVERIES or pair.outcome != OK or pair.completion is None:
            continue
        v = pair.completion.value
        if not isinstance(v, immutables.Map):
            raise HistoryError(f"gossip history: a deliveries read's value is {v!r}")
        entries = v.get("rumors")
        if not isinstance(entries, tuple):
            raise HistoryError(f"gossip history: a deliveries read's rumors are {entries!r}")
        rumors = tuple((str(o), _as_int(i), _as_int(s), str(p), _as_int(ms))
                       for o, i, s, p, ms in (_fields(e, 5, "log entry") for e in entries))
        out[str(pair.invoke.key)] = FinalRead(
            incarnation=_as_int(v["incarnation"]), started_ms=_as_int(v["started_ms"]),
            capacity=_as_int(v["capacity"]), rumors=rumors)
    return out


def check_gossip(history: History, *, rumor_ttl_ms: int,
                 finals: Mapping[str, FinalRead] | None = None) -> CheckerResult:
    """The gossip checker (module docstring). `rumor_ttl_ms`: how long a node keeps a rumor
    for anti-entropy, in the clock of the history's ``unix_ms`` values. `finals`: check
    these final reads instead of the history's ``deliveries`` ops (a harness deciding
    whether the rumors have settled before it records them)."""
    by_payload, outcomes = _publishes(history)
    if finals is None:
        finals = final_reads(history)
    problems: list[str] = []
    forged: list[str] = []
    duplicates: list[str] = []
    missing: dict[str, list[RumorKey]] = {}
    unverifiable: dict[str, int] = {}

    required: dict[RumorKey, int] = {}  # rumor -> unix_ms of its acknowledgement
    for entries in by_payload.values():
        for p in entries:
            if p.rumor is None or p.unix_ms is None:
                continue
            origin_final = finals.get(p.rumor[0])
            if origin_final is not None and origin_final.incarnation == p.rumor[1]:
                required[p.rumor] = p.unix_ms

    payload_of: dict[RumorKey, str] = {}
    held_at: dict[str, Counter[RumorKey]] = {}
    for node, final in sorted(finals.items()):
        seen = held_at[node] = Counter()
        for origin, inc, seq, payload, _ms in final.rumors:
            rid = (origin, inc, seq)
            seen[rid] += 1
            why = _forgery(by_payload.get(payload, []), origin, rid)
            if why is not None:
                forged.append(f"{node} holds {origin}/{inc}/{seq} {payload!r}: {why}")
            known = payload_of.setdefault(rid, payload)
            if known != payload:
                forged.append(f"{origin}/{inc}/{seq} carries {known!r} and {payload!r}")
        duplicates.extend(f"{node} holds {o}/{i}/{s} {k} times"
                          for (o, i, s), k in sorted(seen.items()) if k > 1)
        window_start = final.started_ms - rumor_ttl_ms // 2
        full = len(final.rumors) >= final.capacity
        oldest = min((r[4] for r in final.rumors), default=0)
        lacks = sorted((ms, rid) for rid, ms in required.items()
                       if ms >= window_start and rid not in seen)
        if full:
            unverifiable[node] = sum(1 for ms, _ in lacks if ms < oldest)
            lacks = [(ms, rid) for ms, rid in lacks if ms >= oldest]
        if lacks:
            missing[node] = [rid for _, rid in lacks]

    # Informational: acknowledged rumors of origins killed later that reached every other
    # node (a restarted origin does not hold its previous process's rumors).
    acked = {p.rumor for entries in by_payload.values() for p in entries if p.rumor}
    spread_anyway = sum(1 for rid in acked - required.keys()
                        if finals and all(rid in held_at[n] for n in finals if n != rid[0]))
    for node, rids in sorted(missing.items()):
        shown = ", ".join(f"{o}/{i}/{s}" for o, i, s in rids[:3])
        problems.append(f"{node} lacks {len(rids)} required rumor(s), e.g. {shown}")
    problems.extend(forged[:MAX_REPORTED])
    problems.extend(duplicates[:MAX_REPORTED])
    valid: Verdict = not problems
    notes: list[str] = []
    if valid and not finals:
        valid, notes = UNKNOWN, ["no node answered the final deliveries read"]
    elif valid and outcomes[OK] == 0:
        valid, notes = UNKNOWN, ["no publish was acknowledged"]
    elif valid and not required:
        valid, notes = UNKNOWN, ["no acknowledged rumor's origin process ran to the end: "
                                 "nothing had to be delivered"]
    elif valid and any(unverifiable.values()):
        valid = UNKNOWN
        notes = [f"{n}: {k} required rumor(s) older than its full log"
                 for n, k in sorted(unverifiable.items()) if k]
    return CheckerResult(checker=CHECKER, valid=valid, details={
        "publishes": {OK: outcomes[OK], INFO: outcomes[INFO], FAIL: outcomes[FAIL]},
        "required": len(required),
        "not_required_but_everywhere": spread_anyway,
        "nodes_checked": sorted(finals),
        "missing": {n: len(r) for n, r in sorted(missing.items())},
        "forged": len(forged),
        "duplicates": len(duplicates),
        "log_entries": {n: len(f.rumors) for n, f in sorted(finals.items())},
        "problems": problems[:3 * MAX_REPORTED],
        "notes": notes,
    })


def _forgery(candidates: list[_Published], origin: str, rid: RumorKey) -> str | None:
    """Why a log entry matches no publish of its payload (None: it matches one)."""
    if not candidates:
        return "no one published this payload"
    at_origin = [p for p in candidates if p.node == origin]
    if not at_origin:
        return f"published at {', '.join(sorted({p.node for p in candidates}))}, not {origin}"
    if any(p.rumor is None and p.outcome != FAIL for p in at_origin):
        return None  # an info publish: any id of its origin
    if any(p.rumor == rid for p in at_origin):
        return None
    if all(p.outcome == FAIL for p in at_origin):
        return "its publish failed"
    return "not the acknowledged rumor id"


__all__ = ["CHECKER", "DELIVERIES", "PUBLISH", "FinalRead", "check_gossip", "final_reads",
           "publish_ok_value"]
