"""What a backlog of expired pending transactions costs in loss-recovery traffic, and how long
the backlog takes to clear once it can.

The in-process cluster of `tests/consensus/leaderless/test_leaderless_ordered_veto.py` (four
`LeaderlessCore`s, `FastCrypto`, 100 ms ticks, `Persisted` fed back at once, veto mode,
`delta_old_ms` = 100, `checkpoint_ticks` = 2, `close_ticks` = 10, the default
`rebroadcast_ticks` = 20): n4 down, and B pairs of conflicting transactions (one key per
pair) split so that neither of a pair reaches Q = 3; with n4 down no checkpoint can drop
them (the veto needs n4's vote), so all 2B stay pending past their deadlines at n1..n3.

Printed per B: the messages and wire bytes the live nodes sent per period (`rebroadcast_ticks`)
in the steady state (ticks 100 to 300 after the split), the `FetchTransactions` and
`TransactionProof` part of it, and then, n4 restarted, the ticks until every node decided
all 2B (and the bytes sent meanwhile). Counts are deterministic (no wall clock).

    .venv/bin/python bench/leaderless_refetch.py [--pairs 25,50,100,200]

With `--sim SEEDS` (e.g. `--sim 0,1,2`): simulator runs instead (`phalanx.jepsen.sim`, 4
nodes, codec on): `--clients` signing clients (20 ms think time) write for 6 virtual
seconds, the halves n1,n2 | n3,n4 are cut apart from 0.3 s to 4.3 s (no half has Q = 3:
everything submitted meanwhile expires pending), then 4 s of liveness. Printed per seed:
messages and bytes sent in all, the `FetchTransactions` and `TransactionProof` messages, the
operations' outcomes and the checker's verdict.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests/consensus/leaderless"))

from leaderless_harness import submit_split_pairs
from test_leaderless_ordered_veto import N1, N2, N3, N4, OrderedCluster, state

from phalanx.consensus.core import Input, Ready
from phalanx.consensus.leaderless.store import TxState
from phalanx.consensus.types import NodeId
from phalanx.net import wire

STEADY = (100, 300)
"""The ticks (after the split) over which the steady-state traffic is counted."""
MAX_HEAL_TICKS = 2000


class Counting(OrderedCluster):
    counting = False
    messages: Counter[str]
    sent_bytes: Counter[str]

    def step(self, node: NodeId, inp: Input) -> Ready:
        ready = super().step(node, inp)
        if self.counting:
            for send in ready.messages:
                name = type(send.message).__name__
                self.messages[name] += 1
                self.sent_bytes[name] += len(wire.encode(send.message))
        return ready

    def reset(self) -> None:
        self.messages, self.sent_bytes = Counter(), Counter()


def scenario(pairs: int) -> str:
    c = Counting(4, delta_old_ms=100, checkpoint_ticks=2, close_ticks=10, stuck_resolution="veto")
    c.reset()
    c.down.add(N4)
    c.tick()
    txs = [t for pair in submit_split_pairs(c, pairs) for t in pair]
    for t1, t2 in zip(txs[::2], txs[1::2], strict=True):
        c.submit(t1, to=(N3,))  # the clients send to every node (retries)
        c.submit(t2, to=(N1, N2))
    c.deliver()
    c.tick(rounds=STEADY[0])
    live = (N1, N2, N3)
    pending = sum(state(c, n, t) is TxState.PENDING for n in live for t in txs)
    c.reset()
    c.counting = True
    c.tick(rounds=STEADY[1] - STEADY[0])
    periods = (STEADY[1] - STEADY[0]) / c.nodes[N1].core._config.rebroadcast_ticks
    msgs, sent = sum(c.messages.values()), sum(c.sent_bytes.values())
    fetch = c.messages["FetchTransactions"], c.sent_bytes["FetchTransactions"]
    proof = c.messages["TransactionProof"], c.sent_bytes["TransactionProof"]
    line = (f"B={pairs:4} pending {pending:4}/{3 * len(txs):<4} per period: "
            f"{msgs / periods:8.1f} msgs {sent / periods / 1e3:9.1f} KB | Fetch "
            f"{fetch[0] / periods:6.1f} msgs {fetch[1] / periods / 1e3:7.1f} KB | Proof "
            f"{proof[0] / periods:7.1f} msgs {proof[1] / periods / 1e3:8.1f} KB")
    c.reset()
    c.down.discard(N4)
    c.restart(N4)
    every = (N1, N2, N3, N4)
    for tick in range(1, MAX_HEAL_TICKS + 1):
        c.tick()
        if all(state(c, n, t) not in (TxState.PENDING, None) for n in every for t in txs):
            return (f"{line} | healed: all decided in {tick} ticks, "
                    f"{sum(c.sent_bytes.values()) / 1e6:.2f} MB")
    left = sum(state(c, n, t) in (TxState.PENDING, None) for n in every for t in txs)
    return f"{line} | healed: {left} undecided after {MAX_HEAL_TICKS} ticks"


def sim(seed: int, clients: int) -> str:
    from phalanx.jepsen import nemesis
    from phalanx.jepsen.sim import network
    from phalanx.jepsen.sim.run import RunConfig, run

    ms = 1_000_000
    made: list[network.NetworkStats] = []
    base = network.NetworkStats

    def recording() -> network.NetworkStats:
        stats = base()
        made.append(stats)
        return stats

    network.NetworkStats = recording  # type: ignore[assignment, misc]
    try:
        shape = {"fault": nemesis.PARTITION_HALVES, "episode": 1,
                 "groups": (("n1", "n2"), ("n3", "n4"))}
        schedule = (nemesis.FaultEvent(at_ns=300 * ms, action="start", **shape),  # type: ignore[arg-type]
                    nemesis.FaultEvent(at_ns=4_300 * ms, action="stop", **shape))  # type: ignore[arg-type]
        result = run(RunConfig(
            seed=seed, protocol="leaderless", nodes=4, faults=(nemesis.PARTITION_HALVES,),
            swarm=False, time_ns=6_000 * ms, liveness_ns=4_000 * ms, schedule=schedule,
            max_events=20_000_000, max_bytes_sent=4_000_000_000,
            clients=clients, settings=(("ops_per_client", 10_000),
                      ("think_ns", 20 * ms))))
    finally:
        network.NetworkStats = base  # type: ignore[misc]
    by_type = made[-1].by_type()
    st = result.stats
    verdict = "ok" if not result.violations else "VIOLATIONS: " + "; ".join(
        str(v) for v in result.violations)[:300]
    return (f"seed {seed} clients {clients}: {st['messages_sent']:,} msgs "
            f"{st['bytes_sent'] / 1e6:.1f} MB | Fetch {by_type.get('FetchTransactions', 0):,} "
            f"Proof {by_type.get('TransactionProof', 0):,} | ops ok {result.ops_ok} info "
            f"{result.ops_info} | {result.wall_s:.0f} s wall | {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", default="25,50,100,200")
    parser.add_argument("--sim", default="", help="simulator seeds, e.g. 0,1,2")
    parser.add_argument("--clients", type=int, default=32)
    args = parser.parse_args()
    if args.sim:
        for seed in (int(s) for s in args.sim.split(",")):
            print(sim(seed, args.clients), flush=True)
        return
    for pairs in (int(p) for p in args.pairs.split(",")):
        print(scenario(pairs), flush=True)


if __name__ == "__main__":
    main()
