"""A node of a running 3-process Raft cluster loses its data directory (SIGKILL, `rm -rf`),
restarts empty while clients keep writing, and rejoins by fetching the checkpoint's pieces
from its peers (`phalanx.runtime.piece_transfer`): every acknowledged write is then in its
state, and with the old leader SIGKILLed, the cluster (the rejoined node and one other)
still answers every one of them. The in-process sibling that `make test` runs is
`tests/runtime/test_piece_catchup.py::test_wiped_follower_rejoins_from_its_peers`.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import trio
from runtime_helpers import RawClient, cluster_client, make_cluster
from test_process import call, call_once, find_leader, spawn, status_of, write_configs

from phalanx.apps import kv_wire
from phalanx.apps.kv_types import Get, Put, Txn, Value
from phalanx.consensus.types import ClientRequest
from phalanx.net.client_protocol import ClientCall, ClientReply, ReadConsistency, ReplyStatus
from phalanx.ops.node_config import NodeConfig

BATCH = 100


def value(i: int) -> bytes:
    """1 KB values: the leader's log keeps at most 1 MiB behind its checkpoint."""
    return (b"v%d" % i).ljust(1000, b".")


def txn(no: int, keys: range) -> ClientRequest:
    writes = tuple(Put(key=f"k{i:05d}", value=value(i)) for i in keys)
    return ClientRequest(client_id=f"tester/w{no}", request_no=1,  # a session each: retries
                                                                  # of one never expire
                         command=kv_wire.encode_command(Txn(compares=(), success=writes)))


async def pipelined(config: NodeConfig, requests: list[ClientRequest], *,
                    stale: bool = False) -> list[ClientReply]:
    """`requests` sent at once on one connection to `config`'s node; their replies in the
    order of `requests`."""
    client = await RawClient.connect(config.client_listen, cluster_client(config))
    try:
        consistency = ReadConsistency.STALE if stale else ReadConsistency.LINEARIZABLE
        for request in requests:
            await client.send(ClientCall(request=request, consistency=consistency))
        replies = []
        for _ in requests:
            reply = await client.receive()
            assert isinstance(reply, ClientReply)
            replies.append(reply)
    finally:
        await client.aclose()
    by_id = {(r.client_id, r.request_no): r for r in replies}
    return [by_id[r.client_id, r.request_no] for r in requests]


def gets(client_id: str, keys: list[int]) -> list[ClientRequest]:
    return [ClientRequest(client_id=client_id, request_no=n, read_only=True,
                          command=kv_wire.encode_command(Get(key=f"k{i:05d}")))
            for n, i in enumerate(keys, start=1)]


def check(replies: list[ClientReply], keys: list[int]) -> None:
    assert len(replies) == len(keys)
    for reply, i in zip(replies, keys, strict=True):
        assert reply.status is ReplyStatus.OK, reply
        assert kv_wire.decode_result(reply.result) == Value(value=value(i)), i


@pytest.mark.long  # 20 s, ~55 s on a loaded 2-core machine: `make sweeps`
async def test_wiped_node_rejoins_a_running_cluster_with_nothing_acknowledged_lost(
        tmp_path: Path) -> None:
    configs = make_cluster(tmp_path, checkpoint_every=8)
    by_id = {c.id: c for c in configs}
    paths = write_configs(tmp_path, configs)
    logs = {c.id: tmp_path / f"{c.id}.log" for c in configs}
    procs: dict[str, subprocess.Popen[bytes]] = {c.id: spawn(paths[c.id], logs[c.id])
                                                 for c in configs}
    acknowledged: list[int] = []
    try:
        no = 1

        async def write(batches: int) -> None:
            """`batches` transactions, pipelined to the leader (`call` retries any that a
            leader change interrupted, with the same ids)."""
            nonlocal no
            requests = [txn(no + k, range((no + k) * BATCH, (no + k + 1) * BATCH))
                        for k in range(batches)]
            no += batches
            for request, reply in zip(requests, await pipelined(
                    await find_leader(configs), requests), strict=True):
                if reply.status is not ReplyStatus.OK:
                    reply = await call(configs, request)
                assert reply.status is ReplyStatus.OK, reply
                lo = int(request.client_id.removeprefix("tester/w")) * BATCH
                acknowledged.extend(range(lo, lo + BATCH))

        await write(20)
        leader = (await find_leader(configs)).id
        victim = next(c.id for c in configs if c.id != leader)
        procs[victim].send_signal(signal.SIGKILL)
        procs[victim].wait(timeout=10)
        shutil.rmtree(by_id[victim].data_dir)
        await write(40)  # 4 MB: the leader's log no longer reaches back
        procs[victim] = spawn(paths[victim], logs[victim])
        await write(20)  # while it rejoins
        with trio.fail_after(60):
            while True:
                lead = await status_of(by_id[leader])
                mine = await status_of(by_id[victim])
                if (lead is not None and mine is not None
                        and mine.applied_index >= lead.commit_index):
                    break
                await trio.sleep(0.1)
        log = logs[victim].read_text()
        assert "fetched checkpoint pieces" in log, log[-3000:]
        keys = acknowledged[::7]
        with trio.fail_after(30):  # the install's batch completes (RETRY meanwhile)
            for _ in range(300):
                probe = await pipelined(by_id[victim], gets("tester/s", keys[-1:]), stale=True)
                if probe[0].status is not ReplyStatus.RETRY:
                    break
                await trio.sleep(0.1)
        check(await pipelined(by_id[victim], gets("tester/s", keys), stale=True), keys)
        # Without the old leader, the quorum is the rejoined node and one other.
        procs[leader].send_signal(signal.SIGKILL)
        procs[leader].wait(timeout=10)
        rest = [c for c in configs if c.id != leader]
        keys = acknowledged[::11]
        await call(rest, gets("tester/r", keys[:1])[0])  # waits out the election
        check(await pipelined(await find_leader(rest), gets("tester/r", keys)), keys)
        assert await call_once(await find_leader(rest), txn(no, range(0, 1))) is not None
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
