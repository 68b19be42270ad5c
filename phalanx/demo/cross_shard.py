"""`phalanx demo --scenario cross-shard`: cross-shard transfers between two linked clusters.

Owns: the real-process demonstration of the cluster-sending service
(`phalanx.services.clustersend_node`): accounts split between two shards, each a cluster of
node processes on loopback with the KV app, linked with `phalanx cluster link`:

    shard A: PBFT, 4 replicas, n4 runs ``--byzantine MODE`` (default equivocate)
    shard B: Raft, 3 nodes

A transfer of m from account x (in A) to y (in B) is ONE transaction in A: "if x's balance is
still what I read and outbox slot k is free: x -= m and put a credit of m to y in slot k"
(`transfer_command`); A's members sign the committed credit, the service sends it with its
certificate to B, and B's members submit it to B's consensus as "if inbox slot (A, k) is
empty: record it and y += m" (`CsDeliver`: every B replica checks A's certificate when it
applies) -- exactly once however many members submit it. Same the
other way. Steps, each PASS or FAIL (the first FAIL ends the run):

    1. both shards up, linked, accounts opened (1,000 each, 4 per shard).
    2. --rounds transfers each way (both directions at once, one at a time each), while
       each shard's whole state is read atomically again and again: its books balance at
       every read (balances + credits sent - credits received = its opening total).
       Every credit is applied in the other shard
       (at every honest live node; in the PBFT shard one honest replica may lag behind the
       2f+1 that commit, and is reported).
    3. SIGKILL B's n1; --rounds more transfers each way: all credited.
    4. conservation: at every up-to-date honest node the two shards' balances add up to the
       opening total; every outbox slot is in the other shard's inbox with the same value,
       and nothing else is.
    5. restart B's n1: it catches up to the same balances and inbox.

Must not import: the runtime (nodes are processes). Not deterministic (real processes).
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import trio

from phalanx.apps.kv_types import Get, Put, Scan, ScanResult, TxnResult, Value
from phalanx.apps.kv_wire import decode_result, encode_command
from phalanx.client.async_client import Client, open_client
from phalanx.client.errors import ClientError
from phalanx.jepsen.cross_shard_bank import balance_key, shard_books, transfer_command
from phalanx.net.client_protocol import ReadConsistency
from phalanx.ops import pki
from phalanx.ops.link import link_clusters
from phalanx.ops.local_cluster import (
    NodeProcesses,
    find_free_base_port,
    init_cluster,
    node_command,
)
from phalanx.ops.node_config import ClusterConfig

ACCOUNTS = 4
OPENING = 1_000
KILLED = "n1"


class StepFailed(Exception):
    pass


@dataclass
class Shard:
    name: str
    cluster: ClusterConfig
    cluster_id: str
    procs: NodeProcesses
    accounts: tuple[str, ...]
    next_seq: int = 0
    live: list[str] = field(default_factory=list)
    liars: tuple[str, ...] = ()
    """Byzantine nodes: running, never checked (their state is whatever they claim)."""


async def _read(client: Client, command: Get | Scan, *, stale: bool = False) -> object:
    return decode_result(await client.call(
        encode_command(command), read_only=True,
        consistency=ReadConsistency.STALE if stale else ReadConsistency.LINEARIZABLE))


async def transfer(src: Shard, dst: Shard, rng: random.Random, say: Callable[[str], None],
                   number: int) -> None:
    x, y = rng.choice(src.accounts), rng.choice(dst.accounts)
    amount = rng.randint(1, 50)
    async with open_client(src.cluster, timeout=30) as client:
        for _ in range(20):
            current = await _read(client, Get(key=balance_key(x)))
            if not isinstance(current, Value):
                raise StepFailed(f"reading {x}: unexpected reply {current!r}")
            result = decode_result(await client.call(transfer_command(
                x, current.value, amount, dst.cluster_id, src.next_seq, y,
                f"t{number}")))
            if isinstance(result, TxnResult) and result.succeeded:
                src.next_seq += 1
                return
            if isinstance(result, TxnResult) and result.observed[1] is not None:
                src.next_seq += 1  # the slot is taken (an earlier attempt of ours applied)
    raise StepFailed(f"transfer {number} {x}->{y} kept failing its guards")


def run(args: argparse.Namespace, directory: Path, *, delete: bool) -> int:
    """`phalanx demo --scenario cross-shard` (`phalanx.services.builtin.CLUSTERSEND.demo`)."""
    rounds = max(1, getattr(args, "rounds", 5))
    mode = getattr(args, "byzantine", "equivocate")
    rng = random.Random(getattr(args, "seed", None) or 18)
    t0 = time.monotonic()

    def say(text: str) -> None:
        print(f"[{time.monotonic() - t0:5.1f}s] {text}", flush=True)

    base_a = find_free_base_port(4)
    base_b = base_a
    while abs(base_b - base_a) < 300:
        base_b = find_free_base_port(3)
    ca = init_cluster(directory / "shard-a", protocol="pbft", nodes=4, base_port=base_a,
                      services=("clustersend",))
    cb = init_cluster(directory / "shard-b", protocol="raft", nodes=3, base_port=base_b,
                      services=("clustersend",))
    la, lb = link_clusters(ca.directory, cb.directory)

    def command_a(config_path: Path) -> list[str]:
        argv = node_command(config_path)
        return [*argv, "--byzantine", mode] if config_path.stem == "n4" else argv

    a = Shard("A", ca, la.cluster_id, NodeProcesses(ca, command=command_a),
              tuple(f"a{i}" for i in range(ACCOUNTS)), liars=("n4",))
    b = Shard("B", cb, lb.cluster_id, NodeProcesses(cb),
              tuple(f"b{i}" for i in range(ACCOUNTS)))
    say(f"cross-shard demo: shard A = PBFT 4 (n4 --byzantine {mode}), cluster {a.cluster_id}; "
        f"shard B = Raft 3, cluster {b.cluster_id}; linked; in {directory}")
    results: list[str] = []
    try:
        passed = trio.run(_steps, a, b, rounds, rng, say, results)
    finally:
        a.procs.stop(grace=5.0)
        b.procs.stop(grace=5.0)
        if delete:
            shutil.rmtree(directory, ignore_errors=True)
    say(f"RESULT: {'PASS' if passed else 'FAIL'} ({sum(r == 'PASS' for r in results)}/5 "
        "steps passed)" + ("" if delete else f"; logs in {directory}/shard-*/logs"))
    if not passed:
        print("phalanx demo: FAILED (see the FAIL line above)", file=sys.stderr)
    return 0 if passed else 1


async def _stale_view(shard: Shard, other: Shard, node: str) -> tuple[int, int]:
    """(sum of `shard`'s balances, inbox entries from `other`) in `node`'s applied state."""
    cluster = shard.cluster
    peer = next(p for p in cluster.nodes if p.id == node)
    context = pki.client_context(cluster.ca, certificate=cluster.client_cert,
                                 private_key=cluster.client_key, check_hostname=False)
    async with open_client([(peer.id, peer.client_addr.host, peer.client_addr.port)],
                           ssl_context=context, protocol=cluster.protocol,
                           client_id=pki.new_client_id(cluster.client_cert),
                           timeout=30) as client:  # a restarted node may be slow on a busy machine
        total = 0
        for account in shard.accounts:
            v = await _read(client, Get(key=balance_key(account)), stale=True)
            if not isinstance(v, Value):
                raise StepFailed(f"{shard.name}/{node}: unexpected reply {v!r}")
            total += int(v.value or b"0")
        scan = await _read(client, Scan(prefix=f"cs/in/{other.cluster_id}/", limit=10_000),
                           stale=True)
        if not isinstance(scan, ScanResult):
            raise StepFailed(f"{shard.name}/{node}: unexpected reply {scan!r}")
        return total, len(scan.items)


async def _views(a: Shard, b: Shard) -> dict[str, tuple[int, int]]:
    out = {}
    for shard, other in ((a, b), (b, a)):
        for node in shard.live:
            if node in shard.liars:
                continue
            out[f"{shard.name}/{node}"] = await _stale_view(shard, other, node)
    return out


async def _settled(a: Shard, b: Shard, within: float) -> dict[str, tuple[int, int]]:
    """Wait until every live node of each shard holds every credit the other shard sent."""
    with trio.move_on_after(within):
        while True:
            views = await _views(a, b)
            if all(len(_complete(views, shard, other)) >= _needed(shard)
                   for shard, other in ((a, b), (b, a))):
                return views
            await trio.sleep(0.1)
    raise StepFailed(f"credits not all applied within {within:.0f} s: (balance sum, inbox) "
                     f"per node {views}; sent A->B {a.next_seq}, B->A {b.next_seq}")


def _first_failure(group: BaseExceptionGroup[BaseException]) -> Exception | None:
    for exc in group.exceptions:
        if isinstance(exc, StepFailed | ClientError):
            return exc
        if isinstance(exc, BaseExceptionGroup):
            found = _first_failure(exc)
            if found is not None:
                return found
    return None


async def _audit(shard: Shard, other: Shard, reads: list[int]) -> None:
    """Read the shard's whole state atomically, again and again: its books must balance,
    balances + credits sent - credits received = its opening total, at every read."""
    opening = OPENING * len(shard.accounts)
    async with open_client(shard.cluster, timeout=30) as client:
        while True:
            scan = await _read(client, Scan(prefix="", limit=10_000))
            if isinstance(scan, ScanResult):
                balances, sent, received = shard_books(scan.items, other.cluster_id)
                if balances + sent - received != opening:
                    raise StepFailed(
                        f"shard {shard.name}'s books do not balance in one read: balances "
                        f"{balances} + sent {sent} - received {received} != {opening}")
                reads[0] += 1
            await trio.sleep(0.05)


def _complete(views: dict[str, tuple[int, int]], shard: Shard, other: Shard
              ) -> dict[str, tuple[int, int]]:
    """The nodes of `shard` whose inbox holds every credit `other` sent."""
    return {k: v for k, v in views.items()
            if k.startswith(f"{shard.name}/") and v[1] == other.next_seq}


def _needed(shard: Shard) -> int:
    """Honest live nodes that must hold everything: all of them, except that a PBFT shard
    with a Byzantine replica may leave ONE honest replica behind (it commits with 2f+1 of
    which the liar may be one; the laggard catches up at a checkpoint)."""
    honest = [n for n in shard.live if n not in shard.liars]
    return len(honest) - (1 if shard.liars else 0)


async def _slots_match(src: Shard, dst: Shard) -> None:
    """Every outbox slot of `src` for `dst` is in `dst`'s inbox with the same value, and
    `dst`'s inbox holds nothing else from `src`."""
    async with open_client(src.cluster, timeout=30) as c1, \
            open_client(dst.cluster, timeout=30) as c2:
        out = await _read(c1, Scan(prefix=f"cs/out/{dst.cluster_id}/", limit=10_000))
        inbox = await _read(c2, Scan(prefix=f"cs/in/{src.cluster_id}/", limit=10_000))
    if not isinstance(out, ScanResult) or not isinstance(inbox, ScanResult):
        raise StepFailed(f"unexpected replies {out!r} {inbox!r}")
    sent = {k.rsplit("/", 1)[1]: v for k, v in out.items}
    got = {k.rsplit("/", 1)[1]: v for k, v in inbox.items}
    if sent != got:
        raise StepFailed(f"{src.name}->{dst.name}: outbox {len(sent)} slots, inbox {len(got)}"
                         f"; differing slots {sorted(set(sent.items()) ^ set(got.items()))}")


async def _open_accounts(shard: Shard) -> None:
    async with open_client(shard.cluster, timeout=60) as client:
        for account in shard.accounts:
            await client.call(encode_command(Put(key=balance_key(account),
                                                 value=str(OPENING).encode())))


async def _steps(a: Shard, b: Shard, rounds: int, rng: random.Random,
                 say: Callable[[str], None], results: list[str]) -> bool:
    total = OPENING * ACCOUNTS * 2
    number = 0

    async def transfers(label: str) -> str:
        started = time.monotonic()
        reads = [0]

        async def one_way(src: Shard, dst: Shard, seed: int) -> None:
            nonlocal number
            mine = random.Random(seed)
            for _ in range(rounds):
                number += 1
                await transfer(src, dst, mine, say, number)

        try:
            async with trio.open_nursery() as nursery:  # both directions at once, audited
                for shard, other in ((a, b), (b, a)):
                    nursery.start_soon(_audit, shard, other, reads)
                async with trio.open_nursery() as writers:
                    writers.start_soon(one_way, a, b, rng.getrandbits(32))
                    writers.start_soon(one_way, b, a, rng.getrandbits(32))
                views = await _settled(a, b, 60.0)
                nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            first = _first_failure(group)
            if first is None:
                raise
            raise first from None
        return (f"{label}: {2 * rounds} transfers, both ways at once (A->B {a.next_seq}, "
                f"B->A {b.next_seq} in all), credited in the other shard in "
                f"{time.monotonic() - started:.1f} s ({len(views)} honest live nodes read); "
                f"{reads[0]} atomic shard reads audited, all balanced")

    async def step1() -> str:
        for shard in (a, b):
            shard.procs.start()
            shard.live = list(shard.procs.node_ids)
        await _open_accounts(a)
        await _open_accounts(b)
        return (f"shards up and linked; accounts {', '.join(a.accounts + b.accounts)} opened "
                f"with {OPENING} each (total {total})")

    async def step2() -> str:
        return await transfers("all nodes up")

    async def step3() -> str:
        b.procs.kill(KILLED)
        b.live.remove(KILLED)
        return await transfers(f"after SIGKILL of B's {KILLED}")

    async def step4() -> str:
        views = await _views(a, b)
        sums: dict[str, int] = {}
        complete = {**_complete(views, a, b), **_complete(views, b, a)}
        for key, (balance, _) in complete.items():
            sums.setdefault(key.split("/")[0], balance)
            if balance != sums[key.split("/")[0]]:
                raise StepFailed(f"up-to-date nodes of a shard disagree on balances: {views}")
        if sums["A"] + sums["B"] != total:
            raise StepFailed(f"money not conserved: A {sums['A']} + B {sums['B']} != {total}")
        await _slots_match(a, b)
        await _slots_match(b, a)
        behind = sorted(set(views) - set(complete))
        return (f"conserved: A {sums['A']} + B {sums['B']} = {total} at "
                f"{', '.join(sorted(complete))}; inboxes hold exactly the {a.next_seq} + "
                f"{b.next_seq} credits sent, once each"
                + (f" (behind, catching up: {', '.join(behind)})" if behind else ""))

    async def step5() -> str:
        started = time.monotonic()
        b.procs.start([KILLED])
        b.live.append(KILLED)
        with trio.move_on_after(60.0):
            while True:
                views = await _settled(a, b, 60.0)
                mine, other = views[f"B/{KILLED}"], views[f"B/{b.live[0]}"]
                if mine == other:
                    break
                await trio.sleep(0.1)
        if mine != other:
            raise StepFailed(f"restarted {KILLED} holds {mine}, the others {other}")
        return (f"restarted B's {KILLED}: same balances and inbox as the others after "
                f"{time.monotonic() - started:.1f} s")

    steps = (step1, step2, step3, step4, step5)
    for index, step in enumerate(steps, 1):
        try:
            line = await step()
        except (StepFailed, ClientError) as e:
            say(f"FAIL  {index}. {e}")
            results.append("FAIL")
            for later in range(index + 1, len(steps) + 1):
                say(f"SKIP  {later}.")
            return False
        say(f"PASS  {index}. {line}")
        results.append("PASS")
    return True


__all__ = ["run", "transfer_command"]
