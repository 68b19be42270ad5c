"""A ticket allocator: a whole phalanx application in one file, the public API only.

`TicketMachine` hands out strictly increasing ticket numbers per queue. Run it on a real
3-node cluster (docs/STATE_MACHINES.md walks through it):

    phalanx cluster init ./tickets --app examples/tickets.py:TicketMachine
    phalanx cluster up ./tickets &
    phalanx call --cluster ./tickets take:bakery          # prints 1, then 2, ...
    phalanx call --cluster ./tickets --read-only peek:bakery

or from Python: ``await client.call(b"take:bakery")`` (`phalanx.open_client`). Test it
(`random_command` below is what the simulator and the harness send it):

    phalanx sim --app examples/tickets.py:TicketMachine --seeds 20
    phalanx jepsen run --app examples/tickets.py:TicketMachine --nemesis kill --time 10

What the StateMachine contract asks (docs/STATE_MACHINES.md): `apply` and `query` are
deterministic (no clock, randomness or I/O; the same commands in the same order give the same
results on every replica); `snapshot` is cheap and never changes after it is taken; `restore`
replaces the whole state with a snapshot's bytes.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

from phalanx import GeneratedCommand, SnapshotFormatError

QUEUES = ("bakery", "post office", "dmv")


class _Snapshot:
    def __init__(self, counters: dict[str, int]) -> None:
        self._data = json.dumps(counters, sort_keys=True).encode()

    def chunks(self) -> Iterator[bytes]:
        yield self._data


class TicketMachine:
    """Commands: ``take:<queue>`` -> the next ticket number. Queries: ``peek:<queue>``."""

    def __init__(self) -> None:
        self.counters: dict[str, int] = {}

    def apply(self, command: bytes) -> bytes:
        op, _, queue = command.decode(errors="replace").partition(":")
        if op != "take" or not queue:
            return b"error: expected take:<queue>"
        self.counters[queue] = self.counters.get(queue, 0) + 1
        return str(self.counters[queue]).encode()

    def query(self, request: bytes) -> bytes:
        op, _, queue = request.decode(errors="replace").partition(":")
        if op != "peek":
            return b"error: expected peek:<queue>"
        return str(self.counters.get(queue, 0)).encode()

    def snapshot(self) -> _Snapshot:
        return _Snapshot(dict(self.counters))  # a copy: later applies never change it

    @staticmethod
    def random_command(rng: random.Random) -> GeneratedCommand:
        """For testing (`phalanx sim --app`, `phalanx jepsen run --app`): a random client's
        next command, drawn from `rng` only. Queues are independent, so each is a key."""
        queue = rng.choice(QUEUES)
        if rng.random() < 0.3:
            return GeneratedCommand(command=f"peek:{queue}".encode(), read_only=True, key=queue)
        return GeneratedCommand(command=f"take:{queue}".encode(), key=queue)

    def restore(self, data: bytes) -> None:
        try:
            counters = {str(k): int(v) for k, v in json.loads(data).items()}
        except (ValueError, TypeError, AttributeError) as e:  # a peer's bytes are input
            raise SnapshotFormatError(f"not a ticket snapshot: {e}") from None
        self.counters = counters  # replaced whole, only once the bytes parsed
