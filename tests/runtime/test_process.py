"""Real node processes (`python -m phalanx.cli.node CONFIG`): the whole cluster is SIGKILLed
after acknowledged writes and restarted from its durable state, which keeps every one of them;
SIGTERM stops a node cleanly with exit code 0."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import trio
from runtime_helpers import RawClient, cluster_client, make_cluster

from phalanx.apps import kv_wire
from phalanx.apps.kv_types import Get, Put, Value
from phalanx.consensus.types import ClientRequest
from phalanx.net.client_protocol import (
    ClientCall,
    ClientReply,
    ReplyStatus,
    StatusCall,
    StatusReply,
)
from phalanx.ops.config_toml import dumps_toml, node_config_dict
from phalanx.ops.node_config import NodeConfig


def write_configs(root: Path, configs: list[NodeConfig]) -> dict[str, Path]:
    (root / "nodes").mkdir(parents=True, exist_ok=True)
    paths = {}
    for config in configs:
        path = root / "nodes" / f"{config.id}.toml"
        path.write_text(dumps_toml(node_config_dict(config, relative_to=path.parent)))
        paths[config.id] = path
    return paths


def spawn(path: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "phalanx.cli.node", str(path)],
                                stdout=out, stderr=subprocess.STDOUT)


async def status_of(config: NodeConfig) -> StatusReply | None:
    try:
        client = await RawClient.connect(config.client_listen, cluster_client(config))
    except OSError:
        return None
    try:
        await client.send(StatusCall(nonce=1))
        reply = await client.receive()
    except (EOFError, trio.BrokenResourceError):
        return None
    finally:
        await client.aclose()
    return reply if isinstance(reply, StatusReply) else None


async def find_leader(configs: list[NodeConfig]) -> NodeConfig:
    with trio.fail_after(30):
        while True:
            for config in configs:
                status = await status_of(config)
                if status is not None and status.role == "leader":
                    return config
            await trio.sleep(0.05)


async def call_once(config: NodeConfig, request: ClientRequest) -> ClientReply | None:
    try:
        client = await RawClient.connect(config.client_listen, cluster_client(config))
    except OSError:
        return None
    try:
        await client.send(ClientCall(request=request))
        reply = await client.receive()
    except (EOFError, trio.BrokenResourceError):
        return None
    finally:
        await client.aclose()
    assert isinstance(reply, ClientReply)
    return reply


async def call(configs: list[NodeConfig], request: ClientRequest) -> ClientReply:
    """What a client does: ask the leader; on RETRY, REDIRECT or a lost connection (an
    election on a loaded machine), find the leader again and retry with the SAME ids."""
    with trio.fail_after(30):
        while True:
            reply = await call_once(await find_leader(configs), request)
            if reply is not None and reply.status in (ReplyStatus.OK, ReplyStatus.ERROR):
                return reply


async def test_sigkill_of_every_node_keeps_acknowledged_writes(tmp_path: Path) -> None:
    configs = make_cluster(tmp_path)
    paths = write_configs(tmp_path, configs)
    logs = {c.id: tmp_path / f"{c.id}.log" for c in configs}
    procs = {c.id: spawn(paths[c.id], logs[c.id]) for c in configs}
    try:
        acknowledged: dict[str, bytes] = {}
        for n in range(1, 31):
            key, value = f"k{n}", f"v{n}".encode()
            request = ClientRequest(client_id="tester/w", request_no=n,
                                    command=kv_wire.encode_command(Put(key=key, value=value)))
            reply = await call(configs, request)
            assert reply.status is ReplyStatus.OK, reply
            acknowledged[key] = value
        # SIGKILL everything at once: no clean shutdown, no final flush.
        for proc in procs.values():
            proc.send_signal(signal.SIGKILL)
        for proc in procs.values():
            assert proc.wait(timeout=10) == -signal.SIGKILL
        procs = {c.id: spawn(paths[c.id], logs[c.id]) for c in configs}
        for n, (key, value) in enumerate(sorted(acknowledged.items()), start=1):
            request = ClientRequest(client_id="tester/r", request_no=n, read_only=True,
                                    command=kv_wire.encode_command(Get(key=key)))
            reply = await call(configs, request)
            assert reply.status is ReplyStatus.OK, reply
            assert kv_wire.decode_result(reply.result) == Value(value=value), key
        # SIGTERM: a clean shutdown, exit code 0.
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        for node_id, proc in procs.items():
            assert proc.wait(timeout=15) == 0, logs[node_id].read_text()[-2000:]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
