"""A ticket allocator: a whole phalanx application in one file, the public API only.

`TicketMachine` hands out strictly increasing ticket numbers per queue. Run it on a real
3-node cluster (docs/STATE_MACHINES.md walks through it):

    phalanx cluster init ./tickets --app examples/tickets.py:TicketMachine
    phalanx cluster up ./tickets &
    phalanx call --cluster ./tickets take:bakery          # prints 1, then 2, ...
    phalanx call --cluster ./tickets --read-only peek:bakery

or from Python: ``await client.call(b"take:bakery")`` (`phalanx.open_client`).

What the StateMachine contract asks (docs/STATE_MACHINES.md): `apply` and `query` are
deterministic (no clock, randomness or I/O; the same commands in the same order give the same
results on every replica); `snapshot` is cheap and never changes after it is taken; `restore`
replaces the whole state with a snapshot's bytes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from phalanx import SnapshotFormatError


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

    def restore(self, data: bytes) -> None:
        try:
            counters = {str(k): int(v) for k, v in json.loads(data).items()}
        except (ValueError, TypeError, AttributeError) as e:  # a peer's bytes are input
            raise SnapshotFormatError(f"not a ticket snapshot: {e}") from None
        self.counters = counters  # replaced whole, only once the bytes parsed
