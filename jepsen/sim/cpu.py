"""An opt-in CPU model for the simulator's WAN: a node processes the messages it receives one
at a time and each costs virtual time (`WanConfig.cpu`, `phalanx sim --cpu-model`).

Owns: `CpuCosts` (the per-operation costs, with the measured defaults and their source) and
`CpuModel` (each node's queue of arrived messages and the time its CPU is free again).

Model (per node, FIFO):
- a message that arrives while the node is busy waits in the node's queue; the node then
  takes them one at a time in arrival order;
- processing one costs ``message_us`` plus ``verify_us`` per signature verified, ``sign_us``
  per signature made and ``mac_us`` per MAC made or checked while the core handled it
  (counted by `FastCrypto.OPS`, the operations the core really performed); the node is busy
  for that long;
- what the node sends while handling it leaves when the processing ends (start + cost), then
  queues on the uplink and the link as before (`wan.WanModel.delay`);
- a client's request reaching a node is queued and charged like a message (its handling:
  the PBFT primary's batching, the leaderless node's check of the client's signature and
  its endorsement; `SimNetwork.local`);
- timer ticks are not queued nor charged (a simplification), but what the node sends then
  still waits until its CPU is free; answers to clients leave through the run, not the
  network, and are not delayed by the handling that produced them.

Default costs (`CpuCosts()`), measured on the development machine by `bench/cpu_costs.py`
(2026-12-02, 2 cores shared with other work, load ~11, Python 3.11, libsodium through
PyNaCl; docs/SCALE.md "The CPU model"): Ed25519 sign 19-21 µs and verify 49-50 µs
(`net.crypto.Ed25519Crypto` on a PBFT `Prepare` and a leaderless `Endorsement`),
HMAC-SHA256 1.7 µs to make and 3.6-4.6 µs to check, and 30.5 µs (PBFT) and 37.8 µs
(leaderless) per received message for the rest of what the simulated node does with it
(decode, the core's step, the driver's handling of its Ready).

Rules: deterministic (virtual time only; queues are dicts keyed by node name, never
iterated); imports no core; without `WanConfig.cpu` the network never calls it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

US = 1_000


@dataclass(frozen=True, slots=True, kw_only=True)
class CpuCosts:
    """Virtual CPU time per operation, in microseconds (see the module docstring)."""

    message_us: float = 35.0
    """Per received message: decode, the core's step and the driver's work."""
    verify_us: float = 50.0
    """Per signature verified (Ed25519, libsodium)."""
    sign_us: float = 20.0
    """Per signature made (Ed25519, libsodium)."""
    mac_us: float = 3.0
    """Per MAC made or checked (HMAC-SHA256)."""

    def __post_init__(self) -> None:
        if min(self.message_us, self.verify_us, self.sign_us, self.mac_us) < 0:
            raise ValueError("CPU costs must be >= 0")

    def cost_ns(self, signs: int, verifies: int, macs: int, messages: int = 1) -> int:
        return int((messages * self.message_us + signs * self.sign_us
                    + verifies * self.verify_us + macs * self.mac_us) * US)

    def describe(self) -> str:
        return (f"cpu {self.message_us:g} us/message + {self.verify_us:g} us/verify + "
                f"{self.sign_us:g} us/sign + {self.mac_us:g} us/MAC")


Process = Callable[[tuple[str, str, object]], int]
"""Handle one arrived message now; returns its CPU cost in ns."""
Schedule = Callable[[int, Callable[[object], None], object], None]
"""`(at_ns, callback, argument)`: call `callback(argument)` at virtual time `at_ns`."""


class CpuModel:
    """Each node's queue and busy time (see the module docstring)."""

    __slots__ = ("_busy", "_process", "_queues", "_schedule", "costs", "handled", "max_queue",
                 "queued", "spent", "waited")

    def __init__(self, costs: CpuCosts, process: Process, schedule: Schedule) -> None:
        self.costs = costs
        self._process = process
        self._schedule = schedule
        self._busy: dict[str, int] = {}
        """Node -> the virtual time its CPU is free again."""
        self._queues: dict[str, deque[tuple[tuple[str, str, object], int]]] = {}
        """Node -> its waiting messages, each with its arrival time."""
        self.queued = 0
        """Messages that had to wait for a busy CPU."""
        self.max_queue = 0
        """The longest queue seen at any node."""
        self.spent: dict[str, int] = {}
        """Node -> virtual CPU ns it spent handling messages."""
        self.waited: dict[str, int] = {}
        """Node -> the virtual ns its messages spent waiting in its queue, summed."""
        self.handled: dict[str, int] = {}
        """Node -> messages it handled."""

    def free_at(self, node: str, now: int) -> int:
        """When `node`'s CPU is free (`now` if it is idle)."""
        return max(now, self._busy.get(node, 0))

    def busy_until(self, node: str, at: int) -> None:
        """`node`'s CPU is busy until `at` (set while its sends of a handling go out)."""
        self._busy[node] = max(self._busy.get(node, 0), at)

    def arrive(self, item: tuple[str, str, object], now: int) -> None:
        """A message `(src, dst, payload)` reached `dst` at `now`."""
        dst = item[1]
        queue = self._queues.get(dst)
        if queue:  # others wait before it: the node is (or will be) busy with them
            queue.append((item, now))
            self.queued += 1
            self.max_queue = max(self.max_queue, len(queue))
            return
        busy = self._busy.get(dst, 0)
        if busy > now:
            self._queues[dst] = deque(((item, now),))
            self.queued += 1
            self.max_queue = max(self.max_queue, 1)
            self._schedule(busy, self._next, dst)
            return
        cost = self._process(item)
        self._busy[dst] = now + cost
        self.spent[dst] = self.spent.get(dst, 0) + cost
        self.handled[dst] = self.handled.get(dst, 0) + 1

    def take(self, node: str, match: Callable[[tuple[str, str, object]], bool]
             ) -> list[tuple[str, str, object]]:
        """Remove and return the messages waiting at `node` that `match` (in arrival order;
        the others keep theirs): handled now, with the one being handled."""
        queue = self._queues.get(node)
        if not queue:
            return []
        now = self._busy.get(node, 0)
        taken: list[tuple[str, str, object]] = []
        kept: deque[tuple[tuple[str, str, object], int]] = deque()
        waited = 0
        for item, arrived in queue:
            if match(item):
                taken.append(item)
                waited += max(0, now - arrived)
            else:
                kept.append((item, arrived))
        if taken:
            queue.clear()
            queue.extend(kept)
            self.waited[node] = self.waited.get(node, 0) + waited
            self.handled[node] = self.handled.get(node, 0) + len(taken)
        return taken

    def stats(self) -> dict[str, int]:
        """The run's `RunResult.stats` entries of the model: messages that queued, the
        longest queue, the busiest node's CPU time (ms), its number (``n7``: 7; -1 if its
        name has none), the messages it handled and their summed queueing time (ms), and
        the summed queueing time of every message at every node (ms)."""
        spent = self.spent
        busiest = min(spent, key=lambda n: (-spent[n], n)) if spent else ""
        number = busiest[1:]
        return {"cpu_queued": self.queued, "cpu_max_queue": self.max_queue,
                "cpu_busiest_ms": spent.get(busiest, 0) // 1_000_000,
                "cpu_busiest_node": int(number) if number.isdigit() else -1,
                "cpu_busiest_handled": self.handled.get(busiest, 0),
                "cpu_busiest_wait_ms": self.waited.get(busiest, 0) // 1_000_000,
                "cpu_wait_ms": sum(self.waited.values()) // 1_000_000,
                "cpu_handled": sum(self.handled.values())}

    def _next(self, node: object) -> None:
        """The node's CPU is free: take the first queued message."""
        assert isinstance(node, str)
        queue = self._queues[node]
        item, arrived = queue.popleft()
        start = self._busy[node]  # now: this callback was scheduled for then
        self.waited[node] = self.waited.get(node, 0) + start - arrived
        cost = self._process(item)
        self._busy[node] = done = start + cost
        self.spent[node] = self.spent.get(node, 0) + cost
        self.handled[node] = self.handled.get(node, 0) + 1
        if queue:  # (`take` may have emptied it while `_process` ran)
            self._schedule(done, self._next, node)
        else:
            del self._queues[node]
