"""The fault vocabulary: fault kinds, timed fault/heal events, and seeded schedule generation.

Owns: the names of every fault the test harnesses inject (`FAULT_KINDS`, and the Byzantine
behaviours' names, `BYZANTINE_BEHAVIOURS`), the `FaultEvent`
record and its JSON form, fault-mix parsing (`parse_faults`), and `generate_schedule`, which
derives a schedule deterministically from a seed. Both backends interpret the same events:
the deterministic simulator (`phalanx.jepsen.sim`) and the real-cluster harness
(`phalanx.jepsen.harness`).

Rules:
- Pure data and a seeded `random.Random`; no clocks, no I/O, no global randomness. The same
  arguments always give the same schedule.
- Must not import the simulator, consensus cores or storage: a schedule only names nodes.
- Every `start` event is followed by the matching `stop` event of the same `episode`, and
  the schedule ends with every fault healed; interpreters may rely on this.
- Node sets are sorted tuples, so schedules compare and serialise canonically.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

KILL = "kill"
PAUSE = "pause"
PARTITION_ONE = "partition-one"
PARTITION_HALVES = "partition-halves"
PARTITION_RING = "partition-ring"
PARTITION_ASYMMETRIC = "partition-asymmetric"
ISOLATE_LEADER = "isolate-leader"
LOSS = "loss"
DUPLICATE = "duplicate"
DELAY = "delay"
CLOCK_SKEW = "clock-skew"
LOSE_UNFSYNCED = "lose-unfsynced"
LOSE_DISK = "lose-disk"
CRASH_AFTER_READY = "crash-after-ready"
STRAGGLE = "straggle"

FAULT_KINDS: tuple[str, ...] = (
    KILL,
    PAUSE,
    PARTITION_ONE,
    PARTITION_HALVES,
    PARTITION_RING,
    PARTITION_ASYMMETRIC,
    ISOLATE_LEADER,
    LOSS,
    DUPLICATE,
    DELAY,
    CLOCK_SKEW,
    LOSE_UNFSYNCED,
    LOSE_DISK,
)
"""Every fault kind both backends (simulator and real cluster) inject. `lose-unfsynced` is a
modifier of `kill`: a kill then also loses the node's un-fsynced writes (a machine crash
rather than a process crash). `lose-disk` kills one node and restarts it with an empty data
directory (a replaced disk: its IDENTITY file is gone too), so it must recover from its
peers before it votes; an interpreter loses at most one node's disk at a time and turns the
episode into a plain kill while another node is still recovering (two lost disks of three
are data loss, not a fault to survive). The simulator wipes only where the protocol's setup
says its core recovers (`ProtocolSetup.recovers_lost_disk`); on real clusters a PBFT
replica without one counts as one of its f faulty replicas."""

SIM_ONLY_FAULT_KINDS: tuple[str, ...] = (CRASH_AFTER_READY, STRAGGLE)
"""Faults only the deterministic simulator can inject precisely (BUGGIFY-style):

- `crash-after-ready`: while active, a node crashes (a process crash) right after it carried
  out a `Ready` that changed durable state, with probability `value` per such Ready, and
  restarts after a short delay; at most a minority is ever down.
- `straggle`: while active, each message is, with probability `value`, held back by a long
  extra delay, so it arrives after later traffic (e.g. after its receiver restarted).
"""

SIM_FAULT_KINDS: tuple[str, ...] = FAULT_KINDS + SIM_ONLY_FAULT_KINDS

KILL_LEADER = "kill-leader"
KILL_MAJORITY = "kill-majority"
KILL_ALL = "kill-all"
PARTITION_BRIDGE = "partition-bridge"
TRUNCATE_WAL = "truncate-wal"
FLIP_CHECKPOINT = "flip-checkpoint"

REAL_ONLY_FAULT_KINDS: tuple[str, ...] = (
    KILL_LEADER, KILL_MAJORITY, KILL_ALL, PARTITION_BRIDGE, TRUNCATE_WAL, FLIP_CHECKPOINT)
"""Faults only real processes take (interpreted by `phalanx.jepsen.harness`); the simulator's
`generate_schedule` never draws them, so adding them changes no simulated schedule."""

BYZANTINE_BEHAVIOURS: tuple[str, ...] = (
    "silent",
    "omit",
    "equivocate",
    "replay",
    "mutate",
    "forge",
    "bad_checkpoint",
    "corrupt_reply",
)
"""The Byzantine replica behaviours by name (`phalanx.jepsen.byzantine` implements them and
re-exports this as its `BEHAVIOURS`): named here so that command-line parsers list them
without importing the consensus cores."""

MEMBERSHIP = "membership"
OPT_IN_FAULT_KINDS: tuple[str, ...] = (MEMBERSHIP,)
"""Faults only protocols that declare them take (`ProtocolSpec.sim_fault_kinds`), never part
of ``--faults all`` (so adding them changed no existing schedule or trace):

- `membership`: membership changes while the other faults run, drawn by
  `membership_schedule` over spare nodes outside the bootstrap configuration. An
  episode's `value` is its kind (`MEMBERSHIP_REPLACE`: the spare is added as a learner,
  promoted, then a voter chosen when it runs is removed and stopped for good;
  `MEMBERSHIP_GROW`: the spare is added and promoted, and removed at the episode's stop;
  `MEMBERSHIP_LEARNER`: the spare is added as a learner, removed at the stop). Removed
  nodes never come back (a node id is never reused)."""

MEMBERSHIP_REPLACE, MEMBERSHIP_GROW, MEMBERSHIP_LEARNER = 1.0, 2.0, 3.0
MEMBERSHIP_SPARES = 2
"""Spare nodes a run with the `membership` fault has beyond its bootstrap voters (named
after them: n4, n5 for three), in the simulator and on real clusters."""

ALL_FAULT_KINDS: tuple[str, ...] = SIM_FAULT_KINDS + REAL_ONLY_FAULT_KINDS + OPT_IN_FAULT_KINDS
"""Every name a `FaultEvent` may carry."""
"""Every fault kind the simulator interprets (`phalanx sim --faults all`)."""

PARTITIONS: tuple[str, ...] = (
    PARTITION_ONE,
    PARTITION_HALVES,
    PARTITION_RING,
    PARTITION_ASYMMETRIC,
    ISOLATE_LEADER,
)

Action = Literal["start", "stop"]


class ScheduleError(ValueError):
    """A malformed fault list or schedule (our own or the user's input, never a peer's)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultEvent:
    """One timed step of a fault schedule.

    Attributes:
        at_ns: virtual (or wall, for real clusters) nanoseconds since the test started.
        action: `start` injects the fault, `stop` heals it.
        fault: one of `FAULT_KINDS`.
        episode: pairs a `start` with its `stop`.
        nodes: the nodes the fault applies to (kill, pause, clock-skew, partition-one).
        groups: for partitions, the sides: a node talks only to nodes of its own group.
            For `partition-asymmetric`, `groups[0]` are senders whose messages to `groups[1]`
            are dropped while the reverse direction still flows.
        value: a magnitude: loss/duplicate probability, delay factor, clock-rate factor,
            and for `kill` 1.0 when un-fsynced writes are lost.
    """

    at_ns: int
    action: Action
    fault: str
    episode: int
    nodes: tuple[str, ...] = ()
    groups: tuple[tuple[str, ...], ...] = ()
    value: float = 0.0

    def __post_init__(self) -> None:
        if self.fault not in ALL_FAULT_KINDS:
            raise ScheduleError(f"unknown fault kind {self.fault!r}")
        if self.action not in ("start", "stop"):
            raise ScheduleError(f"action must be start or stop, got {self.action!r}")
        if self.at_ns < 0:
            raise ScheduleError(f"at_ns must be >= 0, got {self.at_ns}")

    def describe(self) -> str:
        """A one-line, human-readable form for traces and histories."""
        parts = [f"{self.action} {self.fault}#{self.episode}"]
        if self.nodes:
            parts.append("nodes=" + ",".join(self.nodes))
        if self.groups:
            parts.append("groups=" + "|".join(",".join(g) for g in self.groups))
        if self.value:
            parts.append(f"value={self.value:g}")
        return " ".join(parts)

    def to_json(self) -> dict[str, object]:
        return {
            "at_ns": self.at_ns,
            "action": self.action,
            "fault": self.fault,
            "episode": self.episode,
            "nodes": list(self.nodes),
            "groups": [list(g) for g in self.groups],
            "value": self.value,
        }

    @classmethod
    def from_json(cls, obj: object) -> FaultEvent:
        if not isinstance(obj, dict):
            raise ScheduleError(f"a fault event is a JSON object, got {type(obj).__name__}")
        try:
            action = obj["action"]
            if action not in ("start", "stop"):
                raise ScheduleError(f"bad action {action!r}")
            return cls(
                at_ns=int(obj["at_ns"]),
                action=action,
                fault=str(obj["fault"]),
                episode=int(obj["episode"]),
                nodes=tuple(str(n) for n in obj.get("nodes", ())),
                groups=tuple(tuple(str(n) for n in g) for g in obj.get("groups", ())),
                value=float(obj.get("value", 0.0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ScheduleError(f"malformed fault event {obj!r}: {exc}") from exc


Schedule = tuple[FaultEvent, ...]


def schedule_to_json(schedule: Schedule) -> str:
    return json.dumps([e.to_json() for e in schedule], sort_keys=True)


def schedule_from_json(text: str) -> Schedule:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ScheduleError(f"schedule is not JSON: {exc}") from exc
    if not isinstance(raw, list):
        raise ScheduleError("a schedule is a JSON list of events")
    return tuple(FaultEvent.from_json(e) for e in raw)


def parse_faults(spec: str, *, kinds: tuple[str, ...] = FAULT_KINDS) -> tuple[str, ...]:
    """`all`, `none`, or a comma-separated list of fault kinds → sorted-by-vocabulary tuple.

    `kinds` is the vocabulary the caller interprets (`SIM_FAULT_KINDS` for the simulator);
    `all` means all of it."""
    spec = spec.strip()
    if spec == "all":
        return kinds
    if spec in ("none", ""):
        return ()
    names = [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [n for n in names if n not in kinds]
    if unknown:
        raise ScheduleError(
            f"unknown fault kind(s) {', '.join(unknown)}; choose from {', '.join(kinds)}"
        )
    return tuple(k for k in kinds if k in names)


_MS = 1_000_000


def generate_schedule(
    rng: random.Random,
    *,
    nodes: Sequence[str],
    faults: Sequence[str],
    duration_ns: int,
    start_ns: int = 200 * _MS,
    max_concurrent: int = 2,
) -> Schedule:
    """A seeded fault schedule over [start_ns, duration_ns): episodes of random kinds from
    `faults`, each lasting 50 ms..1.5 s, at most `max_concurrent` overlapping, every one
    healed by `duration_ns`.

    Kills and pauses never take down a majority at once, so the cluster can make progress
    between faults; partitions may cut anything (a minority side, both halves, a ring).

    Determinism: consumes `rng` only; the same rng state and arguments give the same result.
    """
    kinds = [k for k in SIM_FAULT_KINDS if k in faults and k != LOSE_UNFSYNCED]
    lose_unfsynced = LOSE_UNFSYNCED in faults
    if LOSE_UNFSYNCED in faults and KILL not in faults:
        kinds.append(KILL)
    node_list = sorted(nodes)
    if not kinds or not node_list or duration_ns <= start_ns:
        return ()
    n = len(node_list)
    minority = (n - 1) // 2
    events: list[FaultEvent] = []
    # Per in-flight episode: its end time and the nodes it takes down (kill/pause).
    active: list[tuple[int, tuple[str, ...]]] = []
    t = start_ns
    episode = 0
    while True:
        t += rng.randrange(20 * _MS, 400 * _MS)
        active = [(end, down) for end, down in active if end > t]
        if len(active) >= max_concurrent:
            t = min(end for end, _ in active)
            continue
        length = rng.randrange(50 * _MS, 1500 * _MS)
        if t + length >= duration_ns:
            break
        kind = rng.choice(kinds)
        down_now = sorted({d for _, ds in active for d in ds})
        nodes_arg: tuple[str, ...] = ()
        groups: tuple[tuple[str, ...], ...] = ()
        value = 0.0
        if kind in (KILL, PAUSE, LOSE_DISK):
            budget = minority - len(down_now)
            candidates = [x for x in node_list if x not in down_now]
            if budget <= 0 or not candidates:
                continue
            count = 1 if kind == LOSE_DISK else rng.randint(1, budget)
            nodes_arg = tuple(sorted(rng.sample(candidates, count)))
            if kind == KILL and lose_unfsynced:
                value = 1.0
        elif kind == PARTITION_ONE:
            nodes_arg = (rng.choice(node_list),)
            groups = (nodes_arg, tuple(x for x in node_list if x != nodes_arg[0]))
        elif kind == PARTITION_HALVES:
            shuffled = node_list[:]
            rng.shuffle(shuffled)
            cut = n // 2
            groups = (tuple(sorted(shuffled[:cut])), tuple(sorted(shuffled[cut:])))
        elif kind == PARTITION_RING:
            shuffled = node_list[:]
            rng.shuffle(shuffled)
            groups = (tuple(shuffled),)  # a ring order: each node talks to its neighbours
        elif kind == PARTITION_ASYMMETRIC:
            shuffled = node_list[:]
            rng.shuffle(shuffled)
            cut = rng.randint(1, max(1, n - 1))
            groups = (tuple(sorted(shuffled[:cut])), tuple(sorted(shuffled[cut:])))
        elif kind == ISOLATE_LEADER:
            pass  # the interpreter resolves the leader when the episode starts
        elif kind in (LOSS, DUPLICATE):
            value = round(rng.uniform(0.05, 0.4), 3)
        elif kind == DELAY:
            value = round(rng.uniform(3.0, 20.0), 3)
        elif kind == CRASH_AFTER_READY:
            value = round(rng.uniform(0.005, 0.05), 3)
        elif kind == STRAGGLE:
            value = round(rng.uniform(0.02, 0.2), 3)
        elif kind == CLOCK_SKEW:
            nodes_arg = (rng.choice(node_list),)
            value = round(rng.choice((rng.uniform(0.3, 0.9), rng.uniform(1.1, 3.0))), 3)
        for at, action in ((t, "start"), (t + length, "stop")):
            events.append(
                FaultEvent(
                    at_ns=at,
                    action="start" if action == "start" else "stop",
                    fault=kind,
                    episode=episode,
                    nodes=nodes_arg,
                    groups=groups,
                    value=value,
                )
            )
        active.append((t + length, nodes_arg if kind in (KILL, PAUSE, LOSE_DISK) else ()))
        episode += 1
    events.sort(key=lambda e: (e.at_ns, e.episode, e.action == "start"))
    return tuple(events)


def membership_schedule(
    rng: random.Random, *, spares: Sequence[str], duration_ns: int,
    start_ns: int = 300 * _MS,
) -> Schedule:
    """Seeded `membership` episodes over [start_ns, duration_ns), one spare each (see
    `OPT_IN_FAULT_KINDS`), spread over the run: [start_ns, duration_ns) is cut into one slot
    per spare and each episode starts in the first quarter of its slot and lasts a quarter
    to a half of it, so episodes never overlap (a cluster changes its membership one step
    at a time). Deterministic in `rng` and the arguments; episodes are numbered from 10_000
    so they never share a number with `generate_schedule`'s."""
    names = sorted(spares)
    if not names or duration_ns <= start_ns:
        return ()
    slot = (duration_ns - start_ns) // len(names)
    events: list[FaultEvent] = []
    for i, spare in enumerate(names):
        t = start_ns + i * slot + rng.randrange(0, max(1, slot // 4))
        length = rng.randrange(max(1, slot // 4), max(2, slot // 2))
        kind = rng.choice((MEMBERSHIP_REPLACE, MEMBERSHIP_GROW, MEMBERSHIP_LEARNER))
        episode = 10_000 + i
        events.append(FaultEvent(at_ns=t, action="start", fault=MEMBERSHIP,
                                 episode=episode, nodes=(spare,), value=kind))
        events.append(FaultEvent(at_ns=t + length, action="stop", fault=MEMBERSHIP,
                                 episode=episode, nodes=(spare,), value=kind))
    return tuple(events)


MEMBERSHIP_VICTIM: Final = "?"
"""The node of a replace episode's removal, drawn by the interpreter when the removal runs."""


def membership_steps(event: FaultEvent) -> list[tuple[str, str]]:
    """The membership changes a `membership` event asks for, in order, as ``(operation,
    node)`` with operations ``add-learner``, ``promote`` and ``remove`` (node
    `MEMBERSHIP_VICTIM`: a voter the interpreter draws). Shared by the simulator and the
    real-cluster interpreter, so one schedule means the same changes to both."""
    spare, kind = event.nodes[0], event.value
    if event.action == "start":
        steps = [("add-learner", spare)]
        if kind in (MEMBERSHIP_REPLACE, MEMBERSHIP_GROW):
            steps.append(("promote", spare))
        if kind == MEMBERSHIP_REPLACE:
            steps.append(("remove", MEMBERSHIP_VICTIM))
        return steps
    if kind in (MEMBERSHIP_GROW, MEMBERSHIP_LEARNER):
        return [("remove", spare)]
    return []


def cut_links(
    event: FaultEvent, nodes: Sequence[str], *, leader: str | None = None
) -> list[tuple[str, str]]:
    """The directed links ``(src, dst)`` a partition event cuts among `nodes`, sorted.

    `leader` resolves `isolate-leader` (no leader known: nothing is cut). Ring: each node
    keeps only its two neighbours in ``groups[0]``'s order. Asymmetric: ``groups[0]`` →
    ``groups[1]`` is cut, the reverse flows. Otherwise nodes talk only within their group
    (nodes in no group form one more side together). Shared by every interpreter of schedules.
    """
    names = sorted(nodes)
    if event.fault not in PARTITIONS:
        raise ScheduleError(f"{event.fault} is not a partition")
    groups = event.groups
    if event.fault == ISOLATE_LEADER:
        if leader is None:
            return []
        groups = ((leader,), tuple(n for n in names if n != leader))
    if event.fault == PARTITION_RING:
        ring = list(groups[0]) if groups else []
        allowed = {
            (ring[i], ring[(i + d) % len(ring)]) for i in range(len(ring)) for d in (-1, 0, 1)
        }
        return [(a, b) for a in names for b in names if a != b and (a, b) not in allowed]
    if event.fault == PARTITION_ASYMMETRIC:
        if len(groups) < 2:
            return []
        return sorted((a, b) for a in groups[0] for b in groups[1] if a != b)
    side = {n: i for i, g in enumerate(groups) for n in g}
    return [(a, b) for a in names for b in names if a != b and side.get(a, -1) != side.get(b, -1)]
