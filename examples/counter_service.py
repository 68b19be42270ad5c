"""A ticket allocator replicated by phalanx, embedded in a small trio program.

The service has its own state machine (not the KV app): `TicketMachine` hands out strictly
increasing ticket numbers per queue. Three nodes run in this one process on loopback, with
certificates generated into a temporary directory; the program takes tickets through the
leader's client port (raw client protocol), kills the leader, and takes more from the new
one: numbers never repeat, and a retried request (same ids) gets the same ticket back.
Each client (alice, bob) has its own client certificate: the client port requires one, and
a client may only use its own session ids.

Run it:  python examples/counter_service.py
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import trio

from phalanx.consensus.types import ClientRequest
from phalanx.net import client_protocol, wire
from phalanx.net.client_protocol import ClientCall, ClientReply, ReplyStatus
from phalanx.net.framing import FrameDecoder, encode_frame
from phalanx.ops import pki
from phalanx.ops.node_config import Address, NodeConfig, PeerConfig, TlsFiles
from phalanx.ops.ports import free_ports
from phalanx.runtime.identity import prepare_data_dir
from phalanx.runtime.node import Node, open_node


class _Snapshot:
    def __init__(self, counters: dict[str, int]) -> None:
        self._data = json.dumps(counters, sort_keys=True).encode()

    def chunks(self) -> Iterator[bytes]:
        yield self._data


class TicketMachine:
    """Commands: b"take:<queue>" -> the next ticket number; queries: b"peek:<queue>"."""

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
        self.counters = {str(k): int(v) for k, v in json.loads(data).items()}


def cluster_configs(root: Path, n: int = 3) -> list[NodeConfig]:
    ca = pki.create_ca()
    ids = [f"n{i}" for i in range(1, n + 1)]
    ports = free_ports(2 * n)  # outside the ephemeral range: see phalanx.ops.ports
    peer = {i: Address(host="127.0.0.1", port=ports[k]) for k, i in enumerate(ids)}
    client = {i: Address(host="127.0.0.1", port=ports[n + k]) for k, i in enumerate(ids)}
    configs = []
    for node_id in ids:
        paths = pki.write_credentials(pki.issue_node_cert(ca, node_id), root / node_id)
        # A new node of a new cluster: without this mark an empty data directory counts
        # as a lost disk, and the node waits to recover from peers before it votes.
        prepare_data_dir(root / node_id / "data", node=node_id,
                         ca_certificate=paths.ca_certificate)
        configs.append(NodeConfig(
            id=node_id, protocol="raft", data_dir=root / node_id / "data",
            peer_listen=peer[node_id], client_listen=client[node_id], metrics_listen=None,
            tls=TlsFiles(ca=paths.ca_certificate, cert=paths.certificate,
                         key=paths.private_key),
            peers=tuple(PeerConfig(id=o, peer_addr=peer[o], client_addr=client[o])
                        for o in ids if o != node_id)))
    for name in CLIENTS:  # read-write certificates, one per client (its session id: its name)
        pki.write_credentials(pki.issue_client_cert(ca, name), root / "clients")
    return configs


CLIENTS = ("alice", "bob")


def client_credentials(node: Node, name: str) -> tuple[Path, Path]:
    """Client `name`'s certificate and key (`cluster_configs` wrote them beside the nodes')."""
    clients = node.config.tls.ca.parent.parent / "clients"
    return clients / f"{name}.pem", clients / f"{name}.key"


async def take(node: Node, client_id: str, request_no: int, queue: str) -> ClientReply:
    """One call over the node's TLS client port."""
    tcp = await trio.open_tcp_stream(node.client_address.host, node.client_address.port)
    cert, key = client_credentials(node, client_id)
    context = pki.client_context(node.config.tls.ca, certificate=cert, private_key=key,
                                 check_hostname=False)
    tls = trio.SSLStream(tcp, context, server_hostname="127.0.0.1")
    request = ClientRequest(client_id=client_id, request_no=request_no,
                            command=f"take:{queue}".encode())
    await tls.send_all(encode_frame(wire.encode(ClientCall(request=request))))
    decoder = FrameDecoder()
    while (frame := decoder.next_frame()) is None:
        decoder.feed(await tls.receive_some(65536))
    await trio.aclose_forcefully(tls)
    reply = wire.decode(frame, expected=ClientReply)
    return reply


async def main() -> None:
    client_protocol.register()
    with tempfile.TemporaryDirectory(prefix="phalanx-tickets-") as tmp:
        configs = cluster_configs(Path(tmp))
        async with trio.open_nursery() as nursery:
            nodes: dict[str, Node] = {}
            scopes: dict[str, trio.CancelScope] = {}

            async def run(config: NodeConfig, task_status: trio.TaskStatus[Node]) -> None:
                with trio.CancelScope() as scope:
                    scopes[config.id] = scope
                    async with open_node(config, state_machine=TicketMachine()) as node:
                        task_status.started(node)
                        await trio.sleep_forever()

            for config in configs:
                nodes[config.id] = await nursery.start(run, config)

            async def leader() -> Node:
                with trio.fail_after(10):
                    while True:
                        found = [n for n in nodes.values() if n.core_status().role == "leader"]
                        if len(found) == 1:
                            return found[0]
                        await trio.sleep(0.01)

            async def take_retrying(client_id: str, request_no: int, queue: str) -> int:
                with trio.fail_after(10):
                    while True:
                        reply = await take(await leader(), client_id, request_no, queue)
                        if reply.status is ReplyStatus.OK:
                            return int(reply.result)
                        await trio.sleep(0.01)

            first = await leader()
            print(f"leader: {first.id}")
            tickets = [await take_retrying("alice", n, "bakery") for n in range(1, 4)]
            print(f"alice took tickets {tickets} at the bakery")
            again = await take_retrying("alice", 3, "bakery")
            print(f"alice retried request 3 and got ticket {again} again (exactly once)")
            scopes[first.id].cancel()
            del nodes[first.id]
            second = await leader()
            print(f"{first.id} stopped; new leader: {second.id}")
            more = [await take_retrying("bob", n, "bakery") for n in range(1, 3)]
            print(f"bob took tickets {more}")
            if tickets != [1, 2, 3] or again != 3 or more != [4, 5]:
                raise SystemExit("FAILED: tickets repeated or skipped")
            print("ok: tickets never repeat across a leader change")
            nursery.cancel_scope.cancel()


if __name__ == "__main__":
    trio.run(main)
