"""The sans-IO gossip machine: one node's rumor spreading, anti-entropy and membership.

Owns: `GossipConfig`, the inputs `Publish` (plus `phalanx.consensus.core`'s `Receive` and
`Tick`), the output bundle `GossipReady`, and `GossipMachine`, which a driver runs beside a
consensus core (the simulator `phalanx.gossip.sim`, later the trio runtime).

Contract (as the cores', `phalanx.consensus.core`): ``ready = machine.step(input)``.
- `Publish(payload)`: sign a new rumor; it leaves in the next wave (a batch of up to
  `batch_max` rumors started at the next `Tick`, `instances` independent waves per batch).
- `Receive(src, msg)`: a peer's message, authenticated by the transport; may be Byzantine.
- `Tick(now_ms)`: one logical tick; every timeout is counted in ticks (`now_ms` unused).
Output `GossipReady`: `sends` (any order), `published` (the signed rumor a `Publish`
made), `delivered` (rumors of OTHER origins, verified,
each at most once per node), `membership` (changes of this node's view, in order), and
`counters` (the increments this step made to `status()`'s counters).

Rules: no I/O, clocks or global randomness (the `random.Random` is injected, crypto is an
injected `Signer`/`Verifier`); deterministic for a given input sequence; a bad message is
dropped and counted by reason (`status()["dropped:<reason>"]`), never raised. Our misuse
(an unknown `node_id`, a bad config) raises `ValueError`.

Invariants:
- At most `parallel_calls` `Call`s outstanding per node (1: GP's one call at a time);
  each ends on its `CallAck` or after `call_timeout` ticks (protocols.md §3.2's
  transport ACK, made explicit). With `parallel_calls` > 1 a call whose grants are all
  empty is not outstanding at all: its outcome would change nothing (the caller keeps
  what it keeps at once), so it carries `call_id` 0, which asks the callee for no ack.
- A rumor is delivered or forwarded only after its origin's signature verified; a rumor of
  an id already held with other bytes, or older than this node's memory, is dropped.
- `no_signature_check` (test-only bug switch) skips verification: the forgery tests catch it.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from phalanx.consensus.core import Receive, Send, Tick
from phalanx.consensus.crypto import Signer, Verifier
from phalanx.consensus.types import Message, NodeId
from phalanx.gossip.membership import Membership, MembershipChange, SwimConfig
from phalanx.gossip.messages import (
    Call,
    CallAck,
    Digest,
    MemberUpdate,
    Ping,
    PingAck,
    PingReq,
    Rumor,
    RumorPush,
)
from phalanx.gossip.rumors import RumorStore
from phalanx.gossip.spreading import Part, Spreader, WaveKey

BUGS = frozenset({"overlapping_intervals", "no_signature_check"})
"""Test-only bug switches (the sweeps must catch each)."""


class RumorCrypto(Signer, Verifier, Protocol):
    """What the machine needs: sign our rumors, verify others' (`FastCrypto` in the
    simulator, `phalanx.net.crypto.Ed25519Crypto` in the runtime)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GossipConfig:
    """Knobs, in ticks. Defaults suit a tick of ~1/2 of a round-trip time (for a network
    whose round trips span many ticks, `DisseminationConfig.for_network` sizes them).

    Attributes:
        call_timeout: a `Call` without `CallAck` for this long counts as to a dead node.
        batch_max: rumors per wave.
        instances: independent waves per batch (f+1 for the Byzantine setting).
        anti_entropy_interval: push-pull with a random live peer every this many ticks
            (0: never).
        rumor_ttl: rumors and wave state are forgotten this long after first seen.
        membership: run SWIM (off: every member counts as live; the pure GP benches).
        gossip_interval, gossip_nodes: send queued membership updates to this many random
            live peers every this many ticks (memberlist's gossip; 0: only piggy-backed).
        permute: False runs plain GP (identity labels), for comparison only.
        parallel_calls: calls a node keeps in flight at once. 1 is GP (the next split
            waits for the call's outcome); more lets a node split what it keeps while its
            calls are pending (`Spreader.early_keep`), for networks whose round trips are
            long against the tick (a WAN: docs/GOSSIP.md "Over a WAN"); its calls with
            only empty grants then ask for no ack (`call_id` 0).
        wave_interval: a node starts its waves every this many ticks (at its own phase),
            so the rumors it publishes in between share one wave and its n-1 contacts
            (1: every tick).
        leaf_span: 0 is GP; more (with `parallel_calls` > 1) calls an interval of at most
            this many positions position by position with empty grants, unacknowledged,
            instead of splitting it: the same n-1 contacts, fewer acks and hops
            (docs/GOSSIP.md "Over a WAN").
        balance: a successful call also hands the callee whole intervals until the two
            hold about as many positions (still n-1 contacts: same call, disjoint
            intervals); much faster when most nodes are down (docs/GOSSIP.md).
        bugs: test-only bug switches (`BUGS`).
    """

    call_timeout: int = 2
    batch_max: int = 64
    instances: int = 1
    anti_entropy_interval: int = 10
    rumor_ttl: int = 400
    membership: bool = True
    gossip_interval: int = 2
    gossip_nodes: int = 3
    swim: SwimConfig = field(default_factory=SwimConfig)
    permute: bool = True
    balance: bool = False
    parallel_calls: int = 1
    leaf_span: int = 0
    wave_interval: int = 1
    bugs: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if min(self.call_timeout, self.batch_max, self.instances, self.parallel_calls,
               self.wave_interval) < 1:
            raise ValueError("call_timeout, batch_max, instances, parallel_calls and "
                             "wave_interval must be >= 1")
        if self.leaf_span < 0 or (self.leaf_span and self.parallel_calls == 1):
            raise ValueError("leaf_span must be >= 0, and needs parallel_calls > 1 (one call "
                             f"at a time would wait a round trip per leaf), got "
                             f"{self.leaf_span} with parallel_calls {self.parallel_calls}")
        if not self.bugs <= BUGS:
            raise ValueError(f"unknown bugs {sorted(self.bugs - BUGS)}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Publish:
    """Input: disseminate `payload` to every member."""

    payload: bytes


GossipInput = Receive | Tick | Publish


@dataclass(frozen=True, slots=True, kw_only=True)
class GossipReady:
    """Everything one `step` asks the driver to do: send `sends` (any order, best effort),
    hand `delivered` to the application, note `membership` changes. Nothing to persist:
    after a restart the driver builds a new machine with a higher `incarnation`."""

    sends: tuple[Send, ...] = ()
    published: tuple[Rumor, ...] = ()
    delivered: tuple[Rumor, ...] = ()
    membership: tuple[MembershipChange, ...] = ()
    counters: tuple[tuple[str, int], ...] = ()


_EMPTY = GossipReady()


@dataclass(slots=True)
class _Pending:
    call_id: int
    target: NodeId
    parts: tuple[Part, ...]
    deadline: int


class GossipMachine:
    """One node's gossip. See the module docstring for the contract."""

    def __init__(self, node_id: NodeId, members: Sequence[NodeId], *, crypto: RumorCrypto,
                 rng: random.Random, config: GossipConfig | None = None,
                 incarnation: int = 0) -> None:
        if node_id not in members:
            raise ValueError(f"{node_id!r} is not among the members")
        if len(set(members)) != len(members):
            raise ValueError("members must be distinct")
        self.node_id = node_id
        self.members = tuple(sorted(members))
        self._member_set = frozenset(self.members)
        self.config = cfg = config or GossipConfig()
        self.incarnation = incarnation
        self._crypto = crypto
        self._rng = rng
        self._now = 0
        self._seq = 0
        self._wave = 0  # the wave the next `Publish` joins
        self._wave_fill = 0  # rumors in it so far
        self._wave_seed = b""  # the seed drawn for it (signed into each of its rumors)
        self._call_id = 0
        self._pending: dict[int, _Pending] = {}  # call id -> call, oldest first
        self._unacked: Call | None = None  # the last unacknowledged call (reused when equal)
        self._outbox: list[Rumor] = []
        self._store = RumorStore(cfg.rumor_ttl)
        self._spreader = Spreader(node_id, self.members, ttl=cfg.rumor_ttl,
                                  instances=cfg.instances,
                                  permute=cfg.permute, balance=cfg.balance,
                                  early_keep=cfg.parallel_calls > 1,
                                  leaf_span=cfg.leaf_span,
                                  overlapping_intervals="overlapping_intervals" in cfg.bugs)
        self._verify = "no_signature_check" not in cfg.bugs
        self._counters: dict[str, int] = {}
        self._step_counts: dict[str, int] = {}
        self._sends: list[Send] = []
        self._delivered: list[Rumor] = []
        self._published: list[Rumor] = []
        self._membership = (
            Membership(node_id, self.members, incarnation=incarnation, rng=rng,
                       config=cfg.swim, send=self._send, count=self._count, crypto=crypto)
            if cfg.membership else None
        )
        self._others = [m for m in self.members if m != node_id]
        # Periodic work runs at a per-node phase, so nodes that tick in lockstep (the
        # simulator) do not all gossip and exchange digests on the same tick.
        self._phase = rng.randrange(1 << 16)

    # -- plumbing ----------------------------------------------------------------------------

    def _count(self, name: str, by: int = 1) -> None:
        # Into this step's counts only; `_flush` adds them to the totals (once per name
        # per step, not once per event) and `status` sees both.
        counts = self._step_counts
        counts[name] = counts.get(name, 0) + by

    def _drop(self, reason: str) -> None:
        self._count("dropped:" + reason)

    def _send(self, to: NodeId, message: Message) -> None:
        self._sends.append(Send(to=to, message=message))
        self._count("sent:" + type(message).__name__)

    def _updates(self, first: NodeId | None = None) -> tuple[MemberUpdate, ...]:
        return self._membership.piggyback(first) if self._membership else ()

    def _flush(self) -> GossipReady:
        changes: tuple[MembershipChange, ...] = ()
        if self._membership and self._membership.changes:
            changes = tuple(self._membership.changes)
            self._membership.changes.clear()
        if not (self._sends or self._delivered or changes or self._step_counts):
            return _EMPTY
        ready = GossipReady(sends=tuple(self._sends), published=tuple(self._published),
                            delivered=tuple(self._delivered),
                            membership=changes,
                            counters=tuple(sorted(self._step_counts.items())))
        totals = self._counters
        for name, by in self._step_counts.items():
            totals[name] = totals.get(name, 0) + by
        self._sends.clear()
        self._delivered.clear()
        self._published.clear()
        self._step_counts.clear()
        return ready

    # -- the one entry point -----------------------------------------------------------------

    def step(self, inp: GossipInput) -> GossipReady:
        match inp:
            case Publish(payload=payload):
                self._publish(payload)
            case Tick():
                self._tick()
            case Receive(src=src, message=message):
                self._receive(src, message)
            case _:
                raise TypeError(f"not a gossip input: {inp!r}")
        return self._flush()

    def status(self) -> dict[str, int]:
        """Counters (`sent:<message type>`, `dropped:<reason>`, `delivered`, `calls`,
        `call_timeouts`, SWIM's `suspect_raised`/`suspect_heard`/`declared_dead`/
        `refutations`, ...) and sizes (`rumors_held`, `waves_held`, `ids_remembered`), for
        metrics."""
        out = dict(self._counters)
        for name, by in self._step_counts.items():  # (counted in a step not yet flushed)
            out[name] = out.get(name, 0) + by
        out["rumors_held"] = len(self._store)
        out["waves_held"] = len(self._spreader.waves)
        out["ids_remembered"] = self._store.seen.remembered()
        out["incarnation"] = self._membership.incarnation if self._membership \
            else self.incarnation
        return out

    def membership_view(self) -> dict[NodeId, tuple[str, int]]:
        """Each other member's (status name, incarnation) as this node sees it."""
        if self._membership is None:
            return {m: ("ALIVE", 0) for m in self._others}
        return {m: (s.name, i) for m, (s, i) in self._membership.view().items()}

    # -- publishing and spreading ------------------------------------------------------------

    def _publish(self, payload: bytes) -> None:
        # Rumors are numbered per start-up incarnation (a refutation does not renumber);
        # the wave is fixed (and signed) now: up to batch_max rumors join the open wave.
        if self._wave_fill == self.config.batch_max:
            self._wave += 1
            self._wave_fill = 0
        if self._wave_fill == 0:
            self._wave_seed = self._rng.randbytes(16)
        self._wave_fill += 1
        unsigned = Rumor(origin=self.node_id, incarnation=self.incarnation, seq=self._seq,
                         wave=self._wave, seed=self._wave_seed, payload=payload)
        self._seq += 1
        rumor = dataclasses.replace(unsigned, signature=self._crypto.sign(unsigned))
        self._store.add(rumor, self._now)
        self._outbox.append(rumor)
        self._published.append(rumor)
        self._count("published")

    def _start_waves(self) -> None:
        if not self._outbox:
            return
        waves: dict[int, list[Rumor]] = {}
        for rumor in self._outbox:
            waves.setdefault(rumor.wave, []).append(rumor)
        self._outbox.clear()
        for number, batch in waves.items():
            for instance in range(self.config.instances):
                key = WaveKey(self.node_id, self.incarnation, number, instance)
                self._spreader.start(key, tuple(batch), self._now)
            self._count("waves_started")
        self._wave += 1  # later rumors open a new wave
        self._wave_fill = 0

    def _next_call(self) -> None:
        pending = self._pending
        while len(pending) < self.config.parallel_calls:
            planned = self._spreader.plan()
            if planned is None:
                return
            if planned.ack:
                self._call_id += 1
                call_id = self._call_id
                pending[call_id] = _Pending(call_id=call_id, target=planned.target,
                                            parts=planned.parts,
                                            deadline=self._now + self.config.call_timeout)
            else:  # nothing depends on its outcome: no ack asked, not pending
                self._count("calls_unacked")
                updates = self._updates(planned.target)
                last = self._unacked
                # A wave's leaf calls carry one grant object: then one Call object too (a
                # driver may encode it once for all its targets).
                if last is None or updates or last.grants != planned.grants:
                    last = Call(call_id=0, grants=planned.grants, updates=updates)
                    self._unacked = None if updates else last
                self._send(planned.target, last)
                self._count("calls")
                continue
            self._send(planned.target, Call(call_id=call_id, grants=planned.grants,
                                            updates=self._updates(planned.target)))
            self._count("calls")

    def _accept_rumor(self, rumor: Rumor) -> bool:
        """Verify, deduplicate, store and deliver one rumor. False iff it is forged (or of
        no member), which makes a `Call` carrying it unacceptable."""
        if rumor.origin not in self._member_set:
            self._drop("unknown_origin")
            return False
        verdict = self._store.classify(rumor)
        if verdict == "duplicate":
            return True
        if self._verify and not self._crypto.verify(rumor.origin, rumor, rumor.signature):
            self._drop("bad_signature")
            return False
        if rumor.origin == self.node_id:
            self._drop("own_old_rumor")  # ours from before a restart, or a replay of ours
        elif verdict == "stale":
            self._drop("replayed")
        elif verdict == "conflict":
            self._drop("equivocation")
        else:
            self._store.add(rumor, self._now)
            self._delivered.append(rumor)
            self._count("delivered")
        return True

    # -- inputs ------------------------------------------------------------------------------

    def _tick(self) -> None:
        self._now += 1
        now = self._now
        if self._pending:
            expired = []
            for call in self._pending.values():  # oldest first: deadlines never decrease
                if now < call.deadline:
                    break
                expired.append(call)
            for call in expired:
                del self._pending[call.call_id]
                self._spreader.resolve(call.parts, acked=False)
                self._count("call_timeouts")
        cfg = self.config
        if cfg.wave_interval == 1 or (now + self._phase) % cfg.wave_interval == 0:
            self._start_waves()
        self._next_call()
        if self._membership is not None:
            self._membership.tick(now)
            if cfg.gossip_interval and (now + self._phase) % cfg.gossip_interval == 0 \
                    and self._membership.pending_updates():
                for peer in self._membership.random_live(cfg.gossip_nodes):
                    updates = self._updates()
                    if updates:
                        self._send(peer, RumorPush(rumors=(), updates=updates))
        if cfg.anti_entropy_interval and (now + self._phase) % cfg.anti_entropy_interval == 0:
            self._anti_entropy()
        if now % max(1, cfg.rumor_ttl // 4) == 0:
            self._count("rumors_collected", self._store.collect(now))
            self._spreader.collect(now)

    def _anti_entropy(self) -> None:
        if self._membership is not None:
            peers = self._membership.random_live(1)
            peer = peers[0] if peers else None
        else:
            peer = self._rng.choice(self._others) if self._others else None
        if peer is None:
            return
        self._send(peer, self._digest(reply=True))
        self._count("digests")

    def _digest(self, *, reply: bool) -> Digest:
        table = self._membership.table() if self._membership else ()
        return Digest(ids=self._store.ids(), reply=reply, table=table,
                      updates=self._updates())

    def _receive(self, src: NodeId, message: Message) -> None:
        if src not in self._member_set or src == self.node_id:
            self._drop("unknown_sender")
            return
        updates: tuple[MemberUpdate, ...] = getattr(message, "updates", ())
        if self._membership is not None and updates:
            self._membership.apply(updates, self._now)
        match message:
            case Call():
                self._on_call(src, message)
            case CallAck(call_id=call_id):
                pending = self._pending.get(call_id)
                if pending is None or pending.target != src:
                    self._drop("unexpected_ack")
                    return
                del self._pending[call_id]
                self._spreader.resolve(pending.parts, acked=True)
                self._next_call()
            case Ping() | PingReq() | PingAck():
                self._on_probe(src, message)
            case Digest():
                self._on_digest(src, message)
            case RumorPush(rumors=rumors):
                for rumor in rumors:
                    self._accept_rumor(rumor)
            case _:
                self._drop("unknown_message")

    def _on_call(self, src: NodeId, call: Call) -> None:
        for grant in call.grants:
            # Every rumor is looked at (authentic ones are delivered even beside a forgery).
            if not all([self._accept_rumor(r) for r in grant.rumors]):
                return  # forged: no ack, so the caller keeps the interval
        ok = True
        for grant in call.grants:
            verdict = self._spreader.accept(grant, self._now)
            if verdict != "ok":
                self._drop(verdict)
                ok = False
        if ok and call.call_id:  # (call id 0 asks for no ack)
            self._send(src, CallAck(call_id=call.call_id, updates=self._updates()))
        self._next_call()

    def _on_probe(self, src: NodeId, message: Ping | PingReq | PingAck) -> None:
        swim = self._membership
        if swim is None:
            self._drop("membership_off")
        elif isinstance(message, Ping):
            swim.on_ping(src, message)
        elif isinstance(message, PingReq):
            swim.on_ping_req(src, message, self._now)
        else:
            swim.on_ping_ack(src, message)

    def _on_digest(self, src: NodeId, digest: Digest) -> None:
        if self._membership is not None and digest.table:
            self._membership.apply(digest.table, self._now)
        missing = self._store.missing_from(digest.ids)
        if missing:
            self._send(src, RumorPush(rumors=missing, updates=self._updates()))
        if digest.reply:
            self._send(src, self._digest(reply=False))

    # -- introspection for drivers and tests -------------------------------------------------

    @property
    def now(self) -> int:
        return self._now

    def busy(self) -> bool:
        """Whether this node still owns positions of some wave or waits on a call."""
        return bool(self._pending) or self._spreader.busy() or bool(self._outbox)


__all__ = ["BUGS", "GossipConfig", "GossipInput", "GossipMachine", "GossipReady",
           "Publish", "RumorCrypto"]
