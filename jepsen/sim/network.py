"""The simulated network: seeded latency, loss, duplication, reordering and directed cuts.

Owns: `NetworkConfig` (the packet-level knobs) and `SimNetwork`, which carries messages
between simulated nodes through the `EventLoop`. Each message optionally goes through the
wire codec (encode at send, decode at delivery), so an unencodable message fails the run
exactly as it would fail a real cluster.

Model:
- Latency is `min_latency + Exp(mean_jitter)`, scaled by `delay_factor`; independent draws
  reorder messages naturally.
- Loss and duplication are per-message Bernoulli draws; a duplicate gets its own latency.
- Straggling (`straggle`): a per-message Bernoulli draw adds a long extra delay, uniform in
  `[straggle_min_ns, straggle_max_ns)`, so a message overtakes nothing but is overtaken by
  everything sent after it (an old RequestVote arriving after its receiver restarted).
- Partitions are a set of blocked *directed* links `(src, dst)`, so asymmetric partitions are
  natural. A link is checked at send and again at delivery: a message in flight when a cut
  happens is lost, as a TCP connection reset would lose it.
- With a `wan` (`phalanx.jepsen.sim.wan.WanModel`), the latency of a message is the WAN's
  instead (regions, a round-trip table, jitter, bandwidth queues, inter-region loss), scaled
  by `delay_factor`; the nemesis' loss, duplication and straggling still apply. Without one
  (the default), the model above, draw for draw.
- With the WAN's CPU model (`WanConfig.cpu`, `phalanx.jepsen.sim.cpu.CpuModel`), an arrived
  message waits for its node's CPU; what the node sends while handling it (counted as
  `FastCrypto.OPS` moved) departs when the handling ends, and what it sends while busy
  otherwise departs when the CPU is free. A client's request to a node (`local`) waits in
  the same queue and is charged the same way; without the CPU model `local` runs it now.

Rules:
- All randomness comes from the injected `random.Random`; no clocks, no global random.
- Never iterates a set to decide behaviour (membership tests only).
- Must not import consensus cores or storage; nodes are plain names and delivery a callback.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from heapq import heappush as _push
from math import log
from typing import Any

from phalanx.consensus.crypto import FastCrypto
from phalanx.consensus.types import Message
from phalanx.jepsen.sim.cpu import CpuModel
from phalanx.jepsen.sim.loop import Event, EventLoop, Trace
from phalanx.jepsen.sim.wan import WanModel


class _Local:
    """Work a node does for a client (`SimNetwork.local`), queued as a message."""

    __slots__ = ("many", "request", "work")

    def __init__(self, work: Callable[[], None], request: object,
                 many: Callable[[tuple[Any, ...]], None] | None) -> None:
        self.work = work
        self.request = request
        self.many = many


Deliver = Callable[[str, str, Message], None]
Receive = Callable[[str, Message], None]
"""A node's own delivery callback, `(src, message)` (see `SimNetwork.route`)."""
Watch = Callable[[str, str, Message], None]
Encode = Callable[[Message], bytes]
Decode = Callable[[bytes], Message]


@dataclass(slots=True, kw_only=True)
class NetworkConfig:
    """Packet-level behaviour. Mutable: the nemesis changes loss/duplicate/delay at run time."""

    min_latency_ns: int = 100_000
    mean_jitter_ns: int = 900_000
    loss: float = 0.0
    duplicate: float = 0.0
    delay_factor: float = 1.0
    straggle: float = 0.0
    straggle_min_ns: int = 5_000_000
    straggle_max_ns: int = 60_000_000

    def __post_init__(self) -> None:
        if self.min_latency_ns < 0 or self.mean_jitter_ns < 0:
            raise ValueError("latencies must be >= 0")
        if not 0 <= self.straggle_min_ns < self.straggle_max_ns:
            raise ValueError("need 0 <= straggle_min_ns < straggle_max_ns")
        for name in ("loss", "duplicate", "straggle"):
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} must be a probability, got {p}")
        if self.delay_factor <= 0:
            raise ValueError(f"delay_factor must be > 0, got {self.delay_factor}")


@dataclass(slots=True)
class NetworkStats:
    sent: int = 0
    delivered: int = 0
    dropped_partition: int = 0
    dropped_loss: int = 0
    duplicated: int = 0
    straggled: int = 0
    bytes_sent: int = 0
    by_class: dict[type, int] = field(default_factory=dict)
    """Messages sent per class (see `by_type` for the names)."""
    sent_by: dict[str, int] = field(default_factory=dict)
    """Messages sent per source node (a full mesh's hot spot shows here)."""
    bytes_by_class: dict[type, int] = field(default_factory=dict)
    """Encoded bytes sent per class (a network with an encoder only)."""

    def runaway(self, *, events: int, max_events: int, max_bytes: int, now_ns: int) -> str:
        """The run's `runaway` violation: which budget tripped, and the message kinds the
        bytes went to (a storm shows its kind: docs/LEADERLESS.md "Runaway seeds")."""
        total = max(1, self.bytes_sent)
        kinds: dict[str, int] = {}
        for cls, n in self.bytes_by_class.items():
            kinds[cls.__name__] = kinds.get(cls.__name__, 0) + n
        top = sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
        tripped = [f"{events} events (budget {max_events})"] if events > max_events else []
        if self.bytes_sent > max_bytes:
            tripped.append(f"{self.bytes_sent} bytes sent (budget {max_bytes})")
        return (f"runaway: {' and '.join(tripped)} by t={now_ns / 1e6:.3f}ms, "
                f"{self.sent} messages (a message storm or a livelock); bytes by kind: "
                + (", ".join(f"{k} {100 * n // total}%" for k, n in top) or "not measured"))

    def by_type(self) -> dict[str, int]:
        """Messages sent per class name, sorted by name."""
        counts: dict[str, int] = {}
        for cls, n in self.by_class.items():
            counts[cls.__name__] = counts.get(cls.__name__, 0) + n
        return dict(sorted(counts.items()))


_SHARED_FRAMES = 4
"""The shared-frame memo holds up to this many times `decode_memo` frames (`_share`)."""

_SHARED_BYTES = 64 << 20
"""... and at most this many bytes of them (a PBFT NewView weighs up to MBs)."""


def _no_decode(data: bytes) -> Message:
    raise RuntimeError("a message arrived encoded, but this network has no decoder")


class SimNetwork:
    """Carries messages between named nodes in virtual time."""

    def __init__(
        self,
        loop: EventLoop,
        rng: random.Random,
        trace: Trace,
        deliver: Deliver,
        *,
        config: NetworkConfig | None = None,
        encode: Encode | None = None,
        decode: Decode | None = None,
        trace_messages: bool = True,
        watch: Watch | None = None,
        watch_types: frozenset[type] | None = None,
        decode_memo: int = 0,
        wan: WanModel | None = None,
    ) -> None:
        """`watch(src, dst, message)` sees every message sent whose class is in `watch_types`
        (every message when None), before any fault applies to it.

        `decode_memo` > 0 keeps up to that many decoded messages by their bytes and reuses
        them (the memo is cleared when full): heartbeats and their answers repeat byte for
        byte. It also turns on the shared-frame memo: a frame a node sends to several peers
        (one message object, encoded once) is decoded once for all of them, whatever
        arrives in between (`_share`). Only for a `decode` that is a pure function of the
        bytes into an immutable message (the codec's is)."""
        if (encode is None) != (decode is None):
            raise ValueError("give both encode and decode, or neither")
        self.loop = loop
        self.rng = rng
        self.trace = trace
        self.config = config if config is not None else NetworkConfig()
        self.stats = NetworkStats()
        self.byte_budget = 1 << 62
        """Once `stats.bytes_sent` exceeds it, `loop.halted` is set (a runaway guard)."""
        self._deliver = deliver
        self._encode = encode
        # The last message encoded and its bytes: a broadcast sends one (immutable) message
        # object to every peer, encoded once (a NewView or ViewChange weighs up to MBs).
        self._last_sent: Message | None = None
        self._last_payload = b""
        self._decode: Decode = decode if decode is not None else _no_decode
        if decode_memo < 0:
            raise ValueError(f"decode_memo must be >= 0, got {decode_memo}")
        self._memo_size = decode_memo
        self._memo: dict[bytes, Message] = {}
        self._shared: dict[bytes, Message | None] = {}
        """Frames sent to several peers, by their bytes, oldest first: decoded at their
        first arrival (None until then) and kept for the other copies (`_share`)."""
        self._shared_bytes = 0
        self._last_shared = False
        self.decoded = 0
        """Frames decoded (a report's: the memos' misses)."""
        self._random = rng.random
        near, far, next_seq = loop.raw_queue()
        self._near: list[Event] = near
        self._far: list[Event] = far
        self._next_seq = next_seq
        self._arrive_event = self._arrive  # (one bound method for every delivery event)
        self._blocked: set[tuple[str, str]] = set()
        self._trace_messages = trace_messages
        self._trace_records, self._trace_batch, self._trace_flush = trace.records()
        self._watch = watch
        self._watch_types = watch_types
        self._routes: dict[str, Receive] = {}
        self.wan = wan
        self.cpu: CpuModel | None = None
        if wan is not None and wan.config.cpu is not None:
            self.cpu = CpuModel(wan.config.cpu, self._process, self._call_at)
            self._arrive_event = self._arrive_cpu
        self._cpu_node: str | None = None
        """The node whose message is being handled under the CPU model (its sends wait)."""
        self._cpu_sends: list[tuple[str, str, Message]] = []

    def _call_at(self, when: int, function: Callable[[object], None], argument: object) -> None:
        """`function(argument)` at virtual time `when` (>= now; see `EventLoop.raw_queue`)."""
        _push(self._near if when < self.loop.horizon else self._far,
              (when, self._next_seq(), function, argument))

    def route(self, dst: str, receive: Receive) -> None:
        """Deliver messages for `dst` by calling `receive(src, message)` instead of the
        `deliver` callback (one call less per message; the same order and effect)."""
        self._routes[dst] = receive

    # -- partitions -------------------------------------------------------------------------

    def block(self, links: Iterable[tuple[str, str]]) -> None:
        """Cut each directed link `(src, dst)`: messages from src to dst are dropped."""
        self._blocked.update(links)

    def heal(self) -> None:
        self._blocked.clear()

    def blocked(self, src: str, dst: str) -> bool:
        return (src, dst) in self._blocked

    # -- sending ----------------------------------------------------------------------------

    def _latency(self) -> int:
        cfg = self.config
        rng = self.rng
        # `rng.expovariate(1.0 / mean)` inlined (the same arithmetic, so the same draws).
        jitter = -log(1.0 - rng.random()) / (1.0 / cfg.mean_jitter_ns) if cfg.mean_jitter_ns \
            else 0.0
        latency = int((cfg.min_latency_ns + jitter) * cfg.delay_factor)
        if cfg.straggle and rng.random() < cfg.straggle:
            self.stats.straggled += 1
            latency += rng.randrange(cfg.straggle_min_ns, cfg.straggle_max_ns)
        return latency

    def send(self, src: str, dst: str, message: Message) -> None:
        if self._cpu_node is not None and src == self._cpu_node:
            self._cpu_sends.append((src, dst, message))
            return
        kind = type(message)
        watch = self._watch
        if watch is not None:
            types = self._watch_types
            if types is None or kind in types:
                watch(src, dst, message)
        stats = self.stats
        stats.sent += 1
        counts = stats.by_class
        counts[kind] = counts.get(kind, 0) + 1
        by_src = stats.sent_by
        by_src[src] = by_src.get(src, 0) + 1
        payload: bytes | Message
        encode = self._encode
        if encode is not None:
            if message is self._last_sent:
                payload = self._last_payload
                if not self._last_shared and self._memo_size:
                    self._last_shared = True
                    self._share(payload)
            else:
                payload = self._last_payload = encode(message)
                self._last_sent = message
                self._last_shared = False
            stats.bytes_sent += len(payload)
            per_class = stats.bytes_by_class
            per_class[kind] = per_class.get(kind, 0) + len(payload)
            if stats.bytes_sent > self.byte_budget:
                self.loop.halted = True
        else:
            payload = message
        blocked = self._blocked
        if blocked and (src, dst) in blocked:
            stats.dropped_partition += 1
            return
        if self.wan is not None:
            self._send_wan(src, dst, message, payload)
            return
        cfg = self.config
        if cfg.loss and self._random() < cfg.loss:
            stats.dropped_loss += 1
            if self._trace_messages:
                self.trace(f"{src}->{dst} LOST {message}")
            return
        if cfg.duplicate and self._random() < cfg.duplicate:
            stats.duplicated += 1
            # `loop.call_later(self._latency(), ...)`, inlined as below.
            when = self.loop.now + self._latency()
            _push(self._near if when < self.loop.horizon else self._far,
                  (when, self._next_seq(), self._arrive_event, (src, dst, payload)))
        if cfg.straggle:
            latency = self._latency()
        else:  # `_latency()` inlined for the common case (the same draws and arithmetic)
            mean = cfg.mean_jitter_ns
            jitter = -log(1.0 - self._random()) / (1.0 / mean) if mean else 0.0
            latency = int((cfg.min_latency_ns + jitter) * cfg.delay_factor)
        # `loop.call_later(latency, ...)`, inlined (`EventLoop.raw_queue`; latency >= 0:
        # every term is), as the event `_arrive((src, dst, payload))`.
        loop = self.loop
        when = loop.now + latency
        _push(self._near if when < loop.horizon else self._far,
              (when, self._next_seq(), self._arrive_event, (src, dst, payload)))

    def _send_wan(self, src: str, dst: str, message: Message, payload: bytes | Message
                  ) -> None:
        """`send`'s faults and scheduling with the WAN's latency (see the module docstring)."""
        wan = self.wan
        assert wan is not None
        stats = self.stats
        cfg = self.config
        loop = self.loop
        cpu = self.cpu
        start = loop.now if cpu is None else cpu.free_at(src, loop.now)
        if cfg.loss and self._random() < cfg.loss:
            stats.dropped_loss += 1
            if self._trace_messages:
                self.trace(f"{src}->{dst} LOST {message}")
            return
        size = len(payload) if isinstance(payload, bytes) else 0
        copies = 1
        if cfg.duplicate and self._random() < cfg.duplicate:
            stats.duplicated += 1
            copies = 2
        for _ in range(copies):
            delay = wan.delay(src, dst, size, start)
            if delay is None:  # (counted by the WAN: `WanModel.dropped`)
                continue
            delay = int(delay * cfg.delay_factor) + start - loop.now
            if cfg.straggle and self._random() < cfg.straggle:
                stats.straggled += 1
                delay += self.rng.randrange(cfg.straggle_min_ns, cfg.straggle_max_ns)
            when = loop.now + delay
            _push(self._near if when < loop.horizon else self._far,
                  (when, self._next_seq(), self._arrive_event, (src, dst, payload)))

    def local(self, node: str, work: Callable[[], None], request: object = None,
              many: Callable[[tuple[Any, ...]], None] | None = None) -> None:
        """Run `work` (the handling of client `request` at `node`) now, or under the CPU
        model as a message to `node`: queued behind what it is busy with and charged its
        cost. With `many`, the node takes every request waiting in its queue with the same
        `many` together, `many(requests)`, as a driver pass steps the client writes it
        found (each request is charged `message_us`, the crypto once as performed)."""
        cpu = self.cpu
        if cpu is None:
            work()
            return
        cpu.arrive((node, node, _Local(work, request, many)), self.loop.now)

    def _arrive_cpu(self, item: tuple[str, str, bytes | Message]) -> None:
        """A message arrives under the CPU model: its node takes it when free (`_process`;
        a link cut meanwhile drops it then, as for one in flight)."""
        cpu = self.cpu
        assert cpu is not None
        cpu.arrive(item, self.loop.now)

    def _process(self, item: tuple[str, str, object]) -> int:
        """The CPU model's handling of one message (now): deliver it with the node's sends
        held, charge the crypto its core performed, and send them when the CPU is done."""
        cpu = self.cpu
        assert cpu is not None
        node = item[1]
        ops = FastCrypto.OPS
        signs, verifies, macs = ops
        self._cpu_node = node
        handled = 1
        try:
            payload = item[2]
            if type(payload) is _Local:
                many = payload.many
                taken = [] if many is None else cpu.take(
                    node, lambda i: type(i[2]) is _Local and i[2].many is many)
                if many is not None and taken:
                    handled += len(taken)
                    many((payload.request,
                          *(i[2].request for i in taken)))  # type: ignore[attr-defined]
                else:
                    payload.work()
            else:
                self._arrive(item)  # type: ignore[arg-type]
        finally:
            self._cpu_node = None
        cost = cpu.costs.cost_ns(ops[0] - signs, ops[1] - verifies, ops[2] - macs, handled)
        sends, self._cpu_sends = self._cpu_sends, []
        if sends:
            # Sent at the end of the handling: `free_at` is that time while they go out.
            cpu.busy_until(node, self.loop.now + cost)
            for src, dst, message in sends:
                self.send(src, dst, message)
        return cost

    def _share(self, payload: bytes) -> None:
        """`payload` goes to several peers (a broadcast; a gossip wave's leaf calls, byte
        for byte the same from every node that makes them): decode it once for all its
        copies. They arrive over up to a WAN's longest one-way delay plus queueing, while
        the general memo (`decode_memo` entries, cleared when full) is flushed in a few
        simulated ms at n = 180 by frames that never repeat (one batch's ~32,000 MAC'd
        commits, one per peer), so it alone decoded most copies again, each to a new
        object that the crypto memo then met as new. Bounded: the oldest entries go past
        `_SHARED_FRAMES` times `decode_memo` entries or `_SHARED_BYTES` bytes."""
        shared = self._shared
        if payload in shared:  # (equal bytes from another sender: now the newest)
            held = shared.pop(payload)
        else:
            held = None
            self._shared_bytes += len(payload)
        shared[payload] = held
        limit = _SHARED_FRAMES * self._memo_size
        while len(shared) > limit or self._shared_bytes > _SHARED_BYTES:
            oldest = next(iter(shared))
            del shared[oldest]
            self._shared_bytes -= len(oldest)

    def _arrive(self, item: tuple[str, str, bytes | Message]) -> None:
        src, dst, payload = item
        blocked = self._blocked
        if blocked and (src, dst) in blocked:
            self.stats.dropped_partition += 1
            return
        if isinstance(payload, bytes):
            memo = self._memo
            cached = memo.get(payload)
            if cached is None:
                shared = self._shared
                cached = shared.get(payload)
                if cached is None:
                    cached = self._decode(payload)
                    self.decoded += 1
                    if payload in shared:
                        shared[payload] = cached
                    elif self._memo_size:
                        if len(memo) >= self._memo_size:
                            memo.clear()
                        memo[payload] = cached
            message = cached
            self.stats.delivered += 1
            if self._trace_messages:
                # `self.trace.message(src, dst, message, payload)`, inlined.
                records = self._trace_records
                records.append((self.loop.now, src, dst, message, payload))
                if len(records) >= self._trace_batch:
                    self._trace_flush()
        else:
            message = payload
            self.stats.delivered += 1
            if self._trace_messages:
                self.trace(f"{src}->{dst} {message}")
        receive = self._routes.get(dst)
        if receive is not None:
            receive(src, message)
        else:
            self._deliver(src, dst, message)
