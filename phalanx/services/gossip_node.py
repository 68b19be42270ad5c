"""The gossip service on a real node: `GossipMachine` driven by the runtime's service host.

Owns: `GossipService` (the `NodeService` the host ticks and feeds, and the embedding API:
`publish`, `on_deliver`, `subscribe`, `deliveries`, `membership`), `build` (the factory the
registry names) and the restart rule (`next_incarnation`).

How it runs: the host (`phalanx.runtime.services`) calls `tick` every ``[gossip] tick_ms``
and `receive` for every peer message of a gossip type, from the node's trio tasks one at a
time; each step's `GossipReady` is carried out at once: `sends` go to the node's existing
mTLS peer links (best effort; a refused send is counted), `delivered` rumors go to the
delivery log, the callbacks and the subscribers, membership changes are logged. Nothing
here decides anything: the machine does (`phalanx.gossip.machine`).

Keys: rumors and alive updates are signed with the node's signing key (`[keys]
signing_key`, `phalanx.ops.signing_keys.load_crypto`), verified with the peers' public keys
from the config: a forged rumor is dropped and counted (`dropped:bad_signature`).

Restarts: the incarnation is max(wall-clock ms, the last one + 1), written (fsynced) to
``DATA/services/gossip.incarnation`` before the machine starts, so a restarted node's signed
alive beats the suspect/dead the others hold even if the clock stepped back. That file is
all the service persists: rumors live in memory for ``rumor_ttl`` ticks, and a restarted
node gets the recent ones back from its peers by anti-entropy.
"""

from __future__ import annotations

import logging
import math
import os
import random
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path

import trio

from phalanx.consensus.types import Message, NodeId
from phalanx.gossip import (
    GossipConfig,
    GossipMachine,
    GossipReady,
    Publish,
    Receive,
    Rumor,
    SwimConfig,
    Tick,
)
from phalanx.net.codec import EncodeError
from phalanx.ops.pki import CLIENT_ROLES
from phalanx.services.gossip_api import (
    GossipDelivery,
    GossipMember,
    GossipPublish,
    GossipPublished,
    GossipStatus,
    GossipStatusCall,
)
from phalanx.services.spec import NodeService, OptionValue, ServiceContext, ServiceError

logger = logging.getLogger(__name__)

READ_ONLY, READ_WRITE, _ADMIN = CLIENT_ROLES
INCARNATION_FILE = "gossip.incarnation"
MAX_STATUS_RUMORS = 1000


def next_incarnation(state_dir: Path, now_ms: int) -> int:
    """This start's incarnation: above the last one recorded in `state_dir` and at least
    `now_ms`; recorded (fsynced) before it is returned. Raises `ServiceError` for a file
    that does not hold a number."""
    path = state_dir / INCARNATION_FILE
    try:
        last = int(path.read_text().strip())
    except FileNotFoundError:
        last = -1
    except (OSError, ValueError) as e:
        raise ServiceError(f"{path}: not a gossip incarnation ({e}); delete the file to "
                           "start from the clock") from None
    incarnation = max(now_ms, last + 1)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as f:
        f.write(f"{incarnation}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dfd = os.open(state_dir, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return incarnation


def gossip_config(options: Mapping[str, OptionValue]) -> GossipConfig:
    """The machine's knobs from a validated ``[gossip]`` table."""
    try:
        return GossipConfig(
            call_timeout=int(options["call_timeout"]),
            anti_entropy_interval=int(options["anti_entropy_interval"]),
            rumor_ttl=int(options["rumor_ttl"]),
            instances=int(options["instances"]),
            parallel_calls=int(options["parallel_calls"]),
            balance=bool(options["balance"]),
            swim=SwimConfig(probe_interval=int(options["probe_interval"]),
                            probe_timeout=int(options["probe_timeout"])),
        )
    except ValueError as e:
        raise ServiceError(f"[gossip]: {e}") from None


class GossipService:
    """One node's gossip (see the module docstring). `node.services["gossip"]`."""

    def __init__(self, machine: GossipMachine, *, send: Callable[[NodeId, Message], bool],
                 tick_seconds: float, wall_clock: Callable[[], float],
                 max_payload: int = 65536, keep_delivered: int = 1000) -> None:
        self.machine = machine
        self._send = send
        self._tick_seconds = tick_seconds
        self._clock = wall_clock
        self.max_payload = max_payload
        self._log: deque[GossipDelivery] = deque(maxlen=keep_delivered)
        self._callbacks: list[Callable[[Rumor], None]] = []
        self._subscribers: list[trio.MemorySendChannel[Rumor]] = []
        self._counts: dict[str, int] = {}

    # -- the embedding API -------------------------------------------------------------------

    @property
    def node_id(self) -> NodeId:
        return self.machine.node_id

    @property
    def incarnation(self) -> int:
        return self.machine.incarnation

    def publish(self, payload: bytes) -> Rumor:
        """Sign `payload` as a rumor of this node; it leaves with the next tick's wave."""
        if len(payload) > self.max_payload:
            raise ValueError(f"a gossip payload is at most {self.max_payload} bytes "
                             f"([gossip] max_payload), got {len(payload)}")
        ready = self.machine.step(Publish(payload=payload))
        self._carry_out(ready)
        return ready.published[0]

    def on_deliver(self, callback: Callable[[Rumor], None]) -> None:
        """Call `callback(rumor)` for every rumor of another origin delivered here (once
        each, from the node's task: it must not block)."""
        self._callbacks.append(callback)

    def subscribe(self, buffer: int = 256) -> trio.MemoryReceiveChannel[Rumor]:
        """An async iterator of the rumors delivered from now on. A subscriber more than
        `buffer` rumors behind loses the newer ones (counted: `subscriber_overflow`)."""
        send, receive = trio.open_memory_channel[Rumor](buffer)
        self._subscribers.append(send)
        return receive

    def deliveries(self) -> tuple[GossipDelivery, ...]:
        """The newest rumors published or delivered here (up to `keep_delivered`), oldest
        first, with the wall-clock time of each."""
        return tuple(self._log)

    def membership(self) -> dict[NodeId, tuple[str, int]]:
        """Each other member's (status, incarnation) in this node's SWIM view."""
        return self.machine.membership_view()

    # -- NodeService -------------------------------------------------------------------------

    @property
    def tick_seconds(self) -> float:
        return self._tick_seconds

    def tick(self) -> None:
        self._carry_out(self.machine.step(Tick()))

    def receive(self, src: NodeId, message: Message) -> None:
        self._carry_out(self.machine.step(Receive(src=src, message=message)))

    def needed_role(self, request: Message) -> str:
        return READ_WRITE if isinstance(request, GossipPublish) else READ_ONLY

    def call(self, request: Message) -> Message:
        if isinstance(request, GossipPublish):
            rumor = self.publish(request.payload)
            return GossipPublished(origin=rumor.origin, incarnation=rumor.incarnation,
                                   seq=rumor.seq, unix_ms=self._log[-1].unix_ms)
        if isinstance(request, GossipStatusCall):
            return self.status(max(0, min(request.max_rumors, MAX_STATUS_RUMORS)))
        raise ValueError(f"the gossip service does not serve {type(request).__name__}")

    def status(self, max_rumors: int = 100) -> GossipStatus:
        log = list(self._log)[-max_rumors:] if max_rumors else []
        return GossipStatus(
            node=self.node_id, incarnation=self.machine.status()["incarnation"],
            started_incarnation=self.machine.incarnation,
            deliveries=tuple(log),
            members=tuple(GossipMember(node=m, status=s, incarnation=i)
                          for m, (s, i) in sorted(self.membership().items())),
            counters=tuple(sorted(self.counters().items())))

    def counters(self) -> Mapping[str, int]:
        gauges = self.gauges()
        out = {k: v for k, v in self.machine.status().items() if k not in gauges}
        out.update(self._counts)
        return out

    def gauges(self) -> Mapping[str, int]:
        status = self.machine.status()
        return {k: status[k] for k in ("rumors_held", "waves_held", "ids_remembered",
                                       "incarnation")}

    def close(self) -> None:
        for send in self._subscribers:
            send.close()
        self._subscribers.clear()

    # -- carrying out a step -----------------------------------------------------------------

    def _count(self, name: str) -> None:
        self._counts[name] = self._counts.get(name, 0) + 1

    def _record(self, rumor: Rumor) -> None:
        self._log.append(GossipDelivery(
            origin=rumor.origin, incarnation=rumor.incarnation, seq=rumor.seq,
            payload=rumor.payload, unix_ms=math.floor(self._clock() * 1000)))

    def _carry_out(self, ready: GossipReady) -> None:
        for send in ready.sends:
            try:
                if not self._send(send.to, send.message):
                    self._count("send_refused")  # the peer's queue is full
            except (ValueError, EncodeError):
                # Larger than a peer frame (16 MiB): an anti-entropy push of many large
                # rumors. Dropped and counted, never raised into the transport's reader;
                # the next exchange tries again (the machine does not split pushes yet).
                self._count("send_too_large")
        for rumor in ready.published:
            self._record(rumor)
        for rumor in ready.delivered:
            self._record(rumor)
            for callback in self._callbacks:
                callback(rumor)
            for channel in self._subscribers:
                try:
                    channel.send_nowait(rumor)
                except trio.WouldBlock:
                    self._count("subscriber_overflow")
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    self._count("subscriber_closed")
        for change in ready.membership:
            logger.info("%s: gossip: %s is %s (incarnation %d)", self.node_id, change.node,
                        change.status.name, change.incarnation)


def build(context: ServiceContext) -> NodeService:
    """The registry's factory: the node's gossip service from its config and keys."""
    from phalanx.ops.signing_keys import SigningKeyError, load_crypto

    config = context.config
    try:
        crypto = load_crypto(config)
    except SigningKeyError as e:
        raise ServiceError(f"[gossip] needs every node's signing key: {e} (make the cluster "
                           "with `phalanx cluster init --service gossip`)") from None
    options = context.options
    incarnation = next_incarnation(context.state_dir, math.floor(context.wall_clock() * 1000))
    members = [NodeId(m) for m in config.members()]
    machine = GossipMachine(NodeId(config.id), members, crypto=crypto,
                            rng=random.Random(context.rng.getrandbits(64)),
                            config=gossip_config(options), incarnation=incarnation)
    logger.info("%s: gossip: incarnation %d, %d members, tick %d ms", config.id, incarnation,
                len(members), options["tick_ms"])
    return GossipService(machine, send=context.send,
                         tick_seconds=int(options["tick_ms"]) / 1000,
                         wall_clock=context.wall_clock,
                         max_payload=int(options["max_payload"]),
                         keep_delivered=int(options["keep_delivered"]))
