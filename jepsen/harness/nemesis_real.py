"""Interpreting fault schedules (`phalanx.jepsen.nemesis`) on real node processes.

Owns:
    `RealNemesis`: applies each `FaultEvent` of a schedule to a `RealCluster`, and
    `heal_all()` at the end of a run. The same events the simulator interprets
    (`phalanx.jepsen.sim.run`), mapped to the real world:

    * ``kill``: SIGKILL each node (a process crash; the OS keeps its written pages), restart
      it at the episode's stop. With ``lose-unfsynced`` in the run's faults the runner starts
      the nodes with volatile writes (`phalanx.storage.volatile`), so every kill also loses
      the node's un-fsynced appends (a machine crash); the event's ``value`` is 1.0 then.
    * ``pause``: SIGSTOP, then SIGCONT at the stop.
    * partitions (one, halves, ring, asymmetric, isolate-leader): the directed links cut by
      `nemesis.cut_links` are blocked at their proxies; overlapping episodes compose (a link
      is blocked while any episode cuts it). ``isolate-leader`` resolves the leader through
      the nodes' status replies when the episode starts.
    * ``delay``: every link holds its bytes ``value * DELAY_UNIT`` seconds (the simulator's
      factor scales a ~0.1 ms base latency; loopback is faster still, so a real delay needs
      a unit of its own).
    * ``loss`` / ``duplicate``: the proxies' stalls and resets (see `proxy`).
    * the real-only kinds (`phalanx.jepsen.nemesis.REAL_ONLY_FAULT_KINDS`): ``kill-leader``
      (the node leading when the episode starts), ``kill-majority``, ``kill-all``,
      ``partition-bridge``, and the storage faults ``truncate-wal`` / ``flip-checkpoint``
      (`storage_faults`), applied to the killed node's data directory just before its restart.
    * ``membership`` (opt-in): handed to `membership_real.RealMembership`, which adds,
      promotes and removes nodes from a task of its own; removed nodes are never restarted.
    * ``clock-skew``: atomically writes ``{"clock_rate": value}`` to ``DIR/run/<id>.ctl``,
      which the node polls (`phalanx.runtime.fault_hooks`) and applies to its tick source; 1.0 at
      the stop. The file outlives restarts, so a restarted node keeps its skew.
      (``clock_skew=False`` records the event as not applied, for nodes without the hook.)

A twinned node's kill, pause and restart act on both of its processes, and a partition
cutting its links cuts both twins' (`cluster.ClusterProcesses`, `proxy.ProxyNetwork`).

Every applied event is reported to `record(f, value)` (the history's nemesis ops), with
what it resolved to (the leader it isolated, the nodes actually killed).

Must not import the runtime or consensus cores. Not deterministic (real processes).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
from collections.abc import Callable

from phalanx.jepsen import nemesis
from phalanx.jepsen.harness import schedule as real
from phalanx.jepsen.harness.cluster import RealCluster
from phalanx.jepsen.harness.membership_real import RealMembership
from phalanx.jepsen.harness.storage_faults import flip_checkpoint_bit, tear_wal_tail
from phalanx.jepsen.nemesis import FaultEvent
from phalanx.ops.local_cluster import ClusterError
from phalanx.runtime.identity import IdentityError, read_identity

DELAY_UNIT = 0.002
"""Seconds of one-way delay per unit of a ``delay`` event's factor (3..20 → 6..40 ms)."""


class RealNemesis:
    """Applies fault events to `cluster`; `record(f, value)` logs each one."""

    def __init__(
        self,
        cluster: RealCluster,
        *,
        record: Callable[[str, str], None],
        clock_skew: bool,
    ) -> None:
        self.cluster = cluster
        self._record = record
        self._clock_skew = clock_skew
        self._cuts: dict[int, list[tuple[str, str]]] = {}
        self._killed: set[str] = set()
        self._episode_kills: dict[int, tuple[str, ...]] = {}
        self._rng = random.Random(0x5EED)
        self.membership: RealMembership | None = None
        """The ``membership`` nemesis (its `run` task is the runner's), when in the faults."""
        self.current: dict[int, str] = {}
        """Episodes in progress → their description (for the progress display)."""
        self.applied = 0

    async def apply(self, event: FaultEvent) -> None:
        start = event.action == "start"
        kind = event.fault
        note = ""
        if kind == nemesis.KILL:
            note = self._kill(event.nodes) if start else self._restart(event.nodes)
        elif kind == nemesis.LOSE_DISK:
            note = self._kill(event.nodes) if start else self._lose_disk(event.nodes)
        elif kind in real.KILLS:
            note = await self._episode_kill(event) if start else self._episode_restart(event)
        elif kind == nemesis.PARTITION_BRIDGE:
            if start:
                self._cuts[event.episode] = real.bridge_cuts(event, self.cluster.nodes)
            else:
                self._cuts.pop(event.episode, None)
            self.cluster.network.block(
                sorted({link for links in self._cuts.values() for link in links}))
        elif kind == nemesis.PAUSE:
            note = self._signal(event.nodes, signal.SIGSTOP if start else signal.SIGCONT)
        elif kind in nemesis.PARTITIONS and isinstance(event, FaultEvent):
            if start:
                leader = None
                if kind == nemesis.ISOLATE_LEADER:
                    leader = await self.cluster.leader()
                    note = f"leader={leader}"
                self._cuts[event.episode] = nemesis.cut_links(
                    event, self.cluster.nodes, leader=leader)
            else:
                self._cuts.pop(event.episode, None)
            self.cluster.network.block(
                sorted({link for links in self._cuts.values() for link in links}))
        elif kind == nemesis.LOSS:
            self.cluster.network.set_loss(event.value if start else 0.0)
        elif kind == nemesis.DUPLICATE:
            self.cluster.network.set_duplicate(event.value if start else 0.0)
        elif kind == nemesis.DELAY:
            self.cluster.network.set_delay(event.value * DELAY_UNIT if start else 0.0)
        elif kind == nemesis.CLOCK_SKEW:
            note = self._skew(event.nodes, event.value if start else 1.0)
        elif kind == nemesis.MEMBERSHIP and self.membership is not None:
            note = self.membership.apply(event)
        description = event.describe() + (f" ({note})" if note else "")
        if start:
            self.current[event.episode] = description
        else:
            self.current.pop(event.episode, None)
        self.applied += 1
        self._record(kind, description)

    def _kill(self, nodes: tuple[str, ...]) -> str:
        done = []
        for node in nodes:
            if self.cluster.procs.running(node):
                self.cluster.procs.kill(node)
                self.cluster.paused.discard(node)
                self._killed.add(node)
                done.append(node)
        return "killed " + (",".join(done) or "none")

    async def _episode_kill(self, event: FaultEvent) -> str:
        targets = event.nodes
        if event.fault == nemesis.KILL_LEADER:
            leader = await self.cluster.leader()
            targets = () if leader is None else (leader,)
        before = set(self._killed)
        note = self._kill(targets)
        self._episode_kills[event.episode] = tuple(
            n for n in targets if n in self._killed and n not in before)
        return note

    def _episode_restart(self, event: FaultEvent) -> str:
        nodes = self._episode_kills.pop(event.episode, ())
        notes = [self._damage(event.fault, node) for node in nodes if node in self._killed]
        return "; ".join([*filter(None, notes), self._restart(nodes)])

    def _damage(self, kind: str, node: str) -> str:
        """The storage fault of `kind` on a killed node's data (empty: none applies)."""
        data = self.cluster.data_dir(node)
        if kind == nemesis.TRUNCATE_WAL:
            return f"{node}: {tear_wal_tail(data, self._rng)}"
        if kind == nemesis.FLIP_CHECKPOINT:
            return f"{node}: {flip_checkpoint_bit(data, self._rng)}"
        return ""

    def _lose_disk(self, nodes: tuple[str, ...]) -> str:
        """Wipe each killed node's data directory (IDENTITY included), then restart it: it
        must recover from its peers before it votes (a core without a recovery mode, PBFT's,
        counts it as one of its faulty replicas instead). One lost disk at a time
        (`nemesis.LOSE_DISK`): while another node still recovers, a plain restart."""
        notes = []
        for node in nodes:
            if node not in self._killed:
                continue
            others = [n for n in self.cluster.nodes if n != node and self._recovering(n)]
            if others:
                notes.append(f"{node}: disk kept (recovering: {','.join(others)})")
                continue
            shutil.rmtree(self.cluster.data_dir(node), ignore_errors=True)
            notes.append(f"{node}: data directory wiped")
        return "; ".join([*notes, self._restart(nodes)])

    def _recovering(self, node: str) -> bool:
        """Whether `node` lost its disk and has not caught up yet (its IDENTITY says so)."""
        try:
            identity = read_identity(self.cluster.data_dir(node))
        except IdentityError:
            return True
        return identity is None or identity.state == "recovering"

    def _restart(self, nodes: tuple[str, ...]) -> str:
        todo = [n for n in nodes if n in self._killed and n not in self.cluster.retired]
        self.cluster.procs.start(todo)
        self._killed.difference_update(todo)
        return "restarted " + (",".join(todo) or "none")

    def _signal(self, nodes: tuple[str, ...], signum: int) -> str:
        done = []
        for node in nodes:
            with contextlib.suppress(ClusterError):
                self.cluster.procs.signal(node, signum)
                done.append(node)
                if signum == signal.SIGSTOP:
                    self.cluster.paused.add(node)
                else:
                    self.cluster.paused.discard(node)
        verb = "stopped" if signum == signal.SIGSTOP else "continued"
        return f"{verb} " + (",".join(done) or "none")

    def _skew(self, nodes: tuple[str, ...], rate: float) -> str:
        if not self._clock_skew:
            return "not applied: the runtime has no clock hook"
        for node in nodes:
            ctl = self.cluster.config.directory / "run" / f"{node}.ctl"
            tmp = ctl.with_suffix(".ctl.tmp")
            tmp.write_text(json.dumps({"clock_rate": rate}))
            os.replace(tmp, ctl)
        return f"clock rate {rate:g} on " + ",".join(nodes)

    def heal_all(self) -> None:
        """Heal every fault: links, pauses, kills and clock rates (removed nodes stay
        stopped; no membership change is proposed after it)."""
        if self.membership is not None:
            self.membership.stop()
        self.cluster.network.reset()
        self._cuts.clear()
        self._signal(tuple(sorted(self.cluster.paused)), signal.SIGCONT)
        self._restart(tuple(sorted(self._killed)))
        self._episode_kills.clear()
        if self._clock_skew:
            self._skew(self.cluster.nodes, 1.0)
        self.current.clear()
        self._record("heal", "heal all")
