"""How one simulation carries out its nemesis: fault events applied to the simulated nodes
and network, the BUGGIFY crash hook, and the heal at the end of the fault phase.

Owns: `NemesisRun` (the run's fault state: active partitions by episode, killed nodes, the
crash-after-ready probability and the last term/vote each node persisted). The run
(`phalanx.jepsen.sim.run`) builds one per run, after its nodes and membership nemesis, and
hands it the schedule's events in time order (a named scenario's among them:
`phalanx.jepsen.sim.scenarios`).

Rules: deterministic (all draws from the injected `buggify_rng`, virtual time only); at
most a minority is down through BUGGIFY crashes; `heal_all` leaves every node up, resumed,
at clock rate 1 and every link and packet fault healed.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from phalanx.consensus.core import Ready
from phalanx.jepsen import nemesis
from phalanx.jepsen.history import HistoryRecorder
from phalanx.jepsen.sim.loop import EventLoop, Trace
from phalanx.jepsen.sim.membership import MembershipNemesis
from phalanx.jepsen.sim.network import SimNetwork
from phalanx.jepsen.sim.node import SimNode
from phalanx.jepsen.sim.run_config import MS

BOOT_WINDOW_NS = 200 * MS
"""The boot BUGGIFY window (`boot_buggify`): up to the schedule's first possible episode."""


class NemesisRun:
    """One run's fault interpreter (see the module docstring)."""

    def __init__(self, *, loop: EventLoop, trace: Trace, recorder: HistoryRecorder,
                 network: SimNetwork, nodes: dict[str, SimNode], names: tuple[str, ...],
                 minority: int, faults: tuple[str, ...], buggify_rng: random.Random,
                 recovers_lost_disk: bool, leader: Callable[[], str | None],
                 membership: MembershipNemesis | None) -> None:
        self.loop = loop
        self.trace = trace
        self.recorder = recorder
        self.network = network
        self.nodes = nodes
        self.names = names
        self.faults = faults
        self.buggify_rng = buggify_rng
        self.recovers_lost_disk = recovers_lost_disk
        self.leader = leader
        self.membership = membership
        self._crash_after_ready = 0.0
        self._killed: set[str] = set()
        self._term_vote: dict[str, tuple[int, str | None]] = {}
        self.minority = minority
        """The most nodes BUGGIFY crashes keep down at once (a minority of the voters)."""
        self._partitions: dict[int, list[tuple[str, str]]] = {}
        if nemesis.CRASH_AFTER_READY in faults:
            # (Otherwise the probability stays 0 for the whole run and the hook would
            # only ever answer False: no call per persisted Ready.)
            for name in names:
                nodes[name].crash_point = self._crash_point

    def _crash_point(self, node: SimNode, ready: Ready) -> bool:
        """BUGGIFY: maybe crash `node` right after a Ready with persistence (see
        `nemesis.CRASH_AFTER_READY`), keeping at most a minority down; restart it soon.

        A Ready that changed the durable term or vote other than to vote for itself (a voter's
        election step: the moment a lost or unpersisted vote matters) crashes with probability
        3/4, any other with the episode's probability."""
        hs = ready.hard_state
        election = False
        if hs is not None:
            election = hs.vote != node.name and (
                self._term_vote.get(node.name) != (hs.term, hs.vote))
            self._term_vote[node.name] = (hs.term, hs.vote)
        p = self._crash_after_ready
        if not p or self.buggify_rng.random() >= (0.75 if election else p):
            return False
        down = sum(1 for name in self.names if not self.nodes[name].up)
        if down >= self.minority:
            return False
        name = node.name
        self.trace(f"NEMESIS crash-after-ready {name}")
        delay = self.buggify_rng.randrange(20_000, 1 * MS)

        def restart() -> None:
            if name not in self._killed:
                node.restart()

        self.loop.call_later(delay, restart)
        return True

    def boot_buggify(self) -> None:
        """With the BUGGIFY faults in this seed's mix, `crash-after-ready` is also on (and
        `straggle` with probability 1/2) from boot until the schedule's first possible episode
        (`BOOT_WINDOW_NS`): the first election is where candidates collide most (every
        node's timer started together)."""
        rng = self.buggify_rng
        cfg = self.network.config
        boot: list[str] = []
        if nemesis.CRASH_AFTER_READY in self.faults:
            self._crash_after_ready = round(rng.uniform(0.005, 0.05), 3)
            boot.append(f"crash-after-ready={self._crash_after_ready:g}")
        if nemesis.STRAGGLE in self.faults and rng.random() < 0.5:
            cfg.straggle = round(rng.uniform(0.02, 0.2), 3)
            boot.append(f"straggle={cfg.straggle:g}")
        if not boot:
            return
        self.trace(f"NEMESIS boot buggify {' '.join(boot)}")

        def stop() -> None:
            self.trace("NEMESIS boot buggify ends")
            self._crash_after_ready = 0.0
            cfg.straggle = 0.0

        self.loop.call_at(BOOT_WINDOW_NS, stop)

    def apply_fault(self, event: nemesis.FaultEvent) -> None:
        start = event.action == "start"
        kind = event.fault
        self.trace(f"NEMESIS {event.describe()}")
        self.recorder.nemesis(f=kind, value=event.describe(), time=self.loop.now)
        cfg = self.network.config
        if kind == nemesis.KILL:
            for name in event.nodes:
                if start:
                    self._killed.add(name)
                    self.nodes[name].crash(lose_unfsynced=event.value >= 1.0)
                else:
                    self._killed.discard(name)
                    self.nodes[name].restart()
        elif kind == nemesis.LOSE_DISK:
            for name in event.nodes:
                if not start:
                    self._killed.discard(name)
                    self.nodes[name].restart()
                    continue
                self._killed.add(name)
                others = any(self.nodes[o].recovering for o in self.names if o != name)
                if self.recovers_lost_disk and not others:
                    self.nodes[name].lose_disk()
                else:  # one lost disk at a time, and only where the core can recover
                    self.nodes[name].crash(lose_unfsynced=False)
        elif kind == nemesis.PAUSE:
            for name in event.nodes:
                if start:
                    self.nodes[name].pause()
                else:
                    self.nodes[name].resume()
        elif kind in nemesis.PARTITIONS:
            if start:
                self._partitions[event.episode] = self._links(event)
            else:
                self._partitions.pop(event.episode, None)
            self.network.heal()
            for links in self._partitions.values():
                self.network.block(links)
        elif kind == nemesis.LOSS:
            cfg.loss = event.value if start else 0.0
        elif kind == nemesis.DUPLICATE:
            cfg.duplicate = event.value if start else 0.0
        elif kind == nemesis.DELAY:
            cfg.delay_factor = event.value if start else 1.0
        elif kind == nemesis.CLOCK_SKEW:
            for name in event.nodes:
                self.nodes[name].clock_rate = event.value if start else 1.0
        elif kind == nemesis.CRASH_AFTER_READY:
            self._crash_after_ready = event.value if start else 0.0
        elif kind == nemesis.STRAGGLE:
            cfg.straggle = event.value if start else 0.0
        elif kind == nemesis.MEMBERSHIP and self.membership is not None:
            self.membership.apply(event)

    def _links(self, event: nemesis.FaultEvent) -> list[tuple[str, str]]:
        leader = self.leader() if event.fault == nemesis.ISOLATE_LEADER else None
        if leader is not None:
            self.trace(f"NEMESIS isolate-leader resolves to {leader}")
        return nemesis.cut_links(event, self.names, leader=leader)

    def heal_all(self) -> None:
        self.trace("NEMESIS heal all")
        self._partitions.clear()
        self._killed.clear()
        self._crash_after_ready = 0.0
        self.network.heal()
        cfg = self.network.config
        cfg.loss, cfg.duplicate, cfg.delay_factor, cfg.straggle = 0.0, 0.0, 1.0, 0.0
        if self.membership is not None:
            self.membership.stop()
        for name in self.names:
            node = self.nodes[name]
            node.clock_rate = 1.0
            node.resume()
            node.restart()  # (not a retired one: removed from the membership)
