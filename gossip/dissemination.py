"""Broadcasts through gossip: a sans-IO layer between any consensus core and the network.

Owns: `DisseminationConfig`, `Dissemination` (one node's layer, beside its core) and its
output `Carried`. Generic over protocols: it never looks at what a core sends, only at the
shape of a `Ready`'s sends. A run of consecutive sends of one message (equal values) to
every other member is a BROADCAST: it is published as one rumor through the node's
`GossipMachine` (every broadcast between two layer ticks rides one wave, so several
messages share each contact). Every other send (point to point, or to some of the peers)
goes out directly, unchanged. A rumor delivered at a node is decoded and handed to that
node's core as ``Receive(src=origin, message=inner)``: as if the origin had sent it.

Trust (docs/GOSSIP.md "Leaderless dissemination"): directly, `Receive.src` is the peer the
transport authenticated. Through gossip it is the rumor's origin, authenticated by the
origin's signature over the rumor (payload included), verified before delivery; a forged or
tampered rumor is dropped (`dropped:bad_signature`), so a core's trust in `src` holds
unchanged. Inner messages keep their own signatures (endorsements by their endorser,
transactions by their client), which the core still checks. What the layer adds: rumor ids
deduplicate and replay floors drop replays (the core sees each broadcast once per origin
incarnation). What it costs: delivery now depends on forwarders; a Byzantine forwarder can
withhold a subtree's copy (GP's failed-call rule, anti-entropy and the core's own re-sends
and fetches recover it), and delivery takes O(log n) rounds instead of one hop.

Timing: `DisseminationConfig()` counts ticks sized for a LAN; `for_network` derives the
call timeout, resend window and rumor memory from a network's longest round trip and
lets a node keep its calls in flight in parallel (a WAN: docs/GOSSIP.md "Over a WAN").

Rules: as the gossip machine's (no I/O, clocks or global randomness; the `random.Random`,
the crypto and the codec functions are injected). A rumor whose payload does not decode is
dropped and counted (`dropped:undecodable_payload`), never raised.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from phalanx.consensus.core import Receive, Send, Tick
from phalanx.consensus.types import Message, NodeId
from phalanx.gossip.machine import GossipConfig, GossipMachine, GossipReady, Publish, RumorCrypto
from phalanx.gossip.messages import GOSSIP_MESSAGES

GOSSIP_TYPES: frozenset[type] = frozenset(GOSSIP_MESSAGES.values())

"""The classes a node hands to its layer instead of its core (`Dissemination.handles`)."""

LEAF_SPAN = 8
"""`for_network`'s smallest `GossipConfig.leaf_span`: of a wave's n-1 calls, 7 wait for
an ack at n = 60 (GP's midpoint splits: 27 with its empty grants unacknowledged, all n-1
before; docs/GOSSIP.md "Over a WAN")."""

LEAF_GROUPS = 8
"""With the cluster's size, `for_network` sizes `leaf_span` so that a wave ends in about
this many leaf intervals whatever n: (n-1) // 8, at least `LEAF_SPAN` (n = 180: 22, so 7
acked calls of 179 and 5 hops to the last node, against 31 and 7 with 8)."""


def _default_gossip() -> GossipConfig:
    # GP alone: no SWIM (GP calls every member anyway, n-1 contacts, and probes would be
    # paid by every commit without helping it) and no anti-entropy (a core has its own
    # re-sends and fetches for loss; digests of every rumor held cost more bytes than the
    # broadcasts themselves at n = 180). Rumors and waves are kept 1,000 ticks: a wave
    # still spreading when its state is collected is refused (`stale_wave`: no ack, the
    # caller times out), which at 200 ticks of 2 ms broke 12% of the calls at n = 180.
    return GossipConfig(membership=False, call_timeout=4, anti_entropy_interval=0,
                        rumor_ttl=1000)


@dataclass(frozen=True, slots=True, kw_only=True)
class DisseminationConfig:
    """Attributes:
        gossip: the gossip machine's knobs (its ticks are the layer's ticks).
    """

    gossip: GossipConfig = field(default_factory=_default_gossip)
    resend_window: int = 100
    """A broadcast byte-equal to one this node published less than this many ticks ago
    is not published again (counted `suppressed_resends`): a core's periodic re-send of
    its signatures, meant for lost messages, would otherwise start a second wave while the
    first is still spreading (and slower dissemination means more re-sends: a feedback
    loop). 0: publish every broadcast."""

    @classmethod
    def for_network(cls, *, tick_ns: int, max_rtt_ns: int, parallel_calls: int = 1024,
                    leaf_span: int | None = None, wave_interval: int = 1, nodes: int = 0
                    ) -> DisseminationConfig:
        """The layer's timing in TIME, sized from the network (as `WanConfig.tick_ns` sizes
        a core's tick): the defaults' ticks suit a LAN whose round trip is ~1/2 tick; over a
        WAN whose round trip `max_rtt_ns` spans tens of ticks, a call times out after 1.5
        round trips plus 2 ticks (not falsely: a false timeout re-calls a subtree), the
        resend window is at least 4 round trips (a wave takes ~log2 n one-way delays), the
        rumor and wave memory at least 40, and each node keeps up to `parallel_calls` calls
        in flight (`GossipConfig.parallel_calls`; a bound on state, not a pace: at n = 60
        over the 5-region WAN, 16 left PBFT's calls queued for seconds, 64 cost 1.0 s p50,
        1024 0.83 s). Intervals of at most `leaf_span` positions are called position by
        position with empty, unacknowledged grants (`GossipConfig.leaf_span`, `LEAF_SPAN`:
        the same n-1 contacts per wave, fewer acks and hops; 0: GP's splits; by default
        `LEAF_SPAN`, or with the cluster's size `nodes`, (nodes-1) // `LEAF_GROUPS` when
        larger: a tree of the same shape at any n). Never shorter than the defaults."""
        if tick_ns < 1 or max_rtt_ns < 0:
            raise ValueError(f"need tick_ns >= 1 and max_rtt_ns >= 0, got {tick_ns}, "
                             f"{max_rtt_ns}")
        base = cls()
        if leaf_span is None:
            leaf_span = max(LEAF_SPAN, (nodes - 1) // LEAF_GROUPS)
        rtt_ticks = -(-max_rtt_ns // tick_ns)  # ceil
        gossip = dataclasses.replace(
            base.gossip, call_timeout=max(base.gossip.call_timeout, rtt_ticks * 3 // 2 + 2),
            rumor_ttl=max(base.gossip.rumor_ttl, 40 * rtt_ticks),
            parallel_calls=parallel_calls, leaf_span=leaf_span if parallel_calls > 1 else 0,
            wave_interval=wave_interval)
        return cls(gossip=gossip, resend_window=max(base.resend_window, 4 * rtt_ticks))


@dataclass(frozen=True, slots=True, kw_only=True)
class Carried:
    """One layer step's output: `sends` to carry out (direct ones and gossip traffic, any
    order, best effort), `delivered` to step into the node's core in order (each a
    `Receive` from the rumor's origin), `published` (broadcasts turned into rumors) and
    `counters` (this step's increments of `status()`)."""

    sends: tuple[Send, ...] = ()
    delivered: tuple[Receive, ...] = ()
    published: int = 0
    counters: tuple[tuple[str, int], ...] = ()


class Dissemination:
    """One node's layer. `outgoing(sends)` for each Ready's messages, `receive(src, msg)`
    for each message `handles(msg)` says is gossip, `tick()` every layer tick."""

    def __init__(self, node_id: NodeId, members: Sequence[NodeId], *, crypto: RumorCrypto,
                 rng: random.Random, encode: Callable[[Message], bytes],
                 decode: Callable[[bytes], Message | None],
                 config: DisseminationConfig | None = None, incarnation: int = 0) -> None:
        """`decode` returns None for bytes that are not a message (never raises)."""
        self.config = cfg = config or DisseminationConfig()
        self.machine = GossipMachine(node_id, members, crypto=crypto, rng=rng,
                                     config=cfg.gossip, incarnation=incarnation)
        self.node_id = node_id
        self._peers = frozenset(m for m in members if m != node_id)
        self._encode = encode
        self._decode = decode
        self._counters: dict[str, int] = {}
        self._recent: dict[bytes, int] = {}  # payload -> tick published (insertion order)
        self._ticks = 0

    @staticmethod
    def handles(message: Message) -> bool:
        """Whether `message` is gossip traffic (for the layer, not the core)."""
        return type(message) in GOSSIP_TYPES

    def status(self) -> dict[str, int]:
        """The layer's counters (`broadcasts`, `direct`, `dropped:undecodable_payload`)
        and the gossip machine's (`sent:<type>`, `delivered`, `dropped:<reason>`, ...)."""
        out = self.machine.status()
        for name, count in self._counters.items():
            out[name] = out.get(name, 0) + count
        return out

    # -- the three inputs -------------------------------------------------------------------

    def outgoing(self, sends: Sequence[Send]) -> Carried:
        """Split one Ready's `sends`: broadcasts become rumors (sent with the next wave, at
        the next `tick`), the rest is returned to send now, in order."""
        direct: list[Send] = []
        published = 0
        counts: dict[str, int] = {}
        i, end = 0, len(sends)
        peers = len(self._peers)
        while i < end:
            if end - i < peers:  # too few left for a broadcast: the rest go direct
                direct += sends[i:]
                break
            message = sends[i].message
            j = i + 1
            while j < end and (sends[j].message is message or sends[j].message == message):
                j += 1
            run = sends[i:j]
            if len(run) == peers and {s.to for s in run} == self._peers:
                payload = self._encode(message)
                if payload in self._recent:
                    _add(counts, "suppressed_resends", 1)
                else:
                    if self.config.resend_window:
                        self._recent[payload] = self._ticks
                    ready = self.machine.step(Publish(payload=payload))
                    direct += ready.sends  # (none today: a wave starts at the next tick)
                    _merge(counts, ready.counters)
                    published += 1
            else:
                direct += run
            i = j
        if published:
            _add(counts, "broadcasts", published)
        if len(direct):
            _add(counts, "direct", len(direct))
        return self._carried(direct, (), published, counts)

    def receive(self, src: NodeId, message: Message) -> Carried:
        """A gossip message from peer `src` (authenticated by the transport; may be
        Byzantine)."""
        return self._from_machine(self.machine.step(Receive(src=src, message=message)))

    def tick(self) -> Carried:
        """One layer tick: starts a wave of what was published since the last, timeouts,
        anti-entropy."""
        self._ticks += 1
        recent = self._recent
        horizon = self._ticks - self.config.resend_window
        while recent:
            oldest = next(iter(recent))
            if recent[oldest] > horizon:
                break
            del recent[oldest]
        return self._from_machine(self.machine.step(Tick()))

    # -- plumbing ----------------------------------------------------------------------------

    def _from_machine(self, ready: GossipReady) -> Carried:
        # Hot (every gossip message): the machine's sorted counters pass through as they
        # are unless a payload fails to decode.
        counters = ready.counters
        if not ready.delivered:
            return Carried(sends=ready.sends, counters=counters)
        delivered: list[Receive] = []
        undecodable = 0
        for rumor in ready.delivered:
            inner = self._decode(rumor.payload)
            if inner is None:
                undecodable += 1
                continue
            delivered.append(Receive(src=rumor.origin, message=inner))
        if undecodable:
            counts = dict(counters)
            _add(counts, "dropped:undecodable_payload", undecodable)
            _add(self._counters, "dropped:undecodable_payload", undecodable)
            counters = tuple(sorted(counts.items()))
        return Carried(sends=ready.sends, delivered=tuple(delivered), counters=counters)

    def _carried(self, sends: list[Send], delivered: Sequence[Receive], published: int,
                 counts: dict[str, int]) -> Carried:
        for name in ("broadcasts", "direct", "suppressed_resends",
                     "dropped:undecodable_payload"):
            if name in counts:
                _add(self._counters, name, counts[name])
        return Carried(sends=tuple(sends), delivered=tuple(delivered), published=published,
                       counters=tuple(sorted(counts.items())))


def _add(counts: dict[str, int], name: str, by: int) -> None:
    counts[name] = counts.get(name, 0) + by


def _merge(counts: dict[str, int], pairs: Sequence[tuple[str, int]]) -> None:
    for name, by in pairs:
        _add(counts, name, by)


__all__ = ["GOSSIP_TYPES", "Carried", "Dissemination", "DisseminationConfig"]
