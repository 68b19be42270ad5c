"""``phalanx jepsen run --workload gossip``: the gossip service on real processes under faults.

Owns `GossipRunOptions`, `GossipRunOutcome` and `run_gossip(options, console)`, which:
  1. creates the run's store (``STORE/<test>/<stamp>/``) and a proxied cluster of real
     processes with the gossip service (`prepare_cluster(services=("gossip",))`, every
     ``[gossip]`` option at its default; with ``bug`` the deliberate bug's options, e.g.
     ``no-anti-entropy``: ``anti_entropy_interval = 0`` on every node), and waits until
     every node answers its gossip status (`ClusterUnavailable` otherwise) and, for at most
     `ALIVE_WAIT` s, until each sees the others ALIVE (a note otherwise), and for a leader;
  2. runs `concurrency` client processes publishing rumors (unique payloads) at random
     nodes through the service's client operation (`phalanx.client.service_calls`, the
     operation behind `phalanx gossip publish`) at `rate` publishes a second in total,
     while the seeded nemesis schedule (`schedule.real_schedule`, the same kinds and
     meaning as every harness run: kill, pause, partitions, loss...) is applied; each
     publish is recorded ``ok`` (the node's rumor id and time), ``fail`` (refused: nothing
     published) or ``info`` (no answer: maybe published);
  3. heals everything, waits for the nodes again (a recovery problem if one does not
     answer), publishes one more rumor at every node (so that some rumors are required even
     when every node was killed at some point: a killed origin's earlier rumors are not),
     then reads every node's delivery log (`GossipStatusCall`) until every rumor the
     checker requires is everywhere or `settle_timeout` passes; the last read of each node
     is the history's ``deliveries`` op (the vocabulary of `phalanx.jepsen.gossip_checker`);
  4. checks the history (`check_gossip`: delivered everywhere, not forged, once; the stats
     checker; a ``recovery`` checker: every node answered at the end), writes
     ``history.jsonl``, ``results.json``, each node's log and data, and the report.

Publishes are capped at `MAX_PUBLISHES` per run (rate x time): the delivery logs keep the
newest 1000 rumors (``keep_delivered``) and the checker needs them all.

Must not import the runtime or consensus cores. Real time and processes: not deterministic;
the seed fixes the schedule and the workload's choices.
"""

from __future__ import annotations

import random
import shutil
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Final

import trio
from rich.console import Console

from phalanx.client.errors import ClientError, ClientTimeout
from phalanx.client.service_calls import call_every_node, call_service
from phalanx.jepsen.checker import CheckerResult, check_stats
from phalanx.jepsen.gossip_checker import (
    DELIVERIES,
    PUBLISH,
    FinalRead,
    check_gossip,
    publish_ok_value,
)
from phalanx.jepsen.gossip_sweep import NO_ANTI_ENTROPY
from phalanx.jepsen.harness.cluster import (
    ClusterUnavailable,
    RealCluster,
    open_real_cluster,
    prepare_cluster,
)
from phalanx.jepsen.harness.nemesis_real import RealNemesis
from phalanx.jepsen.harness.schedule import REAL_FAULT_KINDS, real_schedule
from phalanx.jepsen.history import FAIL, INFO, OK, HistoryRecorder, OpType
from phalanx.jepsen.linearizability import UNKNOWN, Verdict, merge_verdicts
from phalanx.jepsen.nemesis import FaultEvent
from phalanx.jepsen.report import render_report
from phalanx.jepsen.store import create_run
from phalanx.ops.config_toml import dumps_toml, node_config_dict
from phalanx.ops.node_config import ClusterConfig, load_node_config
from phalanx.protocols import DEFAULT_PROTOCOL
from phalanx.protocols import get as get_protocol
from phalanx.services import get as get_service
from phalanx.services.gossip_api import (
    GossipPublish,
    GossipPublished,
    GossipStatus,
    GossipStatusCall,
)

WORKLOAD: Final = "gossip"
SERVICE: Final = "gossip"
MAX_PUBLISHES: Final = 900
FINAL_TRIES: Final = 3
ALIVE_WAIT: Final = 20.0
STATUS_RUMORS: Final = 1000
"""Rumors a final read asks for (the service's `MAX_STATUS_RUMORS`, its `keep_delivered`)."""
BUG_OPTIONS: Final[Mapping[str, Mapping[str, int]]] = {NO_ANTI_ENTROPY: {
    "anti_entropy_interval": 0}}
"""Deliberate bugs (`--gossip-bug`): ``[gossip]`` options that break the property."""
BUGS: Final = tuple(sorted(BUG_OPTIONS))


@dataclass(frozen=True, slots=True, kw_only=True)
class GossipRunOptions:
    protocol: str = DEFAULT_PROTOCOL
    nodes: int = 5
    faults: tuple[str, ...] = ()
    time_s: float = 30.0
    rate: float = 10.0
    concurrency: int = 3
    seed: int = 0
    store: Path = Path("store")
    nemesis_scale: float = 4.0
    op_timeout: float = 2.0
    recovery_timeout: float = 60.0
    settle_timeout: float = 30.0
    bug: str = ""
    """A deliberate bug (`BUGS`): a control run the checker must find invalid."""

    def __post_init__(self) -> None:
        problem = get_protocol(self.protocol).size_problem(self.nodes)
        if problem is not None:
            raise ValueError(problem)
        if self.concurrency < 1 or self.rate <= 0 or self.time_s <= 0:
            raise ValueError("concurrency must be >= 1, rate and time > 0")
        if self.rate * self.time_s > MAX_PUBLISHES:
            raise ValueError(f"--rate x --time is {self.rate * self.time_s:g} publishes; the "
                             f"gossip workload checks at most {MAX_PUBLISHES} (the nodes' "
                             "delivery logs keep 1000): lower --rate or --time")
        if self.bug and self.bug not in BUG_OPTIONS:
            raise ValueError(f"unknown gossip bug {self.bug!r} (known: {', '.join(BUGS)})")

    @property
    def node_names(self) -> tuple[str, ...]:
        return tuple(f"n{i}" for i in range(1, self.nodes + 1))

    @property
    def test_name(self) -> str:
        faults = ("all" if set(self.faults) == set(REAL_FAULT_KINDS)
                  else "+".join(self.faults) or "none")
        bug = f"-bug-{self.bug}" if self.bug else ""
        return f"{self.protocol}-{WORKLOAD}-{faults}{bug}-n{self.nodes}"


@dataclass(slots=True, kw_only=True)
class GossipRunOutcome:
    directory: Path
    valid: Verdict = UNKNOWN
    checkers: dict[str, CheckerResult] = field(default_factory=dict)
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    nemesis_events: int = 0
    reasons: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """Observations that are not failures (e.g. SWIM still suspecting a node)."""
    settle_s: float = 0.0
    duration_s: float = 0.0
    report: Path | None = None


def _set_bug(config: ClusterConfig, bug: str) -> None:
    """Write the bug's ``[gossip]`` options into every node config (before any starts)."""
    for node in config.nodes:
        path = config.node_config_path(node.id)
        cfg = load_node_config(path)
        services = dict(cfg.services)
        services[SERVICE] = {**services[SERVICE], **BUG_OPTIONS[bug]}
        path.write_text(dumps_toml(node_config_dict(replace(cfg, services=services),
                                                    relative_to=path.parent)))


class _Run:
    def __init__(self, options: GossipRunOptions, cluster: RealCluster) -> None:
        self.options = options
        self.cluster = cluster
        self.recorder = HistoryRecorder()
        self.t0 = trio.current_time()
        self.counts: Counter[tuple[str, str]] = Counter()
        self.stopped = False
        self.next_process = options.concurrency
        self.nemesis = RealNemesis(cluster, record=self.record_nemesis, clock_skew=True)

    def now(self) -> int:
        return int((trio.current_time() - self.t0) * 1e9)

    def stopping(self) -> bool:
        return self.stopped

    def record_nemesis(self, f: str, value: str) -> None:
        self.recorder.nemesis(f=f, value=value, time=self.now())

    def fresh_process(self) -> int:
        self.next_process += 1
        return self.next_process - 1

    async def publish(self, process: int, node: str, payload: str) -> OpType:
        rec = self.recorder
        rec.invoke(process=process, f=PUBLISH, key=node, value=payload, time=self.now())
        try:
            reply = await call_service(self.cluster.config, node, SERVICE,
                                       GossipPublish(payload=payload.encode()),
                                       seconds=self.options.op_timeout)
        except ClientTimeout as e:  # maybe published (a refused connection lands here too)
            rec.complete(process=process, type=INFO, time=self.now(), error=type(e).__name__)
            return INFO
        except ClientError as e:  # refused or forbidden: nothing happened
            rec.complete(process=process, type=FAIL, time=self.now(), error=str(e)[:120])
            return FAIL
        if not isinstance(reply, GossipPublished):
            rec.complete(process=process, type=INFO, time=self.now(),
                         error=f"answered {type(reply).__name__}")
            return INFO
        rec.complete(process=process, type=OK, time=self.now(),
                     value=publish_ok_value(reply.origin, reply.incarnation, reply.seq,
                                            reply.unix_ms))
        return OK

    async def worker(self, slot: int) -> None:
        o = self.options
        rng = random.Random(o.seed * 1_000 + slot)
        process = slot
        k = 0
        next_at = trio.current_time()
        while not self.stopping():
            next_at = max(next_at + rng.expovariate(o.rate / o.concurrency),
                          trio.current_time() - 1.0)
            await trio.sleep_until(next_at)
            if self.stopping():
                break
            node = rng.choice(o.node_names)
            kind = await self.publish(process, node, f"s{slot}-{k}")
            k += 1
            self.counts[(PUBLISH, kind)] += 1
            if kind == INFO:
                process = self.fresh_process()

    async def run_nemesis(self, schedule: tuple[FaultEvent, ...], origin: float) -> None:
        for event in schedule:
            await trio.sleep_until(origin + event.at_ns * self.options.nemesis_scale / 1e9)
            await self.nemesis.apply(event)

    async def statuses(self) -> dict[str, GossipStatus]:
        replies = await call_every_node(self.cluster.config, SERVICE,
                                        GossipStatusCall(max_rumors=STATUS_RUMORS),
                                        seconds=self.options.op_timeout)
        return {n: r for n, r in replies.items() if isinstance(r, GossipStatus)}

    async def wait_nodes(self, within: float, *, all_alive: bool) -> bool:
        """Until every node answers its gossip status (and, with `all_alive`, sees every
        other ALIVE), or `within` seconds; whether it happened."""
        names = set(self.options.node_names)
        with trio.move_on_after(within):
            while True:
                st = await self.statuses()
                if set(st) == names and (not all_alive or all(
                        m.status == "ALIVE" for s in st.values() for m in s.members)):
                    return True
                await trio.sleep(0.25)
        return False

    async def wait_up(self, what: str, notes: list[str]) -> None:
        """Every node's service answering (else `ClusterUnavailable`), then, at most
        `ALIVE_WAIT` s, every node seeing the others ALIVE (else a note: on an overloaded
        machine SWIM can keep suspecting nodes whose ticks are late; that is not a failure
        of dissemination, which does not wait for membership)."""
        o = self.options
        if not await self.wait_nodes(o.recovery_timeout, all_alive=False):
            raise ClusterUnavailable(f"not every node's gossip service answered within "
                                     f"{o.recovery_timeout:g} s {what}")
        if not await self.wait_nodes(ALIVE_WAIT, all_alive=True):
            notes.append(f"not every node saw the others ALIVE within {ALIVE_WAIT:g} s {what}")

    async def exercise(self, schedule: tuple[FaultEvent, ...], console: Console,
                       outcome: GossipRunOutcome, ttl_ms: int) -> bool:
        """Steps 2 and 3 of the module docstring; whether every node answered the end."""
        o = self.options
        console.print(f"publishing for {o.time_s:g} s with {len(schedule)} nemesis events",
                      highlight=False)
        t_start = trio.current_time()
        async with trio.open_nursery() as nursery:
            for slot in range(o.concurrency):
                nursery.start_soon(self.worker, slot)
            nursery.start_soon(self.run_nemesis, schedule, t_start)
            await trio.sleep_until(t_start + o.time_s)
            self.stopped = True
            nursery.cancel_scope.deadline = trio.current_time() + o.op_timeout + 5
        self.nemesis.heal_all()
        outcome.nemesis_events = self.nemesis.applied
        console.print("healed every fault; waiting for every node to answer and the rumors "
                      "to settle", highlight=False)
        try:
            await self.wait_up("after healing", outcome.notes)
        except ClusterUnavailable as e:
            outcome.reasons.append(str(e))
        for node in o.node_names:  # rumors after the faults: required everywhere
            for attempt in range(FINAL_TRIES):
                if await self.publish(self.fresh_process(), node,
                                      f"final-{node}-{attempt}") == OK:
                    break
        settle_start = trio.current_time()
        give_up = settle_start + o.settle_timeout
        so_far = self.recorder.history()  # the publishes are over
        while True:
            finals = {n: final_read(s) for n, s in (await self.statuses()).items()}
            verdict = check_gossip(so_far, rumor_ttl_ms=ttl_ms, finals=finals).valid
            if verdict is not False or trio.current_time() >= give_up:
                break
            await trio.sleep(0.5)
        outcome.settle_s = trio.current_time() - settle_start
        self.record_finals(finals)
        return set(finals) == set(o.node_names)

    def record_finals(self, finals: Mapping[str, FinalRead]) -> None:
        """Record the final ``deliveries`` reads (a node without one: ``fail``)."""
        now = self.now()
        for node in self.options.node_names:
            process = self.fresh_process()
            self.recorder.invoke(process=process, f=DELIVERIES, key=node, time=now)
            final = finals.get(node)
            if final is None:
                self.recorder.complete(process=process, type=FAIL, time=now, value=None,
                                       error="no answer")
            else:
                self.recorder.complete(process=process, type=OK, time=now,
                                       value=final.to_value())


def final_read(s: GossipStatus) -> FinalRead:
    """A node's status as the checker's final read. The incarnation its process started
    with is the wall-clock ms of the start (`phalanx.services.gossip_node.next_incarnation`;
    later only if the clock stepped back, which makes the requirement weaker, never wrong);
    not SWIM's `incarnation`, which refutations raise."""
    return FinalRead(incarnation=s.started_incarnation, started_ms=s.started_incarnation,
                     capacity=STATUS_RUMORS,
                     rumors=tuple((d.origin, d.incarnation, d.seq,
                                   d.payload.decode("utf-8", "replace"), d.unix_ms)
                                  for d in s.deliveries))


def _ttl_ms(config: ClusterConfig) -> int:
    """The nodes' ``rumor_ttl`` in milliseconds (the first node's table: they share it)."""
    options = {**get_service(SERVICE).defaults(),
               **load_node_config(config.node_config_path(config.nodes[0].id))
               .services.get(SERVICE, {})}
    return int(options["rumor_ttl"]) * int(options["tick_ms"])


async def run_gossip(options: GossipRunOptions, console: Console) -> GossipRunOutcome:
    """Run one gossip test (module docstring); the result is also in the run's store."""
    started = time.monotonic()
    o = options
    schedule = real_schedule(o, o.node_names)
    doc = asdict(o)
    doc.update(store=str(o.store), test=o.test_name, faults=list(o.faults))
    store = create_run(o.store, o.test_name, config=doc, seed=o.seed, schedule=schedule)
    outcome = GossipRunOutcome(directory=store.path)
    cluster_dir = store.path / "cluster"
    prepared = prepare_cluster(cluster_dir, nodes=o.nodes, protocol=o.protocol,
                               services=(SERVICE,))
    if o.bug:
        _set_bug(prepared.config, o.bug)
    ttl_ms = _ttl_ms(prepared.config)
    rng = random.Random(o.seed)
    answered_at_end = False
    unavailable: str | None = None
    async with open_real_cluster(cluster_dir, nodes=o.nodes, protocol=o.protocol,
                                 rng=random.Random(rng.getrandbits(64)),
                                 prepared=prepared) as cluster:
        bug = f"; deliberate bug: {o.bug}" if o.bug else ""
        console.print(f"cluster of {o.nodes} {o.protocol} nodes with the gossip service up in "
                      f"{cluster_dir}{bug}; waiting for every node to see the others alive",
                      highlight=False, soft_wrap=True)
        run = _Run(o, cluster)
        try:
            await run.wait_up("after the start", outcome.notes)
            await cluster.wait_for_leader(30.0)  # kill-leader and isolate-leader need one
        except ClusterUnavailable as e:
            unavailable = str(e)  # raised outside the cluster's nursery (not in a group)
        else:
            answered_at_end = await run.exercise(schedule, console, outcome, ttl_ms)
    if unavailable is not None:
        raise ClusterUnavailable(unavailable)
    history = run.recorder.history()
    store.write_history(history)
    gossip = check_gossip(history, rumor_ttl_ms=ttl_ms)
    if not answered_at_end:
        outcome.reasons.append("not every node answered the final read")
    results = (gossip, check_stats(history, functions=(PUBLISH,)),
               CheckerResult(checker="recovery", valid=answered_at_end, details={
                   "settle_s": round(outcome.settle_s, 2), "problems": list(outcome.reasons)}))
    outcome.checkers = {r.checker: r for r in results}
    outcome.valid = merge_verdicts(r.valid for r in results)
    for (f, kind), n in sorted(run.counts.items()):
        outcome.counts.setdefault(f, {OK: 0, FAIL: 0, INFO: 0})[kind] = n
    outcome.duration_s = time.monotonic() - started
    store.write_results({
        "valid": outcome.valid, "workload": WORKLOAD,
        "checkers": {r.checker: r.to_json() for r in results},
        "counts": outcome.counts, "nemesis_events": outcome.nemesis_events,
        "bug": o.bug, "rumor_ttl_ms": ttl_ms, "settle_s": round(outcome.settle_s, 2),
        "duration_s": round(outcome.duration_s, 3), "reasons": outcome.reasons,
        "notes": outcome.notes})
    for node in o.node_names:
        store.copy_node(node, log=cluster_dir / "logs" / f"{node}.log",
                        data=cluster_dir / "data" / node)
    for sub in ("data", "logs"):
        shutil.rmtree(cluster_dir / sub, ignore_errors=True)
    outcome.report = await trio.to_thread.run_sync(lambda: render_report(store.path))
    return outcome


__all__ = ["BUGS", "MAX_PUBLISHES", "WORKLOAD", "GossipRunOptions", "GossipRunOutcome",
           "run_gossip"]
