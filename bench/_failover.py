"""Leader failover measurement for `bench/kv.py`: SIGKILL the leader, time to first acked write.

Owns: `failover_trial` (system-neutral: a put function and a kill function) and the etcd
flavour (`etcd_failover`, with a writer that moves to a surviving member). The phalanx
flavour lives in `_phalanx.py` next to its client.

Method: one writer does put after put. After `settle_s` of healthy writes, `kill()` sends
SIGKILL to the leader process and the clock starts. The result is the time from the kill to
the acknowledgement of the first write that was *started after* the kill. Counting only
writes started after the kill excludes an ack already in flight from the dying leader, at
the price of over-estimating by at most one write latency (about a millisecond): the figure
is conservative.

Must not import phalanx. Loopback only.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Awaitable, Callable

import trio
from _etcd import EtcdCluster, EtcdError, EtcdMember, EtcdWriter, HttpConnection
from _loadgen import LOOPBACK, make_value

Log = Callable[[str], None]


async def failover_trial(
    put: Callable[[bytes, bytes], Awaitable[None]],
    kill: Callable[[], None],
    *,
    prefix: str,
    value_size: int = 100,
    settle_s: float = 1.0,
    timeout_s: float = 30.0,
) -> float:
    """Seconds from `kill()` to the ack of the first write started after it (inf on timeout)."""
    value = make_value(value_size)
    perf = time.perf_counter
    killed_at = [math.inf]
    result = [math.inf]
    healthy = [0]
    done = trio.Event()

    async def writer() -> None:
        seq = 0
        while True:
            key = f"{prefix}{seq}".encode()
            seq += 1
            t0 = perf()
            try:
                await put(key, value)
            except (OSError, RuntimeError, TimeoutError, trio.BrokenResourceError,
                    trio.ClosedResourceError, ValueError):
                await trio.sleep(0.002)
                continue
            if t0 > killed_at[0]:
                result[0] = perf() - killed_at[0]
                done.set()
                return
            healthy[0] += 1

    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer)
        await trio.sleep(settle_s)
        if healthy[0] == 0:
            nursery.cancel_scope.cancel()
            raise RuntimeError("failover: no write succeeded before the kill")
        killed_at[0] = perf()
        kill()
        with trio.move_on_after(timeout_s):
            await done.wait()
        nursery.cancel_scope.cancel()
    return result[0]


class _RoamingEtcdWriter:
    """Writes to one member; on any failure moves to the next member not known dead."""

    def __init__(
        self, members: list[EtcdMember], dead: set[str], *, start: int, attempt_s: float
    ) -> None:
        self._members = members
        self._dead = dead
        self._at = start
        self._writer: EtcdWriter | None = None
        self._attempt_s = attempt_s

    async def put(self, key: bytes, value: bytes) -> None:
        try:
            if self._writer is None:
                m = self._members[self._at]
                self._writer = EtcdWriter(await HttpConnection.open(LOOPBACK, m.client_port))
            with trio.fail_after(self._attempt_s):
                await self._writer.put(key, value)
        except (OSError, EtcdError, trio.TooSlowError, trio.BrokenResourceError) as e:
            await self.aclose()
            self._at = (self._at + 1) % len(self._members)
            while self._members[self._at].name in self._dead:
                self._at = (self._at + 1) % len(self._members)
            raise EtcdError(f"put failed: {type(e).__name__}") from None

    async def aclose(self) -> None:
        if self._writer is not None:
            w, self._writer = self._writer, None
            with contextlib.suppress(OSError, trio.BrokenResourceError):
                await w.aclose()


async def etcd_failover(cluster: EtcdCluster, *, trials: int, log: Log) -> list[float]:
    """Kill etcd's leader `trials` times (restarting it in between); seconds per trial."""
    times: list[float] = []
    for trial in range(trials):
        leader = await cluster.wait_ready()
        members = list(cluster.members)
        dead: set[str] = set()
        writer = _RoamingEtcdWriter(
            members, dead, start=members.index(leader), attempt_s=0.2
        )

        def kill(name: str = leader.name, dead: set[str] = dead) -> None:
            dead.add(name)
            cluster.kill(name)

        took = await failover_trial(writer.put, kill, prefix=f"fo{trial}-")
        await writer.aclose()
        log(f"etcd failover trial {trial + 1}: killed {leader.name}, first ack after "
            f"{took * 1e3:.0f} ms")
        times.append(took)
        cluster.restart(leader.name)
    await cluster.wait_ready()
    return times
