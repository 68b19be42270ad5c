"""``phalanx jepsen run --shards 2 --workload cross-shard-bank``: two linked clusters under faults.

Owns `ShardRunOptions` and `run_shards(options, console)`, which:
  1. creates the run's store (``STORE/<test>/<stamp>/``) and two clusters of real processes
     (``cluster-A/``, ``cluster-B/``; each its own protocol, KV app and the ``clustersend``
     service), links them (`phalanx.ops.link.link_clusters`) before either starts, and
     starts each behind its own fault-injection proxies (`open_real_cluster`); the
     ``--byzantine`` spec applies to every shard whose protocol tolerates Byzantine faults;
  2. opens `accounts` accounts of `opening` in each shard, then runs `concurrency` client
     processes: each operation picks a shard and one of: an atomic ``read`` of the shard's
     whole state, a ``transfer`` between two of its accounts, or a ``send`` to an account of
     the other shard (a debit plus an outbox slot in one transaction,
     `phalanx.jepsen.cross_shard_bank.transfer_command`); sends of one shard are serialised
     so that its outbox has no gaps (a slot whose outcome is unknown is tried again by the
     next send). Meanwhile each shard gets its own seeded nemesis schedule (kill, pause,
     partitions inside the shard: the proxies sit on intra-shard links only; the links
     between the shards go direct);
  3. heals both shards, waits for them to recover, then reads both again and again until
     every credit sent is received (or `settle_timeout`);
  4. checks the history (`check_cross_shard`: books balanced at every read, no negative
     balance, no forged credit, every credit received by the end; the stats checker; a
     ``recovery`` checker) and writes ``history.jsonl``, ``results.json`` and each node's
     log and data (``nodes/<shard>-<node>/``).

Must not import the runtime or consensus cores. Real time and processes: not deterministic;
the seed fixes the schedules and the workload's choices.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Final

import trio
from rich.console import Console

from phalanx.apps.kv_types import Get, Put, Scan, ScanResult, TxnResult, Value
from phalanx.apps.kv_wire import decode_result, encode_command
from phalanx.client.async_client import Client, ClientError, open_client
from phalanx.jepsen.checker import CheckerResult, check_stats
from phalanx.jepsen.cross_shard_bank import (
    ShardSpec,
    balance_key,
    check_cross_shard,
    encode_state,
    local_transfer_command,
    transfer_command,
)
from phalanx.jepsen.harness.byzantine_plan import (
    ByzantinePlan,
    ByzantinePlanError,
    parse_byzantine,
    plan_byzantine,
)
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
from phalanx.jepsen.store import create_run
from phalanx.net.client_protocol import ReadConsistency
from phalanx.ops.link import link_clusters
from phalanx.protocols import FaultModel
from phalanx.protocols import get as get_protocol

WORKLOAD: Final = "cross-shard-bank"
SHARD_NAMES: Final = ("A", "B")
SERVICE: Final = "clustersend"
SEND_TRIES: Final = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardRunOptions:
    protocols: tuple[str, ...] = ("pbft", "raft")
    nodes: tuple[int, ...] = (4, 3)
    faults: tuple[str, ...] = ()
    time_s: float = 60.0
    rate: float = 20.0
    concurrency: int = 4
    seed: int = 0
    store: Path = Path("store")
    nemesis_scale: float = 4.0
    byzantine: str = ""
    accounts: int = 4
    opening: int = 1_000
    op_timeout: float = 3.0
    recovery_timeout: float = 60.0
    settle_timeout: float = 90.0

    def __post_init__(self) -> None:
        if len(self.protocols) != len(SHARD_NAMES) or len(self.nodes) != len(SHARD_NAMES):
            raise ValueError(f"exactly {len(SHARD_NAMES)} shards are supported")
        for protocol, n in zip(self.protocols, self.nodes, strict=True):
            problem = get_protocol(protocol).size_problem(n)
            if problem is not None:
                raise ValueError(problem)
        for plan in self.plans():
            if plan.twins:
                raise ByzantinePlanError("twins are not supported with --shards (a twin "
                                         "is not in the other shard's link)")

    def plans(self) -> tuple[ByzantinePlan, ...]:
        """Each shard's Byzantine replicas: the spec applies to Byzantine-tolerant shards."""
        items = parse_byzantine(self.byzantine)
        out = []
        for i, (protocol, n) in enumerate(zip(self.protocols, self.nodes, strict=True)):
            if items and get_protocol(protocol).fault_model is FaultModel.BYZANTINE:
                out.append(plan_byzantine(items, tuple(f"n{j}" for j in range(1, n + 1)),
                                          protocol=protocol, seed=self.seed + i,
                                          allow_violation=False))
            else:
                out.append(ByzantinePlan())
        return tuple(out)

    @property
    def test_name(self) -> str:
        faults = ("all" if set(self.faults) == set(REAL_FAULT_KINDS)
                  else "+".join(self.faults) or "none")
        labels = [p.label() for p in self.plans()]
        byz = "".join(f"-{label}" for label in labels if label)
        shards = "+".join(f"{p}{n}" for p, n in zip(self.protocols, self.nodes, strict=True))
        return f"shards-{shards}-{WORKLOAD}-{faults}{byz}"


@dataclass(frozen=True, slots=True)
class _Schedule:
    seed: int
    faults: tuple[str, ...]
    time_s: float
    nemesis_scale: float


@dataclass(slots=True)
class _Shard:
    name: str
    cluster: RealCluster
    cluster_id: str
    accounts: tuple[str, ...]
    plan: ByzantinePlan
    nemesis: RealNemesis | None = None
    next_seq: int = 0
    send_lock: trio.Lock = field(default_factory=trio.Lock)


@dataclass(slots=True, kw_only=True)
class ShardRunOutcome:
    directory: Path
    valid: Verdict = UNKNOWN
    checkers: dict[str, CheckerResult] = field(default_factory=dict)
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    nemesis_events: int = 0
    byzantine: str = "none"
    reasons: list[str] = field(default_factory=list)
    duration_s: float = 0.0


async def _call(client: Client, command: bytes, *, read: bool = False) -> object:
    if read:
        return decode_result(await client.call(
            command, read_only=True, consistency=ReadConsistency.LINEARIZABLE))
    return decode_result(await client.call(command))


class _Run:
    def __init__(self, options: ShardRunOptions, shards: tuple[_Shard, _Shard]) -> None:
        self.options = options
        self.shards = shards
        self.recorder = HistoryRecorder()
        self.t0 = trio.current_time()
        self.counts: Counter[tuple[str, str]] = Counter()
        self.stopped = False
        self.next_process = options.concurrency

    def stopping(self) -> bool:
        return self.stopped

    def now(self) -> int:
        return int((trio.current_time() - self.t0) * 1e9)

    def fresh_process(self) -> int:
        self.next_process += 1
        return self.next_process - 1

    def record_nemesis(self, shard: str) -> Callable[[str, str], None]:
        def record(f: str, value: str) -> None:
            self.recorder.nemesis(f=f, value=f"{shard}: {value}", time=self.now())
        return record

    async def read(self, process: int, shard: _Shard, client: Client) -> OpType:
        return (await self.read_state(process, shard, client))[0]

    async def read_state(self, process: int, shard: _Shard, client: Client
                         ) -> tuple[OpType, dict[str, bytes]]:
        """One atomic read of `shard`'s whole state, recorded; (kind, the state)."""
        self.recorder.invoke(process=process, f="read", key=shard.name, time=self.now())
        try:
            scan = await _call(client, encode_command(Scan(prefix="", limit=10_000)),
                               read=True)
        except ClientError as e:
            self.recorder.complete(process=process, type=FAIL, time=self.now(),
                                   value=None, error=type(e).__name__)
            return FAIL, {}
        if not isinstance(scan, ScanResult):
            self.recorder.complete(process=process, type=FAIL, time=self.now(),
                                   value=None, error=repr(scan)[:80])
            return FAIL, {}
        self.recorder.complete(process=process, type=OK, time=self.now(),
                               value=encode_state(scan.items))
        return OK, dict(scan.items)

    async def _balance(self, client: Client, account: str) -> bytes | None:
        got = await _call(client, encode_command(Get(key=balance_key(account))), read=True)
        if not isinstance(got, Value):
            raise ClientError(f"unexpected reply {got!r}")
        return got.value

    async def transfer(self, process: int, shard: _Shard, client: Client,
                       rng: random.Random) -> OpType | None:
        x, y = rng.sample(shard.accounts, 2)
        amount = rng.randint(1, 50)
        try:
            bx, by = await self._balance(client, x), await self._balance(client, y)
        except ClientError:
            return None
        if bx is None or int(bx) < amount:
            return None
        self.recorder.invoke(process=process, f="transfer", key=shard.name,
                             value=(x, y, amount), time=self.now())
        return await self._outcome(process, client,
                                   local_transfer_command(x, bx, y, by, amount))

    async def send(self, process: int, shard: _Shard, other: _Shard, client: Client,
                   rng: random.Random) -> OpType | None:
        x, y = rng.choice(shard.accounts), rng.choice(other.accounts)
        amount = rng.randint(1, 50)
        async with shard.send_lock:  # one send at a time per shard: no gaps in its outbox
            try:
                bx = await self._balance(client, x)
            except ClientError:
                return None
            if bx is None or int(bx) < amount:
                return None
            seq = shard.next_seq
            self.recorder.invoke(process=process, f="send", key=shard.name,
                                 value=(x, y, amount, seq), time=self.now())
            command = transfer_command(x, bx, amount, other.cluster_id, seq, y,
                                       f"{shard.name}{seq}")
            try:
                result = await _call(client, command)
            except ClientError as e:
                self.recorder.complete(process=process, type=INFO, time=self.now(),
                                       error=type(e).__name__)
                return INFO  # the slot's fate is unknown: the next send tries it again
            ok = isinstance(result, TxnResult) and result.succeeded
            if ok or (isinstance(result, TxnResult) and result.observed[1] is not None):
                shard.next_seq += 1  # ours, or an earlier attempt's that applied
            self.recorder.complete(process=process, type=OK if ok else FAIL,
                                   time=self.now())
            return OK if ok else FAIL

    async def _outcome(self, process: int, client: Client, command: bytes) -> OpType:
        try:
            result = await _call(client, command)
        except ClientError as e:
            self.recorder.complete(process=process, type=INFO, time=self.now(),
                                   error=type(e).__name__)
            return INFO
        kind: OpType = OK if isinstance(result, TxnResult) and result.succeeded else FAIL
        self.recorder.complete(process=process, type=kind, time=self.now())
        return kind

    async def worker(self, slot: int) -> None:
        o = self.options
        rng = random.Random(o.seed * 1_000 + slot)
        process = slot
        async with contextlib.AsyncExitStack() as stack:
            clients = [await stack.enter_async_context(open_client(
                s.cluster.client_config(slot), timeout=o.op_timeout,
                attempt_timeout=min(0.5, o.op_timeout))) for s in self.shards]
            next_at = trio.current_time()
            while not self.stopping():
                next_at = max(next_at + rng.expovariate(o.rate / o.concurrency),
                              trio.current_time() - 1.0)
                await trio.sleep_until(next_at)
                if self.stopping():
                    break
                i = rng.randrange(len(self.shards))
                shard, other, client = self.shards[i], self.shards[1 - i], clients[i]
                f = rng.choices(("read", "transfer", "send"), (3, 3, 4))[0]
                kind: OpType | None
                if f == "read":
                    kind = await self.read(process, shard, client)
                elif f == "transfer":
                    kind = await self.transfer(process, shard, client, rng)
                else:
                    kind = await self.send(process, shard, other, client, rng)
                if kind is not None:
                    self.counts[(f, kind)] += 1
                if kind == INFO:
                    process = self.fresh_process()

    async def run_nemesis(self, shard: _Shard, schedule: tuple[FaultEvent, ...],
                          origin: float) -> None:
        assert shard.nemesis is not None
        for event in schedule:
            await trio.sleep_until(origin + event.at_ns * self.options.nemesis_scale / 1e9)
            await shard.nemesis.apply(event)

    async def settle(self, within: float) -> bool:
        """Read both shards until every credit sent is received (True) or `within` s."""
        give_up = trio.current_time() + within
        async with open_client(self.shards[0].cluster.config, timeout=5.0) as ca, \
                open_client(self.shards[1].cluster.config, timeout=5.0) as cb:
            while True:
                states: list[dict[str, bytes]] = []
                for shard, client in zip(self.shards, (ca, cb), strict=True):
                    kind, state = await self.read_state(self.fresh_process(), shard, client)
                    if kind == OK:
                        states.append(state)
                if len(states) == 2 and all(
                        _delivered(states[i], states[1 - i], self.shards[i], self.shards[1 - i])
                        for i in (0, 1)):
                    return True
                if trio.current_time() >= give_up:
                    return False
                await trio.sleep(0.5)


def _delivered(src: dict[str, bytes], dst: dict[str, bytes], s: _Shard, d: _Shard) -> bool:
    """Every outbox slot of `s` for `d` is in `d`'s inbox (and nothing else is)."""
    out = {k.rsplit("/", 1)[1] for k in src if k.startswith(f"cs/out/{d.cluster_id}/")}
    got = {k.rsplit("/", 1)[1] for k in dst if k.startswith(f"cs/in/{s.cluster_id}/")}
    return out == got


def _schedules(o: ShardRunOptions, shards: tuple[int, ...]) -> tuple[tuple[FaultEvent, ...], ...]:
    return tuple(real_schedule(_Schedule(seed=o.seed + i, faults=o.faults, time_s=o.time_s,
                                         nemesis_scale=o.nemesis_scale),
                               tuple(f"n{j}" for j in range(1, n + 1)))
                 for i, n in enumerate(shards))


async def _open_accounts(shard: _Shard, opening: int) -> None:
    async with open_client(shard.cluster.config, timeout=30.0) as client:
        for account in shard.accounts:
            await client.call(encode_command(Put(key=balance_key(account),
                                                 value=str(opening).encode())))


async def run_shards(options: ShardRunOptions, console: Console) -> ShardRunOutcome:
    """Run one two-shard test (module docstring); the result is also in the run's store."""
    started = time.monotonic()
    o = options
    plans = o.plans()
    schedules = _schedules(o, o.nodes)
    doc = asdict(o)
    doc.update(store=str(o.store), test=o.test_name,
               byzantine_plans=[p.to_json() for p in plans],
               schedules={n: [str(e) for e in s] for n, s in zip(SHARD_NAMES, schedules,
                                                                  strict=True)})
    store = create_run(o.store, o.test_name, config=doc, seed=o.seed)
    outcome = ShardRunOutcome(directory=store.path, byzantine="; ".join(
        f"{n}: {p.describe()}" for n, p in zip(SHARD_NAMES, plans, strict=True)))
    dirs = [store.path / f"cluster-{n}" for n in SHARD_NAMES]
    prep_a = prepare_cluster(dirs[0], nodes=o.nodes[0], protocol=o.protocols[0],
                             services=(SERVICE,))
    prep_b = prepare_cluster(dirs[1], nodes=o.nodes[1], protocol=o.protocols[1],
                             services=(SERVICE,), avoid=prep_a.base_port)
    link_a, link_b = link_clusters(dirs[0], dirs[1])
    rng = random.Random(o.seed)
    recovered = settled = False
    async with open_real_cluster(dirs[0], nodes=o.nodes[0], rng=random.Random(rng.getrandbits(64)),
                                 byzantine=plans[0], prepared=prep_a) as ca, \
            open_real_cluster(dirs[1], nodes=o.nodes[1], rng=random.Random(rng.getrandbits(64)),
                              byzantine=plans[1], prepared=prep_b) as cb:
        shards = (_Shard("A", ca, link_a.cluster_id,
                         tuple(f"a{i}" for i in range(o.accounts)), plans[0]),
                  _Shard("B", cb, link_b.cluster_id,
                         tuple(f"b{i}" for i in range(o.accounts)), plans[1]))
        console.print(f"shard A: {o.protocols[0]} x{o.nodes[0]} ({plans[0].describe()}), "
                      f"shard B: {o.protocols[1]} x{o.nodes[1]} ({plans[1].describe()}); "
                      f"linked; in {store.path}", highlight=False, soft_wrap=True)
        for s in shards:
            await s.cluster.wait_for_leader(60.0)
            await _open_accounts(s, o.opening)
        run = _Run(o, shards)
        for s, plan in zip(shards, plans, strict=True):
            s.nemesis = RealNemesis(s.cluster, record=run.record_nemesis(s.name),
                                    clock_skew=True)
            if plan.nodes:
                run.recorder.nemesis(f="byzantine", value=f"{s.name}: {plan.describe()}",
                                     time=run.now())
        console.print(f"running {WORKLOAD} for {o.time_s:g} s with "
                      f"{sum(map(len, schedules))} nemesis events", highlight=False)
        t_start = trio.current_time()
        async with trio.open_nursery() as nursery:
            for slot in range(o.concurrency):
                nursery.start_soon(run.worker, slot)
            for s, schedule in zip(shards, schedules, strict=True):
                nursery.start_soon(run.run_nemesis, s, schedule, t_start)
            await trio.sleep_until(t_start + o.time_s)
            run.stopped = True
            nursery.cancel_scope.deadline = trio.current_time() + o.op_timeout + 5
        for s in shards:
            assert s.nemesis is not None
            s.nemesis.heal_all()
            outcome.nemesis_events += s.nemesis.applied
        console.print("healed every fault; waiting for both shards to recover and settle",
                      highlight=False)
        try:
            for s in shards:
                await s.cluster.wait_recovered(o.recovery_timeout)
            recovered = True
        except ClusterUnavailable as e:
            outcome.reasons.append(str(e))
        settle_started = trio.current_time()
        settled = await run.settle(o.settle_timeout)
        if not settled:
            outcome.reasons.append(f"credits still in flight {o.settle_timeout:g} s after "
                                   "healing")
        settle_s = trio.current_time() - settle_started
    history = run.recorder.history()
    store.write_history(history)
    specs = (ShardSpec(name="A", cluster_id=link_a.cluster_id, opening=o.opening * o.accounts),
             ShardSpec(name="B", cluster_id=link_b.cluster_id, opening=o.opening * o.accounts))
    results = (check_cross_shard(history, specs), check_stats(history, functions=("read",)),
               CheckerResult(checker="recovery", valid=recovered and settled, details={
                   "recovered": recovered, "settled": settled,
                   "settle_s": round(settle_s, 2), "problems": list(outcome.reasons)}))
    outcome.checkers = {r.checker: r for r in results}
    outcome.valid = merge_verdicts(r.valid for r in results)
    for (f, kind), n in sorted(run.counts.items()):
        outcome.counts.setdefault(f, {OK: 0, FAIL: 0, INFO: 0})[kind] = n
    outcome.duration_s = time.monotonic() - started
    store.write_results({
        "valid": outcome.valid, "checkers": {r.checker: r.to_json() for r in results},
        "counts": outcome.counts, "nemesis_events": outcome.nemesis_events,
        "byzantine": outcome.byzantine, "clusters": {s.name: s.cluster_id for s in specs},
        "duration_s": round(outcome.duration_s, 3), "reasons": outcome.reasons})
    for name, directory, n in zip(SHARD_NAMES, dirs, o.nodes, strict=True):
        for j in range(1, n + 1):
            node = f"n{j}"
            store.copy_node(f"{name}-{node}", log=directory / "logs" / f"{node}.log",
                            data=directory / "data" / node)
        for sub in ("data", "logs"):
            shutil.rmtree(directory / sub, ignore_errors=True)
    return outcome


__all__ = ["WORKLOAD", "ShardRunOptions", "ShardRunOutcome", "run_shards"]
