"""Real node processes under a low descriptor limit (RLIMIT_NOFILE 128, soft = hard): a flood
of TLS connections to the leader is capped below the limit with a storage reserve, so the
leader keeps saving its log and hard state and serving writes (the attack: with the common
limit of 1,024, 1,100 idle TLS connections made the next hard-state save fail with "Too
many open files" and the node exited). Also: idle sockets on the peer port are shed while
the peers keep their links."""

from __future__ import annotations

import contextlib
import resource
import subprocess
import sys
from pathlib import Path

import trio
from runtime_helpers import TESTER, RawClient, cluster_client, make_cluster
from test_process import call, find_leader, write_configs

from phalanx.apps import kv_wire
from phalanx.apps.kv_types import Put
from phalanx.consensus.types import ClientRequest
from phalanx.net.client_protocol import ClientCall, ClientReply, ReplyStatus

NOFILE = 128


def _low_nofile() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


def spawn_limited(path: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "phalanx.cli.node", str(path)],
                                stdout=out, stderr=subprocess.STDOUT, preexec_fn=_low_nofile)


def put(n: int) -> ClientRequest:
    return ClientRequest(client_id=f"{TESTER}/w", request_no=n,
                         command=kv_wire.encode_command(Put(key=f"k{n}", value=b"v")))


async def test_a_connection_flood_never_takes_the_descriptors_storage_needs(
        tmp_path: Path) -> None:
    configs = make_cluster(tmp_path)
    paths = write_configs(tmp_path, configs)
    logs = {c.id: tmp_path / f"{c.id}.log" for c in configs}
    procs = {c.id: spawn_limited(paths[c.id], logs[c.id]) for c in configs}
    flood: list[RawClient] = []
    idle: list[trio.SocketStream] = []
    try:
        assert (await call(configs, put(1))).status is ReplyStatus.OK
        leader = await find_leader(configs)
        client = await RawClient.connect(leader.client_listen, cluster_client(leader))
        limiter = trio.CapacityLimiter(16)
        creds = cluster_client(leader)

        async def connect() -> None:
            async with limiter:
                with contextlib.suppress(OSError, trio.BrokenResourceError):
                    flood.append(await RawClient.connect(leader.client_listen, creds))

        async with trio.open_nursery() as nursery:
            for _ in range(NOFILE + 32):  # more TLS connections than the node has descriptors
                nursery.start_soon(connect)
        for _ in range(40):  # and idle sockets on the peer port
            idle.append(await trio.open_tcp_stream(leader.peer_listen.host,
                                                   leader.peer_listen.port))
        for n in range(2, 12):  # every write appends to the WAL and saves hard state
            await client.send(ClientCall(request=put(n)))
            reply = await client.receive()
            assert isinstance(reply, ClientReply)
            if reply.status in (ReplyStatus.REDIRECT, ReplyStatus.RETRY):
                # An election on the loaded 2-core machine (what leadership costs under a
                # flood is bench/attack_handshakes.py's to measure): same ids, new leader.
                reply = await call(configs, put(n))
            assert reply.status is ReplyStatus.OK, reply
        for node_id, proc in procs.items():
            assert proc.poll() is None, logs[node_id].read_text()[-2000:]
            assert "Too many open files" not in logs[node_id].read_text()
        assert len(flood) < NOFILE - 64  # some were shed: the cap keeps the reserve
        await client.aclose()
    finally:
        for c in flood:
            await c.aclose()
        for s in idle:
            await s.aclose()
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
