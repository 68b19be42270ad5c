"""How a simulated cluster carries its cores' broadcasts: `direct` (every send is one
network message: the full mesh) or `gossip` (`phalanx.gossip.dissemination`: a core's
broadcasts ride GP waves; point-to-point sends stay direct).

Owns: `GossipFabric` (the run option's values are `run_config.DISSEMINATIONS`), which runs one
`Dissemination` layer beside every `SimNode`: it takes each Ready's sends (`SimNode.outbox`),
receives the network's gossip messages for the node (everything else goes to the node as
before), ticks every layer every `tick_ns`, and steps the delivered inner messages into the
node's core as ``Receive`` from their origin. Generic: nothing here knows a protocol.

Timing: without a WAN the layers run the default `DisseminationConfig` (ticks sized for
this network's ~1 ms round trips: traces unchanged); with one (`RunConfig.wan`) it is
sized from the WAN's longest round trip (`DisseminationConfig.for_network`: call timeout,
resend window and rumor memory in time, several calls in flight per node).

Model: a layer lives and dies with its node's process: a crashed node's layer is gone and
its restart builds a new one at the node's new incarnation (`SimNode.incarnation`), so
rumors of the previous life are not confused with the new ones. A paused node's layer does
not tick (it makes no calls) but still answers calls; what it delivers queues in the
node's paused inbox, as any message would.

Rules: deterministic (a per-node `random.Random` derived from the run's seed, the node and
its incarnation; virtual time only); imports no core.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence

from phalanx.consensus.core import Send
from phalanx.consensus.crypto import FastCrypto
from phalanx.consensus.types import Message, NodeId
from phalanx.gossip.dissemination import Carried, Dissemination, DisseminationConfig
from phalanx.gossip.messages import GOSSIP_MESSAGES
from phalanx.jepsen.sim.crypto_memo import CryptoMemo
from phalanx.jepsen.sim.loop import EventLoop
from phalanx.jepsen.sim.node import SimNode
from phalanx.jepsen.sim.wan import WanConfig
from phalanx.net import wire
from phalanx.net.codec import DecodeError, Registry

DEFAULT_TICK_NS = 2_000_000
"""The layers' tick: about two one-way latencies of the simulated network (0.1 ms plus an
exponential 0.9 ms mean), so a GP call (timeout 3 ticks) rarely times out falsely, and the
broadcasts of 2 ms share one wave."""

_DECODE_MEMO = 4096
"""Rumor payloads kept decoded (by their bytes; cleared when full)."""


class GossipFabric:
    """Every node's dissemination layer for one run (see the module docstring)."""

    def __init__(self, *, loop: EventLoop, nodes: Mapping[str, SimNode],
                 send: Callable[[str, str, Message], None], codec: Registry, seed: int,
                 config: DisseminationConfig | None = None,
                 tick_ns: int = DEFAULT_TICK_NS, wan: WanConfig | None = None) -> None:
        """Without a `config`, the layers' timing is the default (a LAN's) or, with a
        `wan`, sized from its longest round trip (`DisseminationConfig.for_network`)."""
        if tick_ns < 1:
            raise ValueError(f"tick_ns must be >= 1, got {tick_ns}")
        if config is None and wan is not None:
            config = DisseminationConfig.for_network(tick_ns=tick_ns,
                                                     max_rtt_ns=wan.max_rtt_ns,
                                                     nodes=len(nodes))
        wire.register_all(GOSSIP_MESSAGES, registry=codec)
        self._loop = loop
        self._nodes = nodes
        self._send = send
        self._codec = codec
        self._encode = codec.encoder()
        self._seed = seed
        self._config = config or DisseminationConfig()
        self._tick_ns = tick_ns
        self._members = tuple(NodeId(n) for n in sorted(nodes))
        self._layers: dict[str, tuple[int, Dissemination]] = {}
        self._decoded: dict[bytes, Message | None] = {}
        # Every layer's FastCrypto shares one memo of tags (`crypto_memo`: the same values,
        # less CPU): the copies of a wave's leaf call decode to one object (the network's
        # decode memo), whose rumors its receivers then verify once.
        self._crypto_memo = CryptoMemo()
        self.counters: dict[str, int] = {}
        """Every layer's counters, summed over the run (`Dissemination.status` names)."""
        for node in nodes.values():
            node.outbox = self._outbox

    def start(self) -> None:
        """Start every layer's ticks (staggered by a seeded phase: nodes do not tick in
        lockstep)."""
        rng = random.Random(f"gossip-fabric:{self._seed}")
        for name in sorted(self._nodes):
            self._loop.call_later(rng.randrange(self._tick_ns),
                                  lambda n=name: self._tick(n))  # type: ignore[misc]

    def receive(self, name: str) -> Callable[[str, Message], None]:
        """The network route of node `name`: gossip messages to its layer, the rest to it."""
        node = self._nodes[name]
        deliver = node.deliver
        handles = Dissemination.handles

        def route(src: str, message: Message) -> None:
            if not handles(message):
                deliver(src, message)
                return
            layer = self._layer(name)
            if layer is not None:
                self._carry(name, layer.receive(NodeId(src), message))

        return route

    # -- internals ---------------------------------------------------------------------------

    def _decode(self, data: bytes) -> Message | None:
        # Memoised by the bytes, as the network's decoding (`SimNetwork` `decode_memo`): a
        # rumor's payload reaches every node; decoded once, as one object, which the cores'
        # `FastCrypto` memo then verifies once (`crypto_memo`). Messages are frozen:
        # sharing one object between nodes changes nothing they do.
        memo = self._decoded
        if data in memo:
            return memo[data]
        try:
            message: object = self._codec.decode(data)
        except DecodeError:
            message = None
        out = message if isinstance(message, Message) else None
        if len(memo) >= _DECODE_MEMO:
            memo.clear()
        memo[data] = out
        return out

    def _layer(self, name: str) -> Dissemination | None:
        node = self._nodes[name]
        if not node.up:
            self._layers.pop(name, None)  # the process died with its layer
            return None
        held = self._layers.get(name)
        if held is not None and held[0] == node.incarnation:
            return held[1]
        layer = Dissemination(
            NodeId(name), self._members,
            crypto=FastCrypto(NodeId(name), memo=self._crypto_memo),
            rng=random.Random(f"gossip:{self._seed}:{name}:{node.incarnation}"),
            encode=self._encode, decode=self._decode, config=self._config,
            incarnation=node.incarnation)
        self._layers[name] = (node.incarnation, layer)
        return layer

    def _outbox(self, name: str, sends: Sequence[Send]) -> None:
        layer = self._layer(name)
        if layer is None:
            return
        self._carry(name, layer.outgoing(sends))

    def _tick(self, name: str) -> None:
        node = self._nodes[name]
        if not node.paused:
            layer = self._layer(name)
            if layer is not None:
                self._carry(name, layer.tick())
        self._loop.call_later(self._tick_ns, lambda: self._tick(name))

    def _carry(self, name: str, carried: Carried) -> None:
        counters = self.counters
        for key, by in carried.counters:
            counters[key] = counters.get(key, 0) + by
        send = self._send
        for out in carried.sends:
            send(name, out.to, out.message)
        if carried.delivered:
            node = self._nodes[name]
            for inp in carried.delivered:
                node.deliver(inp.src, inp.message)
