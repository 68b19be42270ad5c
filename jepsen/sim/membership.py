"""The simulator's `membership` fault: membership changes proposed while the other faults run.

Owns: `MembershipNemesis`, which interprets the `membership` episodes of
`phalanx.jepsen.nemesis.membership_schedule` as a queue of changes (add a spare as a
learner, promote it, remove a node) and proposes them, one at a time, to whichever node
leads, through the protocol's own admin hook (`ProtocolNode.admin_input`, what
`phalanx member` uses on a real cluster), retrying every `POLL_NS` while there is no leader,
a change is in progress or a learner has not caught up; and `durable_voters`, the nodes
whose logs the "committed means durable on a majority" check counts once the membership
moves.

Rules:
    * Deterministic: its own `random.Random` (the victim of a replace is drawn when the
      removal is first attempted), virtual time only; the trace says every step.
    * A change counts as done when the leader's configuration shows it (not joint); a
      removed node is stopped for good (as an operator stops it) once a leader has
      committed past the point where the removal showed, and is never restarted by the heal.
    * Nothing is proposed after `stop` (the heal): changes in flight finish on their own
      (a leader leaves a joint configuration by itself).
    * At most a minority of the bootstrap voters is ever removed: a replace adds first, so
      the voter count never drops below the bootstrap's.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Final

from phalanx.consensus.types import Configuration, Entry, EntryKind
from phalanx.jepsen import nemesis
from phalanx.jepsen.sim.loop import EventLoop
from phalanx.jepsen.sim.node import SimNode
from phalanx.protocols import get as get_protocol

POLL_NS: Final = 20_000_000
"""How often a pending change is retried (virtual ns)."""


_VICTIM = nemesis.MEMBERSHIP_VICTIM


class MembershipNemesis:
    """Interprets `membership` events for one run (see the module docstring)."""

    def __init__(self, *, loop: EventLoop, rng: random.Random, trace: Callable[[str], None],
                 nodes: Mapping[str, SimNode], voters: tuple[str, ...],
                 leader: Callable[[], str | None],
                 admin_input: Callable[..., Any]) -> None:
        self._loop = loop
        self._rng = rng
        self._trace = trace
        self._nodes = nodes
        self._bootstrap = voters
        self._leader = leader
        self._admin_input = admin_input
        self._ops: deque[tuple[str, str]] = deque()
        self._polling = False
        self._stopped = False
        self._retire_after: dict[str, int] = {}
        self.retired: set[str] = set()
        """Removed nodes, stopped for good."""
        self.done = 0
        """Changes that took effect."""
        self.refused = 0

    def apply(self, event: nemesis.FaultEvent) -> None:
        self._ops.extend(nemesis.membership_steps(event))
        self._kick()

    def stop(self) -> None:
        """The heal: propose nothing more (pending changes are dropped)."""
        if self._ops:
            self._trace(f"MEMBERSHIP heal drops {len(self._ops)} pending change(s)")
        self._ops.clear()
        self._stopped = True

    def _kick(self) -> None:
        if not self._polling and not self._stopped:
            self._polling = True
            self._loop.call_later(POLL_NS, self._poll)

    def _poll(self) -> None:
        self._polling = False
        if self._stopped:
            return
        self._retire_ready()
        if self._ops:
            self._try(*self._ops[0])
        if self._ops or self._retire_after:
            self._kick()

    def _try(self, op: str, node: str) -> None:
        name = self._leader()
        core = None if name is None else self._nodes[name].core
        if name is None or core is None:
            return
        status = core.status()
        config: Configuration = getattr(status, "config", Configuration(voters=()))
        if config.joint:
            return  # the previous change is still in flight
        if node == _VICTIM:
            candidates = sorted(v for v in config.voters if v not in self.retired)
            if len(candidates) <= len(self._bootstrap):  # the promotion did not happen
                self._ops.popleft()
                return
            node = self._rng.choice(candidates)
            self._ops[0] = (op, node)
            self._trace(f"MEMBERSHIP replace removes {node}")
        members = set(config.members())
        if op == "promote" and node not in members:
            self._ops.appendleft(("add-learner", node))  # the learner entry was lost
            return
        if ((op == "add-learner" and node in members)
                or (op == "promote" and node in config.voters)
                or (op == "remove" and node not in members)):
            self._ops.popleft()
            self.done += 1
            self._trace(f"MEMBERSHIP {op} {node} done: voters={','.join(config.voters)} "
                        f"learners={','.join(config.learners)}")
            if op == "remove":
                self._retire_after[node] = int(getattr(status, "last_index", 0))
            return
        made = self._admin_input(op, node, status)
        if isinstance(made, str):
            self.refused += 1
            self._trace(f"MEMBERSHIP {op} {node} at {name}: {made}")
            return
        self._nodes[name].step(made)
        refused = getattr(core.status(), "conf_change_error", None)
        if refused:
            self.refused += 1
        self._trace(f"MEMBERSHIP {op} {node} proposed at {name}"
                    + (f": refused ({refused})" if refused else ""))

    def _retire_ready(self) -> None:
        """Stop removed nodes once a leader committed past their removal."""
        if not self._retire_after:
            return
        name = self._leader()
        core = None if name is None else self._nodes[name].core
        if core is None:
            return
        commit = core.status().commit_index
        for node, index in sorted(self._retire_after.items()):
            if commit >= index:
                del self._retire_after[node]
                self.retired.add(node)
                self._nodes[node].retire()  # kill episodes' stops do not restart it
                self._trace(f"MEMBERSHIP {node} removed: stopped for good")


def durable_voters(applied: Mapping[int, Entry], bootstrap: tuple[str, ...]) -> tuple[str, ...]:
    """The nodes a majority of which must hold every applied entry: the voters of the newest
    applied configuration (its outgoing half while joint: everything committed before and
    during the change is on a majority of those), else the bootstrap voters."""
    for index in sorted(applied, reverse=True):
        entry = applied[index]
        if entry.kind is EntryKind.CONFIG and entry.config is not None:
            config = entry.config
            return tuple(config.voters_outgoing if config.joint else config.voters)
    return bootstrap


def spares_for(protocol: str, faults: tuple[str, ...], nodes: int) -> int:
    """How many spare nodes a run of `protocol` with `faults` needs (0 without the
    `membership` fault).

    Raises:
        ValueError: `membership` asked of a protocol that does not declare it
            (`ProtocolSpec.sim_fault_kinds`).
    """
    if nemesis.MEMBERSHIP not in faults:
        return 0
    if nemesis.MEMBERSHIP not in get_protocol(protocol).sim_fault_kinds:
        raise ValueError(f"protocol {protocol} does not support the membership fault "
                         "(static membership)")
    return nemesis.MEMBERSHIP_SPARES


def admin_hook(protocol: str) -> Callable[..., Any]:
    """`protocol`'s `ProtocolNode.admin_input` (what turns ``add-learner``, ``promote`` and
    ``remove`` into the core's input)."""
    hook: Callable[..., Any] | None = getattr(get_protocol(protocol).node.load(),
                                              "admin_input", None)
    if hook is None:
        raise ValueError(f"protocol {protocol} declares the membership fault but its "
                         "ProtocolNode has no admin_input")
    return hook


def with_changes(schedule: nemesis.Schedule, seed: int, spares: tuple[str, ...],
                 duration_ns: int) -> nemesis.Schedule:
    """`schedule` with the seed's `membership` episodes (their own generator) merged in."""
    changes = nemesis.membership_schedule(random.Random(f"membership-schedule:{seed}"),
                                          spares=spares, duration_ns=duration_ns)
    return tuple(sorted((*schedule, *changes),
                        key=lambda e: (e.at_ns, e.episode, e.action == "start")))
