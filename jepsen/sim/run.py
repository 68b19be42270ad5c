"""One seeded simulation: build a cluster, inject a fault schedule, heal, check everything.

Owns: `run(config)` (and `_Cluster`, what a run drives); `RunConfig`, `RunResult` and
`swarm_choices` live in `phalanx.jepsen.sim.run_config` and are re-exported here; the
fault events are carried out by `phalanx.jepsen.sim.nemesis_run.NemesisRun`. A run is
a pure function of its config: every random draw comes from child generators of
`random.Random(seed)`, time is virtual, and the result carries the sha256 of the trace so
two runs can be compared.

Phases:
1. Fault phase `[0, time_ns)`: nodes boot, clients run closed loops, the nemesis schedule
   (`phalanx.jepsen.nemesis.generate_schedule`, plus a named scenario's events:
   `phalanx.jepsen.sim.scenarios`) is interpreted; log matching is checked every
   `check_every_ns`.
2. Heal at `time_ns`: every node restarted/resumed, links restored, packet faults off.
3. Liveness window `[time_ns, time_ns + liveness_ns)`: every pending operation must
   complete by its end; halfway through, clients stop and one final read per key is issued,
   which must succeed.
4. Checks: invariant violations, linearizability (`phalanx.jepsen.linearizability.check`,
   step-limited so the verdict is deterministic), liveness.

Swarm testing (`RunConfig.swarm`, on by default): each seed also draws, from its own
generator, a random non-empty subset of the configured fault kinds and the protocol's
tuning knobs (`swarm_choices`), so a sweep covers many fault mixes and configurations
(pre-vote and check-quorum on and off, short and long election timeouts, pipelining depth,
batch sizes, checkpoint interval). The choices depend on the seed only, are printed in the
failure report and are re-derived by the replay command.

Rules: no clocks or global randomness in anything the run does (wall time is measured only
around it, for reports); protocols are reached through `phalanx.jepsen.sim.protocols`.

Garbage collection: a run allocates many short-lived containers (messages, Readys, events),
so `run` raises the young-generation threshold to `GC_THRESHOLD0` for its duration and
restores the previous thresholds after (young collections at the default 700 cost ~1.4% of
a run's instructions). Nothing in a run depends on when the collector runs.
"""

from __future__ import annotations

import gc
import random
import time
import typing
from collections.abc import Callable
from functools import partial

from phalanx.apps import kv_wire
from phalanx.consensus.types import ClientRequest, Message
from phalanx.jepsen import nemesis
from phalanx.jepsen.history import HistoryRecorder
from phalanx.jepsen.linearizability import check as check_linearizable
from phalanx.jepsen.sim import membership as sim_membership
from phalanx.jepsen.sim.clients import ClientConfig, SimClient, ValueCounter
from phalanx.jepsen.sim.dissemination import GossipFabric
from phalanx.jepsen.sim.invariants import InvariantChecker
from phalanx.jepsen.sim.loop import EventLoop, Trace
from phalanx.jepsen.sim.nemesis_run import NemesisRun
from phalanx.jepsen.sim.network import NetworkConfig, SimNetwork
from phalanx.jepsen.sim.node import SimNode
from phalanx.jepsen.sim.protocols import SimWorkload, WorkloadEnv, protocol_setup
from phalanx.jepsen.sim.run_config import GOSSIP, MS, RunConfig, RunResult, swarm_choices
from phalanx.jepsen.sim.scenarios import with_scenario
from phalanx.jepsen.sim.wan import WanModel
from phalanx.net.codec import DecodeError, Registry

__all__ = ["GC_THRESHOLD0", "RunConfig", "RunResult", "run", "swarm_choices"]

_MS = MS
_ABORTED = b"\x00phalanx:aborted"
"""What an abort counts as among a BFT request's replies (no KV result encodes so)."""


def _message_decoder(codec: Registry) -> Callable[[bytes], Message]:
    """`codec.decode` of a whole message (the network memoises it by bytes: `decode_memo`)."""
    return typing.cast(Callable[[bytes], Message], codec.decoder(Message))


class _NodeCodec:
    """A node's persistence codec: `Registry.encode` as `Registry.encoder()` (the same bytes
    and errors, fewer lookups per call) and `Registry.decode`."""

    __slots__ = ("decode", "encode")

    def __init__(self, registry: Registry) -> None:
        self.encode: Callable[[object], bytes] = registry.encoder()
        self.decode: Callable[[bytes], object] = registry.decoder()


class _Cluster:
    """Wires nodes, network, clients and the nemesis (`NemesisRun`) for one run."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        root = random.Random(cfg.seed)
        self.loop = EventLoop()
        self.trace = Trace(self.loop, keep_all=cfg.keep_trace)
        self.recorder = HistoryRecorder()
        self.faults, self.knobs = swarm_choices(cfg)
        spares = sim_membership.spares_for(cfg.protocol, self.faults, cfg.nodes)
        setup = protocol_setup(
            cfg.protocol, bugs=cfg.bugs, nodes=cfg.nodes, seed=cfg.seed,
            knobs=self.knobs + ((("spares", spares),) if spares else ()),
            byzantine=cfg.byzantine, twins=cfg.twins, app=cfg.app,
        )
        self.checker = setup.checker or InvariantChecker(leader_role=setup.leader_role)
        self.replies = setup.replies
        self.answers_all = setup.replies is not None or setup.workload is not None
        self._watch_send = setup.watch_send
        if setup.description:
            self.trace(f"SETUP {setup.description}")
        self.names = setup.names
        codec = setup.codec
        # (Its own generators: a run without a WAN draws exactly what it always drew.)
        wan = None if cfg.wan is None else WanModel(
            cfg.wan, self.names, random.Random(f"wan:{cfg.seed}"),
            random.Random(f"wan-clients:{cfg.seed}"))
        self.network = SimNetwork(
            self.loop,
            random.Random(root.getrandbits(64)),
            self.trace,
            self._deliver,
            config=NetworkConfig(),
            encode=codec.encoder() if cfg.use_codec else None,
            decode=_message_decoder(codec) if cfg.use_codec else None,
            # Heartbeats and their answers repeat byte for byte, and decoding is a pure
            # function of the bytes into an immutable message.
            decode_memo=4096,
            watch=self._watch if setup.watch_send is not None else None,
            watch_types=setup.watch_types,
            wan=wan,
        )
        self.wan = wan
        if wan is not None:
            self.trace(f"SETUP wan: {cfg.wan.describe() if cfg.wan else ''}")
        self.client_rng = random.Random(root.getrandbits(64))
        self.sched_rng = random.Random(root.getrandbits(64))
        self.buggify_rng = random.Random(root.getrandbits(64))
        self.nodes: dict[str, SimNode] = {}
        node_codec = _NodeCodec(codec)  # the simulator is single-threaded: one is enough
        for name in self.names:
            self.nodes[name] = SimNode(
                name,
                loop=self.loop,
                rng=random.Random(root.getrandbits(64)),
                trace=self.trace,
                send=self.network.send,
                clients=self,
                checker=(
                    InvariantChecker(leader_role=setup.leader_role)  # a liar's: not checked
                    if name in setup.byzantine
                    else self.checker
                ),
                make_core=setup.make_core,
                make_replica=setup.make_replica,
                codec=node_codec,
                observe=setup.observe,
                tick_ns=cfg.tick,
                fresh_clock=setup.deadline_clock,
            )
            self.network.route(name, self.nodes[name].deliver)
        self.voters = self.names[:cfg.nodes]
        self.membership: sim_membership.MembershipNemesis | None = None
        if spares:  # (its own generator: every other draw stays as it was)
            self.membership = sim_membership.MembershipNemesis(
                loop=self.loop, rng=random.Random(f"membership:{cfg.seed}"),
                trace=self.trace, nodes=self.nodes, voters=self.voters,
                leader=self.leader, admin_input=sim_membership.admin_hook(cfg.protocol))
        self.nemesis = NemesisRun(
            loop=self.loop, trace=self.trace, recorder=self.recorder, network=self.network,
            nodes=self.nodes, names=self.names, minority=(cfg.nodes - 1) // 2,
            faults=self.faults, buggify_rng=self.buggify_rng,
            recovers_lost_disk=setup.recovers_lost_disk, leader=self.leader,
            membership=self.membership)
        self.fabric: GossipFabric | None = None
        if cfg.dissemination == GOSSIP:  # broadcasts through each node's gossip layer
            self.fabric = GossipFabric(loop=self.loop, nodes=self.nodes,
                                       send=self.network.send, codec=codec, seed=cfg.seed,
                                       tick_ns=cfg.gossip_tick_ns, wan=cfg.wan)
            for name in self.names:
                self.network.route(name, self.fabric.receive(name))
        values = ValueCounter()
        client_config = ClientConfig()
        if wan is not None:
            attempt, op = cfg.client_timeouts_ns(client_config.attempt_timeout_ns,
                                                 client_config.op_timeout_ns)
            client_config = ClientConfig(attempt_timeout_ns=attempt, op_timeout_ns=op)
        keys = [f"k{i}" for i in range(cfg.keys)]
        self.keys = keys
        self.clients: dict[str, SimClient] = {}
        for i in range(cfg.clients + cfg.keys):
            client = SimClient(
                i,
                loop=self.loop,
                rng=random.Random(root.getrandbits(64)),
                nodes=self.names,
                keys=keys,
                recorder=self.recorder,
                transport=self,
                encode=kv_wire.encode_command,
                values=values,
                config=client_config,
            )
            self.clients[f"c{i}"] = client
        self._by_session: dict[str, SimClient] = {}
        self._client_rtt_ns = 500_000
        """Client to node and back, one way, without a WAN (with one: `WanModel`)."""
        self._reply_ns = 0 if wan is not None else self._client_rtt_ns
        """The latency `answer_decided` adds (with a WAN each reply crossed it already)."""
        # Node -> its batched submit (`SimNetwork.local`), under the CPU model, if any.
        self._submit_many: dict[str, Callable[[tuple[ClientRequest, ...]], None]] = {}
        if setup.submit_batch is not None and self.network.cpu is not None:
            self._submit_many = {name: partial(node.submit_many, batch=setup.submit_batch)
                                 for name, node in self.nodes.items()}
        self.workload: SimWorkload | None = None
        if setup.workload is not None:  # the protocol's own clients (after every other draw)
            self.workload = setup.workload(WorkloadEnv(
                loop=self.loop, rng=random.Random(root.getrandbits(64)), trace=self.trace,
                nodes=self.nodes, submit=self._submit_later, clients=cfg.clients,
                keys=cfg.keys))

    # -- transport seams ---------------------------------------------------------------------

    def _watch(self, src: str, dst: str, message: Message) -> None:
        watch = self._watch_send
        if watch is not None:
            problem = watch(src, dst, message)
            if problem is not None:
                self.checker.record("vote-safety", self.loop.now, problem)

    def _deliver(self, src: str, dst: str, message: Message) -> None:
        self.nodes[dst].deliver(src, message)

    def submit(self, client: SimClient, node: str, request: ClientRequest) -> None:
        self._by_session[request.client_id] = client
        if self.replies is not None:  # BFT: the primary or every replica; f+1 replies
            self.replies.record(request)
            cores = [self.nodes[name].core for name in self.names]
            claims = [None if c is None else c.status().leader for c in cores]
            for name in self.replies.targets(request, claims):
                self._submit_later(name, request)
            return
        self._submit_later(node, request)

    def _submit_later(self, node: str, request: ClientRequest) -> None:
        target = self.nodes[node]
        self.loop.call_later(self._client_ns(request.client_id, node),
                             partial(self.network.local, node, partial(target.submit, request),
                                     request, self._submit_many.get(node)))

    def _client_ns(self, client_id: str, node: str) -> int:
        """One way between a client and a node."""
        wan = self.wan
        return self._client_rtt_ns if wan is None else wan.client_delay(client_id, node)

    def answer(self, node: str, client_id: str, request_no: int, result: bytes) -> None:
        if self.wan is not None:  # the reply crosses the WAN; the client counts it on arrival
            self.loop.call_later(self.wan.client_delay(client_id, node),
                                 partial(self._answer, node, client_id, request_no, result))
            return
        self._answer(node, client_id, request_no, result)

    def _answer(self, node: str, client_id: str, request_no: int, result: bytes) -> None:
        if self.workload is not None:
            self.workload.answer(node, client_id, request_no, result)
            return
        client = self._by_session.get(client_id)
        if client is None or client.session != client_id:
            return  # unknown, or a session the client abandoned (its request numbers restart)
        if self.replies is not None:
            accepted = self.replies.reply(node, client_id, request_no, result)
            if accepted is None:
                return
            result = accepted
        self.answer_decided(node, client, request_no, result)

    def answer_decided(self, node: str, client: SimClient, request_no: int,
                       result: bytes) -> None:
        """Hand `client` its accepted `result` (after the f+1 rule, under BFT)."""
        client_id = client.session
        try:
            decoded = kv_wire.decode_result(result)
        except DecodeError:
            self.trace(f"{node} answered {client_id}#{request_no} with an undecodable result")
            return
        self.loop.call_later(
            self._reply_ns, lambda: client.on_result(node, request_no, decoded)
        )

    def reject(self, node: str, request: ClientRequest, leader_hint: str | None) -> None:
        client = self._by_session.get(request.client_id)
        if client is None or self.replies is not None:  # BFT: one replica's word is no proof
            return
        self.loop.call_later(
            self._client_ns(request.client_id, node),
            lambda: client.on_rejected(node, request.request_no, leader_hint),
        )

    def abort(self, node: str, request: ClientRequest, reason: str) -> None:
        if self.wan is not None:  # the notice crosses the WAN first
            self.loop.call_later(self.wan.client_delay(request.client_id, node),
                                 partial(self._abort, node, request, reason))
            return
        self._abort(node, request, reason)

    def _abort(self, node: str, request: ClientRequest, reason: str) -> None:
        if self.workload is not None:
            self.workload.abort(node, request.client_id, request.request_no)
            return
        client = self._by_session.get(request.client_id)
        if client is None or client.session != request.client_id:
            return
        if self.replies is not None:  # BFT: f+1 matching aborts, counted like results
            accepted = self.replies.reply(node, request.client_id, request.request_no,
                                          _ABORTED)
            if accepted is None:
                return
            if accepted != _ABORTED:  # a corrupting replica's copy: read like any result
                self.answer_decided(node, client, request.request_no, accepted)
                return
        self.loop.call_later(
            self._reply_ns, lambda: client.on_aborted(node, request.request_no, reason))

    # -- state ------------------------------------------------------------------------------

    def leader(self) -> str | None:
        best: tuple[int, str] | None = None
        for name in self.names:
            core = self.nodes[name].core
            if core is None:
                continue
            st = core.status()
            if st.role == self.checker.leader_role and (best is None or st.term > best[0]):
                best = (st.term, name)
        return None if best is None else best[1]

    def check_logs(self) -> None:
        logs = {n: self.nodes[n].log for n in self.names}
        self.checker.check_log_matching(logs, self.loop.now)
        if self.membership is not None:  # a majority of the voters in force, not of all
            logs = {n: logs[n] for n in sim_membership.durable_voters(self.checker.applied,
                                                                       self.voters)}
        self.checker.check_committed_durable(
            logs, self.loop.now,
            recovering=frozenset(n for n in self.names if self.nodes[n].recovering))


GC_THRESHOLD0 = 10_000
"""The young-generation collection threshold during a run (see the module docstring)."""


def run(cfg: RunConfig) -> RunResult:
    """Run one seeded simulation and check it (see the module docstring)."""
    thresholds = gc.get_threshold()
    if 0 < thresholds[0] < GC_THRESHOLD0:  # (0: automatic collection is off; keep it so)
        gc.set_threshold(GC_THRESHOLD0, *thresholds[1:])
    try:
        return _run(cfg)
    finally:
        gc.set_threshold(*thresholds)


def _run(cfg: RunConfig) -> RunResult:
    wall0 = time.perf_counter()
    c = _Cluster(cfg)
    loop = c.loop
    schedule = cfg.schedule if cfg.schedule is not None else nemesis.generate_schedule(
        c.sched_rng, nodes=c.names, faults=c.faults, duration_ns=cfg.time_ns
    )
    if c.membership is not None and cfg.schedule is None:
        schedule = sim_membership.with_changes(schedule, cfg.seed, c.names[cfg.nodes:],
                                              cfg.time_ns)
    schedule = with_scenario(cfg.scenario, schedule, seed=cfg.seed, voters=c.voters,
                             time_ns=cfg.time_ns)
    for event in schedule:
        loop.call_at(event.at_ns, lambda e=event: c.nemesis.apply_fault(e))  # type: ignore[misc]
    c.nemesis.boot_buggify()
    for name in c.names:
        c.nodes[name].start()
    if c.fabric is not None:
        c.fabric.start()
    workload = c.workload  # (when set, it replaces the register clients and final reads)
    workers = [c.clients[f"c{i}"] for i in range(cfg.clients)] if workload is None else []
    final_readers = ([c.clients[f"c{cfg.clients + k}"] for k in range(cfg.keys)]
                     if workload is None else [])
    if workload is not None:
        loop.call_at(20 * _MS, workload.start)
    for client in workers:
        loop.call_at(20 * _MS, client.start)
    net_stats = c.network.stats
    max_events, max_bytes = cfg.budgets()
    loop.event_budget = max_events
    c.network.byte_budget = max_bytes

    def runaway() -> bool:
        return loop.events_run > max_events or net_stats.bytes_sent > max_bytes

    t = 0
    while t < cfg.time_ns and not runaway():
        t = min(cfg.time_ns, t + cfg.check_every_ns)
        loop.run_until(t)
        c.check_logs()
    c.nemesis.heal_all()
    end = cfg.time_ns + cfg.liveness_ns
    for client in workers:
        client.enter_liveness(end)
    half = cfg.time_ns + cfg.liveness_ns // 2
    loop.run_until(half)
    for client in workers:
        client.stop()
    if workload is not None:
        workload.stop(end)
    for k, reader in enumerate(final_readers):
        reader.enter_liveness(end)
        reader.issue("read", c.keys[k])
    while loop.now < end and not runaway():
        loop.run_until(min(end, loop.now + cfg.check_every_ns))
        c.check_logs()
    violations = [str(v) for v in c.checker.violations]
    if runaway():
        violations.append(net_stats.runaway(events=loop.events_run, max_events=max_events,
                                            max_bytes=max_bytes, now_ns=loop.now))
    for client in workers + final_readers:
        violations += [f"liveness: {s}" for s in client.stuck()]
    for reader in final_readers:
        if reader.ok < 1:
            violations.append(f"liveness: final read by {reader.session} did not succeed")
    history = c.recorder.history()
    lin = check_linearizable(history, time_limit=None, step_limit=cfg.lin_step_limit)
    if workload is not None:
        violations += workload.check()
    if lin.valid is False:
        violations.append(
            f"linearizability: history not linearizable on keys {list(lin.failing_keys)}: "
            + "; ".join(str(r.to_json())[:400] for r in lin.keys if r.valid is False)
        )
    ops_ok = sum(cl.ok for cl in workers) + (workload.ok if workload is not None else 0)
    return RunResult(
        config=cfg,
        violations=violations,
        trace_hash=c.trace.hexdigest(),
        trace_tail=c.trace.tail(),
        trace_lines=c.trace.lines,
        history=history.ops,
        linearizable=lin.valid,
        ops_ok=ops_ok,
        ops_info=sum(cl.infos for cl in workers) + (workload.infos if workload else 0),
        deliveries=c.network.stats.delivered,
        events=loop.events_run,
        wall_s=time.perf_counter() - wall0,
        schedule=schedule,
        stats={
            "crashes": sum(n.stats.crashes for n in c.nodes.values()),
            "elections": len(c.checker.leaders),
            "applied_max": max(c.checker.applied, default=0),
            "dropped_loss": c.network.stats.dropped_loss,
            "dropped_wan": c.wan.dropped if c.wan is not None else 0,
            "dropped_partition": c.network.stats.dropped_partition,
            "straggled": c.network.stats.straggled,
            "messages_sent": net_stats.sent,
            "bytes_sent": net_stats.bytes_sent,
            "max_node_sent": max(net_stats.sent_by.values(), default=0),
            **({} if c.network.cpu is None else c.network.cpu.stats()),
            **{f"bytes:{cls.__name__}": b for cls, b in net_stats.bytes_by_class.items()},
            **{f"gossip:{k}": v for k, v in sorted(
                (c.fabric.counters if c.fabric is not None else {}).items())},
        },
        commit_latencies_ns=workload.commit_latencies_ns() if workload is not None else (),
        commit_times_ns=workload.commit_times_ns() if workload is not None else (),
        faults_used=c.faults,
        knobs=c.knobs,
    )
