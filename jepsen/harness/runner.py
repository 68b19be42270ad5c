"""One Jepsen test on a real local cluster: workload + nemesis, heal, final reads, check, store.

Owns:
    `RunOptions`, `RunOutcome` and `run_test(options, console)`, which:
      1. creates the run's store (`phalanx.jepsen.store.create_run`: ``STORE/<test>/<stamp>/``
         with ``test.json``, and ``STORE/latest``) and a fresh proxied cluster in its
         ``cluster/`` folder (`open_real_cluster`; with ``lose-unfsynced`` among the faults its
         nodes keep un-fsynced writes in memory, so every kill is a machine crash);
      2. waits for a leader, performs the workload's setup operations (bank: the opening
         balances), then runs `concurrency` logical client processes (each with its own
         client session) driving one `phalanx.jepsen.workloads.Workload` through `perform`
         at `rate` operations per second in total, while the nemesis schedule
         (`schedule.real_schedule`) is applied in wall time (virtual times multiplied by
         `nemesis_scale`, so episodes last long enough for real processes to notice); a
         process whose operation ends ``info`` continues under a new process id; keys rotate
         after `ops_per_key` operations (the workload's ``per_key_limit``); with
         ``byzantine`` (PBFT, leaderless) the plan's replicas run their ``--byzantine`` mode or are
         twinned from the start (`byzantine_plan`, `cluster`), the history opens with a
         ``byzantine`` nemesis op naming them, and odd client slots reach twin B;
      3. stops the clients, heals everything, waits until the cluster recovered
         (`RealCluster.wait_recovered`: Byzantine replicas are not waited for), and performs
         the workload's final operations (reads; PBFT clients accept f+1 matching replies,
         so a lying replica cannot make one succeed); an eventually consistent protocol
         (`CallStrategy.ENDORSEMENT`: signed transactions, the workload's
         ``transactions`` mode) must then show every honest node's whole state identical
         (STALE scans, one node at a time) within `CONVERGE_TIMEOUT`;
      4. writes ``history.jsonl``, checks it (the workload's checkers, the stats checker,
         ``convergence`` where step 3 checked it, and a ``recovery`` checker: the cluster
         recovered and every final read succeeded),
         writes ``results.json`` (with ``byzantine``: the plan), copies every node's log
         and data into ``nodes/<id>/`` (twin B of ``n3`` into ``nodes/n3-b/``),
         and renders ``latency.svg``, ``rate.svg`` and ``index.html``.
    Verdict: the merge of every checker (False beats "unknown" beats True).

Must not import the runtime or consensus cores. Real time and processes: not deterministic,
never run by the simulator; the seed fixes the schedule and the workload's choices.
"""

from __future__ import annotations

import hashlib
import random
import shutil
import ssl
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Final

import trio
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from phalanx.appspec import DEFAULT_APP
from phalanx.appspec import get as get_app
from phalanx.appspec import specs as app_specs
from phalanx.client.async_client import ClientError, open_client
from phalanx.jepsen.checker import CheckerResult, RunResult
from phalanx.jepsen.harness.byzantine_plan import (
    ByzantinePlan,
    format_items,
    parse_byzantine,
    plan_byzantine,
)
from phalanx.jepsen.harness.cluster import (
    TWIN_B_SUFFIX,
    TWINS_DIR,
    ClusterUnavailable,
    RealCluster,
    open_real_cluster,
)
from phalanx.jepsen.harness.membership_real import RealMembership
from phalanx.jepsen.harness.nemesis_real import RealNemesis
from phalanx.jepsen.harness.schedule import REAL_FAULT_KINDS, real_schedule
from phalanx.jepsen.history import FAIL, INFO, OK, HistoryRecorder, OpType, Process
from phalanx.jepsen.linearizability import UNKNOWN
from phalanx.jepsen.nemesis import (
    LOSE_UNFSYNCED,
    MEMBERSHIP,
    MEMBERSHIP_SPARES,
    OPT_IN_FAULT_KINDS,
    FaultEvent,
)
from phalanx.jepsen.report import render_report
from phalanx.jepsen.store import RunStore, create_run
from phalanx.jepsen.workloads import (
    Invocation,
    Workload,
    WorkloadConfig,
    perform,
)
from phalanx.ops import pki
from phalanx.ops.node_config import ClusterConfig
from phalanx.protocols import DEFAULT_PROTOCOL, CallStrategy
from phalanx.protocols import get as get_protocol

WORKLOADS: Final = tuple(sorted({w for a in app_specs() for w in a.workload_names}))
"""Workloads the runner drives: every registered app's (`AppSpec.workloads`)."""

OPERATION_ATTEMPTS: Final = 5
CONVERGE_TIMEOUT: Final = 30.0
"""Seconds after the final reads for every honest node's state to become identical
(eventually consistent protocols only)."""
"""Tries of each setup and final operation (a try that ends ``info`` or ``fail`` is retried)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOptions:
    protocol: str = DEFAULT_PROTOCOL
    app: str = DEFAULT_APP
    """The replicated application (`phalanx.appspec`); `workload` must be one of its."""
    nodes: int = 5
    workload: str = "register"
    faults: tuple[str, ...] = ()
    time_s: float = 60.0
    rate: float = 50.0
    concurrency: int = 5
    seed: int = 0
    store: Path = Path("store")
    keys: int = 5
    ops_per_key: int = 150
    op_timeout: float = 2.0
    abort_grace: float = 3.0
    """Signed transactions: how long past a transaction's deadline a client waits for its
    outcome (a deadlocked pair aborts only after a checkpoint, which starts `delta_old`
    after the deadline); an abort seen in time is a definite ``fail``, not ``info``."""
    nemesis_scale: float = 4.0
    recovery_timeout: float = 60.0
    check_time_limit: float = 60.0
    byzantine: str = ""
    """``--byzantine`` spec (`phalanx.jepsen.harness.byzantine_plan`): PBFT replicas that lie."""
    expect_violation: bool = False
    """Allow more than f Byzantine replicas: a control run that may end invalid."""
    protocol_options: tuple[tuple[str, str], ...] = ()
    """``--option NAME=VALUE`` pairs for the cluster's ``[protocol]`` table, checked by the
    protocol's node (`options_problem`, as `cluster init --option`)."""

    def __post_init__(self) -> None:
        app = get_app(self.app)  # UnknownApp is a ValueError
        if self.workload not in app.workload_names:
            raise ValueError(f"unknown workload {self.workload!r} for the {self.app} app; "
                             f"known: {', '.join(app.workload_names)}")
        problem = app.protocol_problem(get_protocol(self.protocol))
        if problem is not None:
            raise ValueError(problem)
        if self.nodes < 1 or self.concurrency < 1 or self.rate <= 0 or self.time_s <= 0:
            raise ValueError("nodes and concurrency must be >= 1, rate and time > 0")
        if self.nemesis_scale <= 0 or self.keys < 1 or self.ops_per_key < 1:
            raise ValueError("nemesis_scale must be > 0, keys and ops_per_key >= 1")
        self.byzantine_plan()  # raises ByzantinePlanError (a ValueError) on a bad spec
        spec = get_protocol(self.protocol)
        for kind in OPT_IN_FAULT_KINDS:
            if kind in self.faults and kind not in spec.sim_fault_kinds:
                raise ValueError(f"--nemesis {kind}: protocol {self.protocol} does not "
                                 "support it (static membership)")
        if self.protocol_options:
            check = getattr(get_protocol(self.protocol).node.load(), "options_problem", None)
            problem = (f"protocol {self.protocol} takes no --option" if check is None
                       else check(dict(self.protocol_options)))
            if problem is not None:
                raise ValueError(f"--option: {problem}")

    def byzantine_plan(self) -> ByzantinePlan:
        """The run's Byzantine replicas, placed by the seed (`plan_byzantine`)."""
        return plan_byzantine(parse_byzantine(self.byzantine), self.node_names,
                              protocol=self.protocol, seed=self.seed,
                              allow_violation=self.expect_violation)

    @property
    def node_names(self) -> tuple[str, ...]:
        """``n1..nN``, as `phalanx.ops.local_cluster.init_cluster` names them."""
        return tuple(f"n{i}" for i in range(1, self.nodes + 1))

    @property
    def spare_names(self) -> tuple[str, ...]:
        """The spare nodes after them that the ``membership`` nemesis adds (none without)."""
        if MEMBERSHIP not in self.faults:
            return ()
        return tuple(f"n{i}" for i in range(self.nodes + 1,
                                            self.nodes + MEMBERSHIP_SPARES + 1))

    @property
    def test_name(self) -> str:
        if set(self.faults) == set(REAL_FAULT_KINDS):
            faults = "all"
        else:
            faults = "+".join(self.faults) if self.faults else "none"
        label = self.byzantine_plan().label()
        byz = f"-{label}" if label else ""
        # (A custom app's FILE.py:FACTORY: its file and factory, no directories.)
        app = "" if self.app == DEFAULT_APP else f"{self.app.rpartition('/')[2]}-"
        app = app.replace(":", "-")
        return f"{self.protocol}-{app}{self.workload}-{faults}{byz}-n{self.nodes}"

    def workload_config(self) -> WorkloadConfig:
        """Each worker paces itself with `Workload.delay`, so the per-worker rate is
        ``rate / concurrency``."""
        signs = get_protocol(self.protocol).call_strategy is CallStrategy.ENDORSEMENT
        return WorkloadConfig(seed=self.seed, rate=self.rate / self.concurrency,
                              per_key_limit=self.ops_per_key, active_keys=self.keys,
                              transactions=signs)


@dataclass(slots=True, kw_only=True)
class RunOutcome:
    """What `run_test` found; ``results.json`` holds the same (and the checkers' details)."""

    directory: Path
    valid: bool | str = UNKNOWN
    reasons: list[str] = field(default_factory=list)
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per operation kind ``f``: ``{"ok": n, "fail": n, "info": n}`` (workers only)."""
    nemesis_events: int = 0
    recovered: bool = False
    final_reads_ok: int = 0
    final_reads: int = 0
    duration_s: float = 0.0
    checkers: dict[str, object] = field(default_factory=dict)
    """Checker name → its verdict (True, False, "unknown")."""
    network: dict[str, int] = field(default_factory=dict)
    report: Path | None = None
    byzantine: str = "none"
    """`ByzantinePlan.describe` of the run's Byzantine replicas."""
    node_status: dict[str, dict[str, object]] = field(default_factory=dict)
    """Each process's status after the final reads (`RealCluster.node_status`)."""
    converged: bool | None = None
    """Eventually consistent protocols (`CallStrategy.ENDORSEMENT`): whether every honest
    node's applied state (a STALE scan of each) became identical after the final reads;
    None where the protocol orders everything (Raft, PBFT: not checked)."""
    digests: dict[str, str] = field(default_factory=dict)
    """Per honest node, a digest of its last scanned state (with `converged`)."""

    @property
    def totals(self) -> dict[str, int]:
        out = {OK: 0, FAIL: 0, INFO: 0}
        for per in self.counts.values():
            for k, v in per.items():
                out[k] += v
        return out


class _Run:
    """The mutable state of one run, shared by its tasks."""

    def __init__(self, options: RunOptions, cluster: RealCluster, workload: Workload) -> None:
        self.options = options
        self.cluster = cluster
        self.workload = workload
        self.recorder = HistoryRecorder()
        self.t0 = trio.current_time()
        self.counts: Counter[tuple[str, str]] = Counter()
        self.stopped = False
        self.next_process = options.concurrency
        self.nemesis = RealNemesis(cluster, record=self.record_nemesis, clock_skew=True)
        if options.spare_names:
            self.nemesis.membership = RealMembership(
                cluster, bootstrap=options.nodes, record=self.record_nemesis,
                rng=random.Random(options.seed ^ 0x3E3B))

    def stopping(self) -> bool:
        return self.stopped

    def now(self) -> int:
        return int((trio.current_time() - self.t0) * 1e9)

    def record_nemesis(self, f: str, value: str) -> None:
        self.recorder.nemesis(f=f, value=value, time=self.now())

    def fresh_process(self) -> int:
        p = self.next_process
        self.next_process += 1
        return p

    def total(self, kind: str) -> int:
        return sum(v for (_, k), v in self.counts.items() if k == kind)

    async def worker(self, slot: int) -> None:
        process: Process = slot
        o = self.options
        async with open_client(self.cluster.client_config(slot), timeout=o.op_timeout,
                               attempt_timeout=min(0.5, o.op_timeout),
                               abort_grace=o.abort_grace) as client:
            next_at = trio.current_time()
            while not self.stopping():
                next_at = max(next_at + self.workload.delay(),
                              trio.current_time() - 1.0)  # fell behind: do not burst
                await trio.sleep_until(next_at)
                if self.stopping():
                    break
                invocation = self.workload.next_invocation()
                kind = await perform(self.workload, client, self.recorder, process=process,
                                     invocation=invocation, now=self.now)
                self.counts[(invocation.f, kind)] += 1
                if kind == INFO:
                    process = self.fresh_process()

    async def run_nemesis(self, schedule: tuple[FaultEvent, ...], origin: float) -> None:
        """Apply `schedule`, whose times count from `origin` (the workload's start)."""
        for event in schedule:
            await trio.sleep_until(origin + event.at_ns * self.options.nemesis_scale / 1e9)
            await self.nemesis.apply(event)

    async def perform_all(self, invocations: tuple[Invocation, ...]) -> tuple[int, int]:
        """Perform each invocation until it ends ``ok`` (at most `OPERATION_ATTEMPTS` tries,
        each under a fresh process); returns (ok, total)."""
        ok = 0
        async with open_client(self.cluster.config, timeout=self.options.op_timeout,
                               abort_grace=self.options.abort_grace) as client:
            for invocation in invocations:
                for _ in range(OPERATION_ATTEMPTS):
                    kind: OpType = await perform(
                        self.workload, client, self.recorder, process=self.fresh_process(),
                        invocation=invocation, now=self.now)
                    if kind == OK:
                        ok += 1
                        break
                    await trio.sleep(0.5)
        return ok, len(invocations)

    async def converge(self, within: float) -> tuple[bool, dict[str, str]]:
        """Until every honest node's applied state (a STALE scan of its keys, asked of that
        node alone) is the same, or `within` seconds: (identical, a digest per node)."""
        config = self.cluster.config
        context = pki.client_context(config.ca, certificate=config.client_cert,
                                     private_key=config.client_key, check_hostname=False)
        digests: dict[str, str] = {}
        give_up = trio.current_time() + within
        while True:
            for node in self.cluster.honest:
                digests[node] = await _state_digest(config, node, context)
            if len(set(digests.values())) == 1 and "-" not in digests.values():
                return True, digests
            if trio.current_time() >= give_up:
                return False, digests
            await trio.sleep(0.5)

    def describe_faults(self) -> str:
        current = self.nemesis.current
        return "; ".join(current[e] for e in sorted(current)) or "none"


async def _state_digest(config: ClusterConfig, node: str, context: ssl.SSLContext) -> str:
    """A short digest of `node`'s whole KV state, or "-" if it does not answer."""
    addr = next(n.client_addr for n in config.nodes if n.id == node)
    async with open_client([(node, addr.host, addr.port)], ssl_context=context,
                           protocol=config.protocol, timeout=2.0, attempt_timeout=1.0,
                           client_id=pki.new_client_id(config.client_cert)) as client:
        try:
            items = await client.scan("", limit=10_000, stale=True)
        except ClientError:
            return "-"
    return hashlib.sha256(repr(items).encode()).hexdigest()[:12]


async def _progress(run: _Run, console: Console, total: float) -> None:
    if console.is_terminal:
        await _bar(run, console, total)
    while True:  # not a terminal (a log, a CI job): a line every 5 s
        await trio.sleep(5.0)
        console.print(
            f"[{trio.current_time() - run.t0:5.1f}s] ok {run.total(OK):,}, "
            f"info {run.total(INFO):,}, fail {run.total(FAIL):,}; "
            f"faults: {run.describe_faults()}", highlight=False, soft_wrap=True, markup=False)


async def _bar(run: _Run, console: Console, total: float) -> None:
    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[counts]}"), console=console,
                  transient=True) as bar:
        task = bar.add_task("running", total=total, counts="")
        while True:
            bar.update(task, completed=min(total, trio.current_time() - run.t0),
                       counts=f"ok {run.total(OK):,} info {run.total(INFO):,} "
                              f"fail {run.total(FAIL):,} | faults: {run.describe_faults()}")
            await trio.sleep(0.25)


def _config_doc(options: RunOptions) -> dict[str, object]:
    doc = asdict(options)
    doc["store"] = str(options.store)
    doc["faults"] = list(options.faults)
    doc["test"] = options.test_name
    plan = options.byzantine_plan()
    doc["byzantine"] = format_items(parse_byzantine(options.byzantine))
    doc["byzantine_plan"] = plan.to_json()
    return doc


async def run_test(options: RunOptions, console: Console) -> RunOutcome:
    """Run one test (see the module docstring); the result is also in the run's store."""
    started = time.monotonic()
    make_workload = get_app(options.app).workload(options.workload)
    rng = random.Random(options.seed)
    # The schedule names nodes n1..nN, as `init_cluster` does; drawn before the cluster so
    # that test.json can carry it from the start.
    node_names = options.node_names + options.spare_names
    plan = options.byzantine_plan()
    # Kills and partitions over the bootstrap nodes (a kill never takes a majority of
    # them); the spares only take membership episodes.
    schedule = real_schedule(options, options.node_names, options.spare_names)
    store = create_run(options.store, options.test_name, config=_config_doc(options),
                       seed=options.seed, schedule=schedule)
    outcome = RunOutcome(directory=store.path, byzantine=plan.describe())
    cluster_dir = store.path / "cluster"
    async with open_real_cluster(cluster_dir, nodes=options.nodes, protocol=options.protocol,
                                 rng=random.Random(rng.getrandbits(64)),
                                 volatile_writes=LOSE_UNFSYNCED in options.faults,
                                 byzantine=plan, app=options.app,
                                 protocol_options=dict(options.protocol_options),
                                 spares=len(options.spare_names)) as cluster:
        if cluster.nodes != node_names:
            raise ClusterUnavailable(f"unexpected node names {cluster.nodes}")
        byz = f"; Byzantine: {plan.describe()}" if plan.nodes else ""
        console.print(f"cluster of {options.nodes} nodes up in {cluster_dir}{byz}; "
                      "waiting for a leader", highlight=False, soft_wrap=True)
        leader = await cluster.wait_for_leader(30.0)
        workload = make_workload(options.workload_config(), cluster.config)
        run = _Run(options, cluster, workload)
        if plan.nodes:
            run.record_nemesis("byzantine", plan.describe())
        setup_ok, setup_n = await run.perform_all(workload.setup_invocations())
        if setup_ok < setup_n:
            outcome.reasons.append(f"setup: {setup_n - setup_ok} of {setup_n} operations failed")
        leads = (f"{leader} is up (no leader: every node endorses)"
                 if get_protocol(options.protocol).call_strategy
                 is CallStrategy.ENDORSEMENT else f"{leader} leads")
        console.print(f"{leads}; running {options.workload} for {options.time_s:g} s "
                      f"with {len(schedule)} nemesis events", highlight=False)
        t_start = trio.current_time()
        async with trio.open_nursery() as outer:
            outer.start_soon(_progress, run, console, options.time_s)
            async with trio.open_nursery() as nursery:
                for slot in range(options.concurrency):
                    nursery.start_soon(run.worker, slot)
                nursery.start_soon(run.run_nemesis, schedule, t_start)
                if (changes := run.nemesis.membership) is not None:
                    nursery.start_soon(changes.run)
                await trio.sleep_until(t_start + options.time_s)
                run.stopped = True
                if changes is not None:
                    changes.stop()
                nursery.cancel_scope.deadline = trio.current_time() + options.op_timeout + 5
            run.nemesis.heal_all()
            console.print("healed every fault; waiting for the cluster to recover",
                          highlight=False)
            if (changes := run.nemesis.membership) is not None:
                await changes.settle(options.recovery_timeout / 2)
            try:
                await cluster.wait_recovered(options.recovery_timeout)
                outcome.recovered = True
            except ClusterUnavailable as e:
                outcome.reasons.append(str(e))
            outcome.final_reads_ok, outcome.final_reads = await run.perform_all(
                workload.final_invocations())
            if get_protocol(options.protocol).call_strategy is CallStrategy.ENDORSEMENT:
                outcome.converged, outcome.digests = await run.converge(CONVERGE_TIMEOUT)
                if not outcome.converged:
                    outcome.reasons.append(
                        f"honest nodes' states differ after {CONVERGE_TIMEOUT:g} s: "
                        + ", ".join(f"{n} {d}" for n, d in sorted(outcome.digests.items())))
            outcome.node_status = await cluster.node_status()
            outer.cancel_scope.cancel()
        outcome.network = cluster.network.statistics()
    outcome.nemesis_events = run.nemesis.applied
    for (f, kind), n in sorted(run.counts.items()):
        outcome.counts.setdefault(f, {OK: 0, FAIL: 0, INFO: 0})[kind] = n
    history = run.recorder.history()
    store.write_history(history)
    console.print(f"checking {len(history.ops):,} history events", highlight=False)
    limit = options.check_time_limit
    checked = await trio.to_thread.run_sync(lambda: workload.check(history, time_limit=limit))
    merged = _with_recovery(checked, outcome, setup=(setup_ok, setup_n))
    outcome.valid = merged.valid
    outcome.checkers = {r.checker: r.valid for r in merged.results}
    for r in merged.results:
        if r.valid is False:
            outcome.reasons.append(f"{r.checker} checker: not valid")
    outcome.duration_s = time.monotonic() - started
    doc = merged.to_json()
    doc.update(_harness_doc(outcome))
    doc["byzantine"] = plan.to_json()
    store.write_results(doc)
    _collect_nodes(store, cluster_dir, node_names, twins=plan.twins)
    outcome.report = await trio.to_thread.run_sync(lambda: render_report(store.path))
    return outcome


def _with_recovery(checked: RunResult, o: RunOutcome, *, setup: tuple[int, int]) -> RunResult:
    """`checked` plus the ``recovery`` checker (module docstring, step 4)."""
    reads_ok = o.final_reads_ok == o.final_reads
    convergence = () if o.converged is None else (CheckerResult(
        checker="convergence", valid=o.converged, details={"digests": o.digests}),)
    recovery = CheckerResult(
        checker="recovery",
        valid=o.recovered and reads_ok and setup[0] == setup[1],
        details={"recovered": o.recovered,
                 "final_reads": {"ok": o.final_reads_ok, "total": o.final_reads},
                 "setup": {"ok": setup[0], "total": setup[1]},
                 "problems": list(o.reasons)},
    )
    return RunResult(workload=checked.workload,
                     results=(*checked.results, *convergence, recovery),
                     linearizability=checked.linearizability)


def _harness_doc(o: RunOutcome) -> dict[str, object]:
    return {
        "reasons": o.reasons,
        "counts": o.counts,
        "totals": o.totals,
        "nemesis_events": o.nemesis_events,
        "recovered": o.recovered,
        "final_reads": {"ok": o.final_reads_ok, "total": o.final_reads},
        "duration_s": round(o.duration_s, 3),
        "network": o.network,
        "node_status": o.node_status,
    }


def _collect_nodes(store: RunStore, cluster_dir: Path, nodes: tuple[str, ...], *,
                   twins: tuple[str, ...] = ()) -> None:
    """Move every node's log and data into ``nodes/<id>/`` (`RunStore.copy_node`; twin B of
    node ``n3`` into ``nodes/n3-b/``), then drop the cluster's copies; the cluster's
    configuration and certificates stay in ``cluster/``."""
    for node in nodes:
        store.copy_node(node, log=cluster_dir / "logs" / f"{node}.log",
                        data=cluster_dir / "data" / node)
    twin_dir = cluster_dir / TWINS_DIR
    for node in twins:
        store.copy_node(node + TWIN_B_SUFFIX, log=twin_dir / "logs" / f"{node}.log",
                        data=twin_dir / "data" / node)
    for sub in ("data", "logs"):
        shutil.rmtree(cluster_dir / sub, ignore_errors=True)
        shutil.rmtree(twin_dir / sub, ignore_errors=True)
