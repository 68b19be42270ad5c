"""Real-cluster nemesis schedules: the shared vocabulary plus the faults only real processes take.

Owns:
    `REAL_FAULT_KINDS` (what ``phalanx jepsen run --nemesis`` accepts: every shared
    `phalanx.jepsen.nemesis.FAULT_KINDS` kind, then the real-only kinds below, which the
    vocabulary module declares as `REAL_ONLY_FAULT_KINDS`) and `real_schedule`, whose events are
    plain `FaultEvent`s.

    * ``kill-leader``: SIGKILL whichever node leads when the episode starts; restart it at
      the stop.
    * ``kill-majority``: SIGKILL a random majority; ``kill-all``: every node. Both restart
      them at the stop (the cluster is unavailable meanwhile and must recover).
    * ``partition-bridge``: two halves that both see one bridge node (Jepsen's bridge).
    * ``truncate-wal``: SIGKILL one node; before its restart its newest WAL segment gets a
      torn tail (a partial record header, as a crash mid-append leaves it), which recovery
      must cut off.
    * ``flip-checkpoint``: SIGKILL one node; before its restart one bit of its newest
      checkpoint file is flipped; the node must report the corrupt checkpoint, fall back to
      an older one (or its peers) and catch up.

Membership (``--nemesis membership``, opt-in, `nemesis.OPT_IN_FAULT_KINDS`): episodes of
`nemesis.membership_schedule` over the run's spare nodes, carried out by
`phalanx.jepsen.harness.membership_real`.

Schedule: `real_schedule` is `generate_schedule` over the shared kinds (unchanged, so a
shared fault list gives the simulator's schedule for the same seed), merged with episodes of
the real-only kinds drawn from a second, seed-derived `random.Random`: one at a time, 1..2 s
(virtual) apart, each lasting 0.5..1.5 s. Episode numbers of real-only events start at
`REAL_EPISODE_BASE`, so they never collide with shared ones.

Must not import the runtime, consensus cores or storage. Pure and seeded.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace
from typing import Final, Protocol

from phalanx.jepsen import nemesis
from phalanx.jepsen.nemesis import (
    FLIP_CHECKPOINT,
    KILL_ALL,
    KILL_LEADER,
    KILL_MAJORITY,
    PARTITION_BRIDGE,
    REAL_ONLY_FAULT_KINDS,
    TRUNCATE_WAL,
    FaultEvent,
    generate_schedule,
)

REAL_FAULT_KINDS: Final[tuple[str, ...]] = (*nemesis.FAULT_KINDS, *REAL_ONLY_FAULT_KINDS)
"""``--nemesis all``; the opt-in kinds (`nemesis.OPT_IN_FAULT_KINDS`: ``membership``) are
accepted by name too, for protocols that declare them."""
KILLS: Final[tuple[str, ...]] = (KILL_LEADER, KILL_MAJORITY, KILL_ALL, TRUNCATE_WAL,
                                 FLIP_CHECKPOINT)
"""Real-only kinds that SIGKILL nodes at the start and restart them at the stop."""
REAL_EPISODE_BASE: Final = 100_000
_MS = 1_000_000


class _Options(Protocol):
    @property
    def seed(self) -> int: ...
    @property
    def faults(self) -> tuple[str, ...]: ...
    @property
    def time_s(self) -> float: ...
    @property
    def nemesis_scale(self) -> float: ...


def bridge_groups(nodes: Sequence[str], rng: random.Random) -> tuple[tuple[str, ...], ...]:
    """Jepsen's bridge: two halves plus one node in both; as groups ``(left+b, right+b)``."""
    shuffled = sorted(nodes)
    rng.shuffle(shuffled)
    bridge, rest = shuffled[0], shuffled[1:]
    half = len(rest) // 2
    return (tuple(sorted([*rest[:half], bridge])), tuple(sorted([*rest[half:], bridge])))


def bridge_cuts(event: FaultEvent, nodes: Sequence[str]) -> list[tuple[str, str]]:
    """Directed links a bridge cuts: between nodes that share no group."""
    names = sorted(nodes)
    member = {n: {i for i, g in enumerate(event.groups) if n in g} for n in names}
    return [(a, b) for a in names for b in names if a != b and not member[a] & member[b]]


def real_schedule(options: _Options, nodes: Sequence[str],
                  spares: Sequence[str] = ()) -> tuple[FaultEvent, ...]:
    """The run's schedule in unscaled (virtual) ns from the workload's start (module doc).
    With ``membership`` among the faults, `spares` (not in `nodes`) are the nodes its
    episodes add (`nemesis.membership_schedule`, from a third seed-derived generator)."""
    duration_ns = int(options.time_s / options.nemesis_scale * 1e9)
    shared = tuple(f for f in options.faults if f in nemesis.FAULT_KINDS)
    base = generate_schedule(
        random.Random(options.seed), nodes=nodes, faults=shared, duration_ns=duration_ns)
    extra = _real_only(random.Random(options.seed ^ 0x5EA1), nodes,
                       [f for f in REAL_ONLY_FAULT_KINDS if f in options.faults], duration_ns)
    changes: tuple[FaultEvent, ...] = ()
    if nemesis.MEMBERSHIP in options.faults:
        changes = nemesis.membership_schedule(random.Random(options.seed ^ 0x3E3B),
                                              spares=spares, duration_ns=duration_ns)
        base = _place_spares(base, spares, random.Random(options.seed ^ 0x5EA2))
    events = [*base, *extra, *changes]
    events.sort(key=lambda e: (e.at_ns, e.episode, e.action == "start"))
    return tuple(events)


def _place_spares(events: tuple[FaultEvent, ...], spares: Sequence[str],
                  rng: random.Random) -> tuple[FaultEvent, ...]:
    """Partitions drawn over the bootstrap nodes with each spare put on a side (its
    episode's start and stop alike); otherwise the spares, in no group, would form one
    more side together, cut from everyone (`nemesis.cut_links`)."""
    if not spares:
        return events
    placed: dict[int, tuple[tuple[str, ...], ...]] = {}
    out = []
    for e in events:
        if e.fault in (nemesis.PARTITION_ONE, nemesis.PARTITION_HALVES) and e.groups:
            groups = placed.get(e.episode)
            if groups is None:
                sides = [list(g) for g in e.groups]
                for spare in spares:  # partition-one: the spares stay with the majority
                    side = (len(sides) - 1 if e.fault == nemesis.PARTITION_ONE
                            else rng.randrange(len(sides)))
                    sides[side].append(spare)
                groups = placed[e.episode] = tuple(tuple(sorted(g)) for g in sides)
            e = replace(e, groups=groups)
        elif e.fault == nemesis.PARTITION_RING and e.groups:
            e = replace(e, groups=(e.groups[0] + tuple(spares),))
        out.append(e)
    return tuple(out)


def _real_only(rng: random.Random, nodes: Sequence[str], kinds: list[str],
               duration_ns: int) -> list[FaultEvent]:
    names = sorted(nodes)
    out: list[FaultEvent] = []
    if not kinds or not names:
        return out
    t = 300 * _MS
    episode = REAL_EPISODE_BASE
    while True:
        t += rng.randrange(1000 * _MS, 2000 * _MS)
        length = rng.randrange(500 * _MS, 1500 * _MS)
        if t + length >= duration_ns:
            return out
        kind = rng.choice(kinds)
        targets: tuple[str, ...] = ()
        groups: tuple[tuple[str, ...], ...] = ()
        if kind == KILL_MAJORITY:
            targets = tuple(sorted(rng.sample(names, len(names) // 2 + 1)))
        elif kind == KILL_ALL:
            targets = tuple(names)
        elif kind in (TRUNCATE_WAL, FLIP_CHECKPOINT):
            targets = (rng.choice(names),)
        elif kind == PARTITION_BRIDGE:
            groups = bridge_groups(names, rng)
        for at, action in ((t, "start"), (t + length, "stop")):
            out.append(FaultEvent(at_ns=at, action="start" if action == "start" else "stop",
                                    fault=kind, episode=episode, nodes=targets, groups=groups))
        episode += 1
        t += length

