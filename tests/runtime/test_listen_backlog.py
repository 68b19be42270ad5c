"""A real node process queues at most `LISTEN_BACKLOG` unaccepted connections per port.

The attack (bench/attack_handshakes.py): a flood of 2,000 sockets outpaces the leader's accept
loop, and with the kernel's default backlog (somaxconn, 4,096) the client port's accept queue
filled with ~4,000 connections whose clients had long given up; after the flood ended the
leader spent ~20 s doing TLS handshakes for them at its handshake rate, writes stayed at a
quarter of their rate, and new clients waited behind them. With a small backlog the kernel
drops the excess SYNs instead (a real client retries its SYN), so the queue drains in well
under a second. Here the node is stopped (SIGSTOP: its accept loop cannot run) and 300
connections are attempted on each port."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import trio
from runtime_helpers import make_cluster
from test_process import spawn, status_of, write_configs

from phalanx.net.conn_gate import LISTEN_BACKLOG
from phalanx.ops.node_config import Address, NodeConfig

ATTEMPTS = 300


def accept_queue(port: int) -> int:
    """The accept-queue length of the loopback listener on `port` (/proc/net/tcp: a LISTEN
    socket's rx_queue)."""
    with open("/proc/net/tcp", encoding="ascii") as f:
        for line in f:
            fields = line.split()
            if fields[3] == "0A" and fields[1].endswith(f":{port:04X}"):
                return int(fields[4].split(":")[1], 16)
    raise AssertionError(f"no listener on port {port}")


async def serving(config: NodeConfig, *, within: float) -> None:
    """Wait until the node answers a status call on its client port."""
    with trio.fail_after(within):
        while True:
            if await status_of(config) is not None:
                return
            await trio.sleep(0.05)


async def connect_many(address: Address) -> tuple[int, list[trio.SocketStream]]:
    """Attempt `ATTEMPTS` connections at once for 0.8 s (before a dropped SYN's first
    retransmission); the number that completed, and their streams."""
    streams: list[trio.SocketStream] = []

    async def one() -> None:
        with trio.move_on_after(0.8):
            with contextlib.suppress(OSError):
                streams.append(await trio.open_tcp_stream(address.host, address.port))

    async with trio.open_nursery() as nursery:
        for _ in range(ATTEMPTS):
            nursery.start_soon(one)
    return len(streams), streams


async def test_a_stopped_node_queues_at_most_the_backlog_on_each_port(tmp_path: Path) -> None:
    configs = make_cluster(tmp_path, n=1)
    paths = write_configs(tmp_path, configs)
    config = configs[0]
    log = tmp_path / "n1.log"
    proc = spawn(paths[config.id], log)
    streams: list[trio.SocketStream] = []
    try:
        await serving(config, within=30)
        os.kill(proc.pid, signal.SIGSTOP)
        for address in (config.client_listen, config.peer_listen):
            connected, opened = await connect_many(address)
            streams += opened
            queued = accept_queue(address.port)
            assert queued <= LISTEN_BACKLOG + 1, (address, queued)
            assert connected < ATTEMPTS, (address, connected)
        os.kill(proc.pid, signal.SIGCONT)
        for s in streams:
            await s.aclose()
        streams = []
        await serving(config, within=10)  # and the node serves as before
        assert proc.poll() is None, log.read_text()[-2000:]
    finally:
        for s in streams:
            await trio.aclose_forcefully(s)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.wait()
