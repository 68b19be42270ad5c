"""Test helpers for the runtime: local cluster configs with fresh certificates and free ports,
and a raw client-protocol connection (the real client library is tested elsewhere).

`make_cluster(root)` also issues the admin client certificate ``tester`` (`cluster_client`): a
client port requires one, and a client may only use its own session ids (``tester``,
``tester/...``, ``tester#...``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import trio

from phalanx.net import client_protocol, wire
from phalanx.net.framing import FrameDecoder, encode_frame
from phalanx.ops import pki
from phalanx.ops.node_config import (
    Address,
    CheckpointConfig,
    NodeConfig,
    PeerConfig,
    TimingConfig,
    TlsFiles,
)
from phalanx.ops.ports import free_ports
from phalanx.runtime.identity import prepare_data_dir

HOST = "127.0.0.1"
TICK_MS = 10


def make_cluster(
    root: Path,
    n: int = 3,
    *,
    fsync: str = "group",
    checkpoint_every: int = 10_000,
    metrics: bool = False,
) -> list[NodeConfig]:
    """Configs of an `n`-node Raft cluster on loopback, credentials under `root`."""
    ca = pki.create_ca()
    pki.write_ca(ca, root / "ca")
    ids = [f"n{i}" for i in range(1, n + 1)]
    ports = free_ports(3 * n)
    peer_addr = {i: Address(host=HOST, port=ports[k]) for k, i in enumerate(ids)}
    client_addr = {i: Address(host=HOST, port=ports[n + k]) for k, i in enumerate(ids)}
    pki.write_credentials(pki.issue_client_cert(ca, TESTER, role="admin"), root / "clients")
    configs = []
    for k, node_id in enumerate(ids):
        paths = pki.write_credentials(pki.issue_node_cert(ca, node_id), root / "nodes" / node_id)
        prepare_data_dir(root / "data" / node_id, node=node_id,
                         ca_certificate=paths.ca_certificate)
        configs.append(NodeConfig(
            id=node_id,
            protocol="raft",
            data_dir=root / "data" / node_id,
            peer_listen=peer_addr[node_id],
            client_listen=client_addr[node_id],
            metrics_listen=Address(host=HOST, port=ports[2 * n + k]) if metrics else None,
            tls=TlsFiles(ca=paths.ca_certificate, cert=paths.certificate, key=paths.private_key),
            peers=tuple(PeerConfig(id=o, peer_addr=peer_addr[o], client_addr=client_addr[o])
                        for o in ids if o != node_id),
            fsync=fsync,
            timing=TimingConfig(tick_ms=TICK_MS, election_ticks=10, heartbeat_ticks=1),
            checkpoint=CheckpointConfig(every_entries=checkpoint_every, every_bytes=64 << 20,
                                        keep=3),
        ))
    return configs


TESTER = "tester"


def cluster_client(config: NodeConfig) -> pki.CredentialPaths:
    """The ``tester`` client credentials of the `make_cluster` cluster `config` belongs to."""
    root = config.tls.ca.parents[2]  # root/nodes/<id>/ca.pem
    return pki.CredentialPaths(certificate=root / "clients" / f"{TESTER}.pem",
                               private_key=root / "clients" / f"{TESTER}.key",
                               ca_certificate=config.tls.ca)


class RawClient:
    """One TLS connection speaking the client protocol, frame by frame."""

    def __init__(self, stream: trio.SSLStream[trio.SocketStream]) -> None:
        self.stream = stream
        self._decoder = FrameDecoder()
        self._frames: list[bytes] = []

    @classmethod
    async def connect(cls, address: Address, ca: Path | pki.CredentialPaths) -> RawClient:
        """Connect presenting the client certificate `ca` names (just a CA file: none)."""
        client_protocol.register()
        tcp = await trio.open_tcp_stream(address.host, address.port)
        if isinstance(ca, pki.CredentialPaths):
            context = pki.client_context(ca.ca_certificate, certificate=ca.certificate,
                                         private_key=ca.private_key, check_hostname=False)
        else:
            context = pki.client_context(ca, check_hostname=False)
        tls = trio.SSLStream(tcp, context, server_hostname=address.host)
        await tls.do_handshake()
        return cls(tls)

    async def send(self, message: object) -> None:
        await self.stream.send_all(encode_frame(wire.encode(message)))

    async def send_raw(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def receive(self) -> object:
        """The next message; raises EOFError when the node closed the connection."""
        while True:
            frame = self._decoder.next_frame()
            if frame is not None:
                return wire.decode(frame)
            try:
                data = await self.stream.receive_some(65536)
            except trio.BrokenResourceError:
                raise EOFError from None
            if not data:
                raise EOFError
            self._decoder.feed(data)

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)


async def wait_for(predicate: Callable[[], bool], *, within: float = 10.0,
                   what: str = "condition") -> None:
    """Poll `predicate` until true: a deterministic wait with a deadline, not a fixed sleep
    (the state it watches lives in other tasks' objects, so there is no event to wait on)."""
    with trio.fail_after(within):
        while not predicate():  # noqa: ASYNC110
            await trio.sleep(0.005)
