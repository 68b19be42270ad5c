"""What ending one stuck pair of conflicting transactions costs, by `stuck_resolution` mode.

The in-process cluster of `tests/consensus/leaderless/test_leaderless_ordered_veto.py` (four
`LeaderlessCore`s, `FastCrypto`, 100 ms ticks, `Persisted` fed back at once): T1 endorsed by
two nodes, T2 by the others (a split: neither reaches Q = 3), with every node up or n4
down. Printed per mode and case: ticks from the split until every live node decided both,
messages and wire bytes the nodes sent meanwhile (all traffic: endorsement re-sends too),
the outcome. `close_ticks` = 10, `checkpoint_ticks` = 2, `delta_old_ms` = 100.

    .venv/bin/python bench/leaderless_stuck_cost.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests/consensus/leaderless"))

from leaderless_harness import EPOCH, make_tx, version
from test_leaderless_ordered_veto import N1, N2, N3, N4, OrderedCluster, state

from phalanx.consensus.core import Input, Ready
from phalanx.consensus.leaderless.store import TxState
from phalanx.consensus.types import NodeId
from phalanx.net import wire

MAX_TICKS = 200


class Counting(OrderedCluster):
    sent = 0
    sent_bytes = 0

    def step(self, node: NodeId, inp: Input) -> Ready:
        ready = super().step(node, inp)
        for send in ready.messages:
            self.sent += 1
            self.sent_bytes += len(wire.encode(send.message))
        return ready


def scenario(mode: str, crash: bool) -> str:
    c = Counting(4, delta_old_ms=100, checkpoint_ticks=2, close_ticks=10,
                 stuck_resolution=mode)
    if crash:
        c.down.add(N4)
    c.tick()
    t1 = make_tx("set x a", reqs={"x": version(None)}, deadline=EPOCH + 400)
    t2 = make_tx("set x b", client="c2", reqs={"x": version(None)}, deadline=EPOCH + 400)
    live = (N1, N2, N3) if crash else (N1, N2, N3, N4)
    second = tuple(n for n in live if n not in (N1, N2))
    c.cut = {(a, b) for a in live for b in live if (a in second) != (b in second)}
    c.submit(t1, to=(N1, N2))
    c.submit(t2, to=second)
    c.deliver()
    c.cut.clear()
    c.submit(t1, to=second)
    c.submit(t2, to=(N1, N2))
    c.deliver()
    c.sent = c.sent_bytes = 0
    for tick in range(1, MAX_TICKS + 1):
        c.tick()
        if all(state(c, n, t) is not TxState.PENDING for n in live for t in (t1, t2)):
            outcome = sorted({str(state(c, n, t)) for n in live for t in (t1, t2)})
            return f"decided in {tick} ticks, {c.sent} messages, {c.sent_bytes} bytes: {outcome}"
    return f"undecided after {MAX_TICKS} ticks ({c.sent} messages, {c.sent_bytes} bytes)"


def main() -> None:
    for mode in ("veto", "pbft"):
        for crash in (False, True):
            case = "n4 down" if crash else "all up "
            print(f"{mode:4}  {case}  {scenario(mode, crash)}")


if __name__ == "__main__":
    main()
