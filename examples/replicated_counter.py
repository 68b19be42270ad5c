"""Counters in a plain Python class, replicated: `@replicated` commands, `@query` reads.

No bytes, no snapshot code: `phalanx.replicated_class` turns the marked methods into
typed, deterministic commands (msgpack, never pickle) and checkpoints ``__dict__``
(docs/STATE_MACHINES.md "A plain class: @replicated"). Run it on a real 3-node cluster:

    phalanx cluster init ./counters --app examples/replicated_counter.py:Counters
    phalanx cluster up ./counters &
    python examples/replicated_counter.py ./counters          # incr, add, read, an error

and test it (`random_call` below is what the simulator sends):

    phalanx sim --app examples/replicated_counter.py:Counters --seeds 20
"""

from __future__ import annotations

import random
import sys

from phalanx import query, replicated

NAMES = ("apples", "pears")


class Counters:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    @replicated
    def incr(self, name: str, by: int = 1) -> int:
        if by < 0:
            raise ValueError("counters only go up")
        self.counts[name] = self.counts.get(name, 0) + by
        return self.counts[name]

    @replicated
    def reset(self, name: str) -> int:
        return self.counts.pop(name, 0)

    @query
    def get(self, name: str) -> int:
        return self.counts.get(name, 0)

    @query
    def total(self) -> int:
        return sum(self.counts.values())

    @staticmethod
    def random_call(rng: random.Random) -> tuple[str, tuple[object, ...]]:
        """For `phalanx sim --app` / `phalanx jepsen run --app`: a random call."""
        name = rng.choice(NAMES)
        roll = rng.random()
        if roll < 0.5:
            return "incr", (name, rng.randint(1, 3))
        if roll < 0.6:
            return "reset", (name,)
        return ("get", (name,)) if roll < 0.9 else ("total", ())


async def main(cluster: str) -> None:
    import phalanx

    async with phalanx.open_client(phalanx.open_cluster(cluster)) as client:
        counters = phalanx.Replicated(Counters, client)
        print("incr apples ->", await counters.incr("apples"))
        print("incr apples by 5 ->", await counters.incr("apples", by=5))
        print("get apples ->", await counters.get("apples"))
        try:
            await counters.incr("apples", -1)
        except phalanx.ReplicatedCallError as e:
            print("incr by -1 ->", e)


if __name__ == "__main__":
    import trio

    trio.run(main, sys.argv[1] if len(sys.argv) > 1 else "./counters")
