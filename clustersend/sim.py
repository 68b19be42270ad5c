"""A deterministic multi-cluster simulator for cluster-sending, and its checker.

Owns: `ClusterSpec`, `WorldConfig`, `World` (its own small event loop over
`ClusterSendMachine`s), `Ordering` (the hook a receiving cluster's consensus plugs into) and
`ModelOrdering` (each cluster's ordering, modelled), `check` (the
checker), `random_world` (the sweep's seeded worlds) and `main` (replay one seed:
``python -m phalanx.clustersend.sim --seed N [--bug NAME]``).

Model: clusters of their own n, f and fault model (`CertKind`); members crashed from the
start, or Byzantine with a scripted behaviour (`phalanx.clustersend.byzantine`); one-way
latencies uniform in `intra_latency` inside a cluster and `inter_latency` between clusters;
each message lost with probability `intra_loss` or `loss`. Each link (src, dst) carries
`sends` values; the sending cluster's ordering "commits" value k at tick 1 + k*`send_every`:
the simulator builds its certificate from honest members' signatures (`certify`) and gives
`Outbound` to every live member. The receiving cluster's consensus is MODELLED by
`ModelOrdering`: it orders the first proposal of each (sending cluster, seq) exactly once,
in seq order per sending cluster (a real core would take `Inbound` as a command and apply it
once; the hook is `ModelOrdering.propose`). Time t: messages due at t are delivered (heap
order (time, seq)), then the ordering commits due values, then every live node ticks, in
sorted id order.

Checker (`check`): every honest live member of a receiving cluster delivered exactly the
agreed values, each once, in seq order; every honest live member of a sending cluster
confirmed each of them once; each cluster's ordering holds exactly the agreed values once
each, in order; so nothing uncertified is accepted and nothing is lost or duplicated.

Determinism: one `random.Random(seed)` for the network, one per Byzantine node derived from
the seed and the node id; dicts in insertion order; no set iteration decides anything.
"""

from __future__ import annotations

import argparse
import heapq
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from phalanx.clustersend.byzantine import BEHAVIOURS, Byzantine
from phalanx.clustersend.certificates import ClusterInfo, certify
from phalanx.clustersend.machine import (
    ClusterSendConfig,
    ClusterSendMachine,
    ClusterSendReady,
    Outbound,
    SendCrypto,
)
from phalanx.clustersend.messages import (
    CertKind,
    CsConfirm,
    CsSend,
    Inbound,
    SendStatement,
    value_digest,
)
from phalanx.clustersend.pairs import Mode
from phalanx.consensus.core import Receive, Send, Tick
from phalanx.consensus.crypto import FastCrypto
from phalanx.consensus.types import Message, NodeId


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSpec:
    """One cluster: `crashed` member indices are down from the start; `byzantine` maps member
    indices to a behaviour of `byzantine.BEHAVIOURS`."""

    name: str
    n: int
    f: int
    kind: CertKind = CertKind.BYZANTINE
    crashed: tuple[int, ...] = ()
    byzantine: tuple[tuple[int, str], ...] = ()

    def members(self) -> tuple[NodeId, ...]:
        return tuple(NodeId(f"{self.name}/n{i}") for i in range(self.n))


@dataclass(frozen=True, slots=True, kw_only=True)
class WorldConfig:
    clusters: tuple[ClusterSpec, ...]
    links: tuple[tuple[str, str], ...]
    sends: int = 1
    send_every: int = 0
    seed: int = 0
    intra_latency: tuple[int, int] = (1, 1)
    inter_latency: tuple[int, int] = (10, 10)
    loss: float = 0.0
    intra_loss: float = 0.0
    machine: ClusterSendConfig = field(default_factory=ClusterSendConfig)
    limit: int = 20_000


@dataclass(slots=True)
class SendStats:
    """Per sent value (link, seq): when it was agreed and first confirmed, the attempt the
    first confirmation came in, and inter-cluster messages attributed to it."""

    agreed_at: int
    confirmed_at: int | None = None
    steps: int | None = None
    inter_messages: int = 0


class Ordering(Protocol):
    """A receiving cluster's ordering, as the simulator uses it: members `propose` the
    `Inbound`s their machines deliver; `log` is what the cluster ordered. A real core plugs
    in here (propose = submit `Inbound` as a command; log = its applied `Inbound`s, which
    its apply step verifies and deduplicates by (sending cluster, seq))."""

    log: list[Inbound]

    def propose(self, inbound: Inbound) -> None: ...


class ModelOrdering:
    """A cluster's ordering, modelled: orders the first proposal of each (sending cluster, seq)
    once, in seq order per sending cluster (a proposal ahead of the next seq waits)."""

    def __init__(self) -> None:
        self.log: list[Inbound] = []
        self._next: dict[str, int] = {}
        self._waiting: dict[tuple[str, int], Inbound] = {}

    def propose(self, inbound: Inbound) -> None:
        key = (inbound.src_cluster, inbound.seq)
        if inbound.seq < self._next.get(inbound.src_cluster, 0) or key in self._waiting:
            return
        self._waiting[key] = inbound
        seq = self._next.get(inbound.src_cluster, 0)
        while (item := self._waiting.pop((inbound.src_cluster, seq), None)) is not None:
            self.log.append(item)
            seq += 1
        self._next[inbound.src_cluster] = seq


class World:
    """Run with `run()`; inspect `delivered`, `confirmed`, `orderings`, `stats`; `check(world)`."""

    def __init__(self, config: WorldConfig,
                 make_ordering: Callable[[str], Ordering] | None = None,
                 crypto: Mapping[NodeId, SendCrypto] | None = None) -> None:
        self.config = cfg = config
        self.now = 0
        self._rng = random.Random(cfg.seed)
        self.infos: dict[str, ClusterInfo] = {
            c.name: ClusterInfo(cluster_id=c.name, members=c.members(), f=c.f, kind=c.kind,
                                epoch=cfg.seed % 1_000_003)
            for c in cfg.clusters}
        self.cluster_of: dict[NodeId, str] = {m: c for c, i in self.infos.items()
                                              for m in i.members}
        # FastCrypto unless given (e.g. `phalanx.net.crypto.ed25519_cluster`, every node's).
        self.crypto: Mapping[NodeId, SendCrypto] = crypto or {
            m: FastCrypto(m) for m in self.cluster_of}
        self.down: set[NodeId] = set()
        self.byzantine: dict[NodeId, Byzantine] = {}
        for spec in cfg.clusters:
            members = spec.members()
            self.down.update(members[i] for i in spec.crashed)
            for i, behaviour in spec.byzantine:
                node = members[i]
                self.byzantine[node] = Byzantine(
                    node, behaviour, self.infos[spec.name], self.infos,
                    self.crypto[node], random.Random(f"{cfg.seed}/{node}"))
        self.live = tuple(sorted(m for m in self.cluster_of if m not in self.down))
        self.honest = tuple(m for m in self.live if m not in self.byzantine)
        self.machines = {m: ClusterSendMachine(m, self.cluster_of[m], self.infos,
                                               crypto=self.crypto[m], config=cfg.machine)
                         for m in self.live}
        make = make_ordering or (lambda cluster: ModelOrdering())
        self.orderings: dict[str, Ordering] = {c: make(c) for c in self.infos}
        self.agreed: dict[tuple[str, str], list[bytes]] = {link: [] for link in cfg.links}
        self.delivered: dict[NodeId, list[Inbound]] = {m: [] for m in self.honest}
        self.confirmed: dict[NodeId, list[tuple[str, int]]] = {m: [] for m in self.honest}
        self.stats: dict[tuple[str, str, int], SendStats] = {}
        self.counters: dict[str, int] = {}
        self.lost = 0
        # ("in" delivered from / "out" confirmed to, node, other cluster): done so far
        self._counts: dict[tuple[str, NodeId, str], int] = {}
        self._heap: list[tuple[int, int, NodeId, NodeId, Message]] = []
        self._seq = 0

    # -- the sending clusters' ordering ------------------------------------------------------

    def _agree(self) -> None:
        cfg = self.config
        for src, dst in cfg.links:
            values = self.agreed[(src, dst)]
            k = len(values)
            if k >= cfg.sends or self.now < 1 + k * cfg.send_every:
                continue
            value = f"{src}->{dst}#{k}@{cfg.seed}".encode()
            values.append(value)
            info = self.infos[src]
            st = SendStatement(src_cluster=src, dst_cluster=dst, epoch=info.epoch, seq=k,
                               digest=value_digest(value))
            signers = [self.crypto[m] for m in info.members if m in self.honest]
            cert = certify(info, st, signers, term=1, leader=signers[0])
            self.stats[(src, dst, k)] = SendStats(agreed_at=self.now)
            for m in info.members:
                if m in self.machines:
                    self._handle(m, self.machines[m].step(Outbound(value=value,
                                                                   certificate=cert)))

    # -- the network -------------------------------------------------------------------------

    def _handle(self, node: NodeId, ready: ClusterSendReady) -> None:
        sends = ready.sends
        byz = self.byzantine.get(node)
        if byz is None:
            for name, by in ready.counters:
                self.counters[name] = self.counters.get(name, 0) + by
            counts = self._counts
            for inbound in ready.deliver:
                self.delivered[node].append(inbound)
                key = ("in", node, inbound.src_cluster)
                counts[key] = counts.get(key, 0) + 1
                self.orderings[self.cluster_of[node]].propose(inbound)
            for c in ready.confirmed:
                self.confirmed[node].append((c.dst_cluster, c.seq))
                key = ("out", node, c.dst_cluster)
                counts[key] = counts.get(key, 0) + 1
                st = self.stats[(self.cluster_of[node], c.dst_cluster, c.seq)]
                if st.confirmed_at is None:
                    st.confirmed_at = self.now
                    attempt = self.machines[node].attempt_of(c.dst_cluster, c.seq)
                    st.steps = None if attempt is None else attempt + 1
            self._transmit(node, sends)
        else:
            self._transmit(node, byz.outgoing(sends))

    def _transmit(self, node: NodeId, sends: Iterable[Send]) -> None:
        cfg = self.config
        src_cluster = self.cluster_of[node]
        for send in sends:
            msg = send.message
            inter = self.cluster_of.get(send.to) != src_cluster
            if inter:
                self._count_inter(msg)
            if self._rng.random() < (cfg.loss if inter else cfg.intra_loss):
                self.lost += 1
                continue
            lo, hi = cfg.inter_latency if inter else cfg.intra_latency
            delay = lo if lo == hi else self._rng.randint(lo, hi)
            self._seq += 1
            heapq.heappush(self._heap, (self.now + delay, self._seq, send.to, node, msg))

    def _count_inter(self, msg: Message) -> None:
        if isinstance(msg, CsSend):
            st = msg.certificate.statement
            key = (st.src_cluster, st.dst_cluster, st.seq)
        elif isinstance(msg, CsConfirm):
            ps = msg.proof.statement
            key = (ps.src_cluster, ps.dst_cluster, ps.seq)
        else:
            return
        stats = self.stats.get(key)
        if stats is not None:
            stats.inter_messages += 1

    def step_tick(self) -> None:
        self.now += 1
        heap = self._heap
        while heap and heap[0][0] <= self.now:
            _, _, dst, src, msg = heapq.heappop(heap)
            machine = self.machines.get(dst)
            if machine is None:
                continue
            byz = self.byzantine.get(dst)
            if byz is not None:
                self._transmit(dst, byz.incoming(msg))
            self._handle(dst, machine.step(Receive(src=src, message=msg)))
        self._agree()
        tick = Tick()
        for node in self.live:
            self._handle(node, self.machines[node].step(tick))
            byz = self.byzantine.get(node)
            if byz is not None:
                self._transmit(node, byz.tick())

    # -- running -----------------------------------------------------------------------------

    def done(self) -> bool:
        cfg = self.config
        for (src, dst), values in self.agreed.items():
            if len(values) < cfg.sends:
                return False
            for m in self.infos[dst].members:
                if m in self.delivered and self._counts.get(("in", m, src), 0) < cfg.sends:
                    return False
            for m in self.infos[src].members:
                if m in self.confirmed and self._counts.get(("out", m, dst), 0) < cfg.sends:
                    return False
        return True

    def run(self, until: Callable[[World], bool] | None = None) -> bool:
        """Tick until every send is delivered and confirmed everywhere (or `until`), or the
        limit; whether that happened."""
        stop = until or World.done
        while self.now < self.config.limit:
            self.step_tick()
            if stop(self):
                return True
        return False


def check(world: World) -> list[str]:
    """Violations of cluster-sending's guarantees in `world` (empty: none)."""
    bad: list[str] = []
    for (src, dst), values in world.agreed.items():
        want = [(k, v) for k, v in enumerate(values)]
        for m in world.infos[dst].members:
            if m not in world.delivered:
                continue
            got = [(i.seq, i.value) for i in world.delivered[m] if i.src_cluster == src]
            if got != want:
                forged = [s for s, v in got if s >= len(values) or values[s] != v]
                what = f"accepted values {src} never agreed to (seqs {forged})" if forged \
                    else f"delivered seqs {[s for s, _ in got]}, want 0..{len(values) - 1}"
                bad.append(f"{m}: {what}")
        for m in world.infos[src].members:
            if m not in world.confirmed:
                continue
            got_c = sorted(s for d, s in world.confirmed[m] if d == dst)
            if got_c != list(range(len(values))):
                bad.append(f"{m}: confirmed {src}->{dst} seqs {got_c}, want 0..{len(values) - 1}")
        log = [(i.seq, i.value) for i in world.orderings[dst].log if i.src_cluster == src]
        if log != want:
            bad.append(f"ordering of {dst}: {src}'s values {[s for s, _ in log]} do not match "
                       f"the {len(values)} agreed, once each, in order")
    if len(bad) > 12:
        bad = [*bad[:12], f"... and {len(bad) - 12} more"]
    return bad


def random_world(seed: int, bugs: frozenset[str] = frozenset()) -> WorldConfig:
    """The sweep's world for `seed`: 2-3 clusters (Byzantine n=3f+1 or crash n=2f+1, f in
    1..2) with up to f faulty members each (crashed, or Byzantine of a random behaviour in
    Byzantine clusters), 1-3 links of 2-5 values, random latencies, loss and mode."""
    rng = random.Random(seed)
    specs = []
    for c in range(rng.choice((2, 2, 3))):
        kind = CertKind.CRASH if rng.random() < 0.3 else CertKind.BYZANTINE
        f = rng.choice((1, 1, 2))
        n = 2 * f + 1 if kind == CertKind.CRASH else 3 * f + 1
        faulty = rng.sample(range(n), rng.randint(0, f))
        crashed, byz = [], []
        for i in faulty:
            if kind == CertKind.BYZANTINE and rng.random() < 0.7:
                byz.append((i, rng.choice(BEHAVIOURS)))
            else:
                crashed.append(i)
        specs.append(ClusterSpec(name="ABC"[c], n=n, f=f, kind=kind, crashed=tuple(crashed),
                                 byzantine=tuple(byz)))
    names = [s.name for s in specs]
    pairs = [(a, b) for a in names for b in names if a != b]
    links = tuple(rng.sample(pairs, rng.randint(1, min(3, len(pairs)))))
    inter_lo = rng.randint(3, 10)
    inter = (inter_lo, inter_lo + rng.choice((0, 0, 5)))
    intra = (1, rng.choice((1, 2)))
    loss = rng.choice((0.0, 0.0, 0.1, 0.3))
    machine = ClusterSendConfig(mode=rng.choice(tuple(Mode)),
                                attempt_timeout=2 * inter[1] + 4 * intra[1] + 2, bugs=bugs)
    return WorldConfig(clusters=tuple(specs), links=links, sends=rng.randint(2, 5),
                       send_every=rng.choice((0, 1, 5)), seed=seed, intra_latency=intra,
                       inter_latency=inter, loss=loss, intra_loss=loss / 3, machine=machine,
                       limit=6_000)


def run_seed(seed: int, bugs: frozenset[str] = frozenset()) -> tuple[World, list[str]]:
    """Run `random_world(seed, bugs)`; the world and its violations (a run that hits its tick
    limit before everything is delivered and confirmed shows up as violations)."""
    world = World(random_world(seed, bugs))
    world.run()
    return world, check(world)


def replay_command(seed: int, bugs: frozenset[str] = frozenset()) -> str:
    flags = "".join(f" --bug {b}" for b in sorted(bugs))
    return f"python -m phalanx.clustersend.sim --seed {seed}{flags}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m phalanx.clustersend.sim",
        description="Replay one seeded cluster-sending world of the sweep and check it.")
    parser.add_argument("--seed", type=int, required=True, help="the world's seed")
    parser.add_argument("--bug", action="append", default=[],
                        help="a deliberate bug switch (accept_uncertified, never_retry)")
    args = parser.parse_args(argv)
    try:
        world, bad = run_seed(args.seed, frozenset(args.bug))
    except ValueError as e:  # an unknown bug name
        parser.error(str(e))
    cfg = world.config
    print(f"seed {args.seed}: clusters "
          + ", ".join(f"{c.name}(n={c.n} f={c.f} {c.kind.name.lower()} crashed={list(c.crashed)}"
                      f" byzantine={list(c.byzantine)})" for c in cfg.clusters)
          + f"; links {list(cfg.links)} x{cfg.sends}; mode {cfg.machine.mode}; loss {cfg.loss}")
    print(f"ran {world.now} ticks; dropped: "
          + ", ".join(f"{k[8:]}={v}" for k, v in sorted(world.counters.items())
                      if k.startswith("dropped:")))
    for line in bad:
        print("VIOLATION", line)
    print("OK" if not bad else f"{len(bad)} violation(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
