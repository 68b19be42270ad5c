"""The simulator CPU model's costs, measured on this machine (`phalanx.jepsen.sim.cpu`).

Prints, in CPU microseconds (`time.process_time`, median of 5 interleaved rounds):
- Ed25519 sign and verify of `net.crypto.Ed25519Crypto` (libsodium) on a PBFT `Prepare` and
  a leaderless `Endorsement`, and an HMAC-SHA256 MAC and its check;
- per received message, what the simulator's node does besides real crypto: decode, the
  core's step and the driver's handling of the Ready (its sends included), averaged over
  every delivery of a 10-node WAN run of PBFT and of the leaderless core (FastCrypto's
  keyed BLAKE2b stand-ins included: a few µs).

Usage: `python bench/cpu_costs.py [--rounds 5]` (~1 min). Compare with `CpuCosts()`'s
defaults (docs/SCALE.md "The CPU model"); say the load (`uptime`) with the figures.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

from phalanx.consensus.leaderless.messages import LEADERLESS_MESSAGES, Endorsement
from phalanx.consensus.pbft.messages import PBFT_MESSAGES, Prepare
from phalanx.consensus.types import NodeId
from phalanx.jepsen.sim import network
from phalanx.jepsen.sim.run import RunConfig, run
from phalanx.jepsen.sim.wan import WanConfig
from phalanx.net import wire
from phalanx.net.crypto import ed25519_cluster
from phalanx.protocols import FaultModel
from phalanx.protocols import get as protocol_spec
from phalanx.protocols import names as protocol_names

MS = 1_000_000


def per_call_us(fn: Callable[[], object], calls: int) -> float:
    t0 = time.process_time()
    for _ in range(calls):
        fn()
    return (time.process_time() - t0) / calls * 1e6


def crypto_rounds(rounds: int, calls: int = 2_000) -> dict[str, list[float]]:
    wire.register_all(PBFT_MESSAGES)
    wire.register_all(LEADERLESS_MESSAGES)
    keys = ed25519_cluster((NodeId("n1"), NodeId("n2")), seed=b"bench")
    me, peer = keys[NodeId("n1")], keys[NodeId("n2")]
    messages = {"prepare": Prepare(view=0, seq=7, digest=b"d" * 32, replica=NodeId("n1")),
                "endorsement": Endorsement(tx_id=b"t" * 32, endorser=NodeId("n1"),
                                           conditions=(b"c" * 32,))}
    out: dict[str, list[float]] = {}
    for _ in range(rounds):  # interleaved: every figure once per round
        for name, msg in messages.items():
            sig = me.sign(msg)
            tag = me.mac(NodeId("n2"), msg)
            out.setdefault(f"sign {name}", []).append(per_call_us(lambda m=msg: me.sign(m),
                                                                  calls))
            out.setdefault(f"verify {name}", []).append(per_call_us(
                lambda m=msg, s=sig: peer.verify(NodeId("n1"), m, s), calls))
            out.setdefault(f"mac {name}", []).append(per_call_us(
                lambda m=msg: me.mac(NodeId("n2"), m), calls))
            out.setdefault(f"check mac {name}", []).append(per_call_us(
                lambda m=msg, t=tag: peer.verify_mac(NodeId("n1"), m, t), calls))
    return out


def per_message_us(protocol: str) -> float:
    """CPU µs per delivery spent in the network's handling of an arrived message (decode,
    the node's step and Ready: everything but the event loop and the sends' scheduling)."""
    spent = [0.0, 0]
    original = network.SimNetwork._arrive

    def timed(self: network.SimNetwork, item: tuple[str, str, object]) -> None:
        t0 = time.process_time()
        original(self, item)  # type: ignore[arg-type]
        spent[0] += time.process_time() - t0
        spent[1] += 1

    network.SimNetwork._arrive = timed  # type: ignore[method-assign]
    try:
        run(RunConfig(seed=1, protocol=protocol, nodes=10, faults=(), swarm=False, clients=10,
                      time_ns=4_000 * MS, liveness_ns=4_000 * MS, sized_budgets=True,
                      wan=WanConfig(regions=5)))
    finally:
        network.SimNetwork._arrive = original  # type: ignore[method-assign]
    return spent[0] / max(1, int(spent[1])) * 1e6


def byzantine_protocols() -> list[str]:
    """The registered protocols that tolerate Byzantine faults (the ones the CPU model
    compares), from the registry."""
    return [n for n in protocol_names() if protocol_spec(n).fault_model is FaultModel.BYZANTINE]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    for name, values in crypto_rounds(args.rounds).items():
        print(f"{name:24s} {statistics.median(values):7.1f} us  (rounds: "
              f"{', '.join(f'{v:.1f}' for v in values)})")
    rows: dict[str, list[float]] = {}
    for _ in range(max(1, args.rounds // 2)):
        for protocol in byzantine_protocols():
            rows.setdefault(protocol, []).append(per_message_us(protocol))
    for protocol, values in rows.items():
        print(f"per message, {protocol:10s} {statistics.median(values):7.1f} us  (runs: "
              f"{', '.join(f'{v:.1f}' for v in values)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
