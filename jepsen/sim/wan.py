"""A wide-area network for the simulator: nodes and clients in regions, a published
inter-region round-trip table, jitter, per-link and per-node bandwidth, and loss.

Owns: `WanConfig` (the knobs, part of `RunConfig.wan`), `WanModel` (placement and the
delay of one message), `rtt_table()` (the data file `wan_rtt.csv`, with its source) and
`SPREAD` (the order in which regions are taken: the first k spread over continents).

Model (one message of `size` bytes from `src` to `dst`, sent at `now`):
- placement: the i-th node of the setup's name order is in region ``i % k``, client ``c<i>``
  in region ``i % k`` (so every region holds nodes and clients);
- propagation: half the pair's round trip (the table's two directions averaged; within a
  region `intra_rtt_ms`), plus jitter drawn from Exp(mean = `jitter_pct` % of it);
- bandwidth: the message first leaves the sender's uplink (`uplink_mbps`, shared by all its
  messages, FIFO), then crosses the directed link (`link_mbps`, FIFO per (src, dst)); each
  costs ``size * 8 / rate`` and a message waits for the ones queued before it. A rate of 0
  is unlimited. Without the codec a message has no size (no serialisation cost);
- loss: each message between two regions is lost with probability `loss`;
- CPU (opt-in, `cpu`): each node handles its received messages one at a time, each costing
  virtual time, and what it sends leaves when it is done (`phalanx.jepsen.sim.cpu`).

Rules: deterministic (the injected `random.Random` only; queues are plain dicts keyed by
names, never iterated); imports no core, node or run; the default run has no WAN at all
(`RunConfig.wan is None`: the network's original model, bit for bit).
"""

from __future__ import annotations

import csv
import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from math import log
from pathlib import Path

from phalanx.jepsen.sim.cpu import CpuCosts

MS = 1_000_000
TABLE = Path(__file__).with_name("wan_rtt.csv")
SPREAD = ("us-east-1", "eu-central-1", "ap-northeast-1", "ap-southeast-2", "sa-east-1",
          "us-west-2", "eu-west-1", "ap-southeast-1", "ap-northeast-2", "us-west-1")
"""Regions in the order `WanConfig.regions` takes them: five continents first (N. Virginia,
Frankfurt, Tokyo, Sydney, São Paulo), then the rest of the table."""


@cache
def rtt_table() -> dict[tuple[str, str], float]:
    """(from, to) -> average round trip in ms, from `wan_rtt.csv` (the source is in its
    header). The diagonal is left out (see `WanConfig.intra_rtt_ms`)."""
    rows = [r for r in csv.reader(
        line for line in TABLE.read_text().splitlines() if line and not line.startswith("#"))]
    header = rows[0][1:]
    table: dict[tuple[str, str], float] = {}
    for row in rows[1:]:
        for to, value in zip(header, row[1:], strict=True):
            if to != row[0]:
                table[(row[0], to)] = float(value)
    return table


@dataclass(frozen=True, slots=True, kw_only=True)
class WanConfig:
    """The WAN of a run (`RunConfig.wan`); see the module docstring for the model."""

    regions: int = 5
    jitter_pct: float = 10.0
    """Mean of the exponential jitter, percent of the one-way propagation delay."""
    link_mbps: float = 100.0
    """Bandwidth of each directed node-to-node link (0: unlimited)."""
    uplink_mbps: float = 1_000.0
    """Bandwidth of each node's uplink, shared by everything it sends (0: unlimited)."""
    loss: float = 0.0
    """Probability that a message between two different regions is lost."""
    intra_rtt_ms: float = 1.0
    """Round trip inside one region (between availability zones: ~0.25-3.4 ms measured)."""
    cpu: CpuCosts | None = None
    """The CPU model (`phalanx.jepsen.sim.cpu`): each node handles its received messages one
    at a time at these costs. None (the default): processing takes no virtual time."""

    def __post_init__(self) -> None:
        if not 1 <= self.regions <= len(SPREAD):
            raise ValueError(f"regions must be 1..{len(SPREAD)}, got {self.regions}")
        if min(self.jitter_pct, self.link_mbps, self.uplink_mbps, self.intra_rtt_ms) < 0:
            raise ValueError("WAN jitter, bandwidths and intra-region RTT must be >= 0")
        if not 0.0 <= self.loss <= 1.0:
            raise ValueError(f"WAN loss must be a probability, got {self.loss}")

    @property
    def names(self) -> tuple[str, ...]:
        return SPREAD[: self.regions]

    def rtt_ms(self, a: int, b: int) -> float:
        """The round trip between regions `a` and `b` (indexes into `names`)."""
        if a == b:
            return self.intra_rtt_ms
        ra, rb = self.names[a], self.names[b]
        table = rtt_table()
        return (table[(ra, rb)] + table[(rb, ra)]) / 2

    @property
    def max_rtt_ns(self) -> int:
        k = self.regions
        return int(max(self.rtt_ms(a, b) for a in range(k) for b in range(k)) * MS)

    def tick_ns(self, base_ns: int) -> int:
        """The node tick sized to this WAN: at least `base_ns` and a quarter of the longest
        round trip, so tick-counted timers (elections, view changes, re-sends) outlast a
        round trip as they outlast the default network's."""
        return max(base_ns, (self.max_rtt_ns // 4 // MS) * MS)

    def describe(self) -> str:
        return (f"{self.regions} regions ({', '.join(self.names)}), jitter {self.jitter_pct:g}%, "
                f"link {self.link_mbps:g} Mbit/s, uplink {self.uplink_mbps:g} Mbit/s, "
                f"loss {self.loss:g}" + (f", {self.cpu.describe()}" if self.cpu else ""))


def client_index(client_id: str) -> int:
    """The client number of an id ``c<i>`` or a session ``c<i>.<generation>``; another
    id gets a stable number from its bytes."""
    head = client_id.split(".", 1)[0]
    if head[:1] == "c" and head[1:].isdigit():
        return int(head[1:])
    return zlib.crc32(client_id.encode())


class WanModel:
    """Placement and per-message delays of one run (see the module docstring)."""

    __slots__ = ("_client_rng", "_link_free", "_link_ns_per_byte", "_loss", "_one_way",
                 "_region", "_rng", "_up_free", "_up_ns_per_byte", "config", "dropped")

    def __init__(self, config: WanConfig, nodes: Sequence[str], rng: random.Random,
                 client_rng: random.Random) -> None:
        self.config = config
        k = config.regions
        self._region = {name: i % k for i, name in enumerate(nodes)}
        self._one_way = [[config.rtt_ms(a, b) * MS / 2 for b in range(k)] for a in range(k)]
        self._rng = rng
        self._client_rng = client_rng
        self._loss = config.loss
        self._up_ns_per_byte = 8_000 / config.uplink_mbps if config.uplink_mbps else 0.0
        self._link_ns_per_byte = 8_000 / config.link_mbps if config.link_mbps else 0.0
        self._up_free: dict[str, float] = {}
        self._link_free: dict[tuple[str, str], float] = {}
        self.dropped = 0
        """Messages lost to `WanConfig.loss`."""

    def region(self, node: str) -> str:
        return self.config.names[self._region[node]]

    def delay(self, src: str, dst: str, size: int, now: int) -> int | None:
        """Nanoseconds from `now` until the message arrives, or None when it is lost."""
        a = self._region.get(src, 0)
        b = self._region.get(dst, 0)
        if a != b and self._loss and self._rng.random() < self._loss:
            self.dropped += 1
            return None
        start = float(now)
        # An empty message queues too: it must not overtake one still being sent (FIFO).
        per = self._up_ns_per_byte
        if per:
            start = max(start, self._up_free.get(src, 0.0)) + size * per
            self._up_free[src] = start
        per = self._link_ns_per_byte
        if per:
            link = (src, dst)
            start = max(start, self._link_free.get(link, 0.0)) + size * per
            self._link_free[link] = start
        one_way = self._one_way[a][b]
        return int(start - now + one_way + self._jitter(self._rng, one_way))

    def client_delay(self, client_id: str, node: str) -> int:
        """One way between a client and a node (no bandwidth cost: requests are small)."""
        a = client_index(client_id) % self.config.regions
        one_way = self._one_way[a][self._region.get(node, 0)]
        return int(one_way + self._jitter(self._client_rng, one_way))

    def _jitter(self, rng: random.Random, one_way: float) -> float:
        mean = one_way * self.config.jitter_pct / 100
        return -log(1.0 - rng.random()) * mean if mean else 0.0
