"""SWIM failure detection with Lifeguard suspicion: who is alive, suspect or dead.

Owns: `SwimConfig`, `MembershipChange` (an output event) and `Membership` (one node's view
of the fixed member universe, its probe schedule, its suspicion timers and its queue of
updates to piggy-back). Ref: Das, Gupta, Motivala, SWIM (DSN 2002); Dadgar et al.,
Lifeguard (arXiv 1707.00788); hashicorp/memberlist state.go and suspicion.go
(protocols.md §3.4). Written from the papers and notes, not translated.

Protocol, in ticks:
- Every `probe_interval` ticks probe the next member of a shuffled round-robin of the
  members not known dead: `Ping`. No `PingAck` within `probe_timeout` ticks: ask
  `indirect_checks` random other members to probe it (`PingReq`; they relay the ack).
  Still nothing when the interval ends: suspect it and gossip `suspect`.
- A suspicion becomes dead after a timeout that starts at `max` and shrinks towards `min`
  as independent suspicions of the same incarnation arrive (Lifeguard: log(c+1)/log(k+1)
  of the way for c confirmations, k = suspicion_mult - 2), min = suspicion_mult *
  max(1, log10 n) * probe_interval, max = suspicion_max_mult * min.
- A node that hears itself suspected or declared dead at its incarnation refutes: it bumps
  its incarnation and gossips `alive`. A restarted node starts with a higher incarnation.
- Updates ride on every outgoing message (`piggyback`), at most
  retransmit_mult * ceil(log10(n+1)) times each, fewest transmissions first; the update
  about a suspected probe target rides first on its ping (Lifeguard's buddy system).

Precedence (memberlist): alive(i) overrides a view of incarnation < i; suspect(i) overrides
alive(j <= i); dead(i) overrides alive or suspect (j <= i); dead is final for that
incarnation. Updates about unknown nodes are dropped and counted.

Invariants: deterministic given the injected `random.Random`; iteration over sorted member
ids; never raises on peer input.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from phalanx.consensus.crypto import Signer, Verifier
from phalanx.consensus.types import Message, NodeId
from phalanx.gossip.messages import MemberStatus, MemberUpdate, Ping, PingAck, PingReq
from phalanx.gossip.permutation import Permutation


@dataclass(frozen=True, slots=True, kw_only=True)
class SwimConfig:
    """SWIM/Lifeguard knobs, in ticks (memberlist's LAN profile scaled to ticks of ~RTT/2).

    The indirect path (PingReq, Ping, PingAck, relayed PingAck: 4 one-way hops) must fit
    between `probe_timeout` and the end of the `probe_interval`, or every lost direct ping
    becomes a suspicion. `suspicion_mult`/`suspicion_max_mult` set Lifeguard's min and max
    suspicion timeouts; `retransmit_mult` how often each update is piggy-backed;
    `max_piggyback` how many updates ride one message."""

    probe_interval: int = 8
    probe_timeout: int = 3
    indirect_checks: int = 3
    suspicion_mult: int = 4
    suspicion_max_mult: int = 6
    retransmit_mult: int = 4
    max_piggyback: int = 8

    def __post_init__(self) -> None:
        if not 0 < self.probe_timeout < self.probe_interval:
            raise ValueError("need 0 < probe_timeout < probe_interval")


@dataclass(frozen=True, slots=True, kw_only=True)
class MembershipChange:
    """This node's view of `node` changed to `status` at `incarnation` (an output)."""

    node: NodeId
    status: MemberStatus
    incarnation: int


@dataclass(slots=True)
class _Member:
    status: MemberStatus = MemberStatus.ALIVE
    incarnation: int = 0
    suspected_at: int = 0
    confirmations: set[NodeId] = field(default_factory=set)
    proof: MemberUpdate | None = None  # the signed alive behind `incarnation` (state sync)


@dataclass(slots=True)
class _Queued:
    update: MemberUpdate
    transmits: int = 0


@dataclass(slots=True)
class _Probe:
    seq: int
    target: NodeId
    sent_at: int
    indirect: bool = False
    acked: bool = False


Sender = Callable[[NodeId, Message], None]


class AliveCrypto(Signer, Verifier, Protocol):
    """Signs this node's alive updates and verifies the others' (the machine's crypto)."""


MAX_INCARNATION = 2**62
"""Updates at or above it are dropped: SWIM trusts members, and a Byzantine one could
otherwise push a refuting node's incarnation past the codec's integer range."""


class Membership:
    """One node's SWIM state. `send` queues an outgoing message (the machine adds it to its
    `Ready`); `count` bumps a named counter."""

    def __init__(self, node_id: NodeId, members: Sequence[NodeId], *, incarnation: int,
                 rng: random.Random, config: SwimConfig, send: Sender,
                 count: Callable[[str], None], crypto: AliveCrypto) -> None:
        self.node_id = node_id
        self._crypto = crypto
        self._alive: MemberUpdate | None = None  # our signed alive at `incarnation`
        self.incarnation = incarnation
        self.config = config
        self._rng = rng
        self._send = send
        self._count = count
        self._ids = tuple(m for m in sorted(members) if m != node_id)
        self._known = frozenset(self._ids)
        # Invariant: a member absent from `_members` is ALIVE at incarnation 0 (how every
        # node starts); entries are created on first change, so the table stays small.
        self._members: dict[NodeId, _Member] = {}
        self._suspects: dict[NodeId, None] = {}  # insertion-ordered set
        self._dead = 0
        n = len(self._ids) + 1
        self._retransmits = config.retransmit_mult * max(1, math.ceil(math.log10(n + 1)))
        base = config.suspicion_mult * max(1.0, math.log10(n)) * config.probe_interval
        self._suspicion_min = math.ceil(base)
        self._suspicion_max = config.suspicion_max_mult * self._suspicion_min
        k = config.suspicion_mult - 2
        self._suspicion_k = 0 if n - 2 < k else k
        self._queue: dict[NodeId, _Queued] = {}  # the newest update about each node
        self._order: Permutation | None = None  # this pass of the probe round-robin
        self._order_pos = 0
        self._probe: _Probe | None = None
        self._relays: dict[int, tuple[NodeId, int, NodeId, int]] = {}  # seq -> src, their seq
        self._seq = 0
        self._next_probe = rng.randrange(config.probe_interval)  # nodes probe out of phase
        self.changes: list[MembershipChange] = []
        self._enqueue(self._my_alive())

    def _my_alive(self) -> MemberUpdate:
        """Our alive update at our incarnation, signed (once per incarnation)."""
        if self._alive is None or self._alive.incarnation != self.incarnation:
            unsigned = MemberUpdate(node=self.node_id, status=MemberStatus.ALIVE,
                                    incarnation=self.incarnation, source=self.node_id)
            self._alive = replace(unsigned, signature=self._crypto.sign(unsigned))
        return self._alive

    # -- views -------------------------------------------------------------------------------

    def _member(self, node: NodeId) -> _Member:
        member = self._members.get(node)
        if member is None:
            member = self._members[node] = _Member()
        return member

    def status_of(self, node: NodeId) -> MemberStatus:
        if node == self.node_id:
            return MemberStatus.ALIVE
        member = self._members.get(node)
        return MemberStatus.ALIVE if member is None else member.status

    def view(self) -> dict[NodeId, tuple[MemberStatus, int]]:
        default = (MemberStatus.ALIVE, 0)
        return {m: default if (s := self._members.get(m)) is None else (s.status, s.incarnation)
                for m in self._ids}

    def live_peers(self) -> list[NodeId]:
        """Members not known dead, sorted (suspects included: they may refute)."""
        return [m for m in self._ids if self.status_of(m) != MemberStatus.DEAD]

    def random_live(self, k: int, exclude: NodeId | None = None) -> list[NodeId]:
        """Up to `k` distinct random members not known dead (nor `exclude`)."""
        if self._dead * 2 > len(self._ids):  # mostly dead: filter, then sample
            pool = [m for m in self.live_peers() if m != exclude]
            return self._rng.sample(pool, min(k, len(pool)))
        picked: list[NodeId] = []
        limit = len(self._ids) - self._dead - (exclude is not None)
        while len(picked) < min(k, limit):
            m = self._ids[self._rng.randrange(len(self._ids))]
            if m != exclude and m not in picked and self.status_of(m) != MemberStatus.DEAD:
                picked.append(m)
        return picked

    def table(self) -> tuple[MemberUpdate, ...]:
        """The view, self included, for push-pull state sync: every member not in the
        initial state (ALIVE at incarnation 0), which every node assumes for the others."""
        rest = tuple(
            s.proof if s.status == MemberStatus.ALIVE and s.proof is not None else
            MemberUpdate(node=m, status=s.status, incarnation=s.incarnation,
                         source=self.node_id)
            for m, s in sorted(self._members.items())
            if s.status != MemberStatus.ALIVE or s.incarnation
        )
        return (self._my_alive(), *rest)

    # -- piggy-backing -----------------------------------------------------------------------

    def _enqueue(self, update: MemberUpdate) -> None:
        self._queue[update.node] = _Queued(update)

    def piggyback(self, first: NodeId | None = None) -> tuple[MemberUpdate, ...]:
        """Up to `max_piggyback` queued updates (the one about `first` before the others)."""
        if not self._queue:
            return ()
        ranked = sorted(self._queue.items(),
                        key=lambda kv: (kv[0] != first, kv[1].transmits, kv[0]))
        out = []
        for node, entry in ranked[: self.config.max_piggyback]:
            out.append(entry.update)
            entry.transmits += 1
            if entry.transmits >= self._retransmits:
                del self._queue[node]
        return tuple(out)

    def pending_updates(self) -> int:
        return len(self._queue)

    # -- applying updates --------------------------------------------------------------------

    def apply(self, updates: tuple[MemberUpdate, ...], now: int) -> None:
        for update in updates:
            self._apply_one(update, now)

    def _refute(self, incarnation: int) -> None:
        self.incarnation = max(self.incarnation, incarnation) + 1
        self._count("refutations")
        self._enqueue(self._my_alive())

    def _apply_one(self, u: MemberUpdate, now: int) -> None:
        if u.incarnation >= MAX_INCARNATION:  # refuting it would overflow the wire's ints
            self._count("dropped:bad_incarnation")
            return
        if u.status == MemberStatus.ALIVE and u.incarnation > 0 and \
                not self._crypto.verify(u.node, u, u.signature):
            self._count("dropped:bad_alive_signature")
            return
        if u.node == self.node_id:
            if u.status != MemberStatus.ALIVE and u.incarnation >= self.incarnation:
                self._refute(u.incarnation)
            elif u.status == MemberStatus.ALIVE and u.incarnation > self.incarnation:
                self._refute(u.incarnation)  # our own newer alive, from before a restart
            return
        if u.node not in self._known:
            self._count("dropped:unknown_member")
            return
        member = self._member(u.node)
        if u.status == MemberStatus.ALIVE:
            if u.incarnation > member.incarnation:
                self._set(u.node, member, MemberStatus.ALIVE, u.incarnation)
                member.proof = u
                self._enqueue(u)
        elif u.status == MemberStatus.SUSPECT:
            if u.incarnation < member.incarnation or member.status == MemberStatus.DEAD:
                return
            if member.status == MemberStatus.SUSPECT and u.incarnation == member.incarnation:
                if u.source not in member.confirmations:
                    member.confirmations.add(u.source)
                    self._enqueue(u)
                return
            self._suspect(u.node, member, u.incarnation, u.source, now)
        else:
            if u.incarnation < member.incarnation or (
                member.status == MemberStatus.DEAD and u.incarnation == member.incarnation
            ):
                return
            self._set(u.node, member, MemberStatus.DEAD, u.incarnation)
            self._enqueue(u)

    def _set(self, node: NodeId, member: _Member, status: MemberStatus, inc: int) -> None:
        changed = member.status != status or member.incarnation != inc
        self._dead += (status == MemberStatus.DEAD) - (member.status == MemberStatus.DEAD)
        if status == MemberStatus.SUSPECT:
            self._suspects[node] = None
        else:
            self._suspects.pop(node, None)
        member.status, member.incarnation = status, inc
        if status != MemberStatus.SUSPECT:
            member.confirmations.clear()
        if changed:
            self.changes.append(MembershipChange(node=node, status=status, incarnation=inc))
            if status == MemberStatus.DEAD:
                self._count("declared_dead")

    def _suspect(self, node: NodeId, member: _Member, inc: int, source: NodeId,
                 now: int) -> None:
        self._set(node, member, MemberStatus.SUSPECT, inc)
        member.suspected_at = now
        member.confirmations = {source}
        self._count("suspect_raised" if source == self.node_id else "suspect_heard")
        self._enqueue(MemberUpdate(node=node, status=MemberStatus.SUSPECT, incarnation=inc,
                                   source=source))

    def suspicion_timeout(self, confirmations: int) -> int:
        """Lifeguard's timeout after `confirmations` independent suspicions besides the first."""
        lo, hi, k = self._suspicion_min, self._suspicion_max, self._suspicion_k
        if k < 1:
            return lo
        frac = math.log(confirmations + 1) / math.log(k + 1)
        return max(lo, math.floor(hi - frac * (hi - lo)))

    # -- probing -----------------------------------------------------------------------------

    def tick(self, now: int) -> None:
        """Advance timers: indirect probes, the end of a probe interval, suspicion expiry."""
        probe = self._probe
        if probe is not None and not probe.acked and not probe.indirect \
                and now - probe.sent_at >= self.config.probe_timeout:
            probe.indirect = True
            for helper in self.random_live(self.config.indirect_checks, probe.target):
                self._send(helper, PingReq(seq=probe.seq, target=probe.target,
                                           updates=self.piggyback(probe.target)))
        if now >= self._next_probe:
            if probe is not None and not probe.acked:
                member = self._member(probe.target)
                if member.status == MemberStatus.ALIVE:
                    self._suspect(probe.target, member, member.incarnation, self.node_id, now)
            self._probe = None
            self._start_probe(now)
            self._next_probe = now + self.config.probe_interval
        for node in list(self._suspects):
            member = self._members[node]
            if now - member.suspected_at >= self.suspicion_timeout(len(member.confirmations) - 1):
                self._set(node, member, MemberStatus.DEAD, member.incarnation)
                self._enqueue(MemberUpdate(node=node, status=MemberStatus.DEAD,
                                           incarnation=member.incarnation,
                                           source=self.node_id))
        for seq in [s for s, r in self._relays.items() if now > r[3]]:
            del self._relays[seq]

    def _next_target(self) -> NodeId | None:
        """The next member not known dead in a shuffled round-robin (a fresh seeded
        permutation per pass, evaluated lazily: no O(n) shuffle per pass)."""
        ids = self._ids
        for _ in range(2 * len(ids) + 1):
            if self._order is None or self._order_pos >= len(ids):
                self._order = Permutation(self._rng.randbytes(16), len(ids))
                self._order_pos = 0
            target = ids[self._order(self._order_pos)]
            self._order_pos += 1
            if self.status_of(target) != MemberStatus.DEAD:
                return target
        return None

    def _start_probe(self, now: int) -> None:
        target = self._next_target()
        if target is None:
            return
        self._seq += 1
        self._probe = _Probe(seq=self._seq, target=target, sent_at=now)
        self._send(target, Ping(seq=self._seq, target=target, updates=self.piggyback(target)))

    def on_ping(self, src: NodeId, ping: Ping) -> None:
        if ping.target != self.node_id:
            self._count("dropped:misrouted_ping")
            return
        self._send(src, PingAck(seq=ping.seq, target=self.node_id, updates=self.piggyback()))

    def on_ping_req(self, src: NodeId, req: PingReq, now: int) -> None:
        if req.target == self.node_id or req.target not in self._known:
            self._count("dropped:bad_ping_req")
            return
        self._seq += 1
        self._relays[self._seq] = (src, req.seq, req.target, now + self.config.probe_interval)
        self._send(req.target, Ping(seq=self._seq, target=req.target,
                                    updates=self.piggyback(req.target)))

    def on_ping_ack(self, src: NodeId, ack: PingAck) -> None:
        probe = self._probe
        if probe is not None and ack.seq == probe.seq and ack.target == probe.target:
            probe.acked = True
            return
        relay = self._relays.pop(ack.seq, None)
        if relay is not None and src == relay[2]:
            self._send(relay[0], PingAck(seq=relay[1], target=relay[2],
                                         updates=self.piggyback()))
            return
        self._count("dropped:unexpected_ping_ack")
